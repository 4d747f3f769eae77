// The bf16 dot-product panel GEMM (cpu/bf16_panel_gemm.h), compiled with the AVX-512 flags
// (avx512_bf16 among them) and entered only where the CPU has avx512_bf16.
//
// The register tile: R <= 6 rows of x times NV <= 4 panels (16 columns each), R x NV
// float32 accumulators (24 of the 32 zmm at full size) and NV pair rows of the weight per
// two k; each row's pair of x is one broadcast memory operand of its VDPBF16PS. Per pair
// row: NV loads, R broadcasts, R x NV dot products (each 32 multiply-adds).

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// "(may be) used uninitialized" (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/bf16_panel_gemm.h"

// No templates or inline functions shared with other translation units here (no
// std::min, no c10 checks): the linker could keep this file's AVX-512 copy of one for
// every caller. Everything local is in the anonymous namespace.

namespace tp::cpu {

namespace {

constexpr int kRows = 6;

int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// What the end of a chunk does with a tile's partial sums P (rows r0.., the tile's columns).
struct Epilogue {
  const float* scale = nullptr;  // [16 NV] the chunk's column scales
  const float* zero = nullptr;   // [16 NV] zero points, or nullptr
  const float* x_sum = nullptr;  // row r's chunk sum at x_sum[r * ld_sum] (with zero)
  int64_t ld_sum = 0;
  bool accumulate = false;  // add to y (else overwrite)
  int64_t ncols = 0;        // valid columns of the tile (<= 16 NV)
};

uint32_t pair_at(const uint16_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

template <int R, int NV>
void tile(const uint16_t* x, int64_t ld_x, const uint32_t* b, int64_t pairs, const Epilogue& e, float* y,
          int64_t ld_y) {
  __m512 c[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) c[r][v] = _mm512_setzero_ps();
  for (int64_t q = 0; q < pairs; ++q) {
    __m512bh w[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) w[v] = (__m512bh)_mm512_load_si512(b + q * kBf16PairLd + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair_at(x + r * ld_x + 2 * q)));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, w[v]);
    }
  }
  __m512 s[NV], z[NV];
  __mmask16 mask[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    s[v] = _mm512_loadu_ps(e.scale + 16 * v);
    z[v] = e.zero != nullptr ? _mm512_loadu_ps(e.zero + 16 * v) : _mm512_setzero_ps();
    const int64_t valid = e.ncols - 16 * v;
    mask[v] =
        valid >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>(valid > 0 ? (1u << valid) - 1u : 0u);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m512 xs = _mm512_set1_ps(e.x_sum != nullptr ? e.x_sum[r * e.ld_sum] : 0.0f);
    float* yr = y + r * ld_y;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      __m512 p = c[r][v];
      if (e.zero != nullptr) p = _mm512_fnmadd_ps(z[v], xs, p);
      const __m512 prev = e.accumulate ? _mm512_maskz_loadu_ps(mask[v], yr + 16 * v) : _mm512_setzero_ps();
      _mm512_mask_storeu_ps(yr + 16 * v, mask[v], _mm512_fmadd_ps(p, s[v], prev));
    }
  }
}

using TileFn = void (*)(const uint16_t*, int64_t, const uint32_t*, int64_t, const Epilogue&, float*, int64_t);
constexpr TileFn kTiles[kRows][kBf16PanelsPerStep] = {
    {tile<1, 1>, tile<1, 2>, tile<1, 3>, tile<1, 4>}, {tile<2, 1>, tile<2, 2>, tile<2, 3>, tile<2, 4>},
    {tile<3, 1>, tile<3, 2>, tile<3, 3>, tile<3, 4>}, {tile<4, 1>, tile<4, 2>, tile<4, 3>, tile<4, 4>},
    {tile<5, 1>, tile<5, 2>, tile<5, 3>, tile<5, 4>}, {tile<6, 1>, tile<6, 2>, tile<6, 3>, tile<6, 4>},
};

}  // namespace

void bf16_panel_gemm_range(const uint16_t* x, int64_t ld_x, int64_t m, const float* x_sum, int64_t ld_sum,
                           const Bf16PanelWeight& w, float* y, int64_t ld_y, int64_t p0, int64_t p1) {
  alignas(64) uint32_t pairs[kBf16ChunkK / 2 * kBf16PairLd];
  alignas(64) float scale[kBf16PairLd];
  alignas(64) float zero[kBf16PairLd];
  const int64_t chunk = bf16_panel_chunk(w.k, w.group);
  for (int64_t p = p0; p < p1; p += kBf16PanelsPerStep) {
    const int64_t np = min64(kBf16PanelsPerStep, p1 - p);
    const int64_t c0 = kBf16PanelWidth * p;
    Epilogue e;
    e.scale = scale;
    e.zero = w.zeros ? zero : nullptr;
    e.ld_sum = ld_sum;
    e.ncols = min64(kBf16PanelWidth * np, w.n - c0);
    for (int64_t k0 = 0, ci = 0; k0 < w.k; k0 += chunk, ++ci) {
      const int64_t kc = min64(chunk, w.k - k0);
      w.decode(w.weight, p, np, k0, kc, pairs, scale, zero);
      e.accumulate = k0 > 0;
      const int64_t np_pairs = (kc + 1) / 2;
      for (int64_t r0 = 0; r0 < m; r0 += kRows) {
        const int rows = static_cast<int>(min64(kRows, m - r0));
        Epilogue er = e;
        if (w.zeros) er.x_sum = x_sum + r0 * ld_sum + ci;
        kTiles[rows - 1][np - 1](x + r0 * ld_x + k0, ld_x, pairs, np_pairs, er, y + r0 * ld_y + c0, ld_y);
      }
    }
  }
}

}  // namespace tp::cpu
