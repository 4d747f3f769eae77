// MXFP4's rows kernels' dispatcher (rows.h): packs x into the decoded vectors' order and
// threads over N (cpu::parallel_rows); the per-ISA loops are in rows_avx2.cpp / rows_avx512.cpp.

#include "quant/mxfp4/rows.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <string>

#include "cpu/kernel_counts.h"
#include "cpu/panel_gemm.h"
#include "cpu/parallel.h"

namespace tp::detail {

namespace {

// Rows per unit of work handed to a thread: a multiple of every kernel's row block (4, 2).
constexpr int64_t kUnitRows = 16;

}  // namespace

void mxfp4_pack_x_f32(const float* x, int64_t m, int64_t ld_x, int64_t k, int64_t lanes, float* xp, int64_t ld_xp) {
  const int64_t chunk = 8 * lanes, kpad = cpu::round_up(k, chunk);
  for (int64_t r = 0; r < m; ++r) {
    const float* src = x + r * ld_x;
    float* dst = xp + r * ld_xp;
    for (int64_t c = 0; c < kpad; c += chunk)
      for (int64_t i = 0; i < 8; ++i)
        for (int64_t j = 0; j < lanes; ++j) {
          const int64_t kk = c + 8 * j + i;
          dst[c + i * lanes + j] = kk < k ? src[kk] : 0.0f;
        }
  }
}

void mxfp4_pack_x_bf16(const uint16_t* x, int64_t m, int64_t ld_x, int64_t k, uint32_t* xq, int64_t ld_xq) {
  const int64_t kpad = cpu::round_up(k, 128);
  for (int64_t r = 0; r < m; ++r) {
    const uint16_t* src = x + r * ld_x;
    uint32_t* dst = xq + r * ld_xq;
    for (int64_t c = 0; c < kpad; c += 128)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 16; ++j) {
          const int64_t lo = c + 8 * j + i, hi = lo + 4;
          const uint32_t a = lo < k ? src[lo] : 0u, b = hi < k ? src[hi] : 0u;
          dst[c / 2 + 16 * i + j] = a | (b << 16);
        }
  }
}

at::Tensor mxfp4_rows_linear(const at::Tensor& x, const Mxfp4CpuWeight& w, cpu::Isa isa) {
  TORCH_INTERNAL_ASSERT(x.dim() == 2 && x.size(1) == w.k && x.size(0) >= 1 && x.size(0) <= kMxfp4RowsMaxM &&
                            x.is_contiguous() && isa != cpu::Isa::kScalar,
                        "mxfp4_rows_linear: x ", x.sizes(), " at ", cpu::to_string(isa));
  const int64_t m = x.size(0);
  if (x.scalar_type() == at::kBFloat16 && isa == cpu::Isa::kAvx512 && cpu::features().avx512bf16) {
    // bf16 layers: x's own bits, paired for VDPBF16PS; y rounded to bf16 once.
    cpu::count_kernel("mxfp4 rows/avx512_bf16");             // the benchmarks' kernel column
    const int64_t ld_xq = cpu::round_up(w.k, 128) / 2 + 16;  // rows not a multiple of 4 KB apart
    std::vector<uint32_t> xq(static_cast<size_t>(m * ld_xq));
    mxfp4_pack_x_bf16(reinterpret_cast<const uint16_t*>(x.const_data_ptr<at::BFloat16>()), m, w.k, w.k, xq.data(),
                      ld_xq);
    at::Tensor y = at::empty({m, w.n}, x.options().dtype(at::kFloat));
    float* out = y.data_ptr<float>();
    cpu::parallel_rows(w.n, kUnitRows, [&](int64_t n0, int64_t n1) {
      mxfp4_rows_bf16_avx512(xq.data(), m, ld_xq, w, out, w.n, n0, n1);
    });
    return y.to(at::kBFloat16);
  }
  return cpu::linear_through_f32(x, w.n, w.k, "mxfp4_rows_linear", [&](const float* x2, int64_t mm, float* y) {
    cpu::count_kernel(std::string("mxfp4 rows/") + cpu::to_string(isa));  // the benchmarks' kernel column
    const int64_t lanes = isa == cpu::Isa::kAvx512 ? 16 : 8;
    const int64_t ld_xp = cpu::round_up(w.k, 8 * lanes) + 16;
    std::vector<float> xp(static_cast<size_t>(mm * ld_xp));
    mxfp4_pack_x_f32(x2, mm, w.k, w.k, lanes, xp.data(), ld_xp);
    const auto kernel = isa == cpu::Isa::kAvx512 ? &mxfp4_rows_f32_avx512 : &mxfp4_rows_f32_avx2;
    cpu::parallel_rows(w.n, kUnitRows,
                       [&](int64_t n0, int64_t n1) { kernel(xp.data(), mm, ld_xp, w, y, w.n, n0, n1); });
  });
}

}  // namespace tp::detail
