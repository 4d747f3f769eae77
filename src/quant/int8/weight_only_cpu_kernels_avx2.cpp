// AVX2 + FMA int8_weight_only kernels (weight_only_cpu_kernels.h): the panel decoder
// and the rows kernel. A ymm holds 8 of a panel's 16 columns.
//
// No templates or inline functions shared with other translation units here (no std::
// algorithms, no c10 checks): the linker could keep this file's AVX2 copy of one for
// every caller. Everything local is in the anonymous namespace.

#include <immintrin.h>

#include "common/cpu_panel_gemm.h"
#include "quant/int8/weight_only_cpu_kernels.h"

namespace tp::detail {

namespace {

// 8 codes, sign-extended and converted (exact).
__m256 load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Rows kernel over NP panels (2 NP ymm) for M rows; SPLIT accumulator sets alternate
// over k, to hide FMA latency when M is small.
template <int M, int NP, int SPLIT>
void rows(const float* x, int64_t ld_x, const Int8WoCpuView& w, float* y, int64_t ld_y, int64_t p, int64_t ncols) {
  constexpr int V = 2 * NP;
  const int8_t* panel[NP];
#pragma GCC unroll 16
  for (int j = 0; j < NP; ++j) panel[j] = w.codes + (p + j) * w.k * kPanelWidth;
  __m256 acc[SPLIT][M][V];
#pragma GCC unroll 16
  for (int s = 0; s < SPLIT; ++s)
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) acc[s][r][v] = _mm256_setzero_ps();
  // K is any size: SPLIT k at a time, then the rest one by one.
  int64_t kk = 0;
  const auto step = [&](int64_t k1, int s) {
    __m256 q[V];
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) q[v] = load8(panel[v / 2] + k1 * kPanelWidth + 8 * (v % 2));
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * ld_x + k1);
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) acc[s][r][v] = _mm256_fmadd_ps(q[v], a, acc[s][r][v]);
    }
  };
  for (; kk + SPLIT <= w.k; kk += SPLIT) {
#pragma GCC unroll 16
    for (int s = 0; s < SPLIT; ++s) step(kk + s, s);
  }
  for (; kk < w.k; ++kk) step(kk, 0);
#pragma GCC unroll 16
  for (int r = 0; r < M; ++r) {
    alignas(32) float part[16 * NP];
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      __m256 a = acc[0][r][v];
#pragma GCC unroll 16
      for (int s = 1; s < SPLIT; ++s) a = _mm256_add_ps(a, acc[s][r][v]);
      const __m256 out = _mm256_mul_ps(_mm256_loadu_ps(w.scales + (p + v / 2) * kPanelWidth + 8 * (v % 2)), a);
      if (ncols == 16 * NP) {
        _mm256_storeu_ps(y + r * ld_y + 8 * v, out);
      } else {
        _mm256_store_ps(part + 8 * v, out);
      }
    }
    if (ncols != 16 * NP)
      for (int64_t c = 0; c < ncols; ++c) y[r * ld_y + c] = part[c];
  }
}

using RowsFn = void (*)(const float*, int64_t, const Int8WoCpuView&, float*, int64_t, int64_t, int64_t);

// [M][np - 1]: the kernel for M rows over np panels (np up to kWidePanels[M]).
constexpr RowsFn kRows[kInt8WoSmallM + 1][2] = {
    {nullptr, nullptr},
    {rows<1, 1, 2>, rows<1, 2, 2>},
    {rows<2, 1, 1>, rows<2, 2, 1>},
    {rows<3, 1, 1>, rows<3, 1, 1>},
    {rows<4, 1, 1>, rows<4, 1, 1>},
};
constexpr int kWidePanels[kInt8WoSmallM + 1] = {1, 2, 2, 1, 1};

}  // namespace

void int8_wo_rows_avx2(const float* x, int64_t m, int64_t ld_x, const Int8WoCpuView& w, float* y, int64_t ld_y,
                       int64_t p0, int64_t p1) {
  const int wide = kWidePanels[m];
  for (int64_t p = p0; p < p1;) {
    const int np = p1 - p >= wide ? wide : 1;
    const int64_t first = kPanelWidth * p, left = w.n - first;
    const int64_t ncols = left < kPanelWidth * np ? left : kPanelWidth * np;
    kRows[m][np - 1](x, ld_x, w, y + first, ld_y, p, ncols);
    p += np;
  }
}

void int8_wo_decode_panels_avx2(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                                int64_t ld_buf) {
  const auto& w = *static_cast<const Int8WoCpuView*>(view);
  for (int64_t j = 0; j < np; ++j) {
    const int8_t* panel = w.codes + (p + j) * w.k * kPanelWidth;
    const __m256 s0 = _mm256_loadu_ps(w.scales + (p + j) * kPanelWidth);
    const __m256 s1 = _mm256_loadu_ps(w.scales + (p + j) * kPanelWidth + 8);
    for (int64_t kk = 0; kk < kc; ++kk) {
      const int8_t* line = panel + (k0 + kk) * kPanelWidth;
      float* out = buf + kk * ld_buf + kPanelWidth * j;
      // float32(q) * scale, as tp::dequantize_weight computes it.
      _mm256_storeu_ps(out, _mm256_mul_ps(load8(line), s0));
      _mm256_storeu_ps(out + 8, _mm256_mul_ps(load8(line + 8), s1));
    }
  }
}

}  // namespace tp::detail
