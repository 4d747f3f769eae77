#include "cpu/invariant_gemm.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstring>
#include <string>

#include "cpu/features.h"
#include "cpu/invariant_rows.h"
#include "cpu/kernel_counts.h"
#include "cpu/panel_gemm.h"

namespace tp::cpu {
namespace {

// The largest chunk: a bfloat16 panel chunk is widened into a buffer of this many rows.
constexpr int64_t kMaxChunk = 64;

// kc rows of one bfloat16 panel (k-major, 16 columns) widened exactly to float32: an
// integer loop the compiler vectorizes, then one copy.
void widen_panel_chunk(const uint16_t* src, int64_t kc, float* out) {
  uint32_t bits[kMaxChunk * kPanelWidth];
  for (int64_t i = 0; i < kc * kPanelWidth; ++i) bits[i] = static_cast<uint32_t>(src[i]) << 16;
  std::memcpy(out, bits, sizeof(float) * kc * kPanelWidth);
}

// The scalar path's microkernel (panel_microkernel_scalar's layout: block r is row r,
// contiguous in k), with each step one fused multiply-add as the AVX2 and AVX-512 tiles
// take it: panel_microkernel_scalar rounds the product and the sum apart, which would give
// TP_CPU_ISA=scalar other bits than the vector ISAs.
void fma_microkernel_scalar(const float* xp, int64_t m, int64_t ld_block, const float* buf, int64_t kc, float* y,
                            int64_t ld_y, int64_t ncols) {
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = xp + r * ld_block;
    float* yr = y + r * ld_y;
    for (int64_t c = 0; c < ncols; ++c) {
      float acc = 0.0f;
      for (int64_t kk = 0; kk < kc; ++kk) acc = std::fma(xr[kk], buf[kk * kPanelWidth + c], acc);
      yr[c] = acc;
    }
  }
}

}  // namespace

std::vector<ChunkSpan> dyadic_pieces(int64_t begin, int64_t end) {
  std::vector<ChunkSpan> out;
  while (begin < end) {
    int64_t size = 1;
    while ((begin % (2 * size)) == 0 && begin + 2 * size <= end) size *= 2;
    out.push_back({begin, size});
    begin += size;
  }
  return out;
}

at::Tensor invariant_pack(const at::Tensor& b) {
  TORCH_CHECK(b.dim() == 2 && (b.scalar_type() == at::kFloat || b.scalar_type() == at::kBFloat16),
              "invariant_pack: expected a 2-D float32 or bfloat16 tensor, got ", b.sizes(), " ", b.scalar_type());
  const int64_t n = b.size(0), r = b.size(1), panels = (n + kPanelWidth - 1) / kPanelWidth;
  at::Tensor padded = at::zeros({panels * kPanelWidth, r}, b.options().device(at::kCPU));
  padded.narrow(0, 0, n).copy_(b);
  return padded.view({panels, kPanelWidth, r}).transpose(1, 2).contiguous();
}

at::Tensor invariant_gemm_pieces(const at::Tensor& a, const at::Tensor& b_packed, int64_t n, int64_t first_chunk,
                                 int64_t chunk) {
  return invariant_gemm_pieces(a, b_packed, n, first_chunk, chunk, cpu::isa());
}

at::Tensor invariant_gemm_pieces(const at::Tensor& a, const at::Tensor& b_packed, int64_t n, int64_t first_chunk,
                                 int64_t chunk, Isa isa) {
  check_isa(isa, "invariant_gemm_pieces");
  TORCH_CHECK(a.dim() == 2 && a.scalar_type() == at::kFloat && a.is_contiguous(),
              "invariant_gemm_pieces: a must be contiguous float32 [M, R]");
  TORCH_CHECK(chunk > 0 && chunk <= kMaxChunk, "invariant_gemm_pieces: chunk ", chunk, " outside [1, ", kMaxChunk, "]");
  const int64_t m = a.size(0), r = a.size(1), chunks = (r + chunk - 1) / chunk;
  const int64_t panels = (n + kPanelWidth - 1) / kPanelWidth;
  TORCH_CHECK(b_packed.dim() == 3 && b_packed.size(0) == panels && b_packed.size(1) == r &&
                  b_packed.size(2) == kPanelWidth && b_packed.is_contiguous(),
              "invariant_gemm_pieces: b_packed ", b_packed.sizes(), " is not invariant_pack of [", n, ", ", r, "]");
  const auto spans = dyadic_pieces(first_chunk, first_chunk + chunks);
  at::Tensor out = at::empty({static_cast<int64_t>(spans.size()), m, n}, a.options());
  if (m == 0 || n == 0 || spans.empty()) return out;

  count_kernel(std::string("invariant/") + to_string(isa));  // the benchmarks' kernel column
  if (isa == Isa::kAvx512) {
    // invariant_rows_avx512: the same steps, arranged around the FMA chains (every M).
    InvariantRowsArgs args;
    args.a = a.data_ptr<float>();
    args.m = m;
    args.lda = r;
    args.panels = b_packed.data_ptr();
    args.bf16 = b_packed.scalar_type() == at::kBFloat16;
    args.r = r;
    args.n = n;
    args.first_chunk = first_chunk;
    args.chunk = chunk;
    args.out = out.data_ptr<float>();
    int64_t levels = 2;
    while ((int64_t{1} << (levels - 2)) < chunks) ++levels;
    parallel_over_panels(panels, m, r, kMaxRowsGroup, [&](int64_t p0, int64_t p1) {
      std::vector<float> scratch(static_cast<size_t>(levels * 4 * kMaxRowsGroup * kPanelWidth));
      std::vector<int64_t> lo(static_cast<size_t>(levels)), size(static_cast<size_t>(levels));
      const int64_t pieces = invariant_rows_avx512(args, p0, p1, scratch.data(), lo.data(), size.data());
      TORCH_INTERNAL_ASSERT(pieces == static_cast<int64_t>(spans.size()),
                            "invariant_gemm_pieces: the counter's subtrees are not the dyadic pieces");
    });
    return out;
  }
  // Each chunk of a packed for the microkernels once, shared by every thread.
  std::vector<std::vector<float>> xp(chunks);
  for (int64_t c = 0; c < chunks; ++c)
    xp[c] = panel_pack_x(a.data_ptr<float>() + c * chunk, m, r, std::min(chunk, r - c * chunk), isa);
  const bool bf16 = b_packed.scalar_type() == at::kBFloat16;
  const void* panel_data = b_packed.data_ptr();
  float* out_data = out.data_ptr<float>();

  const auto micro = isa == Isa::kAvx512 ? panel_microkernel_avx512 : panel_microkernel_avx2;
  const int64_t rows_per_tile = panel_rows_per_tile(isa);
  // A thread's panels in blocks whose partial sums (m x width floats each, a few levels
  // deep) stay in L2: ~64 KiB a buffer. A few rows take one panel at a time, so the weight
  // is read as one sequential stream per panel (all of its chunks in a row).
  const int64_t block = m <= 4 ? 1 : std::max<int64_t>(1, (int64_t{16} << 10) / (m * kPanelWidth));
  const auto run_block = [&](int64_t p0, int64_t p1) {
    const int64_t width = kPanelWidth * (p1 - p0), cols = std::min(width, n - kPanelWidth * p0);
    // The binary counter: complete subtrees of decreasing size, merged as soon as a
    // right sibling completes, so at the end they are exactly `spans`. Buffers are reused.
    std::vector<std::vector<float>> stack, spare;
    std::vector<ChunkSpan> held;
    alignas(64) float widened[kMaxChunk * kPanelWidth];
    for (int64_t c = 0; c < chunks; ++c) {
      std::vector<float> part;
      if (spare.empty()) {
        part.resize(static_cast<size_t>(m * width));
      } else {
        part = std::move(spare.back());
        spare.pop_back();
      }
      const int64_t kc = std::min(chunk, r - c * chunk);
      for (int64_t p = p0; p < p1; ++p) {
        // One panel's chunk: float32 panels are read where they lie (the k-major 16 columns
        // the microkernel wants); bfloat16 ones are widened exactly into `widened` first.
        const int64_t offset = (p * r + c * chunk) * kPanelWidth;
        const float* buf = static_cast<const float*>(panel_data) + offset;
        if (bf16) {
          widen_panel_chunk(static_cast<const uint16_t*>(panel_data) + offset, kc, widened);
          buf = widened;
        }
        const int64_t ncols = std::min(kPanelWidth, n - kPanelWidth * p);
        float* y = part.data() + kPanelWidth * (p - p0);
        if (isa == Isa::kScalar) {
          fma_microkernel_scalar(xp[c].data(), m, kc * rows_per_tile, buf, kc, y, width, ncols);
        } else {
          micro(xp[c].data(), m, kc * rows_per_tile, buf, 1, kc, kPanelWidth, y, width, ncols, /*accumulate=*/false);
        }
      }
      stack.push_back(std::move(part));
      held.push_back({first_chunk + c, 1});
      while (held.size() >= 2) {
        const ChunkSpan left = held[held.size() - 2], right = held.back();
        if (left.size != right.size || left.lo % (2 * left.size) != 0) break;
        auto& l = stack[stack.size() - 2];
        const auto& rr = stack.back();
        for (size_t i = 0; i < l.size(); ++i) l[i] = l[i] + rr[i];
        spare.push_back(std::move(stack.back()));
        stack.pop_back();
        held.pop_back();
        held.back() = {left.lo, 2 * left.size};
      }
    }
    TORCH_INTERNAL_ASSERT(held == spans, "invariant_gemm_pieces: the counter's subtrees are not the dyadic pieces");
    for (size_t i = 0; i < stack.size(); ++i)
      for (int64_t row = 0; row < m; ++row)
        std::memcpy(out_data + (static_cast<int64_t>(i) * m + row) * n + kPanelWidth * p0,
                    stack[i].data() + row * width, sizeof(float) * cols);
  };
  parallel_over_panels(panels, m, r, panel_gemm_panels_per_step(isa), [&](int64_t p0, int64_t p1) {
    for (int64_t q = p0; q < p1; q += block) run_block(q, std::min(p1, q + block));
  });
  return out;
}

at::Tensor invariant_sum_pieces(const at::Tensor& a, int64_t first_chunk, int64_t chunk) {
  // Against a row of ones: fma(a, 1, s) is a + s rounded once, so these are the row sums.
  const at::Tensor ones = invariant_pack(at::ones({1, a.size(1)}, at::TensorOptions(at::kFloat)));
  return invariant_gemm_pieces(a, ones, 1, first_chunk, chunk);
}

}  // namespace tp::cpu
