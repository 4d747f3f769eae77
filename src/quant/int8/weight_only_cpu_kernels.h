#pragma once
// Private: tp's CPU kernels for int8_weight_only (W8A16): an int8 weight with one
// float scale per output channel, activations in the layer's dtype. (W8A8, which also
// quantizes x, has its own kernels; these files hold only the weight-only path.)
//
// Semantics (the reference model, tp::dequantize_weight):
//     W[n, k] = q[n, k] * scale[n],   y = x W^T,   q in -128..127
//
// Layout: the checkpoint's own weight i8 [N, K] (row n = output channel n), not a
// copy: int8_wo_cpu_pack keeps a reference to it when it is contiguous, so the layer's
// registered weight and the kernels share one buffer (a repacked copy would double
// the memory of an int8 layer). Scales f32 [panels * 16], padded with zeros, where
// panels = ceil(N / 16) (cpu::kPanelWidth).
//
// Kernels (chosen per call by the dispatcher in weight_only_cpu_kernels.cpp):
// - M <= kInt8WoSmallM, AVX2 / AVX-512 ("rows" kernel, dot-product form): a block of
//   weight rows streams once, each 8 (AVX2) or 16 (AVX-512) k sign-extended and
//   converted (exact), multiplied by the same k of every row of x and accumulated per
//   lane in float32; the lanes are summed at the end, then y = scale * sum. The
//   products q * x are exact; only the float32 accumulation and the final product
//   with the scale round.
// - every other M, and the scalar path for all M: the panel GEMM
//   (cpu/panel_gemm.h) with a decoder that transposes 16 rows x 16 k of bytes
//   in registers and writes float32(q) * scale: bit for bit tp::dequantize_weight's
//   arithmetic.

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "cpu/features.h"

namespace tp::detail {

/// Largest M the rows kernel takes; above it the panel GEMM runs.
inline constexpr int64_t kInt8WoSmallM = 4;

/// bf16 layers where AMX is usable, from cpu::kPanelAmxMinM rows: up to this many rows
/// the AMX row-decoded GEMM (cpu/row_decoded_gemm.h: x times the exact codes, the row scale
/// on each output), above it the panel GEMM's bf16 tiles (the weight decoded as
/// code x scale and rounded to bf16). benchmarks/RESULTS.md, 2026-12-03 (evening).
inline constexpr int64_t kInt8WoAmxRowsMaxM = 192;

/// The row decoder of an Int8WoCpuView for the row-decoded GEMMs (cpu/row_decoded_gemm.h's
/// RowDecodeFn), in weight_only_cpu_kernels_avx512.cpp (uses avx512_bf16).
void int8_wo_decode_row_bf16(const void* view, int64_t row, int64_t k0, int64_t kc, uint16_t* out);

/// An int8 weight-only weight as the CPU kernels read it (layout above).
struct Int8WoCpuWeight {
  int64_t n = 0, k = 0;  // the logical weight [N, K]
  int64_t panels = 0;    // ceil(N / 16)
  at::Tensor codes;      // i8 [N, K], contiguous: the caller's tensor itself when it was
  at::Tensor scales;     // f32 [panels * 16]
  /// Bytes the kernels stream per call (codes and scales).
  int64_t bytes() const;
};

/// Raw pointers into an Int8WoCpuWeight, what the per-ISA kernels read.
struct Int8WoCpuView {
  const int8_t* codes = nullptr;
  const float* scales = nullptr;
  int64_t n = 0, k = 0, panels = 0;
};
Int8WoCpuView int8_wo_cpu_view(const Int8WoCpuWeight& w);

/// The kernels' view of q [N, K] (int8; shared, not copied, when contiguous on the
/// CPU) and scale ([N] or [N, 1], floating; converted to float32).
Int8WoCpuWeight int8_wo_cpu_pack(const at::Tensor& q, const at::Tensor& scale);

/// y = x W^T. x: [..., K] float32, bfloat16 or float16 on the CPU; y: [..., N] in x's
/// dtype (16-bit x is converted to float32 first, exactly; the output is rounded once).
at::Tensor int8_wo_cpu_linear(const at::Tensor& x, const Int8WoCpuWeight& w, cpu::Isa isa = cpu::isa());

/// The same over raw float32 buffers: x [m, K] (row stride ld_x), y [m, N] (ld_y).
/// Threads over N with at::parallel_for. `isa` above cpu::max_isa() is an error.
void int8_wo_cpu_linear(const float* x, int64_t m, int64_t ld_x, const Int8WoCpuWeight& w, float* y, int64_t ld_y,
                        cpu::Isa isa);

/// The decoded float32 weight [N, K] as the panel GEMM's decoder of `isa` writes it
/// (for tests: it must equal tp::dequantize_weight bit for bit).
at::Tensor int8_wo_cpu_decode(const Int8WoCpuWeight& w, cpu::Isa isa);

// ---- Per-ISA entry points (weight_only_cpu_kernels{,_avx2,_avx512}.cpp)

/// cpu::PanelDecodeFn over an Int8WoCpuView (`view`): panels [p, p + np), k in [k0, k0 + kc).
void int8_wo_decode_panels_scalar(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                                  int64_t ld_buf);
void int8_wo_decode_panels_avx2(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                                int64_t ld_buf);
void int8_wo_decode_panels_avx512(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                                  int64_t ld_buf);

/// The rows kernel for m <= kInt8WoSmallM rows of x [m, K] (row stride ld_x) and
/// panels [p0, p1); y [m, N] (ld_y), overwritten.
void int8_wo_rows_avx2(const float* x, int64_t m, int64_t ld_x, const Int8WoCpuView& w, float* y, int64_t ld_y,
                       int64_t p0, int64_t p1);
void int8_wo_rows_avx512(const float* x, int64_t m, int64_t ld_x, const Int8WoCpuView& w, float* y, int64_t ld_y,
                         int64_t p0, int64_t p1);

}  // namespace tp::detail
