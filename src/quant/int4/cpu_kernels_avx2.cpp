// AVX2 + FMA + F16C INT4 kernels (cpu_kernels.h): the panel decoder and the rows
// kernel. A ymm holds 8 of a panel's 16 columns: the low or the high half of a
// 64-byte code line.
//
// No templates or inline functions shared with other translation units here (no std::
// algorithms, no c10 checks): the linker could keep this file's AVX2 copy of one for
// every caller. Everything local is in the anonymous namespace.

#include <immintrin.h>

#include "cpu/panel_gemm.h"
#include "quant/int4/cpu_kernels.h"

namespace tp::detail {

namespace {

// Scales and zero points of 8 columns (half h of panel p) in group g, as float32.
__m256 load_scale(const Int4CpuView& w, int64_t meta) {
  return w.scales_f16 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales_f16 + meta)))
                      : _mm256_loadu_ps(w.scales_f32 + meta);
}
__m256 load_zero(const Int4CpuView& w, int64_t meta) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.zeros + meta))));
}

// Rows kernel over NP panels (2 NP ymm columns vectors) for M rows. SPLIT accumulator
// sets alternate over the 8 k of a code line, to hide FMA latency when M is small.
template <int M, int NP, int SPLIT>
void rows(const float* xs, int64_t ld_xs, const float* sum_x, int64_t ld_sum, const Int4CpuView& w, float* y,
          int64_t ld_y, int64_t p, int64_t ncols, bool prefetch) {
  constexpr int V = 2 * NP;
  const int64_t lines = w.k / 8, groups = w.k / w.group, lines_per_group = w.group / 8;
  const uint32_t* panel[NP];
#pragma GCC unroll 16
  for (int j = 0; j < NP; ++j) panel[j] = w.codes + (p + j) * lines * cpu::kPanelWidth;
  __m256 out[M][V];
#pragma GCC unroll 16
  for (int r = 0; r < M; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) out[r][v] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256 acc[SPLIT][M][V];
#pragma GCC unroll 16
    for (int s = 0; s < SPLIT; ++s)
#pragma GCC unroll 16
      for (int r = 0; r < M; ++r)
#pragma GCC unroll 16
        for (int v = 0; v < V; ++v) acc[s][r][v] = _mm256_setzero_ps();
    for (int64_t b = g * lines_per_group; b < (g + 1) * lines_per_group; ++b) {
      __m256i raw[V];
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v)
        raw[v] =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel[v / 2] + b * cpu::kPanelWidth + 8 * (v % 2)));
      if (prefetch) {
#pragma GCC unroll 16
        for (int j = 0; j < NP; ++j)
          _mm_prefetch(reinterpret_cast<const char*>(panel[j] + (NP * lines + b) * cpu::kPanelWidth), _MM_HINT_T0);
      }
      const float* xk = xs + 8 * b;
#pragma GCC unroll 7
      for (int i = 0; i < 7; ++i) {
        // Nibble i, left in place: q * 16^i, exact in float32; xs carries the 16^-i.
        const __m256i mask = _mm256_set1_epi32(0xF << (4 * i));
        __m256 q[V];
#pragma GCC unroll 16
        for (int v = 0; v < V; ++v) q[v] = _mm256_cvtepi32_ps(_mm256_and_si256(raw[v], mask));
#pragma GCC unroll 16
        for (int r = 0; r < M; ++r) {
          const __m256 a = _mm256_broadcast_ss(xk + r * ld_xs + i);
#pragma GCC unroll 16
          for (int v = 0; v < V; ++v) acc[i % SPLIT][r][v] = _mm256_fmadd_ps(q[v], a, acc[i % SPLIT][r][v]);
        }
      }
      {
        __m256 q[V];
#pragma GCC unroll 16
        for (int v = 0; v < V; ++v) q[v] = _mm256_cvtepi32_ps(_mm256_srli_epi32(raw[v], 28));
#pragma GCC unroll 16
        for (int r = 0; r < M; ++r) {
          const __m256 a = _mm256_broadcast_ss(xk + r * ld_xs + 7);
#pragma GCC unroll 16
          for (int v = 0; v < V; ++v) acc[7 % SPLIT][r][v] = _mm256_fmadd_ps(q[v], a, acc[7 % SPLIT][r][v]);
        }
      }
    }
// y += scale * (sum q x - zero * sum x).
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      const int64_t meta = ((p + v / 2) * groups + g) * cpu::kPanelWidth + 8 * (v % 2);
      const __m256 scale = load_scale(w, meta), zero = load_zero(w, meta);
#pragma GCC unroll 16
      for (int r = 0; r < M; ++r) {
        __m256 a = acc[0][r][v];
#pragma GCC unroll 16
        for (int s = 1; s < SPLIT; ++s) a = _mm256_add_ps(a, acc[s][r][v]);
        a = _mm256_fnmadd_ps(zero, _mm256_broadcast_ss(sum_x + r * ld_sum + g), a);
        out[r][v] = _mm256_fmadd_ps(scale, a, out[r][v]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < M; ++r) {
    if (ncols == 16 * NP) {
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) _mm256_storeu_ps(y + r * ld_y + 8 * v, out[r][v]);
    } else {
      alignas(32) float part[16 * NP];
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) _mm256_store_ps(part + 8 * v, out[r][v]);
      for (int64_t c = 0; c < ncols; ++c) y[r * ld_y + c] = part[c];
    }
  }
}

using RowsFn = void (*)(const float*, int64_t, const float*, int64_t, const Int4CpuView&, float*, int64_t, int64_t,
                        int64_t, bool);

// [M][wide]: the kernel for M rows over 2 panels (wide) or 1.
constexpr RowsFn kRows[kInt4SmallM + 1][2] = {
    {nullptr, nullptr},
    {rows<1, 1, 2>, rows<1, 2, 2>},
    {rows<2, 1, 1>, rows<2, 2, 1>},
    {rows<3, 1, 1>, rows<3, 1, 1>},
    {rows<4, 1, 1>, rows<4, 1, 1>},
};
constexpr int kWidePanels[kInt4SmallM + 1] = {1, 2, 2, 1, 1};

}  // namespace

void int4_rows_avx2(const float* xs, int64_t m, int64_t ld_xs, const float* sum_x, int64_t ld_sum, const Int4CpuView& w,
                    float* y, int64_t ld_y, int64_t p0, int64_t p1) {
  const int wide = kWidePanels[m];
  for (int64_t p = p0; p < p1;) {
    const int np = p1 - p >= wide ? wide : 1;
    const int64_t first = cpu::kPanelWidth * p, left = w.n - first;
    const int64_t ncols = left < cpu::kPanelWidth * np ? left : cpu::kPanelWidth * np;
    kRows[m][np - 1](xs, ld_xs, sum_x, ld_sum, w, y + first, ld_y, p, ncols, p + 2 * np <= p1);
    p += np;
  }
}

void int4_decode_panels_avx2(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                             int64_t ld_buf) {
  const auto& w = *static_cast<const Int4CpuView*>(view);
  const int64_t lines = w.k / 8, groups = w.k / w.group, lines_per_group = w.group / 8;
  const int64_t b_end = (k0 + kc) / 8;
  for (int64_t j = 0; j < np; ++j) {
    const uint32_t* panel = w.codes + (p + j) * lines * cpu::kPanelWidth;
    for (int64_t h = 0; h < 2; ++h) {
      float* col = buf + cpu::kPanelWidth * j + 8 * h;
      for (int64_t b0 = k0 / 8; b0 < b_end;) {
        const int64_t g = b0 / lines_per_group,
                      b1 = (g + 1) * lines_per_group < b_end ? (g + 1) * lines_per_group : b_end;
        const int64_t meta = ((p + j) * groups + g) * cpu::kPanelWidth + 8 * h;
        const __m256 scale = load_scale(w, meta), zero = load_zero(w, meta);
        if (w.scales_f16) {
          // Finite float16 scales (int4_cpu_pack checks): (q - zero) * scale is exact in
          // float32 (at most 8 + 11 significant bits), and so is every term of
          //   q 16^i * (scale 16^-i) - zero * scale
          // which one FMA computes from the nibble masked in place: the same value as
          // tp::dequantize_weight's, in 4 instructions instead of 6.
          __m256 s[8];
#pragma GCC unroll 8
          for (int i = 0; i < 8; ++i)
            s[i] = _mm256_mul_ps(scale, _mm256_set1_ps(i == 7 ? 1.0f : 1.0f / static_cast<float>(1 << (4 * i))));
          const __m256 minus_zs = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(zero, scale));
          for (int64_t b = b0; b < b1; ++b) {
            const __m256i raw =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + b * cpu::kPanelWidth + 8 * h));
            float* out = col + (8 * b - k0) * ld_buf;
#pragma GCC unroll 7
            for (int i = 0; i < 7; ++i) {
              const __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(raw, _mm256_set1_epi32(0xF << (4 * i))));
              _mm256_storeu_ps(out + i * ld_buf, _mm256_fmadd_ps(q, s[i], minus_zs));
            }
            const __m256 q = _mm256_cvtepi32_ps(_mm256_srli_epi32(raw, 28));
            _mm256_storeu_ps(out + 7 * ld_buf, _mm256_fmadd_ps(q, s[7], minus_zs));
          }
        } else {
          const __m256i low4 = _mm256_set1_epi32(15);
          for (int64_t b = b0; b < b1; ++b) {
            const __m256i raw =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + b * cpu::kPanelWidth + 8 * h));
            float* out = col + (8 * b - k0) * ld_buf;
#pragma GCC unroll 8
            for (int i = 0; i < 8; ++i) {
              const __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(raw, 4 * i), low4));
              // (q - zero) * scale, as tp::dequantize_weight computes it.
              _mm256_storeu_ps(out + i * ld_buf, _mm256_mul_ps(_mm256_sub_ps(q, zero), scale));
            }
          }
        }
        b0 = b1;
      }
    }
  }
}

}  // namespace tp::detail
