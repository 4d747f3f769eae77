// NVFP4's rows kernel on AVX2 + FMA (nvfp4.h: nvfp4_rows_f32_avx2), for M <= 4: each weight
// byte read once. A group of 16 is 8 code bytes: split into nibbles in element order, each
// nibble looked up (PSHUFB) as twice its E2M1 value in int8 (0, 1, 2, 3, 4, 6, 8, 12 and
// their negatives), widened to float32 and multiplied by half the group's scale (the
// scale as the producer computes it, one float32 division or product): the weight the
// decoder writes, bit for bit, since halving is exact. R rows at a time for independent
// FMA chains. (Computing 64 groups' scales ahead, eight a vector division, was no faster:
// benchmarks/RESULTS.md, "issue 48, part 1"; the five shuffles a group are the likely bound.)

#include <immintrin.h>

#include <cstdint>

#include "quant/nvfp4/nvfp4.h"

namespace tp::detail {

namespace {

float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

template <int M, int R>
void rows(const float* x, int64_t ld_x, const Nvfp4CpuWeight& w, float* y, int64_t ld_y, int64_t n0) {
  const float* e4m3 = nvfp4_e4m3_table();
  const __m128i twice = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const int64_t groups = w.k / kNvfp4Group;
  const uint8_t* codes[R];
  const uint8_t* scales[R];
  float global[R];
  for (int r = 0; r < R; ++r) {
    codes[r] = w.codes + (n0 + r) * (w.k / 2);
    scales[r] = w.scales + (n0 + r) * groups;
    global[r] = w.global[n0 + r];
  }
  __m256 acc[M][R][2];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) acc[m][r][0] = acc[m][r][1] = _mm256_setzero_ps();
  for (int64_t q = 0; q < groups; ++q) {
    __m256 lo[R], hi[R];
    for (int r = 0; r < R; ++r) {
      const float s = e4m3[scales[r][q]];
      const __m256 half = _mm256_set1_ps((w.divide ? s / global[r] : s * global[r]) * 0.5f);
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes[r] + 8 * q));
      const __m128i nib =
          _mm_unpacklo_epi8(_mm_and_si128(b, low4), _mm_and_si128(_mm_srli_epi16(b, 4), low4));  // elements 0..15
      const __m128i v = _mm_shuffle_epi8(twice, nib);
      lo[r] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), half);
      hi[r] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))), half);
    }
    for (int m = 0; m < M; ++m) {
      const float* xm = x + m * ld_x + 16 * q;
      const __m256 x0 = _mm256_loadu_ps(xm), x1 = _mm256_loadu_ps(xm + 8);
      for (int r = 0; r < R; ++r) {
        acc[m][r][0] = _mm256_fmadd_ps(lo[r], x0, acc[m][r][0]);
        acc[m][r][1] = _mm256_fmadd_ps(hi[r], x1, acc[m][r][1]);
      }
    }
  }
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) y[m * ld_y + n0 + r] = hsum(_mm256_add_ps(acc[m][r][0], acc[m][r][1]));
}

template <int M>
void rows_m(const float* x, int64_t ld_x, const Nvfp4CpuWeight& w, float* y, int64_t ld_y, int64_t n0, int64_t n1) {
  constexpr int R = M <= 2 ? 4 : 2;
  int64_t n = n0;
  for (; n + R <= n1; n += R) rows<M, R>(x, ld_x, w, y, ld_y, n);
  for (; n < n1; ++n) rows<M, 1>(x, ld_x, w, y, ld_y, n);
}

}  // namespace

void nvfp4_rows_f32_avx2(const float* x, int64_t m, int64_t ld_x, const Nvfp4CpuWeight& w, float* y, int64_t ld_y,
                         int64_t n0, int64_t n1) {
  switch (m) {
    case 1: return rows_m<1>(x, ld_x, w, y, ld_y, n0, n1);
    case 2: return rows_m<2>(x, ld_x, w, y, ld_y, n0, n1);
    case 3: return rows_m<3>(x, ld_x, w, y, ld_y, n0, n1);
    default: return rows_m<4>(x, ld_x, w, y, ld_y, n0, n1);
  }
}

}  // namespace tp::detail
