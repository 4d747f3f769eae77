// The portable side of the bf16 dot-product panel GEMM (cpu/bf16_panel_gemm.h): the
// choice, x's padding and group sums, and the threading; the loop is
// cpu/bf16_panel_gemm_avx512.cpp.

#include "cpu/bf16_panel_gemm.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "cpu/panel_gemm.h"
#include "cpu/parallel.h"

namespace tp::cpu {

int64_t bf16_panel_chunk(int64_t k, int64_t group) {
  int64_t chunk = kBf16ChunkK;
  if (group > 0 && group < k)
    while (group % chunk != 0) chunk /= 2;
  TORCH_INTERNAL_ASSERT(chunk >= 2, "bf16_panel_chunk: scale groups of ", group, " k are not a multiple of 2");
  return chunk;
}

at::Tensor bf16_panel_linear(const at::Tensor& x_in, const Bf16PanelWeight& w, const char* what) {
  TORCH_CHECK_VALUE(
      x_in.dim() >= 1 && x_in.size(-1) == w.k && x_in.device().is_cpu() && x_in.scalar_type() == at::kBFloat16, what,
      ": x must be a bfloat16 [..., ", w.k, "] CPU tensor; got ", x_in.sizes(), " ", x_in.scalar_type());
  auto out_shape = x_in.sizes().vec();
  out_shape.back() = w.n;
  const at::Tensor x = x_in.reshape({-1, w.k});
  TORCH_INTERNAL_ASSERT(features().avx512bf16, what, ": this CPU has no avx512_bf16");
  TORCH_INTERNAL_ASSERT(w.decode != nullptr && (w.group >= w.k || w.group % 2 == 0));
  const int64_t m = x.size(0);
  at::Tensor y = at::empty({m, w.n}, x.options().dtype(at::kFloat));
  if (m == 0 || w.n == 0) return y.to(at::kBFloat16).view(out_shape);
  if (w.k == 0) return y.zero_().to(at::kBFloat16).view(out_shape);
  // x as bf16 bits, rows of an even length (a pair per broadcast), zero past K.
  at::Tensor xb = x.view(at::kShort);
  if (w.k % 2 != 0 || xb.stride(1) != 1 || xb.stride(0) % 2 != 0)
    xb = at::constant_pad_nd(xb, {0, round_up(w.k, 2) - w.k}).contiguous();
  const auto* xp = reinterpret_cast<const uint16_t*>(xb.const_data_ptr<int16_t>());
  const int64_t ld_x = xb.stride(0);
  const int64_t chunk = bf16_panel_chunk(w.k, w.group);
  // With zero points: x's sum over each chunk, in float64, rounded once.
  const int64_t chunks = (w.k + chunk - 1) / chunk;
  std::vector<float> x_sum;
  if (w.zeros) {
    x_sum.resize(static_cast<size_t>(m * chunks));
    const at::Tensor xf = xb.narrow(1, 0, w.k).view(at::kBFloat16).to(at::kDouble);
    const at::Tensor sums = at::constant_pad_nd(xf, {0, chunks * chunk - w.k}).view({m, chunks, chunk}).sum(2);
    const at::Tensor sf = sums.to(at::kFloat).contiguous();
    std::copy(sf.const_data_ptr<float>(), sf.const_data_ptr<float>() + m * chunks, x_sum.begin());
  }
  const int64_t panels = (w.n + kBf16PanelWidth - 1) / kBf16PanelWidth;
  float* yp = y.mutable_data_ptr<float>();
  parallel_over_panels(panels, m, w.k, kBf16PanelsPerStep, [&](int64_t p0, int64_t p1) {
    bf16_panel_gemm_range(xp, ld_x, m, x_sum.data(), chunks, w, yp, w.n, p0, p1);
  });
  return y.to(at::kBFloat16).view(out_shape);
}

}  // namespace tp::cpu
