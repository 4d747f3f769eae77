// The dense small-M GEMM and bf16 widening (gemv_body.h) built for AVX2 + FMA + F16C:
// a ymm holds 8 of a row's K; K's tail is finished by scalar FMAs.

#include "cpu/dense/gemv_body.h"

namespace tp::cpu {

void gemv_f32_avx2(const float* x, int64_t m, int64_t k, int64_t ld_x, const float* w, int64_t ld_w, float* y,
                   int64_t ld_y, int64_t n0, int64_t n1) {
  gemv<Isa::kAvx2>(x, m, k, ld_x, w, ld_w, y, ld_y, n0, n1);
}

void gemv_bf16_avx2(const float* x, int64_t m, int64_t k, int64_t ld_x, const uint16_t* w, int64_t ld_w, float* y,
                    int64_t ld_y, int64_t n0, int64_t n1) {
  gemv<Isa::kAvx2>(x, m, k, ld_x, w, ld_w, y, ld_y, n0, n1);
}

void bf16_to_f32_avx2(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst) {
  bf16_to_f32<Isa::kAvx2>(src, rows, cols, ld_src, dst, ld_dst);
}

}  // namespace tp::cpu
