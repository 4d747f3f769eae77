// The portable side of the bf16 dot-product panel GEMM (cpu/bf16_panel_gemm.h): the
// choice, x's padding and group sums, and the threading; the loop is
// cpu/bf16_panel_gemm_avx512.cpp.

#include "cpu/bf16_panel_gemm.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "cpu/amx.h"
#include "cpu/parallel.h"
#include "cpu/panel_gemm.h"

namespace tp::cpu {

int64_t bf16_panel_chunk(int64_t k, int64_t group, int64_t x_group) {
  int64_t chunk = kBf16ChunkK;
  for (const int64_t g : {group, x_group})
    if (g > 0 && g < k)
      while (g % chunk != 0) chunk /= 2;
  TORCH_INTERNAL_ASSERT(chunk >= 2, "bf16_panel_chunk: scale groups of ", group, " and ", x_group,
                        " k are not multiples of 2");
  return chunk;
}

bool bf16_panel_applies(const at::Tensor& x, Isa isa) {
  return x.scalar_type() == at::kBFloat16 && x.device().is_cpu() && x.dim() >= 1 && isa == Isa::kAvx512 &&
         features().avx512bf16 && x.numel() / std::max<int64_t>(x.size(-1), 1) >= kBf16PanelMinM &&
         !amx_status().usable;
}

at::Tensor bf16_panel_linear(const at::Tensor& x, const Bf16PanelWeight& w, const Bf16RowScales* t,
                             const char* what) {
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(1) == w.k && x.device().is_cpu() &&
                        (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kShort),
                    what, ": x must be a bf16 [M, ", w.k, "] CPU tensor; got ", x.sizes(), " ", x.scalar_type());
  TORCH_INTERNAL_ASSERT(features().avx512bf16, what, ": this CPU has no avx512_bf16");
  TORCH_INTERNAL_ASSERT(w.decode != nullptr && (w.group >= w.k || w.group % 2 == 0));
  const int64_t m = x.size(0);
  at::Tensor y = at::empty({m, w.n}, x.options().dtype(at::kFloat));
  if (m == 0 || w.n == 0) return y;
  if (w.k == 0) return y.zero_();
  // x as bf16 bits, rows of an even length (a pair per broadcast), zero past K.
  at::Tensor xb = x.scalar_type() == at::kShort ? x : x.view(at::kShort);
  if (w.k % 2 != 0 || xb.stride(1) != 1 || xb.stride(0) % 2 != 0)
    xb = at::constant_pad_nd(xb, {0, round_up(w.k, 2) - w.k}).contiguous();
  const auto* xp = reinterpret_cast<const uint16_t*>(xb.const_data_ptr<int16_t>());
  const int64_t ld_x = xb.stride(0);
  const Bf16RowScales none;
  const Bf16RowScales& ts = t != nullptr ? *t : none;
  const int64_t chunk = bf16_panel_chunk(w.k, w.group, ts.scale != nullptr ? ts.group : 0);
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
    bf16_panel_gemm_range(xp, ld_x, m, x_sum.data(), chunks, ts, w, yp, w.n, p0, p1);
  });
  return y;
}

}  // namespace tp::cpu
