// The panels backend's chunk kernel, AVX2 code path: up to 6 rows of x against a
// K block of one 16-column panel of W, float32 or bfloat16 (widened in registers:
// exact; layouts in cpu/dense/kernels.h); chunks of 4-6 rows run the assembly tile of
// cpu/dense/panel_tile_avx2.cpp. Compiled with the AVX2 flags; entered only when
// cpu::isa() allows AVX2.

#include <immintrin.h>

#include <cstdint>

#include "cpu/dense/kernels.h"

namespace tp::cpu {

namespace {

constexpr int kStreams = 4;  // interleaved quarters of the K block (cpu/dense/kernels.h)
// Prefetch distance along each stream when the panel comes from memory: 32 lines
// (the hardware prefetcher alone left the reads at ~70 % of the machine's rate).
constexpr int64_t kPrefetchRows = 32;
constexpr int64_t kSumSteps = 128;  // quarter steps (512 k) summed in registers before the tile

// A panel row's 16 weights as floats: columns 0-7 and 8-15. A bfloat16 row is packed
// with the halves interleaved (pack_panels_bf16, AVX2 layout), so one load gives both:
// the low 16 bits of each 32-bit pair are columns 0-7, the high 16 bits columns 8-15,
// and each is a float once moved to the top (shift) or kept there (mask).
inline void load_row(const float* w, __m256& lo, __m256& hi) {
  lo = _mm256_loadu_ps(w);
  hi = _mm256_loadu_ps(w + 8);
}
inline void load_row(const uint16_t* w, __m256& lo, __m256& hi) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  hi = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

template <int MR, typename W>
inline void fma_row(const float* x, const W* w, __m256 (&acc)[MR][2]) {
  __m256 lo, hi;
  load_row(w, lo, hi);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    const __m256 b = _mm256_broadcast_ss(x + r);
    acc[r][0] = _mm256_fmadd_ps(lo, b, acc[r][0]);
    acc[r][1] = _mm256_fmadd_ps(hi, b, acc[r][1]);
  }
}

template <int MR>
inline void add_to(float* tile, __m256 (&acc)[MR][2]) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
    for (int h = 0; h < 2; ++h) {
      float* t = tile + r * kPanelCols + 8 * h;
      _mm256_storeu_ps(t, _mm256_add_ps(_mm256_loadu_ps(t), acc[r][h]));
      acc[r][h] = _mm256_setzero_ps();
    }
}

// The intrinsics kernel's K block: q steps of each of the 4 quarters, summed in acc and
// added into the tile every kSumSteps steps (chunks below 4 rows).
template <int MR, typename W>
inline void chunk_quarters(const float* x, const W* panel, int64_t q, bool stream, const char* next, int64_t next_inc,
                           __m256 (&acc)[MR][2], float* tile) {
  for (int64_t i0 = 0; i0 < q; i0 += kSumSteps) {
    const int64_t i1 = i0 + kSumSteps < q ? i0 + kSumSteps : q;
    for (int64_t i = i0; i < i1; ++i) {
      if (next) {
        _mm_prefetch(next, _MM_HINT_T1);
        next += next_inc;
      }
#pragma GCC unroll 4
      for (int s = 0; s < kStreams; ++s) {
        const int64_t kk = s * q + i;
        if (stream) _mm_prefetch(reinterpret_cast<const char*>(panel + (kk + kPrefetchRows) * kPanelCols), _MM_HINT_T0);
        fma_row<MR, W>(x + kk * MR, panel + kk * kPanelCols, acc);
      }
    }
    add_to<MR>(tile, acc);
  }
}

template <int MR, typename W>
void chunk_panel(const PanelTask& t) {
  const float* x = t.x;
  const W* panel = static_cast<const W*>(t.panel);
  const int64_t kc = t.kc, ld_y = t.ld_y, cols = t.cols;
  float* y = t.y;
  const bool stream = t.stream, accumulate = t.accumulate;
  // The running sums, block by block: one long chain of FMAs per output over all of
  // K would lose ~sqrt(K / 512) times more to rounding.
  alignas(64) float tile[MR * kPanelCols];
  for (int r = 0; r < MR; ++r)
    for (int64_t j = 0; j < kPanelCols; ++j) tile[r * kPanelCols + j] = 0.0f;
  // y, where the chunk adds its sums to an earlier K block's: requested now, read at the
  // end (it is re-read once per K block, from the last-level cache or memory).
  if (accumulate)
    for (int r = 0; r < MR; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(y + r * ld_y), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(y + r * ld_y + kPanelCols - 1), _MM_HINT_T0);
    }
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const int64_t q = kc / kStreams;
  // The next task's panel (cpu/dense/kernels.h), spread evenly over the quarter steps.
  const char* next = static_cast<const char*>(t.prefetch_next);
  const int64_t next_inc = next && q > 0 ? (t.prefetch_bytes + q - 1) / q : 0;
  if constexpr (MR >= 4) {
    // The assembly tile (cpu/dense/panel_tile_avx2.cpp), one block of kSumSteps steps at a time.
    PanelQuarterTileArgs a;
    a.rows = MR;
    a.quarter = q;
    a.tile = tile;
    a.stream = stream;
    a.prefetch = next ? next : reinterpret_cast<const char*>(panel);
    a.prefetch_inc = next_inc;
    for (int64_t i0 = 0; i0 < q; i0 += kSumSteps) {
      a.x = x + i0 * MR;
      a.w = panel + i0 * kPanelCols;
      a.steps = i0 + kSumSteps < q ? kSumSteps : q - i0;
      if constexpr (sizeof(W) == sizeof(float))
        panel_quarter_tile_f32_avx2(a);
      else
        panel_quarter_tile_bf16_avx2(a);
      a.prefetch += a.steps * a.prefetch_inc;
    }
  } else {
    chunk_quarters<MR, W>(x, panel, q, stream, next, next_inc, acc, tile);
  }
  for (int64_t kk = kStreams * q; kk < kc; ++kk) fma_row<MR, W>(x + kk * MR, panel + kk * kPanelCols, acc);
  add_to<MR>(tile, acc);
  for (int r = 0; r < MR; ++r)
    for (int64_t j = 0; j < cols; ++j)
      y[r * ld_y + j] = tile[r * kPanelCols + j] + (accumulate ? y[r * ld_y + j] : 0.0f);
}

// By rows - 1. (Plain arrays: std::array's inline members instantiated here with
// AVX2 flags could be the copy the linker keeps for other files.)
using ChunkFn = void (*)(const PanelTask&);
constexpr ChunkFn kChunkF32[kPanelRowsAvx2] = {&chunk_panel<1, float>, &chunk_panel<2, float>, &chunk_panel<3, float>,
                                               &chunk_panel<4, float>, &chunk_panel<5, float>, &chunk_panel<6, float>};
constexpr ChunkFn kChunkBf16[kPanelRowsAvx2] = {&chunk_panel<1, uint16_t>, &chunk_panel<2, uint16_t>,
                                                &chunk_panel<3, uint16_t>, &chunk_panel<4, uint16_t>,
                                                &chunk_panel<5, uint16_t>, &chunk_panel<6, uint16_t>};

}  // namespace

void panel_chunk_f32_avx2(const PanelTask& t) { kChunkF32[t.rows - 1](t); }
void panel_chunk_bf16_avx2(const PanelTask& t) { kChunkBf16[t.rows - 1](t); }

}  // namespace tp::cpu
