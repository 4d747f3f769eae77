// The panels backend's chunk kernel, AVX-512 code path: up to 16 rows of x against a
// K block of one 16-column panel of W (layouts in cpu_gemm_kernels.h). Compiled with
// the AVX-512 flags; entered only when cpu_isa() allows AVX-512.

#include <immintrin.h>

#include <cstdint>

#include "quant/unquantized/cpu_gemm_kernels.h"

namespace tp::detail {

namespace {

constexpr int kStreams = 4;  // interleaved quarters of the K block (cpu_gemm_kernels.h)
// Prefetch distance along each stream when the panel comes from memory: 32 lines
// (the hardware prefetcher alone left the reads at ~70 % of the machine's rate).
constexpr int64_t kPrefetchRows = 32;
constexpr int64_t kSumSteps = 128;  // quarter steps (512 k) summed in registers before the tile

template <int MR>
inline void fma_row(const float* x, const float* w, __m512 (&acc)[MR]) {
  const __m512 wv = _mm512_loadu_ps(w);
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

template <int MR>
void chunk_panel(const PanelTask& t) {
  const float* x = t.x;
  const float* panel = t.panel;
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
        fma_row<MR>(x + kk * MR, panel + kk * kPanelCols, acc);
      }
    }
    add_to<MR>(tile, acc);
  }
  for (int64_t kk = kStreams * q; kk < kc; ++kk) fma_row<MR>(x + kk * MR, panel + kk * kPanelCols, acc);
  add_to<MR>(tile, acc);
  for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(y + r * ld_y, mask, _mm512_load_ps(tile + r * kPanelCols));
}

// The same for MR rows against two neighbouring panels (32 columns): 2 x MR
// accumulators, so each broadcast feeds 2 FMAs. For MR = 12: 24 FMAs per 14 loads,
// where one panel's 16 rows make 16 FMAs per 17 loads and are bound by loads once
// the weight is in cache (large M).
template <int MR>
void chunk_pair(const PanelTask& t) {
  const float* x = t.x;
  const float* panel = t.panel;
  const int64_t kc = t.kc, ld_y = t.ld_y, cols = t.cols;
  float* y = t.y;
  const bool stream = t.stream, accumulate = t.accumulate;
  const __mmask16 mask0 = static_cast<__mmask16>(cols >= 16 ? 0xFFFFu : (1u << cols) - 1u);
  const __mmask16 mask1 = static_cast<__mmask16>(cols >= 32 ? 0xFFFFu : cols <= 16 ? 0u : (1u << (cols - 16)) - 1u);
  const float* other = panel + t.panel_stride;
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
    const __m512 w0 = _mm512_loadu_ps(panel + kk * kPanelCols), w1 = _mm512_loadu_ps(other + kk * kPanelCols);
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

// By rows - 1. (A plain array: std::array's inline members instantiated here with
// AVX-512 flags could be the copy the linker keeps for other files.)
using ChunkFn = void (*)(const PanelTask&);
constexpr ChunkFn kChunk[kPanelRowsAvx512] = {&chunk_panel<1>,  &chunk_panel<2>,  &chunk_panel<3>,  &chunk_panel<4>,
                                              &chunk_panel<5>,  &chunk_panel<6>,  &chunk_panel<7>,  &chunk_panel<8>,
                                              &chunk_panel<9>,  &chunk_panel<10>, &chunk_panel<11>, &chunk_panel<12>,
                                              &chunk_panel<13>, &chunk_panel<14>, &chunk_panel<15>, &chunk_panel<16>};

constexpr ChunkFn kPair[kPanelPairRowsAvx512] = {&chunk_pair<1>, &chunk_pair<2>,  &chunk_pair<3>,  &chunk_pair<4>,
                                                 &chunk_pair<5>, &chunk_pair<6>,  &chunk_pair<7>,  &chunk_pair<8>,
                                                 &chunk_pair<9>, &chunk_pair<10>, &chunk_pair<11>, &chunk_pair<12>};

}  // namespace

void panel_pair_f32_avx512(const PanelTask& t) { kPair[t.rows - 1](t); }

void panel_chunk_f32_avx512(const PanelTask& t) { kChunk[t.rows - 1](t); }

}  // namespace tp::detail
