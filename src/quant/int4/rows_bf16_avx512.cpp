// INT4's rows kernel for bf16 layers on AVX-512 bf16 dot products (VDPBF16PS), M <=
// kInt4SmallM (cpu_kernels.h: int4_rows_bf16_avx512). Built with the AVX-512 flags
// (avx512_bf16 among them), entered only where the CPU has avx512_bf16.
//
// A code line is 16 words (one per column of a panel), each 8 k of its column, nibble i
// = k 8 b + i. A 16-bit shift by 4 i puts nibble i (low half: k 8 b + i) and nibble 4 + i
// (high half: k 8 b + 4 + i) at the bottom of each half, and VPERMW on a 32-entry table of
// the bf16 values of 0..15 (twice: the bit above the nibble indexes the copy) turns each
// half into its exact code, so each 32-bit lane is a bf16 pair of one column; VDPBF16PS
// multiplies it by x's pair (x[8 b + i], x[8 b + 4 + i]), broadcast. The zero point and the
// scale are applied per group as in the float32 rows kernel: y += scale * (P - zero * X),
// X the float64 group sum of x rounded once. VDPBF16PS reads bf16 subnormals as zero: an x
// below 2^-126 in magnitude counts as 0 in P (not in X), as in cpu/bf16_panel_gemm.h.
//
// Per line (16 columns x 8 k = 128 weights) of one panel at M = 1: 1 load, 3 shifts, 4
// VPERMW, 4 VDPBF16PS, and 4 broadcasts of x shared by the 4 panels in flight (1 each):
// 13 instructions, ~3.25 per 32 weights (the float32 rows kernel: 1 load, 7 ANDs + 1 shift,
// 8 conversions, 8 FMAs, 2 broadcasts: ~27, ~6.75 per 32), for the 16 bytes 32 weights take.

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// "(may be) used uninitialized" (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <cstdint>

#include "cpu/panel_gemm.h"
#include "quant/int4/cpu_kernels.h"

namespace tp::detail {
namespace {

__m512i code_table() {
  alignas(64) static const uint16_t kTable[32] = {0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
                                                  0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170,
                                                  0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
                                                  0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170};
  return _mm512_load_si512(kTable);
}

// NP panels from panel p for M rows of x; SPLIT accumulator chains over the 4 steps of a
// line (VDPBF16PS latency when M * NP is small). `prefetch`: the NP panels after these
// exist; their line b is asked for while line b is used (each panel is a stream of its own).
template <int M, int NP, int SPLIT>
void rows(const uint32_t* xq, int64_t ld_xq, const float* sum_x, int64_t ld_sum, const Int4CpuView& w, float* y,
          int64_t ld_y, int64_t p, int64_t ncols, bool prefetch) {
  const int64_t lines = w.k / 8, groups = w.k / w.group, lines_per_group = w.group / 8;
  const __m512i table = code_table();
  const uint32_t* panel[NP];
#pragma GCC unroll 8
  for (int j = 0; j < NP; ++j) panel[j] = w.codes + (p + j) * lines * cpu::kPanelWidth;
  __m512 out[M][NP];
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) out[r][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[SPLIT][M][NP];
#pragma GCC unroll 8
    for (int s = 0; s < SPLIT; ++s)
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
        for (int j = 0; j < NP; ++j) acc[s][r][j] = _mm512_setzero_ps();
    for (int64_t b = g * lines_per_group; b < (g + 1) * lines_per_group; ++b) {
      __m512i raw[NP];
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) raw[j] = _mm512_loadu_si512(panel[j] + b * cpu::kPanelWidth);
      if (prefetch) {
#pragma GCC unroll 8
        for (int j = 0; j < NP; ++j)
          _mm_prefetch(reinterpret_cast<const char*>(panel[j] + (NP * lines + b) * cpu::kPanelWidth), _MM_HINT_T0);
      }
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        __m512bh q[NP];
#pragma GCC unroll 8
        for (int j = 0; j < NP; ++j)
          q[j] = (__m512bh)_mm512_permutexvar_epi16(i == 0 ? raw[j] : _mm512_srli_epi16(raw[j], 4 * i), table);
#pragma GCC unroll 8
        for (int r = 0; r < M; ++r) {
          const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(xq[r * ld_xq + 4 * b + i]));
#pragma GCC unroll 8
          for (int j = 0; j < NP; ++j) acc[i % SPLIT][r][j] = _mm512_dpbf16_ps(acc[i % SPLIT][r][j], q[j], a);
        }
      }
    }
    // y += scale * (sum q x - zero * sum x).
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) {
      const int64_t meta = ((p + j) * groups + g) * cpu::kPanelWidth;
      const __m512 scale =
          w.scales_f16 ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.scales_f16 + meta)))
                       : _mm512_loadu_ps(w.scales_f32 + meta);
      const __m512 zero =
          _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.zeros + meta))));
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r) {
        __m512 a = acc[0][r][j];
#pragma GCC unroll 4
        for (int s = 1; s < SPLIT; ++s) a = _mm512_add_ps(a, acc[s][r][j]);
        a = _mm512_fnmadd_ps(zero, _mm512_set1_ps(sum_x[r * ld_sum + g]), a);
        out[r][j] = _mm512_fmadd_ps(scale, a, out[r][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) {
      const int64_t left = ncols - 16 * j;
      if (left >= 16) {
        _mm512_storeu_ps(y + r * ld_y + 16 * j, out[r][j]);
      } else if (left > 0) {
        _mm512_mask_storeu_ps(y + r * ld_y + 16 * j, static_cast<__mmask16>((1u << left) - 1u), out[r][j]);
      }
    }
  }
}

using RowsFn = void (*)(const uint32_t*, int64_t, const float*, int64_t, const Int4CpuView&, float*, int64_t, int64_t,
                        int64_t, bool);

// kRows[m][np - 1]: np panels at once, up to kWide[m] (32 zmm: accumulators, codes, table).
constexpr RowsFn kRows[kInt4SmallM + 1][4] = {
    {nullptr, nullptr, nullptr, nullptr},
    {rows<1, 1, 2>, rows<1, 2, 2>, rows<1, 3, 2>, rows<1, 4, 2>},
    {rows<2, 1, 1>, rows<2, 2, 1>, rows<2, 3, 1>, rows<2, 4, 1>},
    {rows<3, 1, 1>, rows<3, 2, 1>, rows<3, 3, 1>, rows<3, 3, 1>},
    {rows<4, 1, 1>, rows<4, 2, 1>, rows<4, 2, 1>, rows<4, 2, 1>},
};
constexpr int kWide[kInt4SmallM + 1] = {1, 4, 4, 3, 2};

}  // namespace

void int4_rows_bf16_avx512(const uint32_t* xq, int64_t m, int64_t ld_xq, const float* sum_x, int64_t ld_sum,
                           const Int4CpuView& w, float* y, int64_t ld_y, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1;) {
    const int np = p1 - p >= kWide[m] ? kWide[m] : static_cast<int>(p1 - p);
    const int64_t first = cpu::kPanelWidth * p, left = w.n - first;
    const int64_t ncols = left < cpu::kPanelWidth * np ? left : cpu::kPanelWidth * np;
    kRows[m][np - 1](xq, ld_xq, sum_x, ld_sum, w, y + first, ld_y, p, ncols, p + 2 * np <= p1);
    p += np;
  }
}

}  // namespace tp::detail
