// The register tile of the FP8 GEMM's large-M path on AVX-512 (cpu_kernels.h,
// fp8_outer_tile_avx512): t[i][j] = sum_p x[i * ldx + p] * b[p * 32 + j], 12 x 32, as
// broadcast FMAs over a transposed weight sliver. The full tile is hand-written
// assembly; fewer rows (an M tail) take intrinsics. Compiled with the AVX-512 flags;
// nothing but the exported function leaves the anonymous namespace (ODR, as in
// cpu_kernels_avx512.cpp).

#include <immintrin.h>

#include <cstdint>

#include "quant/fp8/cpu_kernels.h"

namespace tp::detail {

namespace {

// The tile rows past the last x row (an M tail): intrinsics, accumulators in an array
// (spills are acceptable for the one tail tile per call).
template <int MR>
void outer_tail(const float* x, int64_t ldx, const float* b, int64_t kl, float* t) {
  __m512 c[MR][2];
  for (int i = 0; i < MR; ++i) c[i][0] = c[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kl; ++p) {
    const __m512 b0 = _mm512_loadu_ps(b + p * kFp8TileCols), b1 = _mm512_loadu_ps(b + p * kFp8TileCols + 16);
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(x[i * ldx + p]);
      c[i][0] = _mm512_fmadd_ps(a, b0, c[i][0]);
      c[i][1] = _mm512_fmadd_ps(a, b1, c[i][1]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    _mm512_storeu_ps(t + i * kFp8TileCols, c[i][0]);
    _mm512_storeu_ps(t + i * kFp8TileCols + 16, c[i][1]);
  }
}

// The full 12 x 32 tile in assembly (GCC 12's allocation of 24 accumulators in a loop
// is not reliable): accumulators zmm0-23, sliver vectors zmm30-31, broadcasts zmm24-29;
// 4 columns per iteration. Leaves the sums in t[12][32].
void outer_12x32_asm(const float* x, int64_t ldx, const float* b, int64_t kl, float* t) {
  const float* x3 = x + 3 * ldx;
  const float* x6 = x + 6 * ldx;
  const float* x9 = x + 9 * ldx;
  int64_t iters = kl / 4;
  const int64_t ld = ldx * static_cast<int64_t>(sizeof(float));
  __asm__ volatile(
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\t"
      "vpxord %%zmm1, %%zmm1, %%zmm1\n\t"
      "vpxord %%zmm2, %%zmm2, %%zmm2\n\t"
      "vpxord %%zmm3, %%zmm3, %%zmm3\n\t"
      "vpxord %%zmm4, %%zmm4, %%zmm4\n\t"
      "vpxord %%zmm5, %%zmm5, %%zmm5\n\t"
      "vpxord %%zmm6, %%zmm6, %%zmm6\n\t"
      "vpxord %%zmm7, %%zmm7, %%zmm7\n\t"
      "vpxord %%zmm8, %%zmm8, %%zmm8\n\t"
      "vpxord %%zmm9, %%zmm9, %%zmm9\n\t"
      "vpxord %%zmm10, %%zmm10, %%zmm10\n\t"
      "vpxord %%zmm11, %%zmm11, %%zmm11\n\t"
      "vpxord %%zmm12, %%zmm12, %%zmm12\n\t"
      "vpxord %%zmm13, %%zmm13, %%zmm13\n\t"
      "vpxord %%zmm14, %%zmm14, %%zmm14\n\t"
      "vpxord %%zmm15, %%zmm15, %%zmm15\n\t"
      "vpxord %%zmm16, %%zmm16, %%zmm16\n\t"
      "vpxord %%zmm17, %%zmm17, %%zmm17\n\t"
      "vpxord %%zmm18, %%zmm18, %%zmm18\n\t"
      "vpxord %%zmm19, %%zmm19, %%zmm19\n\t"
      "vpxord %%zmm20, %%zmm20, %%zmm20\n\t"
      "vpxord %%zmm21, %%zmm21, %%zmm21\n\t"
      "vpxord %%zmm22, %%zmm22, %%zmm22\n\t"
      "vpxord %%zmm23, %%zmm23, %%zmm23\n\t"
      "test %[n], %[n]\n\t"
      "jz 2f\n\t"
      "1:\n\t"
      "vmovups 0(%[b]), %%zmm30\n\t"
      "vmovups 0+64(%[b]), %%zmm31\n\t"
      "vbroadcastss 0(%[x0]), %%zmm24\n\t"
      "vfmadd231ps %%zmm30, %%zmm24, %%zmm0\n\t"
      "vfmadd231ps %%zmm31, %%zmm24, %%zmm1\n\t"
      "vbroadcastss 0(%[x0],%[ld],1), %%zmm25\n\t"
      "vfmadd231ps %%zmm30, %%zmm25, %%zmm2\n\t"
      "vfmadd231ps %%zmm31, %%zmm25, %%zmm3\n\t"
      "vbroadcastss 0(%[x0],%[ld],2), %%zmm26\n\t"
      "vfmadd231ps %%zmm30, %%zmm26, %%zmm4\n\t"
      "vfmadd231ps %%zmm31, %%zmm26, %%zmm5\n\t"
      "vbroadcastss 0(%[x3]), %%zmm27\n\t"
      "vfmadd231ps %%zmm30, %%zmm27, %%zmm6\n\t"
      "vfmadd231ps %%zmm31, %%zmm27, %%zmm7\n\t"
      "vbroadcastss 0(%[x3],%[ld],1), %%zmm28\n\t"
      "vfmadd231ps %%zmm30, %%zmm28, %%zmm8\n\t"
      "vfmadd231ps %%zmm31, %%zmm28, %%zmm9\n\t"
      "vbroadcastss 0(%[x3],%[ld],2), %%zmm29\n\t"
      "vfmadd231ps %%zmm30, %%zmm29, %%zmm10\n\t"
      "vfmadd231ps %%zmm31, %%zmm29, %%zmm11\n\t"
      "vbroadcastss 0(%[x6]), %%zmm24\n\t"
      "vfmadd231ps %%zmm30, %%zmm24, %%zmm12\n\t"
      "vfmadd231ps %%zmm31, %%zmm24, %%zmm13\n\t"
      "vbroadcastss 0(%[x6],%[ld],1), %%zmm25\n\t"
      "vfmadd231ps %%zmm30, %%zmm25, %%zmm14\n\t"
      "vfmadd231ps %%zmm31, %%zmm25, %%zmm15\n\t"
      "vbroadcastss 0(%[x6],%[ld],2), %%zmm26\n\t"
      "vfmadd231ps %%zmm30, %%zmm26, %%zmm16\n\t"
      "vfmadd231ps %%zmm31, %%zmm26, %%zmm17\n\t"
      "vbroadcastss 0(%[x9]), %%zmm27\n\t"
      "vfmadd231ps %%zmm30, %%zmm27, %%zmm18\n\t"
      "vfmadd231ps %%zmm31, %%zmm27, %%zmm19\n\t"
      "vbroadcastss 0(%[x9],%[ld],1), %%zmm28\n\t"
      "vfmadd231ps %%zmm30, %%zmm28, %%zmm20\n\t"
      "vfmadd231ps %%zmm31, %%zmm28, %%zmm21\n\t"
      "vbroadcastss 0(%[x9],%[ld],2), %%zmm29\n\t"
      "vfmadd231ps %%zmm30, %%zmm29, %%zmm22\n\t"
      "vfmadd231ps %%zmm31, %%zmm29, %%zmm23\n\t"
      "vmovups 128(%[b]), %%zmm30\n\t"
      "vmovups 128+64(%[b]), %%zmm31\n\t"
      "vbroadcastss 4(%[x0]), %%zmm24\n\t"
      "vfmadd231ps %%zmm30, %%zmm24, %%zmm0\n\t"
      "vfmadd231ps %%zmm31, %%zmm24, %%zmm1\n\t"
      "vbroadcastss 4(%[x0],%[ld],1), %%zmm25\n\t"
      "vfmadd231ps %%zmm30, %%zmm25, %%zmm2\n\t"
      "vfmadd231ps %%zmm31, %%zmm25, %%zmm3\n\t"
      "vbroadcastss 4(%[x0],%[ld],2), %%zmm26\n\t"
      "vfmadd231ps %%zmm30, %%zmm26, %%zmm4\n\t"
      "vfmadd231ps %%zmm31, %%zmm26, %%zmm5\n\t"
      "vbroadcastss 4(%[x3]), %%zmm27\n\t"
      "vfmadd231ps %%zmm30, %%zmm27, %%zmm6\n\t"
      "vfmadd231ps %%zmm31, %%zmm27, %%zmm7\n\t"
      "vbroadcastss 4(%[x3],%[ld],1), %%zmm28\n\t"
      "vfmadd231ps %%zmm30, %%zmm28, %%zmm8\n\t"
      "vfmadd231ps %%zmm31, %%zmm28, %%zmm9\n\t"
      "vbroadcastss 4(%[x3],%[ld],2), %%zmm29\n\t"
      "vfmadd231ps %%zmm30, %%zmm29, %%zmm10\n\t"
      "vfmadd231ps %%zmm31, %%zmm29, %%zmm11\n\t"
      "vbroadcastss 4(%[x6]), %%zmm24\n\t"
      "vfmadd231ps %%zmm30, %%zmm24, %%zmm12\n\t"
      "vfmadd231ps %%zmm31, %%zmm24, %%zmm13\n\t"
      "vbroadcastss 4(%[x6],%[ld],1), %%zmm25\n\t"
      "vfmadd231ps %%zmm30, %%zmm25, %%zmm14\n\t"
      "vfmadd231ps %%zmm31, %%zmm25, %%zmm15\n\t"
      "vbroadcastss 4(%[x6],%[ld],2), %%zmm26\n\t"
      "vfmadd231ps %%zmm30, %%zmm26, %%zmm16\n\t"
      "vfmadd231ps %%zmm31, %%zmm26, %%zmm17\n\t"
      "vbroadcastss 4(%[x9]), %%zmm27\n\t"
      "vfmadd231ps %%zmm30, %%zmm27, %%zmm18\n\t"
      "vfmadd231ps %%zmm31, %%zmm27, %%zmm19\n\t"
      "vbroadcastss 4(%[x9],%[ld],1), %%zmm28\n\t"
      "vfmadd231ps %%zmm30, %%zmm28, %%zmm20\n\t"
      "vfmadd231ps %%zmm31, %%zmm28, %%zmm21\n\t"
      "vbroadcastss 4(%[x9],%[ld],2), %%zmm29\n\t"
      "vfmadd231ps %%zmm30, %%zmm29, %%zmm22\n\t"
      "vfmadd231ps %%zmm31, %%zmm29, %%zmm23\n\t"
      "vmovups 256(%[b]), %%zmm30\n\t"
      "vmovups 256+64(%[b]), %%zmm31\n\t"
      "vbroadcastss 8(%[x0]), %%zmm24\n\t"
      "vfmadd231ps %%zmm30, %%zmm24, %%zmm0\n\t"
      "vfmadd231ps %%zmm31, %%zmm24, %%zmm1\n\t"
      "vbroadcastss 8(%[x0],%[ld],1), %%zmm25\n\t"
      "vfmadd231ps %%zmm30, %%zmm25, %%zmm2\n\t"
      "vfmadd231ps %%zmm31, %%zmm25, %%zmm3\n\t"
      "vbroadcastss 8(%[x0],%[ld],2), %%zmm26\n\t"
      "vfmadd231ps %%zmm30, %%zmm26, %%zmm4\n\t"
      "vfmadd231ps %%zmm31, %%zmm26, %%zmm5\n\t"
      "vbroadcastss 8(%[x3]), %%zmm27\n\t"
      "vfmadd231ps %%zmm30, %%zmm27, %%zmm6\n\t"
      "vfmadd231ps %%zmm31, %%zmm27, %%zmm7\n\t"
      "vbroadcastss 8(%[x3],%[ld],1), %%zmm28\n\t"
      "vfmadd231ps %%zmm30, %%zmm28, %%zmm8\n\t"
      "vfmadd231ps %%zmm31, %%zmm28, %%zmm9\n\t"
      "vbroadcastss 8(%[x3],%[ld],2), %%zmm29\n\t"
      "vfmadd231ps %%zmm30, %%zmm29, %%zmm10\n\t"
      "vfmadd231ps %%zmm31, %%zmm29, %%zmm11\n\t"
      "vbroadcastss 8(%[x6]), %%zmm24\n\t"
      "vfmadd231ps %%zmm30, %%zmm24, %%zmm12\n\t"
      "vfmadd231ps %%zmm31, %%zmm24, %%zmm13\n\t"
      "vbroadcastss 8(%[x6],%[ld],1), %%zmm25\n\t"
      "vfmadd231ps %%zmm30, %%zmm25, %%zmm14\n\t"
      "vfmadd231ps %%zmm31, %%zmm25, %%zmm15\n\t"
      "vbroadcastss 8(%[x6],%[ld],2), %%zmm26\n\t"
      "vfmadd231ps %%zmm30, %%zmm26, %%zmm16\n\t"
      "vfmadd231ps %%zmm31, %%zmm26, %%zmm17\n\t"
      "vbroadcastss 8(%[x9]), %%zmm27\n\t"
      "vfmadd231ps %%zmm30, %%zmm27, %%zmm18\n\t"
      "vfmadd231ps %%zmm31, %%zmm27, %%zmm19\n\t"
      "vbroadcastss 8(%[x9],%[ld],1), %%zmm28\n\t"
      "vfmadd231ps %%zmm30, %%zmm28, %%zmm20\n\t"
      "vfmadd231ps %%zmm31, %%zmm28, %%zmm21\n\t"
      "vbroadcastss 8(%[x9],%[ld],2), %%zmm29\n\t"
      "vfmadd231ps %%zmm30, %%zmm29, %%zmm22\n\t"
      "vfmadd231ps %%zmm31, %%zmm29, %%zmm23\n\t"
      "vmovups 384(%[b]), %%zmm30\n\t"
      "vmovups 384+64(%[b]), %%zmm31\n\t"
      "vbroadcastss 12(%[x0]), %%zmm24\n\t"
      "vfmadd231ps %%zmm30, %%zmm24, %%zmm0\n\t"
      "vfmadd231ps %%zmm31, %%zmm24, %%zmm1\n\t"
      "vbroadcastss 12(%[x0],%[ld],1), %%zmm25\n\t"
      "vfmadd231ps %%zmm30, %%zmm25, %%zmm2\n\t"
      "vfmadd231ps %%zmm31, %%zmm25, %%zmm3\n\t"
      "vbroadcastss 12(%[x0],%[ld],2), %%zmm26\n\t"
      "vfmadd231ps %%zmm30, %%zmm26, %%zmm4\n\t"
      "vfmadd231ps %%zmm31, %%zmm26, %%zmm5\n\t"
      "vbroadcastss 12(%[x3]), %%zmm27\n\t"
      "vfmadd231ps %%zmm30, %%zmm27, %%zmm6\n\t"
      "vfmadd231ps %%zmm31, %%zmm27, %%zmm7\n\t"
      "vbroadcastss 12(%[x3],%[ld],1), %%zmm28\n\t"
      "vfmadd231ps %%zmm30, %%zmm28, %%zmm8\n\t"
      "vfmadd231ps %%zmm31, %%zmm28, %%zmm9\n\t"
      "vbroadcastss 12(%[x3],%[ld],2), %%zmm29\n\t"
      "vfmadd231ps %%zmm30, %%zmm29, %%zmm10\n\t"
      "vfmadd231ps %%zmm31, %%zmm29, %%zmm11\n\t"
      "vbroadcastss 12(%[x6]), %%zmm24\n\t"
      "vfmadd231ps %%zmm30, %%zmm24, %%zmm12\n\t"
      "vfmadd231ps %%zmm31, %%zmm24, %%zmm13\n\t"
      "vbroadcastss 12(%[x6],%[ld],1), %%zmm25\n\t"
      "vfmadd231ps %%zmm30, %%zmm25, %%zmm14\n\t"
      "vfmadd231ps %%zmm31, %%zmm25, %%zmm15\n\t"
      "vbroadcastss 12(%[x6],%[ld],2), %%zmm26\n\t"
      "vfmadd231ps %%zmm30, %%zmm26, %%zmm16\n\t"
      "vfmadd231ps %%zmm31, %%zmm26, %%zmm17\n\t"
      "vbroadcastss 12(%[x9]), %%zmm27\n\t"
      "vfmadd231ps %%zmm30, %%zmm27, %%zmm18\n\t"
      "vfmadd231ps %%zmm31, %%zmm27, %%zmm19\n\t"
      "vbroadcastss 12(%[x9],%[ld],1), %%zmm28\n\t"
      "vfmadd231ps %%zmm30, %%zmm28, %%zmm20\n\t"
      "vfmadd231ps %%zmm31, %%zmm28, %%zmm21\n\t"
      "vbroadcastss 12(%[x9],%[ld],2), %%zmm29\n\t"
      "vfmadd231ps %%zmm30, %%zmm29, %%zmm22\n\t"
      "vfmadd231ps %%zmm31, %%zmm29, %%zmm23\n\t"
      "add $512, %[b]\n\t"
      "add $16, %[x0]\n\t"
      "add $16, %[x3]\n\t"
      "add $16, %[x6]\n\t"
      "add $16, %[x9]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "2:\n\t"
      "vmovups %%zmm0, 0(%[t])\n\t"
      "vmovups %%zmm1, 64(%[t])\n\t"
      "vmovups %%zmm2, 128(%[t])\n\t"
      "vmovups %%zmm3, 192(%[t])\n\t"
      "vmovups %%zmm4, 256(%[t])\n\t"
      "vmovups %%zmm5, 320(%[t])\n\t"
      "vmovups %%zmm6, 384(%[t])\n\t"
      "vmovups %%zmm7, 448(%[t])\n\t"
      "vmovups %%zmm8, 512(%[t])\n\t"
      "vmovups %%zmm9, 576(%[t])\n\t"
      "vmovups %%zmm10, 640(%[t])\n\t"
      "vmovups %%zmm11, 704(%[t])\n\t"
      "vmovups %%zmm12, 768(%[t])\n\t"
      "vmovups %%zmm13, 832(%[t])\n\t"
      "vmovups %%zmm14, 896(%[t])\n\t"
      "vmovups %%zmm15, 960(%[t])\n\t"
      "vmovups %%zmm16, 1024(%[t])\n\t"
      "vmovups %%zmm17, 1088(%[t])\n\t"
      "vmovups %%zmm18, 1152(%[t])\n\t"
      "vmovups %%zmm19, 1216(%[t])\n\t"
      "vmovups %%zmm20, 1280(%[t])\n\t"
      "vmovups %%zmm21, 1344(%[t])\n\t"
      "vmovups %%zmm22, 1408(%[t])\n\t"
      "vmovups %%zmm23, 1472(%[t])\n\t"
      : [b] "+r"(b), [x0] "+r"(x), [x3] "+r"(x3), [x6] "+r"(x6), [x9] "+r"(x9), [n] "+r"(iters)
      : [ld] "r"(ld), [t] "r"(t)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
        "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24",
        "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "cc", "memory");
}

using OuterTileFn = void (*)(const float*, int64_t, const float*, int64_t, float*);
constexpr OuterTileFn kOuterTail[kFp8TileRows] = {&outer_tail<1>, &outer_tail<2>,  &outer_tail<3>,  &outer_tail<4>,
                                                  &outer_tail<5>, &outer_tail<6>,  &outer_tail<7>,  &outer_tail<8>,
                                                  &outer_tail<9>, &outer_tail<10>, &outer_tail<11>, &outer_12x32_asm};

}  // namespace

void fp8_outer_tile_avx512(const float* x, int64_t ldx, const float* b, int64_t kl, int mr, float* t) {
  kOuterTail[mr - 1](x, ldx, b, kl, t);
}

}  // namespace tp::detail
