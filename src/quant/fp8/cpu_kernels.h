#pragma once
// Private: the CPU GEMM of the three FP8 formats (fp8.cpp is the only caller).
//
// Why not an ATen op: on the CPUs we run on (x86 without AVX-512 FP16/AMX), the ops
// that take FP8 operands convert element by element through c10::Float8_e4m3fn, and
// are far slower than the float32 GEMM they end in. Measured on the development VM
// (2 shared cores, heavily loaded; 4096 x 11008, torch 2.11), per call:
//                                            M=1       M=16      M=256
//   at::linear float32                      20-74 ms  240-450   0.8-1.7 s
//   at::linear bfloat16                     30-40 ms   43-53    0.28-0.35 s
//   at::_scaled_mm (fp8 x fp8, unit scales)  2300 ms   2900     3.5 s
//   dequantize with .to(float) + at::linear  1390 ms   1700     2.9 s
//   fp8_linear_f32 (this kernel)            84-126 ms  840-1040 1.8-1.9 s
// So every FP8 format takes this path instead: the weight is decoded chunk by chunk
// (~8 MB of float32 rows, in parallel) through a 256-entry table, with its scales
// folded in, and each chunk is multiplied by one BLAS call (at::mm). The weight stays
// FP8 in memory (1 byte per element), and the arithmetic is that of the float64
// reference up to float32 accumulation. At M=1 the decode dominates; at larger M the
// BLAS calls (one per chunk) do, and on a loaded machine every multi-threaded BLAS
// call pays for its OpenMP barriers, which is why chunks are large.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace tp::detail {

/// y = x w_deq^T, where w_deq[n, k] = float(w[n, k]) * scale[n, k / group].
/// x: [M, K] float32 contiguous (activations, already quantized-dequantized);
/// w: [N, K] float8_e4m3fn; scale: [N, ceil(K / group)] float32; group >= 1 (K for a
/// single scale per row). Returns [M, N] float32.
at::Tensor fp8_linear_f32(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, int64_t group);

}  // namespace tp::detail
