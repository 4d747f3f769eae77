// The panels backend's chunk kernels, AVX-512 code path: up to 16 rows of x against a
// K block of one 16-column panel of W, float32 or bfloat16 (widened in registers:
// exact), or up to 12 rows against two panels (layouts in cpu_gemm_kernels.h). Compiled with
// the AVX-512 flags; entered only when cpu_isa() allows AVX-512.

#include <immintrin.h>

// GCC 12's AVX-512 headers build some zero-extensions from a self-initialised
// "undefined" register, which -Wall flags once they are inlined here: false positives.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cstdint>

#include "quant/unquantized/cpu_gemm_kernels.h"

namespace tp::detail {

namespace {

constexpr int kStreams = 4;  // interleaved quarters of the K block (cpu_gemm_kernels.h)
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

template <int MR, typename W>
inline void fma_row(const float* x, const W* w, __m512 (&acc)[MR]) {
  const __m512 wv = load_w(w);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_fmadd_ps(wv, _mm512_set1_ps(x[r]), acc[r]);
}

template <int MR>
inline void add_to(float* tile, __m512 (&acc)[MR]) {
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    _mm512_storeu_ps(tile + r * kPanelCols, _mm512_add_ps(_mm512_loadu_ps(tile + r * kPanelCols), acc[r]));
    acc[r] = _mm512_setzero_ps();
  }
}

template <int MR, typename W>
void chunk_panel(const PanelTask& t) {
  const float* x = t.x;
  const W* panel = static_cast<const W*>(t.panel);
  const int64_t kc = t.kc, ld_y = t.ld_y, cols = t.cols;
  float* y = t.y;
  const bool stream = t.stream, accumulate = t.accumulate;
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1u);
  // The running sums, block by block: one long chain of FMAs per output over all of
  // K would lose ~sqrt(K / 512) times more to rounding.
  alignas(64) float tile[MR * kPanelCols];
  for (int r = 0; r < MR; ++r)
    _mm512_store_ps(tile + r * kPanelCols,
                    accumulate ? _mm512_maskz_loadu_ps(mask, y + r * ld_y) : _mm512_setzero_ps());
  __m512 acc[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t q = kc / kStreams;
  for (int64_t i0 = 0; i0 < q; i0 += kSumSteps) {
    const int64_t i1 = i0 + kSumSteps < q ? i0 + kSumSteps : q;
    for (int64_t i = i0; i < i1; ++i) {
#pragma GCC unroll 4
      for (int s = 0; s < kStreams; ++s) {
        const int64_t kk = s * q + i;
        if (stream) _mm_prefetch(reinterpret_cast<const char*>(panel + (kk + kPrefetchRows) * kPanelCols), _MM_HINT_T0);
        fma_row<MR, W>(x + kk * MR, panel + kk * kPanelCols, acc);
      }
    }
    add_to<MR>(tile, acc);
  }
  for (int64_t kk = kStreams * q; kk < kc; ++kk) fma_row<MR, W>(x + kk * MR, panel + kk * kPanelCols, acc);
  add_to<MR>(tile, acc);
  for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(y + r * ld_y, mask, _mm512_load_ps(tile + r * kPanelCols));
}

// The same for MR rows against two neighbouring panels (32 columns): 2 x MR
// accumulators, so each broadcast feeds 2 FMAs. For MR = 12: 24 FMAs per 14 loads,
// where one panel's 16 rows make 16 FMAs per 17 loads and are bound by loads once
// the weight is in cache (large M).
template <int MR, typename W>
void chunk_pair(const PanelTask& t) {
  const float* x = t.x;
  const W* panel = static_cast<const W*>(t.panel);
  const int64_t kc = t.kc, ld_y = t.ld_y, cols = t.cols;
  float* y = t.y;
  const bool stream = t.stream, accumulate = t.accumulate;
  const __mmask16 mask0 = static_cast<__mmask16>(cols >= 16 ? 0xFFFFu : (1u << cols) - 1u);
  const __mmask16 mask1 = static_cast<__mmask16>(cols >= 32 ? 0xFFFFu : cols <= 16 ? 0u : (1u << (cols - 16)) - 1u);
  const W* other = panel + t.panel_stride;
  alignas(64) float tile[MR * 2 * kPanelCols];
  for (int r = 0; r < MR; ++r) {
    float* t = tile + r * 2 * kPanelCols;
    _mm512_store_ps(t, accumulate ? _mm512_maskz_loadu_ps(mask0, y + r * ld_y) : _mm512_setzero_ps());
    _mm512_store_ps(t + 16, accumulate ? _mm512_maskz_loadu_ps(mask1, y + r * ld_y + 16) : _mm512_setzero_ps());
  }
  __m512 acc[MR][2];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const auto step = [&](int64_t kk) {
    const __m512 w0 = load_w(panel + kk * kPanelCols), w1 = load_w(other + kk * kPanelCols);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 b = _mm512_set1_ps(x[kk * MR + r]);
      acc[r][0] = _mm512_fmadd_ps(w0, b, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(w1, b, acc[r][1]);
    }
  };
  const auto flush = [&] {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
      for (int h = 0; h < 2; ++h) {
        float* t = tile + r * 2 * kPanelCols + 16 * h;
        _mm512_store_ps(t, _mm512_add_ps(_mm512_load_ps(t), acc[r][h]));
        acc[r][h] = _mm512_setzero_ps();
      }
  };
  const int64_t q = kc / kStreams;
  for (int64_t i0 = 0; i0 < q; i0 += kSumSteps) {
    const int64_t i1 = i0 + kSumSteps < q ? i0 + kSumSteps : q;
    for (int64_t i = i0; i < i1; ++i) {
#pragma GCC unroll 4
      for (int s = 0; s < kStreams; ++s) {
        const int64_t kk = s * q + i;
        if (stream) {
          _mm_prefetch(reinterpret_cast<const char*>(panel + (kk + kPrefetchRows) * kPanelCols), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(other + (kk + kPrefetchRows) * kPanelCols), _MM_HINT_T0);
        }
        step(kk);
      }
    }
    flush();
  }
  for (int64_t kk = kStreams * q; kk < kc; ++kk) step(kk);
  flush();
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(y + r * ld_y, mask0, _mm512_load_ps(tile + r * 2 * kPanelCols));
    _mm512_mask_storeu_ps(y + r * ld_y + 16, mask1, _mm512_load_ps(tile + r * 2 * kPanelCols + 16));
  }
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

}  // namespace tp::detail
