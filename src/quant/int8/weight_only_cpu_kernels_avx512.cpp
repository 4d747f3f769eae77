// AVX-512 int8_weight_only kernels (weight_only_cpu_kernels.h): the panel decoder and
// the rows kernel. A zmm holds one panel's 16 columns.
//
// No templates or inline functions shared with other translation units here (no std::
// algorithms, no c10 checks): the linker could keep this file's AVX-512 copy of one
// for every caller. Everything local is in the anonymous namespace.

// GCC 12 warns about _mm512_undefined_ps() inside its own intrinsics (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "common/cpu_panel_gemm.h"
#include "quant/int8/weight_only_cpu_kernels.h"

namespace tp::detail {

namespace {

// 16 codes, sign-extended and converted (exact).
__m512 load16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Rows kernel over NP panels (NP zmm) for M rows; SPLIT accumulator sets alternate
// over k, to hide FMA latency when M * NP is small.
template <int M, int NP, int SPLIT>
void rows(const float* x, int64_t ld_x, const Int8WoCpuView& w, float* y, int64_t ld_y, int64_t p, int64_t ncols) {
  const int8_t* panel[NP];
#pragma GCC unroll 16
  for (int j = 0; j < NP; ++j) panel[j] = w.codes + (p + j) * w.k * kPanelWidth;
  __m512 acc[SPLIT][M][NP];
#pragma GCC unroll 16
  for (int s = 0; s < SPLIT; ++s)
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < NP; ++v) acc[s][r][v] = _mm512_setzero_ps();
  const auto step = [&](int64_t k1, int s) {
    __m512 q[NP];
#pragma GCC unroll 16
    for (int v = 0; v < NP; ++v) q[v] = load16(panel[v] + k1 * kPanelWidth);
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * ld_x + k1]);
#pragma GCC unroll 16
      for (int v = 0; v < NP; ++v) acc[s][r][v] = _mm512_fmadd_ps(q[v], a, acc[s][r][v]);
    }
  };
  int64_t kk = 0;
  for (; kk + SPLIT <= w.k; kk += SPLIT) {
#pragma GCC unroll 16
    for (int s = 0; s < SPLIT; ++s) step(kk + s, s);
  }
  for (; kk < w.k; ++kk) step(kk, 0);
#pragma GCC unroll 16
  for (int r = 0; r < M; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < NP; ++v) {
      __m512 a = acc[0][r][v];
#pragma GCC unroll 16
      for (int s = 1; s < SPLIT; ++s) a = _mm512_add_ps(a, acc[s][r][v]);
      const __m512 out = _mm512_mul_ps(_mm512_loadu_ps(w.scales + (p + v) * kPanelWidth), a);
      const int64_t first = 16 * v, left = ncols - first;
      if (left >= 16) {
        _mm512_storeu_ps(y + r * ld_y + first, out);
      } else if (left > 0) {
        _mm512_mask_storeu_ps(y + r * ld_y + first, static_cast<__mmask16>((1u << left) - 1), out);
      }
    }
  }
}

using RowsFn = void (*)(const float*, int64_t, const Int8WoCpuView&, float*, int64_t, int64_t, int64_t);

// [M][np - 1]: the kernel for M rows over np panels (np up to kWidePanels[M]).
constexpr int kMaxWide = 4;
constexpr RowsFn kRows[kInt8WoSmallM + 1][kMaxWide] = {
    {nullptr, nullptr, nullptr, nullptr},
    {rows<1, 1, 2>, rows<1, 2, 2>, rows<1, 3, 2>, rows<1, 4, 2>},
    {rows<2, 1, 1>, rows<2, 2, 1>, rows<2, 3, 1>, rows<2, 4, 1>},
    {rows<3, 1, 1>, rows<3, 2, 1>, rows<3, 3, 1>, rows<3, 4, 1>},
    {rows<4, 1, 1>, rows<4, 2, 1>, rows<4, 3, 1>, rows<4, 4, 1>},
};
constexpr int kWidePanels[kInt8WoSmallM + 1] = {1, 4, 4, 4, 4};

}  // namespace

void int8_wo_rows_avx512(const float* x, int64_t m, int64_t ld_x, const Int8WoCpuView& w, float* y, int64_t ld_y,
                         int64_t p0, int64_t p1) {
  const int wide = kWidePanels[m];
  for (int64_t p = p0; p < p1;) {
    const int np = p1 - p >= wide ? wide : static_cast<int>(p1 - p);
    const int64_t first = kPanelWidth * p, left = w.n - first;
    const int64_t ncols = left < kPanelWidth * np ? left : kPanelWidth * np;
    kRows[m][np - 1](x, ld_x, w, y + first, ld_y, p, ncols);
    p += np;
  }
}

void int8_wo_decode_panels_avx512(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                                  int64_t ld_buf) {
  const auto& w = *static_cast<const Int8WoCpuView*>(view);
  for (int64_t j = 0; j < np; ++j) {
    const int8_t* panel = w.codes + (p + j) * w.k * kPanelWidth;
    const __m512 s = _mm512_loadu_ps(w.scales + (p + j) * kPanelWidth);
    for (int64_t kk = 0; kk < kc; ++kk) {
      // float32(q) * scale, as tp::dequantize_weight computes it.
      _mm512_storeu_ps(buf + kk * ld_buf + kPanelWidth * j,
                       _mm512_mul_ps(load16(panel + (k0 + kk) * kPanelWidth), s));
    }
  }
}

}  // namespace tp::detail
