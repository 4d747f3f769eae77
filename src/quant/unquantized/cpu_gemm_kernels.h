#pragma once
// The unquantized method's own CPU kernels, one entry point per ISA: plain functions
// over raw pointers (host memory), sizes and strides. Only <cstdint> here, so the
// per-ISA translation units that include it share no inline code with the rest.
//
// Every kernel computes y[i, n] = sum_k x[i, k] * w[n, k] for i in [0, m), n in [n0, n1):
//   x: [m, k] float32, row stride ld_x
//   w: [N, k] float32, or bfloat16 as its raw 16 bits, row stride ld_w
//   y: [m, N] float32, row stride ld_y (columns outside [n0, n1) are not touched)
// in float32 arithmetic: fused multiply-adds along K (dot-product form, so W is read
// in its stored row-major layout and bfloat16 is widened in registers: no converted
// copy), a horizontal sum per output and K block. For m <= 4 one pass streams W once
// (decode: memory-bound); for more rows W is walked in blocks of 32 rows x 512 columns
// that stay in L2 while every group of 4 rows of x passes over them, so W still comes
// from memory once per call.

#include <cstdint>

namespace tp::detail {

void gemv_f32_scalar(const float* x, int64_t m, int64_t k, int64_t ld_x, const float* w, int64_t ld_w, float* y,
                     int64_t ld_y, int64_t n0, int64_t n1);
void gemv_bf16_scalar(const float* x, int64_t m, int64_t k, int64_t ld_x, const uint16_t* w, int64_t ld_w, float* y,
                      int64_t ld_y, int64_t n0, int64_t n1);

void gemv_f32_avx2(const float* x, int64_t m, int64_t k, int64_t ld_x, const float* w, int64_t ld_w, float* y,
                   int64_t ld_y, int64_t n0, int64_t n1);
void gemv_bf16_avx2(const float* x, int64_t m, int64_t k, int64_t ld_x, const uint16_t* w, int64_t ld_w, float* y,
                    int64_t ld_y, int64_t n0, int64_t n1);

void gemv_f32_avx512(const float* x, int64_t m, int64_t k, int64_t ld_x, const float* w, int64_t ld_w, float* y,
                     int64_t ld_y, int64_t n0, int64_t n1);
void gemv_bf16_avx512(const float* x, int64_t m, int64_t k, int64_t ld_x, const uint16_t* w, int64_t ld_w, float* y,
                      int64_t ld_y, int64_t n0, int64_t n1);

/// dst[r, c] = float(src[r, c]) for a rows x cols block of bfloat16 (raw bits): exact,
/// the bits shifted into a float's high half. The bf16_tiles backend's per-tile widening.
void bf16_to_f32_scalar(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst);
void bf16_to_f32_avx2(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst);
void bf16_to_f32_avx512(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst);

}  // namespace tp::detail
