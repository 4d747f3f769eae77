// The panels backend's chunk kernel, AVX2 code path: up to 6 rows of x against a
// K block of one 16-column panel of W (layouts in cpu_gemm_kernels.h). Compiled with
// the AVX2 flags; entered only when cpu_isa() allows AVX2.

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
inline void fma_row(const float* x, const float* w, __m256 (&acc)[MR][2]) {
  const __m256 lo = _mm256_loadu_ps(w), hi = _mm256_loadu_ps(w + 8);
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

template <int MR>
void chunk_panel(const PanelTask& t) {
  const float* x = t.x;
  const float* panel = t.panel;
  const int64_t kc = t.kc, ld_y = t.ld_y, cols = t.cols;
  float* y = t.y;
  const bool stream = t.stream, accumulate = t.accumulate;
  // The running sums, block by block: one long chain of FMAs per output over all of
  // K would lose ~sqrt(K / 512) times more to rounding.
  alignas(64) float tile[MR * kPanelCols];
  for (int r = 0; r < MR; ++r)
    for (int64_t j = 0; j < kPanelCols; ++j) tile[r * kPanelCols + j] = accumulate && j < cols ? y[r * ld_y + j] : 0.0f;
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
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
  for (int r = 0; r < MR; ++r)
    for (int64_t j = 0; j < cols; ++j) y[r * ld_y + j] = tile[r * kPanelCols + j];
}

// By rows - 1. (A plain array: std::array's inline members instantiated here with
// AVX2 flags could be the copy the linker keeps for other files.)
using ChunkFn = void (*)(const PanelTask&);
constexpr ChunkFn kChunk[kPanelRowsAvx2] = {&chunk_panel<1>, &chunk_panel<2>, &chunk_panel<3>,
                                            &chunk_panel<4>, &chunk_panel<5>, &chunk_panel<6>};

}  // namespace

void panel_chunk_f32_avx2(const PanelTask& t) { kChunk[t.rows - 1](t); }

}  // namespace tp::detail
