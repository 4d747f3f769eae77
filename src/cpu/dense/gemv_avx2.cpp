// The small-M GEMM of the unquantized method, AVX2 + FMA code path (see
// cpu/dense/kernels.h for the contract). Compiled with -mavx2 -mfma -mf16c; entered
// only when cpu::isa() allows it.

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/dense/kernels.h"

namespace tp::cpu {

namespace {

inline __m256 load_w(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_w(const uint16_t* p) {
  // bfloat16 -> float32 is exact: the 16 stored bits are the float's high half.
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline float to_float(float v) { return v; }
inline float to_float(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// R rows of W against M rows of x. 16 ymm registers: M*R accumulators + R weights +
// one x, so (M, R) is (1, 4), (2, 4), (3, 3) or (4, 3).
template <int M, int R, typename W>
void rows_block(const float* x, int64_t ld_x, const W* w, int64_t ld_w, int64_t k, float* y, int64_t ld_y,
                bool accumulate) {
  __m256 acc[M][R];
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) wv[r] = load_w(w + r * ld_w + i);
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      const __m256 xv = _mm256_loadu_ps(x + m * ld_x + i);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[m][r] = _mm256_fmadd_ps(wv[r], xv, acc[m][r]);
    }
  }
  float tail[M][R] = {};
  for (; i < k; ++i) {
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) tail[m][r] = __builtin_fmaf(to_float(w[r * ld_w + i]), x[m * ld_x + i], tail[m][r]);
  }
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float v = hsum(acc[m][r]) + tail[m][r];
      y[m * ld_y + r] = accumulate ? y[m * ld_y + r] + v : v;
    }
}

template <int M, typename W>
void rows_range(const float* x, int64_t ld_x, const W* w, int64_t ld_w, int64_t k, float* y, int64_t ld_y, int64_t n0,
                int64_t n1, bool accumulate) {
  // A group of 4 x rows: 4 x 3 accumulators + 3 W vectors = 15 of 16 ymm (x is an FMA
  // memory operand). kDepth 1024 halves the horizontal sums of 512 (M = 16, 4096 x
  // 11008: 21.7 -> 16.6 ms). Three rows take three W rows too, not two: more rows of
  // W streamed at once, 1.10-1.22x at M = 3 (Zen 4 capped to AVX2, the four Llama
  // shapes at TP 1, 2026-12-02).
  constexpr int R = M <= 2 ? 4 : 3;
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
  constexpr int64_t kRows = 48, kDepth = 1024;  // kRows: a multiple of every R
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

void gemv_f32_avx2(const float* x, int64_t m, int64_t k, int64_t ld_x, const float* w, int64_t ld_w, float* y,
                   int64_t ld_y, int64_t n0, int64_t n1) {
  gemv_any(x, m, k, ld_x, w, ld_w, y, ld_y, n0, n1);
}

void gemv_bf16_avx2(const float* x, int64_t m, int64_t k, int64_t ld_x, const uint16_t* w, int64_t ld_w, float* y,
                    int64_t ld_y, int64_t n0, int64_t n1) {
  gemv_any(x, m, k, ld_x, w, ld_w, y, ld_y, n0, n1);
}

void bf16_to_f32_avx2(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * ld_src;
    float* d = dst + r * ld_dst;
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) _mm256_storeu_ps(d + c, load_w(s + c));
    for (; c < cols; ++c) d[c] = to_float(s[c]);
  }
}

}  // namespace tp::cpu
