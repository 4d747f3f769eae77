// NVFP4's CPU kernel: the shared panel GEMM (cpu/panel_gemm.h) over weights this file's
// decoder writes as float32, each group's scale computed as the producer computes it (one
// float32 division or product of the E4M3 scale and the row's global scale) and each
// element one float32 product of its E2M1 value and that scale. The decoder is plain C++
// compiled for the baseline, so it serves every ISA's microkernel.

#include <ATen/ATen.h>
#include <c10/util/Float8_e4m3fn.h>

#include <array>

#include "cpu/features.h"
#include "cpu/kernel_counts.h"
#include "cpu/panel_gemm.h"
#include "quant/mxfp4/e2m1.h"
#include "quant/nvfp4/nvfp4.h"

namespace tp::detail {

namespace {

// E4M3 (fn) bytes as float32 (exact).
const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[b] = static_cast<float>(c10::Float8_e4m3fn(static_cast<uint8_t>(b), c10::Float8_e4m3fn::from_bits()));
    return t;
  }();
  return table;
}

// buf[kk * ld_buf + j] = W[16 p + j, k0 + kk] (cpu::PanelDecodeFn); rows past N are zeros.
void decode_panels(const void* weight, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf, int64_t ld_buf) {
  const auto& w = *static_cast<const Nvfp4CpuWeight*>(weight);
  const auto& e4m3 = e4m3_values();
  const int64_t groups = w.k / kNvfp4Group, cols = cpu::kPanelWidth * np;
  for (int64_t j = 0; j < cols; ++j) {
    const int64_t n = cpu::kPanelWidth * p + j;
    if (n >= w.n) {
      for (int64_t kk = 0; kk < kc; ++kk) buf[kk * ld_buf + j] = 0.0f;
      continue;
    }
    const uint8_t* codes = w.codes + n * (w.k / 2);
    const uint8_t* scales = w.scales + n * groups;
    const float global = w.global[n];
    float scale = 0.0f;
    for (int64_t kk = 0; kk < kc; ++kk) {
      const int64_t k = k0 + kk;
      if (kk == 0 || k % kNvfp4Group == 0) {
        const float s = e4m3[scales[k / kNvfp4Group]];
        scale = w.divide ? s / global : s * global;
      }
      const uint8_t byte = codes[k / 2];
      buf[kk * ld_buf + j] = kE2m1Values[(k & 1) ? byte >> 4 : byte & 0x0F] * scale;
    }
  }
}

}  // namespace

at::Tensor nvfp4_cpu_linear(const at::Tensor& x, const Nvfp4CpuWeight& w) {
  const cpu::Isa isa = cpu::isa();
  const int64_t panels = (w.n + cpu::kPanelWidth - 1) / cpu::kPanelWidth;
  return cpu::linear_through_f32(x, w.n, w.k, "nvfp4_cpu_linear", [&](const float* x2, int64_t m, float* y) {
    cpu::count_kernel(std::string("nvfp4 panel/") + cpu::to_string(isa));  // the benchmarks' kernel column
    cpu::panel_gemm_parallel(x2, m, w.k, cpu::PanelWeight{w.n, w.k, &decode_panels, &w}, y, w.n, panels, isa);
  });
}

at::Tensor nvfp4_cpu_decode_all(const Nvfp4CpuWeight& w) {
  const int64_t panels = (w.n + cpu::kPanelWidth - 1) / cpu::kPanelWidth;
  return cpu::panel_decode_all(cpu::PanelWeight{w.n, w.k, &decode_panels, &w}, panels, cpu::Isa::kScalar);
}

}  // namespace tp::detail
