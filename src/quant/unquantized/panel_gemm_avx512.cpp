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

// MR rows of x against NP neighbouring panels (NP x 16 columns of y): MR x NP
// accumulators. One panel (NP = 1, up to 16 rows) makes 16 FMAs per 17 loads; two
// (NP = 2, up to 12 rows) 24 FMAs per 14 loads, for large M, where the weight is in
// cache and one panel's block is bound by loads.
template <int MR, int NP, typename W>
void chunk_panels(const PanelTask& t) {
  const float* x = t.x;
  const W* panel[NP];
  __mmask16 mask[NP];  // the columns within N, panel by panel
  for (int j = 0; j < NP; ++j) {
    panel[j] = static_cast<const W*>(t.panel) + j * t.panel_stride;
    const int64_t cols = t.cols - 16 * j;
    mask[j] = static_cast<__mmask16>(cols >= 16 ? 0xFFFFu : cols <= 0 ? 0u : (1u << cols) - 1u);
  }
  // The running sums, block by block: one long chain of FMAs per output over all of
  // K would lose ~sqrt(K / 512) times more to rounding.
  alignas(64) float tile[MR * NP * kPanelCols];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NP; ++j)
      _mm512_store_ps(tile + (r * NP + j) * kPanelCols,
                      t.accumulate ? _mm512_maskz_loadu_ps(mask[j], t.y + r * t.ld_y + 16 * j) : _mm512_setzero_ps());
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
  for (int64_t i0 = 0; i0 < q; i0 += kSumSteps) {
    const int64_t i1 = i0 + kSumSteps < q ? i0 + kSumSteps : q;
    for (int64_t i = i0; i < i1; ++i) {
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
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NP; ++j)
      _mm512_mask_storeu_ps(t.y + r * t.ld_y + 16 * j, mask[j], _mm512_load_ps(tile + (r * NP + j) * kPanelCols));
}

template <int MR, typename W>
void chunk_panel(const PanelTask& t) {
  chunk_panels<MR, 1, W>(t);
}
template <int MR, typename W>
void chunk_pair(const PanelTask& t) {
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

}  // namespace tp::detail
