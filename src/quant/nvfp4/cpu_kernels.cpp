// NVFP4's CPU kernel: the shared panel GEMM (cpu/panel_gemm.h) over weights this file's
// decoder writes as float32, each group's scale computed as the producer computes it (one
// float32 division or product of the E4M3 scale and the row's global scale) and each
// element one float32 product of its E2M1 value and that scale. The decoder is plain C++
// compiled for the baseline, so it serves every ISA's microkernel.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/Float8_e4m3fn.h>

#include <algorithm>
#include <array>

#include "cpu/features.h"
#include "cpu/kernel_counts.h"
#include "cpu/panel_gemm.h"
#include "cpu/parallel.h"
#include "quant/mxfp4/e2m1.h"
#include "quant/nvfp4/nvfp4.h"

namespace tp::detail {

namespace {

// Rows per unit of work handed to a thread (a multiple of the rows kernel's 4).
constexpr int64_t kRowsUnit = 16;

// E4M3 (fn) bytes as float32 (exact).
const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b)
      t[b] = static_cast<float>(c10::Float8_e4m3fn(static_cast<uint8_t>(b), c10::Float8_e4m3fn::from_bits()));
    return t;
  }();
  return table;
}

// A byte's two E2M1 values, element 2i (low nibble) first.
const std::array<std::array<float, 2>, 256>& e2m1_pairs() {
  static const std::array<std::array<float, 2>, 256> table = [] {
    std::array<std::array<float, 2>, 256> t{};
    for (int b = 0; b < 256; ++b) t[b] = {kE2m1Values[b & 0x0F], kE2m1Values[b >> 4]};
    return t;
  }();
  return table;
}

// buf[kk * ld_buf + j] = W[16 p + j, k0 + kk] (cpu::PanelDecodeFn); rows past N are zeros.
// Group by group: one scale each, then two elements per code byte. k0 and kc are even (the
// panel GEMMs cut K in chunks of 256 or 4096, and K is a multiple of 16).
void decode_panels(const void* weight, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf, int64_t ld_buf) {
  const auto& w = *static_cast<const Nvfp4CpuWeight*>(weight);
  const auto& e4m3 = e4m3_values();
  const auto& pairs = e2m1_pairs();
  TORCH_INTERNAL_ASSERT(k0 % 2 == 0 && kc % 2 == 0, "nvfp4 decode_panels: odd K chunk ", k0, " + ", kc);
  const int64_t groups = w.k / kNvfp4Group, cols = cpu::kPanelWidth * np, end = k0 + kc;
  for (int64_t j = 0; j < cols; ++j) {
    const int64_t n = cpu::kPanelWidth * p + j;
    float* out = buf + j - k0 * ld_buf;  // out[k * ld_buf] is element k's place
    if (n >= w.n) {
      for (int64_t k = k0; k < end; ++k) out[k * ld_buf] = 0.0f;
      continue;
    }
    const uint8_t* codes = w.codes + n * (w.k / 2);
    const uint8_t* scales = w.scales + n * groups;
    const float global = w.global[n];
    for (int64_t k = k0; k < end;) {
      const int64_t g = k / kNvfp4Group, stop = std::min(end, (g + 1) * kNvfp4Group);
      const float s = e4m3[scales[g]];
      const float scale = w.divide ? s / global : s * global;
      for (; k < stop; k += 2) {
        const auto& v = pairs[codes[k / 2]];
        out[k * ld_buf] = v[0] * scale;
        out[(k + 1) * ld_buf] = v[1] * scale;
      }
    }
  }
}

}  // namespace

const float* nvfp4_e4m3_table() { return e4m3_values().data(); }

at::Tensor nvfp4_cpu_linear(const at::Tensor& x, const Nvfp4CpuWeight& w) {
  const cpu::Isa isa = cpu::isa();
  // Decode on AVX2 / AVX-512: the rows kernel, threads over N.
  if (isa != cpu::Isa::kScalar && x.dim() == 2 && x.size(0) >= 1 && x.size(0) <= kNvfp4RowsMaxM && x.size(1) == w.k &&
      x.is_contiguous()) {
    return cpu::linear_through_f32(x, w.n, w.k, "nvfp4_cpu_linear", [&](const float* x2, int64_t m, float* y) {
      cpu::count_kernel("nvfp4 rows/avx2");  // the benchmarks' kernel column
      cpu::parallel_rows(w.n, kRowsUnit,
                         [&](int64_t n0, int64_t n1) { nvfp4_rows_f32_avx2(x2, m, w.k, w, y, w.n, n0, n1); });
    });
  }
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
