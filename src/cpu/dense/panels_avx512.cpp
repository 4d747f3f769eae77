// The panels backend's chunk kernels, AVX-512 code path: up to 16 rows of x against a
// K block of one 16-column panel of W, float32 or bfloat16 (widened in registers:
// exact), or up to 12 rows against two panels (layouts in cpu/dense/kernels.h). Compiled with
// the AVX-512 flags; entered only when cpu::isa() allows AVX-512.

#include <immintrin.h>

// GCC 12's AVX-512 headers build some zero-extensions from a self-initialised
// "undefined" register, which -Wall flags once they are inlined here: false positives.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cstdint>

#include "cpu/dense/kernels.h"

namespace tp::cpu {

namespace {

constexpr int kStreams = 4;  // interleaved quarters of the K block (cpu/dense/kernels.h)
// Prefetch distance along each stream when the panel comes from memory: 32 lines
// (the hardware prefetcher alone left the reads at ~70 % of the machine's rate).
constexpr int64_t kPrefetchRows = 32;
constexpr int64_t kSumSteps = 128;  // quarter steps (512 k) summed in registers before the tile

// 16 weights of a panel row as floats.
inline __m512 load_w(const float* w) { return _mm512_loadu_ps(w); }
inline __m512 load_w(const uint16_t* w) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w))), 16));
}

// y, where a chunk adds its sums to an earlier K block's (t.accumulate): requested
// into L1 when the chunk starts and read when it ends, so the chunk does not wait on
// it (y is re-read once per K block, from the last-level cache or memory).
inline void prefetch_y(const PanelTask& t, int np) {
  for (int64_t r = 0; r < t.rows; ++r)
    for (int j = 0; j < np; ++j) _mm_prefetch(reinterpret_cast<const char*>(t.y + r * t.ld_y + 16 * j), _MM_HINT_T0);
}
// y = tile (+ y): the chunk's rows x np panels of sums, columns within N only.
inline void store_y(const PanelTask& t, const float* tile, int np) {
  for (int j = 0; j < np; ++j) {
    const int64_t cols = t.cols - 16 * j;
    const auto mask = static_cast<__mmask16>(cols >= 16 ? 0xFFFFu : cols <= 0 ? 0u : (1u << cols) - 1u);
    for (int64_t r = 0; r < t.rows; ++r) {
      float* y = t.y + r * t.ld_y + 16 * j;
      __m512 v = _mm512_load_ps(tile + (r * np + j) * kPanelCols);
      if (t.accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, y));
      _mm512_mask_storeu_ps(y, mask, v);
    }
  }
}

// MR rows of x against NP neighbouring panels (NP x 16 columns of y): MR x NP
// accumulators. One panel (NP = 1, up to 16 rows) makes 16 FMAs per 17 loads; two
// (NP = 2, up to 12 rows) 24 FMAs per 14 loads, for large M, where the weight is in
// cache and one panel's block is bound by loads.
template <int MR, int NP, typename W>
void chunk_panels(const PanelTask& t) {
  const float* x = t.x;
  const W* panel[NP];
  for (int j = 0; j < NP; ++j) panel[j] = static_cast<const W*>(t.panel) + j * t.panel_stride;
  // The running sums, block by block: one long chain of FMAs per output over all of
  // K would lose ~sqrt(K / 512) times more to rounding.
  alignas(64) float tile[MR * NP * kPanelCols];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NP; ++j) _mm512_store_ps(tile + (r * NP + j) * kPanelCols, _mm512_setzero_ps());
  if (t.accumulate) prefetch_y(t, NP);
  __m512 acc[MR][NP];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_setzero_ps();
  const auto step = [&](int64_t kk) {
    __m512 w[NP];
    for (int j = 0; j < NP; ++j) w[j] = load_w(panel[j] + kk * kPanelCols);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 b = _mm512_set1_ps(x[kk * MR + r]);
      for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_fmadd_ps(w[j], b, acc[r][j]);
    }
  };
  const auto flush = [&] {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NP; ++j) {
        float* sums = tile + (r * NP + j) * kPanelCols;
        _mm512_store_ps(sums, _mm512_add_ps(_mm512_load_ps(sums), acc[r][j]));
        acc[r][j] = _mm512_setzero_ps();
      }
  };
  const int64_t q = t.kc / kStreams;
  // The next task's panels (cpu/dense/kernels.h), spread evenly over the quarter steps.
  const char* next = static_cast<const char*>(t.prefetch_next);
  const int64_t next_inc = next && q > 0 ? (t.prefetch_bytes + q - 1) / q : 0;
  const int64_t next_stride = t.panel_stride * static_cast<int64_t>(sizeof(W));
  for (int64_t i0 = 0; i0 < q; i0 += kSumSteps) {
    const int64_t i1 = i0 + kSumSteps < q ? i0 + kSumSteps : q;
    for (int64_t i = i0; i < i1; ++i) {
      if (next) {
        for (int j = 0; j < NP; ++j) _mm_prefetch(next + j * next_stride, _MM_HINT_T1);
        next += next_inc;
      }
#pragma GCC unroll 4
      for (int s = 0; s < kStreams; ++s) {
        const int64_t kk = s * q + i;
        if (t.stream)
          for (int j = 0; j < NP; ++j)
            _mm_prefetch(reinterpret_cast<const char*>(panel[j] + (kk + kPrefetchRows) * kPanelCols), _MM_HINT_T0);
        step(kk);
      }
    }
    flush();
  }
  for (int64_t kk = kStreams * q; kk < t.kc; ++kk) step(kk);
  flush();
  store_y(t, tile, NP);
}

// A float32 chunk of 10-12 rows whose panels are in cache (not its task's first chunk,
// which streams them from memory through chunk_panels' 4 K streams): the assembly
// tile, one call per 512 k (the same partial sums as chunk_panels' flush), while it
// pulls t.prefetch_bytes of the next task's panels into L2, spread over its steps.
void pair_by_tile(const PanelTask& t) {
  const float* panel = static_cast<const float*>(t.panel);
  alignas(64) float tile[kPanelPairRowsAvx512 * 2 * kPanelCols];
  for (int64_t r = 0; r < t.rows; ++r)
    for (int j = 0; j < 2; ++j) _mm512_store_ps(tile + (2 * r + j) * kPanelCols, _mm512_setzero_ps());
  if (t.accumulate) prefetch_y(t, 2);
  PanelTileArgs a;
  a.rows = t.rows;
  a.panel_stride = t.panel_stride;
  a.tile = tile;
  a.prefetch = t.prefetch_next ? static_cast<const char*>(t.prefetch_next) : static_cast<const char*>(t.panel);
  const int64_t iterations = t.kc / 2;
  a.prefetch_inc = t.prefetch_next && iterations > 0 ? (t.prefetch_bytes + iterations - 1) / iterations : 0;
  constexpr int64_t kBlock = kStreams * kSumSteps;
  for (int64_t k0 = 0; k0 < t.kc; k0 += kBlock) {
    a.x = t.x + k0 * t.rows;
    a.w = panel + k0 * kPanelCols;
    a.steps = t.kc - k0 < kBlock ? t.kc - k0 : kBlock;
    panel_pair_tile_f32_avx512(a);
    a.prefetch += a.steps / 2 * a.prefetch_inc;
  }
  store_y(t, tile, 2);
}

template <int MR, typename W>
void chunk_panel(const PanelTask& t) {
  chunk_panels<MR, 1, W>(t);
}
template <int MR, typename W>
void chunk_pair(const PanelTask& t) {
  if constexpr (MR >= 10 && sizeof(W) == sizeof(float)) {
    if (!t.stream) return pair_by_tile(t);
  }
  chunk_panels<MR, 2, W>(t);
}

// By rows - 1. (Plain arrays: std::array's inline members instantiated here with
// AVX-512 flags could be the copy the linker keeps for other files.)
using ChunkFn = void (*)(const PanelTask&);
#define TP_ROWS_16(f, W)                                                                                            \
  {                                                                                                                 \
    &f<1, W>, &f<2, W>, &f<3, W>, &f<4, W>, &f<5, W>, &f<6, W>, &f<7, W>, &f<8, W>, &f<9, W>, &f<10, W>, &f<11, W>, \
        &f<12, W>, &f<13, W>, &f<14, W>, &f<15, W>, &f<16, W>                                                       \
  }
#define TP_ROWS_12(f, W)                                                                                            \
  {                                                                                                                 \
    &f<1, W>, &f<2, W>, &f<3, W>, &f<4, W>, &f<5, W>, &f<6, W>, &f<7, W>, &f<8, W>, &f<9, W>, &f<10, W>, &f<11, W>, \
        &f<12, W>                                                                                                   \
  }
constexpr ChunkFn kChunkF32[kPanelRowsAvx512] = TP_ROWS_16(chunk_panel, float);
constexpr ChunkFn kChunkBf16[kPanelRowsAvx512] = TP_ROWS_16(chunk_panel, uint16_t);
constexpr ChunkFn kPairF32[kPanelPairRowsAvx512] = TP_ROWS_12(chunk_pair, float);
constexpr ChunkFn kPairBf16[kPanelPairRowsAvx512] = TP_ROWS_12(chunk_pair, uint16_t);
#undef TP_ROWS_16
#undef TP_ROWS_12

}  // namespace

void panel_pair_f32_avx512(const PanelTask& t) { kPairF32[t.rows - 1](t); }
void panel_pair_bf16_avx512(const PanelTask& t) { kPairBf16[t.rows - 1](t); }

void panel_chunk_f32_avx512(const PanelTask& t) { kChunkF32[t.rows - 1](t); }
void panel_chunk_bf16_avx512(const PanelTask& t) { kChunkBf16[t.rows - 1](t); }

}  // namespace tp::cpu
