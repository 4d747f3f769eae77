// The panels backend's register tile on AVX2 (cpu/dense/kernels.h,
// panel_quarter_tile_{f32,bf16}_avx2): 4, 5 or 6 rows of x against one 16-column panel
// of float32 or bfloat16, the K block's four interleaved quarters in one loop, as
// hand-written assembly. With 12 accumulators, two weight vectors and a broadcast the
// 6-row tile needs 15 of the 16 ymm registers (bfloat16 reads its mask from memory);
// GCC 12 kept accumulators, the mask and the prefetch addresses on the stack in the
// intrinsics kernel (cpu/dense/panels_avx2.cpp), reloading and storing them every iteration.
// Compiled with the AVX2 flags; nothing but the exported function leaves the anonymous
// namespace (ODR, as in the other *_avx2.cpp files).

#include <immintrin.h>

#include <cstdint>

#include "cpu/dense/kernels.h"

namespace tp::cpu {

namespace {

// clang-format off
// One step of row R in one quarter: broadcast x[R] (4 R bytes into the quarter's x row,
// addressed by X) into register B (two alternate), then two FMAs into accumulators A0
// and A1 against the step's weights ymm12 / ymm13. Row R's accumulators are ymm(2R)
// and ymm(2R + 1).
#define TP_ROW(X, R, A0, A1, B)                              \
  "vbroadcastss 4*" #R X ", %%ymm" #B "\n\t"                 \
  "vfmadd231ps %%ymm12, %%ymm" #B ", %%ymm" #A0 "\n\t"       \
  "vfmadd231ps %%ymm13, %%ymm" #B ", %%ymm" #A1 "\n\t"
#define TP_ROWS_4(X) TP_ROW(X, 0, 0, 1, 14) TP_ROW(X, 1, 2, 3, 15) TP_ROW(X, 2, 4, 5, 14) TP_ROW(X, 3, 6, 7, 15)
#define TP_ROWS_5(X) TP_ROWS_4(X) TP_ROW(X, 4, 8, 9, 14)
#define TP_ROWS_6(X) TP_ROWS_5(X) TP_ROW(X, 5, 10, 11, 15)

// The 16 weights of one panel row (W addresses it) into ymm12 (columns 0-7) and ymm13
// (8-15): float32 as stored; bfloat16 from AVX2's interleaved halves (cpu/dense/kernels.h),
// one load split by a shift and a mask (%[mask]), exact.
#define TP_WEIGHTS_F32(W)                     \
  "vmovups " W ", %%ymm12\n\t"                \
  "vmovups 32" W ", %%ymm13\n\t"
#define TP_WEIGHTS_BF16(W)                    \
  "vmovdqu " W ", %%ymm13\n\t"                \
  "vpslld $16, %%ymm13, %%ymm12\n\t"          \
  "vpand %[mask], %%ymm13, %%ymm13\n\t"

// One step of every quarter: quarter s is s q rows further into the panel (%[wq] bytes
// each) and into x (%[xq] bytes each); the fourth has registers of its own.
#define TP_QUARTERS(MR, WEIGHTS)                                        \
  WEIGHTS("(%[w])") TP_ROWS_##MR("(%[x])")                              \
  WEIGHTS("(%[w],%[wq],1)") TP_ROWS_##MR("(%[x],%[xq],1)")              \
  WEIGHTS("(%[w],%[wq],2)") TP_ROWS_##MR("(%[x],%[xq],2)")              \
  WEIGHTS("(%[w3])") TP_ROWS_##MR("(%[x3])")

// Row R's sums added into the tile's row R (16 floats at %[t] + 64 R bytes).
#define TP_ADD(R, A0, A1)                                     \
  "vaddps 64*" #R "(%[t]), %%ymm" #A0 ", %%ymm" #A0 "\n\t"    \
  "vaddps 64*" #R "+32(%[t]), %%ymm" #A1 ", %%ymm" #A1 "\n\t" \
  "vmovups %%ymm" #A0 ", 64*" #R "(%[t])\n\t"                 \
  "vmovups %%ymm" #A1 ", 64*" #R "+32(%[t])\n\t"
#define TP_ADD_4 TP_ADD(0, 0, 1) TP_ADD(1, 2, 3) TP_ADD(2, 4, 5) TP_ADD(3, 6, 7)
#define TP_ADD_5 TP_ADD_4 TP_ADD(4, 8, 9)
#define TP_ADD_6 TP_ADD_5 TP_ADD(5, 10, 11)

#define TP_ZERO(A) "vxorps %%ymm" #A ", %%ymm" #A ", %%ymm" #A "\n\t"
#define TP_ZERO_ALL                                                                        \
  TP_ZERO(0) TP_ZERO(1) TP_ZERO(2) TP_ZERO(3) TP_ZERO(4) TP_ZERO(5) TP_ZERO(6) TP_ZERO(7)  \
  TP_ZERO(8) TP_ZERO(9) TP_ZERO(10) TP_ZERO(11)

// Ahead along each quarter when the panel comes from memory: 32 rows (D bytes), as the
// intrinsics kernel.
#define TP_STREAM_PREFETCH(D)                   \
  "prefetcht0 " D "(%[w])\n\t"                 \
  "prefetcht0 " D "(%[w],%[wq],1)\n\t"         \
  "prefetcht0 " D "(%[w],%[wq],2)\n\t"         \
  "prefetcht0 " D "(%[w3])\n\t"

// The loop: one step of every quarter per iteration (the weights advance one panel row
// of ROW bytes, x one row of MR floats), each iteration also sending one line at %[pf]
// to L2 (advancing %[pfi] bytes); then the sums are added into the tile.
#define TP_TILE_ASM(MR, WEIGHTS, ROW, STREAM)                                               \
  __asm__ volatile(                                                                         \
      TP_ZERO_ALL                                                                           \
      "test %[n], %[n]\n\t"                                                                 \
      "jz 2f\n\t"                                                                           \
      "1:\n\t"                                                                              \
      STREAM                                                                                \
      "prefetcht1 (%[pf])\n\t"                                                              \
      TP_QUARTERS(MR, WEIGHTS)                                                              \
      "add $" ROW ", %[w]\n\t"                                                              \
      "add $" ROW ", %[w3]\n\t"                                                             \
      "add $4*" #MR ", %[x]\n\t"                                                            \
      "add $4*" #MR ", %[x3]\n\t"                                                           \
      "add %[pfi], %[pf]\n\t"                                                               \
      "dec %[n]\n\t"                                                                        \
      "jnz 1b\n\t"                                                                          \
      "2:\n\t"                                                                              \
      TP_ADD_##MR                                                                           \
      : [x] "+r"(x), [x3] "+r"(x3), [w] "+r"(w), [w3] "+r"(w3), [n] "+r"(steps), [pf] "+r"(pf) \
      : [wq] "r"(wq), [xq] "r"(xq), [pfi] "r"(pf_inc), [t] "r"(tile), [mask] "m"(mask)        \
      : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",     \
        "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15")
// One variant: rows, bfloat16 or not, streaming or not.
#define TP_TILE_VARIANT(MR, BF16, STREAM)                                                      \
  if constexpr (!BF16 && !STREAM) TP_TILE_ASM(MR, TP_WEIGHTS_F32, "64", "");                  \
  if constexpr (!BF16 && STREAM) TP_TILE_ASM(MR, TP_WEIGHTS_F32, "64", TP_STREAM_PREFETCH("2048")); \
  if constexpr (BF16 && !STREAM) TP_TILE_ASM(MR, TP_WEIGHTS_BF16, "32", "");                  \
  if constexpr (BF16 && STREAM) TP_TILE_ASM(MR, TP_WEIGHTS_BF16, "32", TP_STREAM_PREFETCH("1024"));
// clang-format on

template <int MR, bool kBf16, bool kStream>
void tile(const PanelQuarterTileArgs& a) {
  constexpr int64_t kRowBytes = kPanelCols * (kBf16 ? 2 : 4);
  const char* x = reinterpret_cast<const char*>(a.x);
  const char* w = static_cast<const char*>(a.w);
  const int64_t xq = a.quarter * MR * static_cast<int64_t>(sizeof(float)), wq = a.quarter * kRowBytes;
  const char* x3 = x + 3 * xq;
  const char* w3 = w + 3 * wq;
  const char* pf = a.prefetch;
  int64_t steps = a.steps;
  const int64_t pf_inc = a.prefetch_inc;
  float* tile = a.tile;
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));  // bf16: the high halves
  // (The macros paste the row count: literals, not MR.)
  if constexpr (MR == 4) {
    TP_TILE_VARIANT(4, kBf16, kStream)
  } else if constexpr (MR == 5) {
    TP_TILE_VARIANT(5, kBf16, kStream)
  } else {
    TP_TILE_VARIANT(6, kBf16, kStream)
  }
}

template <bool kBf16>
void tile_rows(const PanelQuarterTileArgs& a) {
  // 4, 5 or 6 rows (cpu/dense/kernels.h): the caller keeps the intrinsics for fewer.
  switch (a.rows) {
    case 6: return a.stream ? tile<6, kBf16, true>(a) : tile<6, kBf16, false>(a);
    case 5: return a.stream ? tile<5, kBf16, true>(a) : tile<5, kBf16, false>(a);
    default: return a.stream ? tile<4, kBf16, true>(a) : tile<4, kBf16, false>(a);
  }
}

}  // namespace

void panel_quarter_tile_f32_avx2(const PanelQuarterTileArgs& a) { tile_rows<false>(a); }
void panel_quarter_tile_bf16_avx2(const PanelQuarterTileArgs& a) { tile_rows<true>(a); }

}  // namespace tp::cpu
