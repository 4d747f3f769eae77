// AVX-512 microkernel of the panel GEMM (cpu/panel_gemm.h): 8 rows x 32 columns of
// accumulators (16 of the 32 zmm registers) for a pair of panels (8 x 16 for a last
// single one); every x element is a broadcast memory operand of its FMA.

// GCC 12 warns about _mm512_undefined_ps() inside its own intrinsics (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "cpu/panel_gemm.h"

// No templates or inline functions shared with other translation units here (no
// std::min, no c10 checks): the linker could keep this file's AVX-512 copy of one for
// every caller. Everything local is in the anonymous namespace.

namespace tp::cpu {

namespace {

constexpr int kRows = 8;

// Rows [0, R) times NV panels of 16 columns; xp is one packed block ([kc, kRows]); y
// holds 16 NV valid columns.
template <int R, int NV>
void tile(const float* xp, const float* buf, int64_t kc, int64_t ld_buf, float* y, int64_t ld_y, bool accumulate) {
  __m512 c[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) c[r][v] = accumulate ? _mm512_loadu_ps(y + r * ld_y + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t kk = 0; kk < kc; ++kk) {
    __m512 b[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) b[v] = _mm512_load_ps(buf + kk * ld_buf + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(xp[kk * kRows + r]);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_fmadd_ps(a, b[v], c[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(y + r * ld_y + 16 * v, c[r][v]);
}

using TileFn = void (*)(const float*, const float*, int64_t, int64_t, float*, int64_t, bool);
constexpr TileFn kTiles2[kRows + 1] = {nullptr,    tile<1, 2>, tile<2, 2>, tile<3, 2>, tile<4, 2>,
                                       tile<5, 2>, tile<6, 2>, tile<7, 2>, tile<8, 2>};
constexpr TileFn kTiles1[kRows + 1] = {nullptr,    tile<1, 1>, tile<2, 1>, tile<3, 1>, tile<4, 1>,
                                       tile<5, 1>, tile<6, 1>, tile<7, 1>, tile<8, 1>};

}  // namespace

void panel_microkernel_avx512(const float* xp, int64_t m, int64_t ld_block, const float* buf, int64_t np, int64_t kc,
                              int64_t ld_buf, float* y, int64_t ld_y, int64_t ncols, bool accumulate) {
  const int64_t width = kPanelWidth * np;
  for (int64_t r0 = 0; r0 < m; r0 += kRows) {
    const int rows = static_cast<int>(m - r0 < kRows ? m - r0 : kRows);
    const TileFn fn = np == 2 ? kTiles2[rows] : kTiles1[rows];
    const float* block = xp + (r0 / kRows) * ld_block;
    if (ncols == width) {
      fn(block, buf, kc, ld_buf, y + r0 * ld_y, ld_y, accumulate);
      continue;
    }
    // A partial last panel: run on a full-width copy and write back the valid columns.
    alignas(64) float part[kRows * 2 * kPanelWidth] = {};
    for (int r = 0; r < rows && accumulate; ++r)
      for (int64_t c = 0; c < ncols; ++c) part[r * width + c] = y[(r0 + r) * ld_y + c];
    fn(block, buf, kc, ld_buf, part, width, accumulate);
    for (int r = 0; r < rows; ++r)
      for (int64_t c = 0; c < ncols; ++c) y[(r0 + r) * ld_y + c] = part[r * width + c];
  }
}

}  // namespace tp::cpu
