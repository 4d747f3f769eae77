#include "quant/int8/weight_only_cpu_kernels.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "cpu/bf16_dot.h"
#include "cpu/kernel_counts.h"
#include "cpu/panel_gemm.h"
#include "cpu/parallel.h"
#include "cpu/row_decoded_gemm.h"

namespace tp::detail {

namespace {

cpu::PanelDecodeFn decoder(cpu::Isa isa) {
  switch (isa) {
    case cpu::Isa::kAvx512: return int8_wo_decode_panels_avx512;
    case cpu::Isa::kAvx2: return int8_wo_decode_panels_avx2;
    case cpu::Isa::kScalar: break;
  }
  return int8_wo_decode_panels_scalar;
}

}  // namespace

int64_t Int8WoCpuWeight::bytes() const { return codes.defined() ? codes.nbytes() + scales.nbytes() : 0; }

Int8WoCpuView int8_wo_cpu_view(const Int8WoCpuWeight& w) {
  Int8WoCpuView v;
  v.codes = w.codes.const_data_ptr<int8_t>();
  v.scales = w.scales.const_data_ptr<float>();
  v.n = w.n;
  v.k = w.k;
  v.panels = w.panels;
  return v;
}

Int8WoCpuWeight int8_wo_cpu_pack(const at::Tensor& q, const at::Tensor& scale) {
  TORCH_CHECK_VALUE(q.dim() == 2 && q.scalar_type() == at::kChar,
                    "int8_wo_cpu_pack: the weight must be an int8 [N, K] tensor; got ", q.sizes(), " ",
                    q.scalar_type());
  const int64_t n = q.size(0), k = q.size(1);
  TORCH_CHECK_VALUE(scale.numel() == n && at::isFloatingType(scale.scalar_type()) &&
                        (scale.dim() == 1 || (scale.dim() == 2 && scale.size(1) == 1)),
                    "int8_wo_cpu_pack: the scale must be a floating [N] or [N, 1] tensor with N=", n, "; got ",
                    scale.sizes(), " ", scale.scalar_type());
  Int8WoCpuWeight w;
  w.n = n;
  w.k = k;
  w.panels = (n + cpu::kPanelWidth - 1) / cpu::kPanelWidth;
  w.codes = q.cpu().contiguous();  // no copy for the layer's own (contiguous, CPU) weight
  w.scales =
      at::constant_pad_nd(scale.cpu().reshape({n}).to(at::kFloat), {0, w.panels * cpu::kPanelWidth - n}).contiguous();
  return w;
}

void int8_wo_decode_panels_scalar(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                                  int64_t ld_buf) {
  const auto& w = *static_cast<const Int8WoCpuView*>(view);
  for (int64_t j = 0; j < np * cpu::kPanelWidth; ++j) {
    const int64_t n = p * cpu::kPanelWidth + j;
    for (int64_t kk = 0; kk < kc; ++kk) {
      buf[kk * ld_buf + j] = n < w.n ? static_cast<float>(w.codes[n * w.k + k0 + kk]) * w.scales[n] : 0.0f;
    }
  }
}

void int8_wo_cpu_linear(const float* x, int64_t m, int64_t ld_x, const Int8WoCpuWeight& w, float* y, int64_t ld_y,
                        cpu::Isa isa) {
  cpu::check_isa(isa, "int8_wo_cpu_linear");
  TORCH_INTERNAL_ASSERT(w.codes.defined(), "int8_wo_cpu_linear: the weight is not packed");
  if (m == 0 || w.n == 0) return;
  if (w.k == 0) {
    for (int64_t r = 0; r < m; ++r) std::fill(y + r * ld_y, y + r * ld_y + w.n, 0.0f);
    return;
  }
  const Int8WoCpuView v = int8_wo_cpu_view(w);
  const bool small = isa != cpu::Isa::kScalar && m <= kInt8WoSmallM;
  cpu::count_kernel(std::string(small ? "int8wo rows/" : "int8wo panel/") +
                    to_string(isa));  // the benchmarks' kernel column
  if (small) {
    const auto rows = isa == cpu::Isa::kAvx512 ? int8_wo_rows_avx512 : int8_wo_rows_avx2;
    // Chunks in whole steps of the rows kernel's widest panel group.
    cpu::parallel_over_panels(w.panels, m, w.k, isa == cpu::Isa::kAvx512 ? 4 : 2,
                              [&](int64_t p0, int64_t p1) { rows(x, m, ld_x, v, y, ld_y, p0, p1); });
    return;
  }
  cpu::panel_gemm_parallel(x, m, ld_x, cpu::PanelWeight{w.n, w.k, decoder(isa), &v}, y, ld_y, w.panels, isa);
}

namespace {

// bf16 x on a row-decoded GEMM: x times the exact int8 codes, the row scale once per
// output (cpu/row_decoded_gemm.h).
at::Tensor rows_linear(const at::Tensor& x, const Int8WoCpuWeight& w, cpu::RowsLoop loop) {
  TORCH_CHECK_VALUE(x.size(-1) == w.k, "int8_wo_cpu_linear: x has shape ", x.sizes(), "; expected [..., ", w.k,
                    "] (in_features)");
  auto out_shape = x.sizes().vec();
  out_shape.back() = w.n;
  const at::Tensor x2 = x.reshape({-1, w.k}).contiguous();
  const int64_t m = x2.size(0);
  at::Tensor y = at::empty({m, w.n}, x2.options().dtype(at::kFloat));
  if (m > 0 && w.k == 0) y.zero_();
  if (m > 0 && w.k > 0) {
    at::Tensor xb = at::empty({cpu::pair_tiles_size(m, w.k)}, x2.options().dtype(at::kShort));
    auto* xbp = reinterpret_cast<uint16_t*>(xb.data_ptr<int16_t>());
    cpu::pack_pair_tiles(reinterpret_cast<const uint16_t*>(x2.const_data_ptr<at::BFloat16>()), m, w.k, w.k, xbp);
    const at::Tensor x_scale = at::ones({1, cpu::round_up(m, 16)}, x2.options().dtype(at::kFloat));
    const Int8WoCpuView v = int8_wo_cpu_view(w);
    cpu::RowDecodedWeight rows;
    rows.n = w.n;
    rows.k = w.k;
    rows.decode = &int8_wo_decode_row_bf16;
    rows.weight = &v;
    rows.scale = v.scales;
    cpu::row_decoded_gemm_parallel(loop, xbp, m, x_scale.const_data_ptr<float>(), x_scale.size(1), rows,
                                   y.mutable_data_ptr<float>(), w.n);
  }
  return y.to(at::kBFloat16).view(out_shape);
}

}  // namespace

at::Tensor int8_wo_cpu_linear(const at::Tensor& x, const Int8WoCpuWeight& w, cpu::Isa isa) {
  if (cpu::panel_amx_bf16_applies(x, isa) && w.codes.defined() && w.n > 0) {
    const int64_t m = x.numel() / std::max<int64_t>(w.k, 1);
    if (m <= kInt8WoAmxRowsMaxM) {
      cpu::count_kernel("int8wo rows/amx");  // the benchmarks' kernel column
      return rows_linear(x, w, cpu::RowsLoop::kAmx);
    }
    cpu::count_kernel("int8wo panel/amx");
    const Int8WoCpuView v = int8_wo_cpu_view(w);
    return cpu::panel_linear_amx_bf16(x, cpu::PanelWeight{w.n, w.k, decoder(isa), &v}, w.panels, "int8_wo_cpu_linear");
  }
  if (cpu::bf16_dot_applies(x, isa) && w.codes.defined()) {
    cpu::count_kernel("int8wo rows/avx512_bf16");  // the benchmarks' kernel column
    return rows_linear(x, w, cpu::RowsLoop::kAvx512Bf16);
  }
  return cpu::linear_through_f32(x, w.n, w.k, "int8_wo_cpu_linear", [&](const float* x2, int64_t m, float* y) {
    int8_wo_cpu_linear(x2, m, w.k, w, y, w.n, isa);
  });
}

at::Tensor int8_wo_cpu_decode(const Int8WoCpuWeight& w, cpu::Isa isa) {
  cpu::check_isa(isa, "int8_wo_cpu_decode");
  const Int8WoCpuView v = int8_wo_cpu_view(w);
  return cpu::panel_decode_all(cpu::PanelWeight{w.n, w.k, decoder(isa), &v}, w.panels, isa);
}

}  // namespace tp::detail
