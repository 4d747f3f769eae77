#pragma once
// Private: tp's CPU kernels for INT4 weight-only GEMM (int4_gptq, int4_awq, and any
// other 4-bit group-wise format once unpacked to codes, scales and zero points).
//
// Semantics (the reference model, tp::dequantize_weight):
//     W[n, k] = (q[n, k] - zero[k / g, n]) * scale[k / g, n],   y = x W^T
// with codes q in 0..15, integer zero points (0..255 stored; GPTQ v1 reaches 16) and
// float scales.
//
// Layout, made once by int4_cpu_pack (the same for every ISA, so tests can run all
// code paths on one packed weight). Output columns are cut into panels of 16
// (cpu::kPanelWidth; N is padded with zero columns to a multiple of 16):
//   codes   u32 [panels, K/8, 16]   word (p, b, j) holds q[16p + j, 8b + i] in bits 4i..4i+3
//                                   (8 consecutive k of one column), so one 64-byte line is
//                                   16 columns x 8 k and a panel's K/8 lines are contiguous
//   scales  f16 [panels, K/g, 16]   when every scale is a finite float16 value (GPTQ and AWQ
//                                   checkpoints store float16), else f32
//   zeros   u8  [panels, K/g, 16]
// Weight bytes per element: 0.5 + 3/g (f16 scales): 0.52 at g = 128.
// Other 4-bit formats repack into the same layout through int4_cpu_pack: signed codes
// c in -8..7 (compressed-tensors pack-quantized) become q = c + 8 with the zero point
// shifted by 8 as well (8 for symmetric), and a channel-wise format is g = K.
//
// Kernels (chosen per call by the dispatcher in cpu_kernels.cpp):
// - M <= kInt4SmallM, bf16 layers on AVX-512 with avx512_bf16 ("int4 rows/avx512_bf16",
//   rows_bf16_avx512.cpp): the same stream and per-group fold, the codes turned into exact
//   bf16 pairs by a shift and a table lookup and multiplied by x's bf16 pairs with
//   VDPBF16PS: ~3.25 instructions per 32 weights instead of ~6.75 (float32 layers never
//   take it).
// - M <= kInt4SmallM, AVX2 / AVX-512 ("rows" kernel): the weight streams once, 8 (AVX2)
//   or 16 (AVX-512) columns per vector. Each nibble is isolated in its 32-bit lane
//   with one AND (for nibble i it becomes q * 16^i, exact in float32) and converted;
//   x is pre-multiplied by 16^-i (exact: a power of two), so the FMA adds exactly
//   q * x. Per group it accumulates a[n] = sum q x, then folds the group's scale and
//   zero point in once: y[n] += scale * (a[n] - zero * sum_k x[k]) (sum x per group in
//   float64, rounded once). So the decoded weight never exists; the products q * x
//   are exact and only the float32 accumulation rounds. While it streams its NP panels
//   it prefetches the same line of the next NP: 4 streams per core alone kept the DRAM
//   reads at ~17 of 37 GB/s.
// - every other M, and the scalar path for all M: the panel GEMM
//   (cpu/panel_gemm.h) with the exact decoder (q - zero) * scale, computed as
//   float32(q) - float32(zero), then * scale: bit for bit tp::dequantize_weight's
//   arithmetic.
// Activations below 2^-98 in magnitude lose bits in the rows kernel's 16^-i
// pre-scaling (gradual underflow): an absolute error of at most 15 * scale * 2^-126
// per term, far below float32 accumulation rounding.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "cpu/features.h"

namespace tp::detail {

/// Largest M the rows kernel takes; above it the panel GEMM runs.
inline constexpr int64_t kInt4SmallM = 4;

/// An INT4 weight repacked for the CPU kernels (layout above).
struct Int4CpuWeight {
  int64_t n = 0, k = 0, group = 0;  // the logical weight [N, K] and its group size g
  int64_t panels = 0;               // ceil(N / 16)
  at::Tensor codes;                 // i32 [panels, K/8, 16] (read as u32)
  at::Tensor scales;                // f16 or f32 [panels, K/g, 16]
  at::Tensor zeros;                 // u8 [panels, K/g, 16]
  /// Bytes the kernels stream per call (codes, scales, zeros).
  int64_t bytes() const;
};

/// Raw pointers into an Int4CpuWeight, what the per-ISA kernels read.
struct Int4CpuView {
  const uint32_t* codes = nullptr;
  const uint16_t* scales_f16 = nullptr;  // exactly one of the two scale pointers is set
  const float* scales_f32 = nullptr;
  const uint8_t* zeros = nullptr;
  int64_t n = 0, k = 0, group = 0, panels = 0;
};
Int4CpuView int4_cpu_view(const Int4CpuWeight& w);

/// Repacks codes q [N, K] (integer, 0..15), scale [K/g, N] (floating) and zero
/// [K/g, N] (integer-valued, 0..255) into the kernel layout. K must be a multiple of
/// `group`, and `group` a multiple of 8; anything else is an error naming the tensor.
Int4CpuWeight int4_cpu_pack(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& zero, int64_t group);

/// One weight from the packs of its consecutive row ranges (in order; each but the last
/// a whole number of panels, cpu::kPanelWidth rows): what int4_cpu_pack of the whole would
/// give, while the unpacked int32 codes exist for one range at a time. Float16 scales
/// only where every part has them.
Int4CpuWeight int4_cpu_concat(std::vector<Int4CpuWeight> parts);

/// y = x W^T. x: [..., K] float32, bfloat16 or float16 on the CPU; y: [..., N] in x's
/// dtype (16-bit x is converted to float32 first, exactly; the output is rounded once).
at::Tensor int4_cpu_linear(const at::Tensor& x, const Int4CpuWeight& w, cpu::Isa isa = cpu::isa());

/// The same over raw float32 buffers: x [m, K] (row stride ld_x), y [m, N] (ld_y).
/// Threads over N with at::parallel_for. `isa` above cpu::max_isa() is an error.
void int4_cpu_linear(const float* x, int64_t m, int64_t ld_x, const Int4CpuWeight& w, float* y, int64_t ld_y,
                     cpu::Isa isa);

/// The decoded float32 weight [N, K] as the panel GEMM's decoder of `isa` writes it
/// (for tests: it must equal tp::dequantize_weight bit for bit).
at::Tensor int4_cpu_decode(const Int4CpuWeight& w, cpu::Isa isa);

// ---- Per-ISA entry points (cpu_kernels.cpp, cpu_kernels_avx2.cpp, cpu_kernels_avx512.cpp)

/// cpu::PanelDecodeFn over an Int4CpuView (`view`): panels [p, p + np), k in [k0, k0 + kc).
void int4_decode_panels_scalar(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                               int64_t ld_buf);
void int4_decode_panels_avx2(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                             int64_t ld_buf);
void int4_decode_panels_avx512(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                               int64_t ld_buf);

/// cpu::Bf16PanelDecodeFn over an Int4CpuView: the codes 0..15 as bf16 pairs, the group's
/// scales and zero points (cpu_kernels_avx512.cpp; the CPU must have avx512_bf16 to run the GEMM).
void int4_bf16_decode_avx512(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, uint32_t* pairs,
                             float* scale, float* zero);
/// The rows kernel for m <= kInt4SmallM rows and panels [p0, p1): xs [m, K] is x
/// pre-scaled by int4_prescale_x (row stride ld_xs), sum_x [m, K/g] the group sums
/// of x (row stride ld_sum); y [m, N] (ld_y), overwritten.
void int4_rows_avx2(const float* xs, int64_t m, int64_t ld_xs, const float* sum_x, int64_t ld_sum, const Int4CpuView& w,
                    float* y, int64_t ld_y, int64_t p0, int64_t p1);
void int4_rows_avx512(const float* xs, int64_t m, int64_t ld_xs, const float* sum_x, int64_t ld_sum,
                      const Int4CpuView& w, float* y, int64_t ld_y, int64_t p0, int64_t p1);

/// The rows kernel of bf16 layers on AVX-512 bf16 dot products (rows_bf16_avx512.cpp; the
/// CPU must have avx512_bf16), for m <= kInt4SmallM: xq [m, K / 2] (row stride ld_xq) is x
/// paired by int4_pair_x_bf16, sum_x as for the rows kernel; y [m, N] (ld_y), overwritten.
void int4_rows_bf16_avx512(const uint32_t* xq, int64_t m, int64_t ld_xq, const float* sum_x, int64_t ld_sum,
                           const Int4CpuView& w, float* y, int64_t ld_y, int64_t p0, int64_t p1);

/// int4_rows_bf16_avx512's inputs from bf16 bits x [m, K] (row stride ld_x): xq[r, 4 b + i] =
/// (x[r, 8 b + i], x[r, 8 b + 4 + i]) in the (low, high) halves (row stride K / 2), and
/// sum_x[r, G] = the float64 sum of x over group G, rounded to float32.
void int4_pair_x_bf16(const uint16_t* x, int64_t m, int64_t ld_x, int64_t k, int64_t group, uint32_t* xq, float* sum_x);

/// The rows kernel's inputs from x [m, K]: xs[r, k] = x[r, k] * 16^-(k % 8) for
/// k % 8 < 7 and x[r, k] for k % 8 = 7 (that nibble is shifted down, not masked);
/// sum_x[r, G] = the float64 sum of x over group G, rounded to float32.
void int4_prescale_x(const float* x, int64_t m, int64_t ld_x, int64_t k, int64_t group, float* xs, float* sum_x);

}  // namespace tp::detail
