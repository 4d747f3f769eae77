// AVX-512 int8_weight_only kernels (weight_only_cpu_kernels.h) over the [N, K] weight:
// the rows kernel (dot-product form, 16 k per zmm, the K tail by masked loads) and
// the panel decoder (16 rows x 16 k of bytes transposed with SSE2 unpacks, then
// widened to a zmm of float32 per k).
//
// No templates or inline functions shared with other translation units here (no std::
// algorithms, no c10 checks): the linker could keep this file's AVX-512 copy of one
// for every caller. Everything local is in the anonymous namespace.

// GCC 12 warns about _mm512_undefined_ps() inside its own intrinsics (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "cpu/panel_gemm.h"
#include "quant/int8/weight_only_cpu_kernels.h"

namespace tp::detail {

namespace {

// Rows kernel: weight rows [n0, n0 + R) against M rows of x, all of K.
template <int M, int R>
void rows(const float* x, int64_t ld_x, const Int8WoCpuView& w, float* y, int64_t ld_y, int64_t n0) {
  const int64_t k = w.k;
  const int8_t* row[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) row[r] = w.codes + (n0 + r) * k;
  __m512 acc[M][R];
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
  const auto step = [&](int64_t kk, __mmask16 mask) {
    __m512 xv[M];
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) xv[m] = _mm512_maskz_loadu_ps(mask, x + m * ld_x + kk);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, row[r] + kk)));
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) acc[m][r] = _mm512_fmadd_ps(q, xv[m], acc[m][r]);
    }
  };
  int64_t kk = 0;
  for (; kk + 16 <= k; kk += 16) step(kk, static_cast<__mmask16>(0xFFFF));
  if (kk < k) step(kk, static_cast<__mmask16>((1u << (k - kk)) - 1));
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) y[m * ld_y + n0 + r] = w.scales[n0 + r] * _mm512_reduce_add_ps(acc[m][r]);
}

using RowsFn = void (*)(const float*, int64_t, const Int8WoCpuView&, float*, int64_t, int64_t);

// Weight rows per block for M rows of x (M * R accumulators) and the kernels for a
// full block and for single leftover rows.
constexpr int kBlock[kInt8WoSmallM + 1] = {0, 8, 8, 4, 4};
constexpr RowsFn kFull[kInt8WoSmallM + 1] = {nullptr, rows<1, 8>, rows<2, 8>, rows<3, 4>, rows<4, 4>};
constexpr RowsFn kOne[kInt8WoSmallM + 1] = {nullptr, rows<1, 1>, rows<2, 1>, rows<3, 1>, rows<4, 1>};

// The 16 x 16 byte transpose: v[j] holds 16 k of row j; afterwards t[kk] holds k = kk
// of rows 0..15. Four rounds of SSE2 unpacks (bytes, words, dwords, qwords).
void transpose16(const __m128i v[16], __m128i t[16]) {
  __m128i a[16], b[16], c[16];
  for (int i = 0; i < 8; ++i) {
    a[i] = _mm_unpacklo_epi8(v[2 * i], v[2 * i + 1]);
    a[i + 8] = _mm_unpackhi_epi8(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    b[4 * i + 0] = _mm_unpacklo_epi16(a[2 * i], a[2 * i + 1]);
    b[4 * i + 1] = _mm_unpackhi_epi16(a[2 * i], a[2 * i + 1]);
    b[4 * i + 2] = _mm_unpacklo_epi16(a[2 * i + 8], a[2 * i + 9]);
    b[4 * i + 3] = _mm_unpackhi_epi16(a[2 * i + 8], a[2 * i + 9]);
  }
  for (int i = 0; i < 2; ++i) {
    for (int g = 0; g < 4; ++g) {
      c[8 * i + 2 * g] = _mm_unpacklo_epi32(b[8 * i + g], b[8 * i + 4 + g]);
      c[8 * i + 2 * g + 1] = _mm_unpackhi_epi32(b[8 * i + g], b[8 * i + 4 + g]);
    }
  }
  for (int d = 0; d < 8; ++d) {
    t[2 * d] = _mm_unpacklo_epi64(c[d], c[8 + d]);
    t[2 * d + 1] = _mm_unpackhi_epi64(c[d], c[8 + d]);
  }
}

}  // namespace

void int8_wo_rows_avx512(const float* x, int64_t m, int64_t ld_x, const Int8WoCpuView& w, float* y, int64_t ld_y,
                         int64_t p0, int64_t p1) {
  const int64_t n1 = p1 * cpu::kPanelWidth < w.n ? p1 * cpu::kPanelWidth : w.n;
  const int block = kBlock[m];
  int64_t n = p0 * cpu::kPanelWidth;
  for (; n + block <= n1; n += block) kFull[m](x, ld_x, w, y, ld_y, n);
  for (; n < n1; ++n) kOne[m](x, ld_x, w, y, ld_y, n);
}

void int8_wo_decode_panels_avx512(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                                  int64_t ld_buf) {
  const auto& w = *static_cast<const Int8WoCpuView*>(view);
  const int64_t k16 = kc / 16 * 16;
  for (int64_t j = 0; j < np; ++j) {
    const int64_t first = (p + j) * cpu::kPanelWidth;
    // Rows past N read row `first` again: their scale is 0 and the GEMM never stores
    // their columns.
    const int8_t* row[cpu::kPanelWidth];
    for (int64_t r = 0; r < cpu::kPanelWidth; ++r) row[r] = w.codes + (first + r < w.n ? first + r : first) * w.k + k0;
    const __m512 s = _mm512_loadu_ps(w.scales + first);
    float* col = buf + cpu::kPanelWidth * j;
    for (int64_t kk = 0; kk < k16; kk += 16) {
      __m128i v[16], t[16];
      for (int r = 0; r < 16; ++r) v[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[r] + kk));
      transpose16(v, t);
      for (int i = 0; i < 16; ++i) {
        // float32(q) * scale, as tp::dequantize_weight computes it.
        _mm512_storeu_ps(col + (kk + i) * ld_buf, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(t[i])), s));
      }
    }
    for (int64_t kk = k16; kk < kc; ++kk) {
      for (int r = 0; r < 16; ++r) col[kk * ld_buf + r] = static_cast<float>(row[r][kk]) * w.scales[first + r];
    }
  }
}

}  // namespace tp::detail
