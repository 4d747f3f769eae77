// The panels backend's large-M register tile on AVX-512 (cpu/dense/kernels.h,
// panel_pair_tile_f32_avx512): 10, 11 or 12 rows of x against two neighbouring float32
// panels, 24 accumulators, as hand-written assembly. GCC 12 does not keep 24
// accumulators, two weight vectors and the broadcasts in the 32 zmm registers of the
// intrinsics kernel (cpu/dense/panels_avx512.cpp): it hoists all of a step's broadcasts and
// spills accumulators to the stack, so every step reloads and stores some of them.
// Compiled with the AVX-512 flags; nothing but the exported function leaves the
// anonymous namespace (ODR, as in the other *_avx512.cpp files).

#include <immintrin.h>

#include <cstdint>

#include "cpu/dense/kernels.h"

namespace tp::cpu {

namespace {

// clang-format off
// One k step of row R: broadcast x[R] (X bytes past %[x]) into register B (six rotate),
// then two FMAs into accumulators A0 and A1 against the step's weights zmm30 / zmm31.
// Row R's accumulators are zmm(2R) and zmm(2R + 1).
#define TP_ROW(X, R, A0, A1, B)                                   \
  "vbroadcastss " #X "+4*" #R "(%[x]), %%zmm" #B "\n\t"           \
  "vfmadd231ps %%zmm30, %%zmm" #B ", %%zmm" #A0 "\n\t"            \
  "vfmadd231ps %%zmm31, %%zmm" #B ", %%zmm" #A1 "\n\t"
#define TP_ROWS_10(X)                                                                         \
  TP_ROW(X, 0, 0, 1, 24) TP_ROW(X, 1, 2, 3, 25) TP_ROW(X, 2, 4, 5, 26) TP_ROW(X, 3, 6, 7, 27) \
  TP_ROW(X, 4, 8, 9, 28) TP_ROW(X, 5, 10, 11, 29) TP_ROW(X, 6, 12, 13, 24)                    \
  TP_ROW(X, 7, 14, 15, 25) TP_ROW(X, 8, 16, 17, 26) TP_ROW(X, 9, 18, 19, 27)
#define TP_ROWS_11(X) TP_ROWS_10(X) TP_ROW(X, 10, 20, 21, 28)
#define TP_ROWS_12(X) TP_ROWS_11(X) TP_ROW(X, 11, 22, 23, 29)

// The weights of one step: 16 floats of each panel, W bytes past %[w].
#define TP_WEIGHTS(W)                           \
  "vmovups " #W "(%[w]), %%zmm30\n\t"           \
  "vmovups " #W "(%[w],%[ws],1), %%zmm31\n\t"

// Row R's sums added into the tile's row R (32 floats at %[t] + 128 R bytes).
#define TP_ADD(R, A0, A1)                                    \
  "vaddps 128*" #R "(%[t]), %%zmm" #A0 ", %%zmm" #A0 "\n\t"  \
  "vaddps 128*" #R "+64(%[t]), %%zmm" #A1 ", %%zmm" #A1 "\n\t" \
  "vmovups %%zmm" #A0 ", 128*" #R "(%[t])\n\t"               \
  "vmovups %%zmm" #A1 ", 128*" #R "+64(%[t])\n\t"
#define TP_ADD_10                                                                          \
  TP_ADD(0, 0, 1) TP_ADD(1, 2, 3) TP_ADD(2, 4, 5) TP_ADD(3, 6, 7) TP_ADD(4, 8, 9)          \
  TP_ADD(5, 10, 11) TP_ADD(6, 12, 13) TP_ADD(7, 14, 15) TP_ADD(8, 16, 17) TP_ADD(9, 18, 19)
#define TP_ADD_11 TP_ADD_10 TP_ADD(10, 20, 21)
#define TP_ADD_12 TP_ADD_11 TP_ADD(11, 22, 23)

#define TP_ZERO(A) "vpxord %%zmm" #A ", %%zmm" #A ", %%zmm" #A "\n\t"
#define TP_ZERO_ALL                                                                            \
  TP_ZERO(0) TP_ZERO(1) TP_ZERO(2) TP_ZERO(3) TP_ZERO(4) TP_ZERO(5) TP_ZERO(6) TP_ZERO(7)      \
  TP_ZERO(8) TP_ZERO(9) TP_ZERO(10) TP_ZERO(11) TP_ZERO(12) TP_ZERO(13) TP_ZERO(14) TP_ZERO(15) \
  TP_ZERO(16) TP_ZERO(17) TP_ZERO(18) TP_ZERO(19) TP_ZERO(20) TP_ZERO(21) TP_ZERO(22) TP_ZERO(23)

// The loop: two k steps per iteration (x advances 2 MR floats, the weights two rows of
// 64 bytes), each also prefetching one line of each panel of the next task into L2
// (%[pf], advancing %[pfi] bytes); an odd last step after it; then the sums are added
// into the tile.
#define TP_TILE_ASM(MR)                                                                   \
  __asm__ volatile(                                                                       \
      TP_ZERO_ALL                                                                         \
      "test %[n], %[n]\n\t"                                                               \
      "jz 2f\n\t"                                                                         \
      "1:\n\t"                                                                            \
      "prefetcht1 (%[pf])\n\t"                                                            \
      "prefetcht1 (%[pf],%[ws],1)\n\t"                                                    \
      TP_WEIGHTS(0) TP_ROWS_##MR(0)                                                       \
      TP_WEIGHTS(64) TP_ROWS_##MR(4*MR)                                                   \
      "add $128, %[w]\n\t"                                                                \
      "add $8*" #MR ", %[x]\n\t"                                                          \
      "add %[pfi], %[pf]\n\t"                                                             \
      "dec %[n]\n\t"                                                                      \
      "jnz 1b\n\t"                                                                        \
      "2:\n\t"                                                                            \
      "test %[odd], %[odd]\n\t"                                                           \
      "jz 3f\n\t"                                                                         \
      TP_WEIGHTS(0) TP_ROWS_##MR(0)                                                       \
      "3:\n\t"                                                                            \
      TP_ADD_##MR                                                                         \
      : [x] "+r"(x), [w] "+r"(w), [n] "+r"(pairs), [pf] "+r"(pf)                          \
      : [ws] "r"(ws), [odd] "r"(odd), [pfi] "r"(pf_inc), [t] "r"(tile)                    \
      : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",   \
        "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16",    \
        "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25",  \
        "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31")
// clang-format on

template <int MR>
void tile(const PanelTileArgs& a) {
  const float* x = a.x;
  const float* w = a.w;
  const char* pf = a.prefetch;
  int64_t pairs = a.steps / 2;
  const int64_t odd = a.steps % 2, ws = a.panel_stride * static_cast<int64_t>(sizeof(float)), pf_inc = a.prefetch_inc;
  float* tile = a.tile;
  if constexpr (MR == 10) TP_TILE_ASM(10);
  if constexpr (MR == 11) TP_TILE_ASM(11);
  if constexpr (MR == 12) TP_TILE_ASM(12);
}

}  // namespace

void panel_pair_tile_f32_avx512(const PanelTileArgs& a) {
  // 10, 11 or 12 rows (cpu/dense/kernels.h): the caller takes chunk_panels for fewer.
  if (a.rows == 12)
    tile<12>(a);
  else if (a.rows == 11)
    tile<11>(a);
  else
    tile<10>(a);
}

}  // namespace tp::cpu
