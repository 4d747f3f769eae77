#pragma once
// Private: the CPU GEMM of the three FP8 formats (fp8.cpp is the only caller).
//
// Why not an ATen op: on the CPUs we run on (x86 without AVX-512 FP16/AMX), the ops
// that take FP8 operands convert element by element through c10::Float8_e4m3fn, and
// are far slower than the float32 GEMM they end in. Measured on the development VM
// (2 cores, 4096 x 11008, torch 2.11), per call:
//   at::linear float32                      M=1:   74 ms   M=256: 1.7 s
//   at::_scaled_mm (fp8 x fp8, unit scales) M=1: 2300 ms   M=256: 3.5 s
//   dequantize with .to(float) + at::linear M=1: 1390 ms   M=256: 2.9 s
// So every FP8 format takes one tiled path instead: a few weight rows at a time are
// decoded through a 256-entry table into a float32 tile (with their scales folded
// in) that stays in cache, and multiplied by BLAS (at::mm). The weight stays FP8 in
// memory (1 byte per element), and the arithmetic is exactly that of the float64
// reference up to float32 accumulation.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace tp::detail {

/// y = x w_deq^T, where w_deq[n, k] = float(w[n, k]) * scale[n, k / group].
/// x: [M, K] float32 contiguous (activations, already quantized-dequantized);
/// w: [N, K] float8_e4m3fn; scale: [N, ceil(K / group)] float32; group >= 1 (K for a
/// single scale per row). Returns [M, N] float32.
at::Tensor fp8_linear_f32(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, int64_t group);

}  // namespace tp::detail
