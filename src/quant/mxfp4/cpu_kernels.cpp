// MXFP4's CPU kernel: the shared panel GEMM (cpu/panel_gemm.h) over weights this file's
// decoder writes exactly as float32: E2M1 code value times 2^(scale - 127), both exact in
// float32 for every scale byte below 255 (2^-127 is a float32 subnormal). The decoder is
// plain C++ compiled for the baseline, so it serves every ISA's microkernel; the GEMM's
// arithmetic is float32 x times the exact weight, summed in float32 in k order.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "cpu/bf16_dot.h"
#include "cpu/features.h"
#include "cpu/kernel_counts.h"
#include "cpu/panel_gemm.h"
#include "cpu/parallel.h"
#include "cpu/row_decoded_gemm.h"
#include "quant/mxfp4/e2m1.h"
#include "quant/mxfp4/mxfp4.h"
#include "quant/mxfp4/rows.h"

namespace tp::detail {

namespace {

// buf[kk * ld_buf + j] = W[16 p + j, k0 + kk] (cpu::PanelDecodeFn); rows past N are zeros.
void decode_panels(const void* weight, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf, int64_t ld_buf) {
  const auto& w = *static_cast<const Mxfp4CpuWeight*>(weight);
  const int64_t blocks_per_row = w.k / kMxfp4Block, cols = cpu::kPanelWidth * np;
  for (int64_t j = 0; j < cols; ++j) {
    const int64_t n = cpu::kPanelWidth * p + j;
    if (n >= w.n) {
      for (int64_t kk = 0; kk < kc; ++kk) buf[kk * ld_buf + j] = 0.0f;
      continue;
    }
    const uint8_t* codes = w.blocks + n * (w.k / 2);
    const uint8_t* scales = w.scales + n * blocks_per_row;
    for (int64_t kk = 0; kk < kc; ++kk) {
      const int64_t k = k0 + kk;
      const uint8_t byte = codes[k / 2];
      const float value = kE2m1Values[(k & 1) ? byte >> 4 : byte & 0x0F];
      buf[kk * ld_buf + j] = std::ldexp(value, static_cast<int>(scales[k / kMxfp4Block]) - 127);
    }
  }
}

// Whether every scale byte lies where the decoded bf16 weight is exact.
bool bf16_exact_scales(const Mxfp4CpuWeight& w) {
  const int64_t count = w.n * (w.k / kMxfp4Block);
  uint8_t lo = 255, hi = 0;
  for (int64_t i = 0; i < count; ++i) {
    lo = std::min(lo, w.scales[i]);
    hi = std::max(hi, w.scales[i]);
  }
  return count == 0 || (lo >= kMxfp4Bf16ScaleMin && hi <= kMxfp4Bf16ScaleMax);
}

// bf16 x on the row-decoded GEMM's AVX-512 bf16 loop: x times the exact dequantized weight.
at::Tensor bf16_rows_linear(const at::Tensor& x, const Mxfp4CpuWeight& w) {
  const at::Tensor x2 = x.contiguous();
  const int64_t m = x2.size(0);
  at::Tensor xb = at::empty({cpu::pair_tiles_size(m, w.k)}, x2.options().dtype(at::kShort));
  auto* xbp = reinterpret_cast<uint16_t*>(xb.data_ptr<int16_t>());
  cpu::pack_pair_tiles(reinterpret_cast<const uint16_t*>(x2.const_data_ptr<at::BFloat16>()), m, w.k, w.k, xbp);
  const at::Tensor ones = at::ones({1, cpu::round_up(m, 16)}, x2.options().dtype(at::kFloat));
  const float one = 1.0f;
  cpu::RowDecodedWeight rows;
  rows.n = w.n;
  rows.k = w.k;
  rows.decode = &mxfp4_decode_row_bf16;
  rows.weight = &w;
  rows.scale = &one;  // the scales are in the decoded weight
  rows.scale_ld = 0;
  at::Tensor y = at::empty({m, w.n}, x2.options().dtype(at::kFloat));
  cpu::row_decoded_gemm_parallel(cpu::RowsLoop::kAvx512Bf16, xbp, m, ones.const_data_ptr<float>(), ones.size(1), rows,
                                 y.mutable_data_ptr<float>(), w.n);
  return y.to(at::kBFloat16);
}

}  // namespace

at::Tensor mxfp4_cpu_linear(const at::Tensor& x, const Mxfp4CpuWeight& w) {
  const cpu::Isa isa = cpu::isa();
  // bf16 x from the bf16_dot crossover (cpu/crossovers.h) where the scales keep the
  // dequantized weight a normal bf16 value.
  if (cpu::bf16_dot_applies(x, isa) && w.n > 0 && w.k > 0 && x.dim() == 2 && x.size(1) == w.k && bf16_exact_scales(w)) {
    cpu::count_kernel("mxfp4 gemm/avx512_bf16");  // the benchmarks' kernel column
    return bf16_rows_linear(x, w);
  }
  // Decode (M <= 4) on AVX2 / AVX-512: the rows kernels (rows.h), the weight streamed once.
  if (isa != cpu::Isa::kScalar && x.dim() == 2 && x.size(0) >= 1 && x.size(0) <= kMxfp4RowsMaxM && x.size(1) == w.k &&
      x.is_contiguous() && x.device().is_cpu() &&
      (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf))
    return mxfp4_rows_linear(x, w, isa);
  const int64_t panels = (w.n + cpu::kPanelWidth - 1) / cpu::kPanelWidth;
  return cpu::linear_through_f32(x, w.n, w.k, "mxfp4_cpu_linear", [&](const float* x2, int64_t m, float* y) {
    cpu::count_kernel(std::string("mxfp4 panel/") + cpu::to_string(isa));  // the benchmarks' kernel column
    cpu::panel_gemm_parallel(x2, m, w.k, cpu::PanelWeight{w.n, w.k, &decode_panels, &w}, y, w.n, panels, isa);
  });
}

at::Tensor mxfp4_cpu_decode_all(const Mxfp4CpuWeight& w) {
  const int64_t panels = (w.n + cpu::kPanelWidth - 1) / cpu::kPanelWidth;
  return cpu::panel_decode_all(cpu::PanelWeight{w.n, w.k, &decode_panels, &w}, panels, cpu::Isa::kScalar);
}

}  // namespace tp::detail
