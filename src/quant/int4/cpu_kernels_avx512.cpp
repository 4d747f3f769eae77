// AVX-512 INT4 kernels (cpu_kernels.h): the panel decoder and the rows kernel. A zmm
// holds one panel's 16 columns: one 64-byte code line is 8 k of a panel.
//
// No templates or inline functions shared with other translation units here (no std::
// algorithms, no c10 checks): the linker could keep this file's AVX-512 copy of one
// for every caller. Everything local is in the anonymous namespace.

// GCC 12 warns about _mm512_undefined_ps() inside its own intrinsics (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "cpu/panel_gemm.h"
#include "quant/int4/cpu_kernels.h"

namespace tp::detail {

namespace {

// Scales and zero points of panel p's 16 columns in one group, as float32.
__m512 load_scale(const Int4CpuView& w, int64_t meta) {
  return w.scales_f16 ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.scales_f16 + meta)))
                      : _mm512_loadu_ps(w.scales_f32 + meta);
}
__m512 load_zero(const Int4CpuView& w, int64_t meta) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.zeros + meta))));
}

// Rows kernel over NP panels (NP zmm) for M rows; SPLIT accumulator sets alternate
// over the 8 k of a code line, to hide FMA latency when M * NP is small.
template <int M, int NP, int SPLIT>
void rows(const float* xs, int64_t ld_xs, const float* sum_x, int64_t ld_sum, const Int4CpuView& w, float* y,
          int64_t ld_y, int64_t p, int64_t ncols, bool prefetch) {
  const int64_t lines = w.k / 8, groups = w.k / w.group, lines_per_group = w.group / 8;
  const uint32_t* panel[NP];
#pragma GCC unroll 16
  for (int j = 0; j < NP; ++j) panel[j] = w.codes + (p + j) * lines * cpu::kPanelWidth;
  __m512 out[M][NP];
#pragma GCC unroll 16
  for (int r = 0; r < M; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NP; ++v) out[r][v] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[SPLIT][M][NP];
#pragma GCC unroll 16
    for (int s = 0; s < SPLIT; ++s)
#pragma GCC unroll 16
      for (int r = 0; r < M; ++r)
#pragma GCC unroll 16
        for (int v = 0; v < NP; ++v) acc[s][r][v] = _mm512_setzero_ps();
    for (int64_t b = g * lines_per_group; b < (g + 1) * lines_per_group; ++b) {
      __m512i raw[NP];
#pragma GCC unroll 16
      for (int v = 0; v < NP; ++v) raw[v] = _mm512_loadu_si512(panel[v] + b * cpu::kPanelWidth);
      if (prefetch) {
#pragma GCC unroll 16
        for (int v = 0; v < NP; ++v)
          _mm_prefetch(reinterpret_cast<const char*>(panel[v] + (NP * lines + b) * cpu::kPanelWidth), _MM_HINT_T0);
      }
      const float* xk = xs + 8 * b;
#pragma GCC unroll 7
      for (int i = 0; i < 7; ++i) {
        // Nibble i, left in place: q * 16^i, exact in float32; xs carries the 16^-i.
        const __m512i mask = _mm512_set1_epi32(0xF << (4 * i));
        __m512 q[NP];
#pragma GCC unroll 16
        for (int v = 0; v < NP; ++v) q[v] = _mm512_cvtepi32_ps(_mm512_and_si512(raw[v], mask));
#pragma GCC unroll 16
        for (int r = 0; r < M; ++r) {
          const __m512 a = _mm512_set1_ps(xk[r * ld_xs + i]);
#pragma GCC unroll 16
          for (int v = 0; v < NP; ++v) acc[i % SPLIT][r][v] = _mm512_fmadd_ps(q[v], a, acc[i % SPLIT][r][v]);
        }
      }
      {
        __m512 q[NP];
#pragma GCC unroll 16
        for (int v = 0; v < NP; ++v) q[v] = _mm512_cvtepi32_ps(_mm512_srli_epi32(raw[v], 28));
#pragma GCC unroll 16
        for (int r = 0; r < M; ++r) {
          const __m512 a = _mm512_set1_ps(xk[r * ld_xs + 7]);
#pragma GCC unroll 16
          for (int v = 0; v < NP; ++v) acc[7 % SPLIT][r][v] = _mm512_fmadd_ps(q[v], a, acc[7 % SPLIT][r][v]);
        }
      }
    }
// y += scale * (sum q x - zero * sum x).
#pragma GCC unroll 16
    for (int v = 0; v < NP; ++v) {
      const int64_t meta = ((p + v) * groups + g) * cpu::kPanelWidth;
      const __m512 scale = load_scale(w, meta), zero = load_zero(w, meta);
#pragma GCC unroll 16
      for (int r = 0; r < M; ++r) {
        __m512 a = acc[0][r][v];
#pragma GCC unroll 16
        for (int s = 1; s < SPLIT; ++s) a = _mm512_add_ps(a, acc[s][r][v]);
        a = _mm512_fnmadd_ps(zero, _mm512_set1_ps(sum_x[r * ld_sum + g]), a);
        out[r][v] = _mm512_fmadd_ps(scale, a, out[r][v]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < M; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < NP; ++v) {
      const int64_t first = 16 * v, left = ncols - first;
      if (left >= 16) {
        _mm512_storeu_ps(y + r * ld_y + first, out[r][v]);
      } else if (left > 0) {
        _mm512_mask_storeu_ps(y + r * ld_y + first, static_cast<__mmask16>((1u << left) - 1), out[r][v]);
      }
    }
  }
}

using RowsFn = void (*)(const float*, int64_t, const float*, int64_t, const Int4CpuView&, float*, int64_t, int64_t,
                        int64_t, bool);

// [M][np - 1]: the kernel for M rows over np panels (np up to kWidePanels[M]).
constexpr int kMaxWide = 4;
constexpr RowsFn kRows[kInt4SmallM + 1][kMaxWide] = {
    {nullptr, nullptr, nullptr, nullptr},
    {rows<1, 1, 2>, rows<1, 2, 2>, rows<1, 3, 2>, rows<1, 4, 2>},
    {rows<2, 1, 1>, rows<2, 2, 1>, rows<2, 3, 1>, rows<2, 4, 1>},
    {rows<3, 1, 1>, rows<3, 2, 1>, rows<3, 3, 1>, rows<3, 4, 1>},
    {rows<4, 1, 1>, rows<4, 2, 1>, rows<4, 3, 1>, rows<4, 4, 1>},
};
constexpr int kWidePanels[kInt4SmallM + 1] = {1, 4, 4, 4, 4};

}  // namespace

void int4_rows_avx512(const float* xs, int64_t m, int64_t ld_xs, const float* sum_x, int64_t ld_sum,
                      const Int4CpuView& w, float* y, int64_t ld_y, int64_t p0, int64_t p1) {
  const int wide = kWidePanels[m];
  for (int64_t p = p0; p < p1;) {
    const int np = p1 - p >= wide ? wide : static_cast<int>(p1 - p);
    const int64_t first = cpu::kPanelWidth * p, left = w.n - first;
    const int64_t ncols = left < cpu::kPanelWidth * np ? left : cpu::kPanelWidth * np;
    kRows[m][np - 1](xs, ld_xs, sum_x, ld_sum, w, y + first, ld_y, p, ncols, p + 2 * np <= p1);
    p += np;
  }
}

void int4_decode_panels_avx512(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                               int64_t ld_buf) {
  const auto& w = *static_cast<const Int4CpuView*>(view);
  const int64_t lines = w.k / 8, groups = w.k / w.group, lines_per_group = w.group / 8;
  const int64_t b_end = (k0 + kc) / 8;
  for (int64_t j = 0; j < np; ++j) {
    const uint32_t* panel = w.codes + (p + j) * lines * cpu::kPanelWidth;
    float* col = buf + cpu::kPanelWidth * j;
    for (int64_t b0 = k0 / 8; b0 < b_end;) {
      const int64_t g = b0 / lines_per_group,
                    b1 = (g + 1) * lines_per_group < b_end ? (g + 1) * lines_per_group : b_end;
      const int64_t meta = ((p + j) * groups + g) * cpu::kPanelWidth;
      const __m512 scale = load_scale(w, meta), zero = load_zero(w, meta);
      if (w.scales_f16) {
        // Finite float16 scales: q 16^i * (scale 16^-i) - zero * scale in one FMA is
        // exactly tp::dequantize_weight's (q - zero) * scale (see the AVX2 decoder).
        __m512 s[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i)
          s[i] = _mm512_mul_ps(scale, _mm512_set1_ps(i == 7 ? 1.0f : 1.0f / static_cast<float>(1 << (4 * i))));
        const __m512 minus_zs = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(zero, scale));
        for (int64_t b = b0; b < b1; ++b) {
          const __m512i raw = _mm512_loadu_si512(panel + b * cpu::kPanelWidth);
          float* out = col + (8 * b - k0) * ld_buf;
#pragma GCC unroll 7
          for (int i = 0; i < 7; ++i) {
            const __m512 q = _mm512_cvtepi32_ps(_mm512_and_si512(raw, _mm512_set1_epi32(0xF << (4 * i))));
            _mm512_storeu_ps(out + i * ld_buf, _mm512_fmadd_ps(q, s[i], minus_zs));
          }
          const __m512 q = _mm512_cvtepi32_ps(_mm512_srli_epi32(raw, 28));
          _mm512_storeu_ps(out + 7 * ld_buf, _mm512_fmadd_ps(q, s[7], minus_zs));
        }
      } else {
        const __m512i low4 = _mm512_set1_epi32(15);
        for (int64_t b = b0; b < b1; ++b) {
          const __m512i raw = _mm512_loadu_si512(panel + b * cpu::kPanelWidth);
          float* out = col + (8 * b - k0) * ld_buf;
#pragma GCC unroll 8
          for (int i = 0; i < 8; ++i) {
            const __m512 q = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(raw, 4 * i), low4));
            // (q - zero) * scale, as tp::dequantize_weight computes it.
            _mm512_storeu_ps(out + i * ld_buf, _mm512_mul_ps(_mm512_sub_ps(q, zero), scale));
          }
        }
      }
      b0 = b1;
    }
  }
}

}  // namespace tp::detail
