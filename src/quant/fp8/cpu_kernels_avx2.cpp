// The FP8 kernels (cpu_kernels_body.h) built for AVX2 + FMA + F16C: a ymm holds 8
// floats, so a chunk is 32 codes. Tables by 16 ymm: a 4 x 3 dot-product block (12
// accumulators) and a 6 x 16 large-M tile (12 accumulators, 2 sliver vectors, a
// broadcast), the tile written out by hand below because GCC 12 spills it.

#include "quant/fp8/cpu_kernels_body.h"

namespace tp::detail {
namespace {

constexpr int kLNr = 16;  // the large-M tile's columns: two ymm

// The tile for MR < 6 rows: t[i][j] = sum_p x[i * ldx + p] * b[p * 16 + j] for i < MR
// (rows MR..5 of t get zeros; t 32-byte aligned). The accumulators are named
// variables: GCC 12 keeps an array of them in memory (a store per FMA) here.
template <int MR>
void outer_tile(const float* x, int64_t ldx, const float* b, int64_t kl, float* t) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  const float* x0 = x;
  const float* x1 = x + ldx;
  const float* x2 = x + 2 * ldx;
  const float* x3 = x + 3 * ldx;
  const float* x4 = x + 4 * ldx;
  const float* x5 = x + 5 * ldx;
  // Unrolled by 4 (kl is a multiple of kChunk): fewer loop and address operations on
  // the ports the FMAs use.
#define TP_FP8_OUTER_STEP(q)                                                                 \
  {                                                                                          \
    const __m256 b0 = _mm256_loadu_ps(b + (q)*kLNr), b1 = _mm256_loadu_ps(b + (q)*kLNr + 8); \
    __m256 a = _mm256_broadcast_ss(x0 + (q));                                                \
    c00 = _mm256_fmadd_ps(a, b0, c00);                                                       \
    c01 = _mm256_fmadd_ps(a, b1, c01);                                                       \
    if constexpr (MR > 1) {                                                                  \
      a = _mm256_broadcast_ss(x1 + (q));                                                     \
      c10 = _mm256_fmadd_ps(a, b0, c10);                                                     \
      c11 = _mm256_fmadd_ps(a, b1, c11);                                                     \
    }                                                                                        \
    if constexpr (MR > 2) {                                                                  \
      a = _mm256_broadcast_ss(x2 + (q));                                                     \
      c20 = _mm256_fmadd_ps(a, b0, c20);                                                     \
      c21 = _mm256_fmadd_ps(a, b1, c21);                                                     \
    }                                                                                        \
    if constexpr (MR > 3) {                                                                  \
      a = _mm256_broadcast_ss(x3 + (q));                                                     \
      c30 = _mm256_fmadd_ps(a, b0, c30);                                                     \
      c31 = _mm256_fmadd_ps(a, b1, c31);                                                     \
    }                                                                                        \
    if constexpr (MR > 4) {                                                                  \
      a = _mm256_broadcast_ss(x4 + (q));                                                     \
      c40 = _mm256_fmadd_ps(a, b0, c40);                                                     \
      c41 = _mm256_fmadd_ps(a, b1, c41);                                                     \
    }                                                                                        \
    if constexpr (MR > 5) {                                                                  \
      a = _mm256_broadcast_ss(x5 + (q));                                                     \
      c50 = _mm256_fmadd_ps(a, b0, c50);                                                     \
      c51 = _mm256_fmadd_ps(a, b1, c51);                                                     \
    }                                                                                        \
  }
  for (int64_t p = 0; p < kl; p += 4) {
    TP_FP8_OUTER_STEP(p)
    TP_FP8_OUTER_STEP(p + 1)
    TP_FP8_OUTER_STEP(p + 2)
    TP_FP8_OUTER_STEP(p + 3)
  }
#undef TP_FP8_OUTER_STEP
  _mm256_store_ps(t, c00);
  _mm256_store_ps(t + 8, c01);
  _mm256_store_ps(t + 1 * kLNr, c10);
  _mm256_store_ps(t + 1 * kLNr + 8, c11);
  _mm256_store_ps(t + 2 * kLNr, c20);
  _mm256_store_ps(t + 2 * kLNr + 8, c21);
  _mm256_store_ps(t + 3 * kLNr, c30);
  _mm256_store_ps(t + 3 * kLNr + 8, c31);
  _mm256_store_ps(t + 4 * kLNr, c40);
  _mm256_store_ps(t + 4 * kLNr + 8, c41);
  _mm256_store_ps(t + 5 * kLNr, c50);
  _mm256_store_ps(t + 5 * kLNr + 8, c51);
}

// The full 6 x 16 tile in assembly: GCC 12 spills one of the 12 accumulators (and
// adds moves) when the loop is unrolled, which costs ~6% at M = 256. Accumulators in
// ymm0-11, the two sliver vectors in ymm12-13, the broadcast in ymm14; 4 columns per
// iteration (kl is a multiple of kChunk). Leaves the sums in t[6][16].
void outer_tile_6(const float* x, int64_t ldx, const float* b, int64_t kl, float* t) {
  const float* x3 = x + 3 * ldx;
  int64_t iters = kl / 4;
  const int64_t ld = ldx * static_cast<int64_t>(sizeof(float));
#define TP_STEP(off_b, off_x)                 \
  "vmovups " #off_b                           \
  "(%[b]), %%ymm12\n\t"                       \
  "vmovups " #off_b                           \
  "+32(%[b]), %%ymm13\n\t"                    \
  "vbroadcastss " #off_x                      \
  "(%[x0]), %%ymm14\n\t"                      \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm0\n\t"  \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm1\n\t"  \
  "vbroadcastss " #off_x                      \
  "(%[x0],%[ld],1), %%ymm14\n\t"              \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm2\n\t"  \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm3\n\t"  \
  "vbroadcastss " #off_x                      \
  "(%[x0],%[ld],2), %%ymm14\n\t"              \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm4\n\t"  \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm5\n\t"  \
  "vbroadcastss " #off_x                      \
  "(%[x3]), %%ymm14\n\t"                      \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm6\n\t"  \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm7\n\t"  \
  "vbroadcastss " #off_x                      \
  "(%[x3],%[ld],1), %%ymm14\n\t"              \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm8\n\t"  \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm9\n\t"  \
  "vbroadcastss " #off_x                      \
  "(%[x3],%[ld],2), %%ymm14\n\t"              \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm10\n\t" \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm11\n\t"
  __asm__ volatile(
      "vxorps %%ymm0, %%ymm0, %%ymm0\n\t"
      "vxorps %%ymm1, %%ymm1, %%ymm1\n\t"
      "vxorps %%ymm2, %%ymm2, %%ymm2\n\t"
      "vxorps %%ymm3, %%ymm3, %%ymm3\n\t"
      "vxorps %%ymm4, %%ymm4, %%ymm4\n\t"
      "vxorps %%ymm5, %%ymm5, %%ymm5\n\t"
      "vxorps %%ymm6, %%ymm6, %%ymm6\n\t"
      "vxorps %%ymm7, %%ymm7, %%ymm7\n\t"
      "vxorps %%ymm8, %%ymm8, %%ymm8\n\t"
      "vxorps %%ymm9, %%ymm9, %%ymm9\n\t"
      "vxorps %%ymm10, %%ymm10, %%ymm10\n\t"
      "vxorps %%ymm11, %%ymm11, %%ymm11\n\t"
      "test %[n], %[n]\n\t"
      "jz 2f\n\t"
      "1:\n\t"
      TP_STEP(0, 0)
      TP_STEP(64, 4)
      TP_STEP(128, 8)
      TP_STEP(192, 12)
      "add $256, %[b]\n\t"
      "add $16, %[x0]\n\t"
      "add $16, %[x3]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "2:\n\t"
      "vmovups %%ymm0, 0(%[t])\n\t"
      "vmovups %%ymm1, 32(%[t])\n\t"
      "vmovups %%ymm2, 64(%[t])\n\t"
      "vmovups %%ymm3, 96(%[t])\n\t"
      "vmovups %%ymm4, 128(%[t])\n\t"
      "vmovups %%ymm5, 160(%[t])\n\t"
      "vmovups %%ymm6, 192(%[t])\n\t"
      "vmovups %%ymm7, 224(%[t])\n\t"
      "vmovups %%ymm8, 256(%[t])\n\t"
      "vmovups %%ymm9, 288(%[t])\n\t"
      "vmovups %%ymm10, 320(%[t])\n\t"
      "vmovups %%ymm11, 352(%[t])\n\t"
      : [b] "+r"(b), [x0] "+r"(x), [x3] "+r"(x3), [n] "+r"(iters)
      : [ld] "r"(ld), [t] "r"(t)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
        "xmm13", "xmm14", "cc", "memory");
#undef TP_STEP
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, float*);
constexpr TileFn kTiles[6] = {&outer_tile<1>, &outer_tile<2>, &outer_tile<3>,
                              &outer_tile<4>, &outer_tile<5>, &outer_tile_6};

// This ISA's blocking (cpu_kernels_body.h).
struct Blocking {
  static constexpr cpu::Isa kIsa = cpu::Isa::kAvx2;
  static constexpr int kNr = 3;
  static constexpr int64_t kLargeM = 56;  // from this many x rows on, the outer-product kernel (measured crossover)
  static constexpr int kLMr = 6;
  static constexpr int kLNr = tp::detail::kLNr;
  static constexpr int64_t kLKc = 256;
  static constexpr int64_t kLNc = 48;
  static void tile(const float* x, int64_t ldx, const float* b, int64_t kl, int mr, float* t) {
    kTiles[mr - 1](x, ldx, b, kl, t);
  }
};
static_assert(kChunkOf<Blocking::kIsa> == kFp8ChunkAvx2);

}  // namespace

void fp8_gemm_avx2(const float* xp, int64_t m, int64_t ld_xp, const Fp8WeightView& w, float* y, int64_t ld_y,
                   int64_t n0, int64_t n1) {
  gemm_by_m<Blocking>(xp, m, ld_xp, w, y, ld_y, n0, n1);
}

void fp8_decode_avx2(const uint8_t* codes, int64_t count, float scale, bool nan_codes, float* out) {
  decode<Blocking::kIsa>(codes, count, scale, nan_codes, out);
}

}  // namespace tp::detail
