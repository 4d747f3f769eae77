// The small-M GEMM of the unquantized method, AVX-512 code path: y = x W^T for
// M <= kCpuGemvMaxM rows of x, W float32 or bfloat16 [N, K] row-major. Memory-bound
// (every weight element is read once per call and used M times), so the loop
// streams W rows and keeps x in L1/L2. Compiled with the AVX-512 flags (see
// docs on per-ISA translation units); entered only when cpu::isa() allows it.

#include <immintrin.h>

// GCC 12's AVX-512 headers build some casts and zero-extensions from a self-initialised
// "undefined" register, which -Wall flags once they are inlined here: false positives.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cstdint>

#include "cpu/dense/kernels.h"

namespace tp::cpu {

namespace {

inline __m512 load_w(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_w(const uint16_t* p) {
  // bfloat16 -> float32 is exact: the 16 stored bits are the float's high half.
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline __m512 load_w_tail(const float* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }
inline __m512 load_w_tail(const uint16_t* p, __mmask16 mask) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p)), 16));
}

// Horizontal sum. (GCC 12's _mm512_reduce_add_ps trips -Wuninitialized in its own header.)
inline float hsum(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// R rows of W against M rows of x: M*R accumulators of 16 lanes (at most 4*4 + 4 + 1
// of the 32 zmm registers), one pass over K, a horizontal sum at the end.
template <int M, int R, typename W>
void rows_block(const float* x, int64_t ld_x, const W* w, int64_t ld_w, int64_t k, float* y, int64_t ld_y,
                bool accumulate) {
  __m512 acc[M][R];
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    __m512 wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) wv[r] = load_w(w + r * ld_w + i);
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      const __m512 xv = _mm512_loadu_ps(x + m * ld_x + i);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_fmadd_ps(wv[r], xv, acc[m][r]);
    }
  }
  if (i < k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (k - i)) - 1u);
    __m512 wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) wv[r] = load_w_tail(w + r * ld_w + i, mask);
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + m * ld_x + i);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_fmadd_ps(wv[r], xv, acc[m][r]);
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float v = hsum(acc[m][r]);
      y[m * ld_y + r] = accumulate ? y[m * ld_y + r] + v : v;
    }
}

template <int M, typename W>
void rows_range(const float* x, int64_t ld_x, const W* w, int64_t ld_w, int64_t k, float* y, int64_t ld_y, int64_t n0,
                int64_t n1, bool accumulate) {
  // 4 x 6 accumulators for a group of 4 x rows (+ 6 W vectors + 1 x: 31 of 32 zmm):
  // 24 FMAs per 10 loads. Fewer x rows keep 4 W rows (one pass over W at M <= 4).
  constexpr int R = M == 4 ? 6 : 4;
  int64_t n = n0;
  for (; n + R <= n1; n += R) rows_block<M, R>(x, ld_x, w + n * ld_w, ld_w, k, y + n, ld_y, accumulate);
  for (; n < n1; ++n) rows_block<M, 1>(x, ld_x, w + n * ld_w, ld_w, k, y + n, ld_y, accumulate);
}

// One pass of rows [m0, m0 + g) of x (g <= 4) over W[n0:n1, k0:k0 + kc].
template <typename W>
void group_pass(int64_t g, const float* x, int64_t ld_x, const W* w, int64_t ld_w, int64_t kc, float* y, int64_t ld_y,
                int64_t n0, int64_t n1, bool accumulate) {
  switch (g) {
    case 1: rows_range<1>(x, ld_x, w, ld_w, kc, y, ld_y, n0, n1, accumulate); break;
    case 2: rows_range<2>(x, ld_x, w, ld_w, kc, y, ld_y, n0, n1, accumulate); break;
    case 3: rows_range<3>(x, ld_x, w, ld_w, kc, y, ld_y, n0, n1, accumulate); break;
    default: rows_range<4>(x, ld_x, w, ld_w, kc, y, ld_y, n0, n1, accumulate); break;
  }
}

template <typename W>
void gemv_any(const float* x, int64_t m, int64_t k, int64_t ld_x, const W* w, int64_t ld_w, float* y, int64_t ld_y,
              int64_t n0, int64_t n1) {
  if (m <= 4) {
    // Decode: one pass streams W[n0:n1] once from memory, x stays in L1/L2.
    group_pass(m, x, ld_x, w, ld_w, k, y, ld_y, n0, n1, false);
    return;
  }
  // More rows: blocks of kRows x kDepth of W stay in L2 while every group of 4 rows
  // of x passes over them, so W is read from memory once; the group's x rows (4 x
  // kDepth floats) stay in L1. Partial sums of later K blocks are added into y.
  // kRows a multiple of both R; kDepth 1024 halves the horizontal sums of 512 (M = 16,
  // 4096 x 11008, 2 threads: 14.5 -> 12.8 ms).
  constexpr int64_t kRows = 48, kDepth = 1024;
  for (int64_t nb = n0; nb < n1; nb += kRows) {
    const int64_t ne = nb + kRows < n1 ? nb + kRows : n1;
    for (int64_t k0 = 0; k0 < k; k0 += kDepth) {
      const int64_t kc = k - k0 < kDepth ? k - k0 : kDepth;
      for (int64_t m0 = 0; m0 < m; m0 += 4)
        group_pass(m - m0 < 4 ? m - m0 : 4, x + m0 * ld_x + k0, ld_x, w + k0, ld_w, kc, y + m0 * ld_y, ld_y, nb, ne,
                   k0 > 0);
    }
  }
}

}  // namespace

void gemv_f32_avx512(const float* x, int64_t m, int64_t k, int64_t ld_x, const float* w, int64_t ld_w, float* y,
                     int64_t ld_y, int64_t n0, int64_t n1) {
  gemv_any(x, m, k, ld_x, w, ld_w, y, ld_y, n0, n1);
}

void gemv_bf16_avx512(const float* x, int64_t m, int64_t k, int64_t ld_x, const uint16_t* w, int64_t ld_w, float* y,
                      int64_t ld_y, int64_t n0, int64_t n1) {
  gemv_any(x, m, k, ld_x, w, ld_w, y, ld_y, n0, n1);
}

void bf16_to_f32_avx512(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * ld_src;
    float* d = dst + r * ld_dst;
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) _mm512_storeu_ps(d + c, load_w(s + c));
    if (c < cols) {
      const __mmask16 mask = static_cast<__mmask16>((1u << (cols - c)) - 1u);
      _mm512_mask_storeu_ps(d + c, mask, load_w_tail(s + c, mask));
    }
  }
}

}  // namespace tp::cpu
