// MXFP4's CPU kernel: the shared panel GEMM (cpu/panel_gemm.h) over weights this file's
// decoder writes exactly as float32: E2M1 code value times 2^(scale - 127), both exact in
// float32 for every scale byte below 255 (2^-127 is a float32 subnormal). The decoder is
// plain C++ compiled for the baseline, so it serves every ISA's microkernel; the GEMM's
// arithmetic is float32 x times the exact weight, summed in float32 in k order.

#include <ATen/ATen.h>

#include <cmath>

#include "cpu/features.h"
#include "cpu/kernel_counts.h"
#include "cpu/panel_gemm.h"
#include "quant/mxfp4/mxfp4.h"
#include "quant/mxfp4/rows.h"

namespace tp::detail {

namespace {

constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

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
      const float value = kE2m1[(k & 1) ? byte >> 4 : byte & 0x0F];
      buf[kk * ld_buf + j] = std::ldexp(value, static_cast<int>(scales[k / kMxfp4Block]) - 127);
    }
  }
}

}  // namespace

at::Tensor mxfp4_cpu_linear(const at::Tensor& x, const Mxfp4CpuWeight& w) {
  const cpu::Isa isa = cpu::isa();
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
