// AVX2 + FMA microkernel of the panel GEMM (cpu/panel_gemm.h): 6 rows x 16 columns of
// accumulators (12 of the 16 ymm registers), the classic SGEMM register tile.

#include <immintrin.h>

#include "cpu/panel_gemm.h"

// No templates or inline functions shared with other translation units here (no
// std::min, no c10 checks): the linker could keep this file's AVX2 copy of one for
// every caller. Everything local is in the anonymous namespace.

namespace tp::cpu {

namespace {

constexpr int kRows = 6;

// Rows [0, R) of a 16-column tile; xp is one packed block ([kc, kRows]); y holds 16
// valid columns.
template <int R>
void tile(const float* xp, const float* buf, int64_t kc, int64_t ld_buf, float* y, int64_t ld_y, bool accumulate) {
  __m256 c0[R], c1[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    c0[r] = accumulate ? _mm256_loadu_ps(y + r * ld_y) : _mm256_setzero_ps();
    c1[r] = accumulate ? _mm256_loadu_ps(y + r * ld_y + 8) : _mm256_setzero_ps();
  }
#pragma GCC unroll 4
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m256 b0 = _mm256_load_ps(buf + kk * ld_buf);
    const __m256 b1 = _mm256_load_ps(buf + kk * ld_buf + 8);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(xp + kk * kRows + r);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(y + r * ld_y, c0[r]);
    _mm256_storeu_ps(y + r * ld_y + 8, c1[r]);
  }
}

using TileFn = void (*)(const float*, const float*, int64_t, int64_t, float*, int64_t, bool);
constexpr TileFn kTiles[kRows + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

}  // namespace

void panel_microkernel_avx2(const float* xp, int64_t m, int64_t ld_block, const float* buf, int64_t np, int64_t kc,
                            int64_t ld_buf, float* y, int64_t ld_y, int64_t ncols, bool accumulate) {
  // np is 1 here (panel_gemm_panels_per_step); ncols < 16 only in the last panel.
  for (int64_t r0 = 0; r0 < m; r0 += kRows) {
    const int rows = static_cast<int>(m - r0 < kRows ? m - r0 : kRows);
    if (ncols == kPanelWidth) {
      kTiles[rows](xp + (r0 / kRows) * ld_block, buf, kc, ld_buf, y + r0 * ld_y, ld_y, accumulate);
      continue;
    }
    // A partial panel: run on a full 16-column copy and write back the valid columns.
    alignas(32) float part[kRows * kPanelWidth] = {};
    for (int r = 0; r < rows && accumulate; ++r)
      for (int64_t c = 0; c < ncols; ++c) part[r * kPanelWidth + c] = y[(r0 + r) * ld_y + c];
    kTiles[rows](xp + (r0 / kRows) * ld_block, buf, kc, ld_buf, part, kPanelWidth, accumulate);
    for (int r = 0; r < rows; ++r)
      for (int64_t c = 0; c < ncols; ++c) y[(r0 + r) * ld_y + c] = part[r * kPanelWidth + c];
  }
}

}  // namespace tp::cpu
