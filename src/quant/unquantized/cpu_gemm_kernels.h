#pragma once
// The unquantized method's own CPU kernels, one entry point per ISA: plain functions
// over raw pointers (host memory), sizes and strides. Only <cstdint> here, so the
// per-ISA translation units that include it share no inline code with the rest.
//
// Every kernel computes y[i, n] = sum_k x[i, k] * w[n, k] for i in [0, m), n in [n0, n1):
//   x: [m, k] float32, row stride ld_x
//   w: [N, k] float32, or bfloat16 as its raw 16 bits, row stride ld_w
//   y: [m, N] float32, row stride ld_y (columns outside [n0, n1) are not touched)
// in float32 arithmetic (fused multiply-adds, a horizontal sum per output). They
// read each weight element once per group of 4 rows of x, so they are meant for small
// m (decode): a memory-bound GEMV.

#include <cstdint>

namespace tp::detail {

void gemv_f32_scalar(const float* x, int64_t m, int64_t k, int64_t ld_x, const float* w, int64_t ld_w, float* y,
                     int64_t ld_y, int64_t n0, int64_t n1);
void gemv_bf16_scalar(const float* x, int64_t m, int64_t k, int64_t ld_x, const uint16_t* w, int64_t ld_w,
                      float* y, int64_t ld_y, int64_t n0, int64_t n1);

void gemv_f32_avx2(const float* x, int64_t m, int64_t k, int64_t ld_x, const float* w, int64_t ld_w, float* y,
                   int64_t ld_y, int64_t n0, int64_t n1);
void gemv_bf16_avx2(const float* x, int64_t m, int64_t k, int64_t ld_x, const uint16_t* w, int64_t ld_w, float* y,
                    int64_t ld_y, int64_t n0, int64_t n1);

void gemv_f32_avx512(const float* x, int64_t m, int64_t k, int64_t ld_x, const float* w, int64_t ld_w, float* y,
                     int64_t ld_y, int64_t n0, int64_t n1);
void gemv_bf16_avx512(const float* x, int64_t m, int64_t k, int64_t ld_x, const uint16_t* w, int64_t ld_w,
                      float* y, int64_t ld_y, int64_t n0, int64_t n1);

}  // namespace tp::detail
