#include "cpu/panel_gemm.h"

#include "cpu/amx.h"
#include "cpu/parallel.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

namespace tp::cpu {

namespace {

// K per decoded chunk: the buffer (kc x 16 np floats, 16 KiB) stays in L1 while
// every row of x passes over it.
constexpr int64_t kChunkK = 256;

}  // namespace

int64_t panel_gemm_panels_per_step(Isa isa) { return isa == Isa::kAvx512 ? 2 : 1; }

int64_t panel_rows_per_tile(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return 8;
    case Isa::kAvx2: return 6;
    case Isa::kScalar: break;
  }
  return 1;
}

std::vector<float> panel_pack_x(const float* x, int64_t m, int64_t ld_x, int64_t k, Isa isa) {
  const int64_t rows = panel_rows_per_tile(isa), blocks = (m + rows - 1) / rows;
  std::vector<float> xp(blocks * k * rows, 0.0f);
  for (int64_t r = 0; r < m; ++r) {
    float* dst = xp.data() + (r / rows) * k * rows + r % rows;
    const float* src = x + r * ld_x;
    for (int64_t kk = 0; kk < k; ++kk) dst[kk * rows] = src[kk];
  }
  return xp;
}

void panel_microkernel_scalar(const float* xp, int64_t m, int64_t ld_block, const float* buf, int64_t np, int64_t kc,
                              int64_t ld_buf, float* y, int64_t ld_y, int64_t ncols, bool accumulate) {
  // One row per block (panel_rows_per_tile): block r is row r, contiguous in k.
  TORCH_INTERNAL_ASSERT(ncols <= kPanelWidth * np && ncols <= ld_buf);
  float acc[2 * kPanelWidth];
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = xp + r * ld_block;
    float* yr = y + r * ld_y;
    for (int64_t c = 0; c < ncols; ++c) acc[c] = accumulate ? yr[c] : 0.0f;
    for (int64_t kk = 0; kk < kc; ++kk) {
      const float xv = xr[kk];
      const float* b = buf + kk * ld_buf;
      for (int64_t c = 0; c < ncols; ++c) acc[c] += xv * b[c];
    }
    for (int64_t c = 0; c < ncols; ++c) yr[c] = acc[c];
  }
}

void panel_gemm(const float* xp, int64_t m, const PanelWeight& w, float* y, int64_t ld_y, int64_t p0, int64_t p1,
                Isa isa) {
  TORCH_INTERNAL_ASSERT(w.decode != nullptr && p0 >= 0 && p0 <= p1 && p1 * kPanelWidth < w.n + kPanelWidth);
  const auto micro = isa == Isa::kAvx512 ? panel_microkernel_avx512
                     : isa == Isa::kAvx2 ? panel_microkernel_avx2
                                         : panel_microkernel_scalar;
  const int64_t step = panel_gemm_panels_per_step(isa), rows = panel_rows_per_tile(isa);
  const int64_t ld_buf = kPanelWidth * step;
  alignas(64) float buf[kChunkK * 2 * kPanelWidth];
  for (int64_t p = p0; p < p1; p += step) {
    const int64_t np = std::min(step, p1 - p);
    const int64_t ncols = std::min(kPanelWidth * np, w.n - kPanelWidth * p);
    for (int64_t k0 = 0; k0 < w.k; k0 += kChunkK) {
      const int64_t kc = std::min(kChunkK, w.k - k0);
      w.decode(w.weight, p, np, k0, kc, buf, ld_buf);
      micro(xp + k0 * rows, m, w.k * rows, buf, np, kc, ld_buf, y + kPanelWidth * p, ld_y, ncols,
            /*accumulate=*/k0 > 0);
    }
  }
}

void panel_gemm_parallel(const float* x, int64_t m, int64_t ld_x, const PanelWeight& w, float* y, int64_t ld_y,
                         int64_t panels, Isa isa) {
  const std::vector<float> xp = panel_pack_x(x, m, ld_x, w.k, isa);
  parallel_over_panels(panels, m, w.k, panel_gemm_panels_per_step(isa),
                       [&](int64_t p0, int64_t p1) { panel_gemm(xp.data(), m, w, y, ld_y, p0, p1, isa); });
}

void parallel_over_panels(int64_t panels, int64_t m, int64_t k, int64_t align,
                          const std::function<void(int64_t p0, int64_t p1)>& fn) {
  if (panels <= 0) return;
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  const int64_t min_chunk =
      std::max<int64_t>(1, (int64_t{1} << 18) / (kPanelWidth * std::max<int64_t>(k, 1) * std::max<int64_t>(m, 1)));
  // About 8 chunks per thread: enough to even out a preempted thread, few enough
  // that each chunk streams long contiguous runs of the weight.
  int64_t chunk = std::max(min_chunk, panels / (8 * threads));
  chunk = (chunk + align - 1) / align * align;
  const int64_t chunks = (panels + chunk - 1) / chunk;
  if (chunks == 1 || threads == 1) {
    fn(0, panels);
    return;
  }
  parallel_grabs(chunks, threads, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) fn(c * chunk, std::min(panels, (c + 1) * chunk));
  });
}

at::Tensor panel_decode_all(const PanelWeight& w, int64_t panels, Isa isa) {
  const int64_t step = panel_gemm_panels_per_step(isa), ld = kPanelWidth * step;
  auto out = at::empty({panels * kPanelWidth, w.k}, at::kFloat);
  std::vector<float> buf(std::max<int64_t>(w.k, 1) * ld);
  for (int64_t p = 0; p < panels && w.k > 0; p += step) {
    const int64_t np = std::min(step, panels - p);
    w.decode(w.weight, p, np, 0, w.k, buf.data(), ld);
    // buf [K, 16 np] -> rows 16p.. of out [panels * 16, K].
    const auto tile = at::from_blob(buf.data(), {w.k, ld}, at::kFloat).narrow(1, 0, kPanelWidth * np);
    out.narrow(0, kPanelWidth * p, kPanelWidth * np).copy_(tile.t());
  }
  return out.narrow(0, 0, w.n).contiguous();
}

void check_isa(Isa isa, const char* what) {
  TORCH_CHECK_VALUE(static_cast<int>(isa) <= static_cast<int>(max_isa()), what, ": the ", to_string(isa),
                    " kernels cannot run on this CPU (it supports up to ", to_string(max_isa()),
                    "; features: ", features().describe(), ")");
}

at::Tensor linear_through_f32(const at::Tensor& x, int64_t n, int64_t k, const char* what,
                              const std::function<void(const float* x, int64_t m, float* y)>& run) {
  TORCH_CHECK_VALUE(
      x.defined() && x.device().is_cpu() &&
          (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf),
      what, ": x must be a float32, bfloat16 or float16 CPU tensor; got ",
      x.defined() ? c10::toString(x.scalar_type()) : "undefined", x.defined() ? " on " : "",
      x.defined() ? x.device().str() : "");
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == k, what, ": x has shape ", x.sizes(), "; expected [..., ", k,
                    "] (in_features)");
  auto out_shape = x.sizes().vec();
  out_shape.back() = n;
  const auto x2 = x.reshape({-1, k}).to(at::kFloat).contiguous();
  auto y = at::empty({x2.size(0), n}, x2.options());
  if (y.numel() > 0) run(x2.const_data_ptr<float>(), x2.size(0), y.mutable_data_ptr<float>());
  return y.to(x.scalar_type()).view(out_shape);
}

bool panel_amx_bf16_applies(const at::Tensor& x, Isa isa) {
  return x.scalar_type() == at::kBFloat16 && x.device().is_cpu() && x.dim() >= 1 && isa == Isa::kAvx512 &&
         x.numel() / std::max<int64_t>(x.size(-1), 1) >= kPanelAmxMinM && amx_status().usable;
}

at::Tensor panel_linear_amx_bf16(const at::Tensor& x, const PanelWeight& w, int64_t panels, const char* what) {
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == w.k, what, ": x has shape ", x.sizes(), "; expected [..., ", w.k,
                    "] (in_features)");
  TORCH_INTERNAL_ASSERT(amx_status().usable && x.scalar_type() == at::kBFloat16);
  auto out_shape = x.sizes().vec();
  out_shape.back() = w.n;
  const at::Tensor x2 = x.reshape({-1, w.k});
  const int64_t m = x2.size(0), kpad = round_up(std::max<int64_t>(w.k, 1), 32);
  // x zero padded to whole 32-k tile steps (its padding meets the weight's zero rows), rows
  // 64 bytes past that so that a tile's 16 rows do not all fall into one L1 set.
  const int64_t ld = kpad + 32;
  at::Tensor xa = at::zeros({m, ld}, x2.options());
  xa.narrow(1, 0, w.k).copy_(x2);
  at::Tensor y = at::empty({m, w.n}, x2.options().dtype(at::kFloat));
  if (w.k == 0) y.zero_();
  if (y.numel() > 0 && w.k > 0) {
    const auto* xp = reinterpret_cast<const uint16_t*>(xa.const_data_ptr<at::BFloat16>());
    float* yp = y.mutable_data_ptr<float>();
    parallel_over_panels(panels, m, w.k, 2,
                         [&](int64_t p0, int64_t p1) { panel_gemm_amx_bf16_range(xp, m, ld, w, yp, w.n, p0, p1); });
  }
  return y.to(at::kBFloat16).view(out_shape);
}

}  // namespace tp::cpu
