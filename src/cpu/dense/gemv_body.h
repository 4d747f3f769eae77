#pragma once
// The dense engine's small-M GEMM (cpu/dense/kernels.h), once over Vec<kIsa>: y = x W^T
// for a few rows of x, W float32 or bfloat16 [N, K] row-major, as stored. Memory-bound
// (every weight element is read once per call and used M times), so the loop streams
// W rows and keeps x in L1/L2. Included only by gemv_avx2.cpp and gemv_avx512.cpp;
// everything here is in an anonymous namespace (cpu/vec.h says why).

#include <cstdint>
#include <cstring>

#include "cpu/dense/kernels.h"
#include "cpu/vec.h"

namespace tp::cpu {
namespace {

// bfloat16 -> float32 is exact: the 16 stored bits are the float's high half.
template <Isa kIsa>
typename Vec<kIsa>::F load_w(const float* p) {
  return Vec<kIsa>::load(p);
}
template <Isa kIsa>
typename Vec<kIsa>::F load_w(const uint16_t* p) {
  return Vec<kIsa>::widen_bf16(p);
}
template <Isa kIsa>
typename Vec<kIsa>::F load_w_first(const float* p, int n) {
  return Vec<kIsa>::load_first(p, n);
}
template <Isa kIsa>
typename Vec<kIsa>::F load_w_first(const uint16_t* p, int n) {
  return Vec<kIsa>::widen_bf16_first(p, n);
}
inline float to_float(float v) { return v; }
inline float to_float(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Rows of W taken at once for M rows of x: M*R accumulators + R weights + one x must
// fit the register file. AVX-512 (32 zmm): 4 x 6 for a group of 4 x rows (31 of 32;
// 24 FMAs per 10 loads), else 4 W rows (one pass over W at M <= 4). AVX2 (16 ymm):
// 4 x 3 + 3 = 15 (x an FMA memory operand); three rows of x take three W rows too,
// not two: more rows of W streamed at once is faster there (benchmarks/RESULTS.md, "Measurements behind the CPU kernels' shapes").
template <Isa kIsa, int M>
constexpr int kWRows = kIsa == Isa::kAvx512 ? (M == 4 ? 6 : 4) : (M <= 2 ? 4 : 3);

// R rows of W against M rows of x, one pass over K, a horizontal sum at the end. The
// K tail: one masked step where the ISA has masks, else scalar FMAs added after the sum.
template <Isa kIsa, int M, int R, typename W>
void rows_block(const float* x, int64_t ld_x, const W* w, int64_t ld_w, int64_t k, float* y, int64_t ld_y,
                bool accumulate) {
  using V = Vec<kIsa>;
  using F = typename V::F;
  constexpr int L = V::kLanes;
  F acc[M][R];
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[m][r] = V::zero();
  int64_t i = 0;
  for (; i + L <= k; i += L) {
    F wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) wv[r] = load_w<kIsa>(w + r * ld_w + i);
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      const F xv = V::load(x + m * ld_x + i);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[m][r] = V::fma(wv[r], xv, acc[m][r]);
    }
  }
  float tail[M][R] = {};
  if constexpr (V::kMaskedTail) {
    if (i < k) {
      const int n = static_cast<int>(k - i);
      F wv[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) wv[r] = load_w_first<kIsa>(w + r * ld_w + i, n);
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) {
        const F xv = V::load_first(x + m * ld_x + i, n);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[m][r] = V::fma(wv[r], xv, acc[m][r]);
      }
    }
  } else {
    for (; i < k; ++i) {
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) tail[m][r] = __builtin_fmaf(to_float(w[r * ld_w + i]), x[m * ld_x + i], tail[m][r]);
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float v = V::kMaskedTail ? V::reduce(acc[m][r]) : V::reduce(acc[m][r]) + tail[m][r];
      y[m * ld_y + r] = accumulate ? y[m * ld_y + r] + v : v;
    }
}

template <Isa kIsa, int M, typename W>
void rows_range(const float* x, int64_t ld_x, const W* w, int64_t ld_w, int64_t k, float* y, int64_t ld_y, int64_t n0,
                int64_t n1, bool accumulate) {
  constexpr int R = kWRows<kIsa, M>;
  int64_t n = n0;
  for (; n + R <= n1; n += R) rows_block<kIsa, M, R>(x, ld_x, w + n * ld_w, ld_w, k, y + n, ld_y, accumulate);
  for (; n < n1; ++n) rows_block<kIsa, M, 1>(x, ld_x, w + n * ld_w, ld_w, k, y + n, ld_y, accumulate);
}

// One pass of rows [m0, m0 + g) of x (g <= 4) over W[n0:n1, k0:k0 + kc].
template <Isa kIsa, typename W>
void group_pass(int64_t g, const float* x, int64_t ld_x, const W* w, int64_t ld_w, int64_t kc, float* y, int64_t ld_y,
                int64_t n0, int64_t n1, bool accumulate) {
  switch (g) {
    case 1: rows_range<kIsa, 1>(x, ld_x, w, ld_w, kc, y, ld_y, n0, n1, accumulate); break;
    case 2: rows_range<kIsa, 2>(x, ld_x, w, ld_w, kc, y, ld_y, n0, n1, accumulate); break;
    case 3: rows_range<kIsa, 3>(x, ld_x, w, ld_w, kc, y, ld_y, n0, n1, accumulate); break;
    default: rows_range<kIsa, 4>(x, ld_x, w, ld_w, kc, y, ld_y, n0, n1, accumulate); break;
  }
}

template <Isa kIsa, typename W>
void gemv(const float* x, int64_t m, int64_t k, int64_t ld_x, const W* w, int64_t ld_w, float* y, int64_t ld_y,
          int64_t n0, int64_t n1) {
  if (m <= 4) {
    // Decode: one pass streams W[n0:n1] once from memory, x stays in L1/L2.
    group_pass<kIsa>(m, x, ld_x, w, ld_w, k, y, ld_y, n0, n1, false);
    return;
  }
  // More rows: blocks of kRows x kDepth of W stay in L2 while every group of 4 rows
  // of x passes over them, so W is read from memory once; the group's x rows (4 x
  // kDepth floats) stay in L1. Partial sums of later K blocks are added into y.
  // kRows a multiple of every R; kDepth 1024 halves the horizontal sums of 512 and was
  // the faster of the two on both ISAs (benchmarks/RESULTS.md, "Measurements behind the CPU kernels' shapes").
  constexpr int64_t kRows = 48, kDepth = 1024;
  for (int64_t nb = n0; nb < n1; nb += kRows) {
    const int64_t ne = nb + kRows < n1 ? nb + kRows : n1;
    for (int64_t k0 = 0; k0 < k; k0 += kDepth) {
      const int64_t kc = k - k0 < kDepth ? k - k0 : kDepth;
      for (int64_t m0 = 0; m0 < m; m0 += 4)
        group_pass<kIsa>(m - m0 < 4 ? m - m0 : 4, x + m0 * ld_x + k0, ld_x, w + k0, ld_w, kc, y + m0 * ld_y, ld_y, nb,
                         ne, k0 > 0);
    }
  }
}

// bfloat16 rows -> float32 rows, exactly.
template <Isa kIsa>
void bf16_to_f32(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst) {
  using V = Vec<kIsa>;
  constexpr int L = V::kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * ld_src;
    float* d = dst + r * ld_dst;
    int64_t c = 0;
    for (; c + L <= cols; c += L) V::store(d + c, V::widen_bf16(s + c));
    if (c < cols) {
      const int n = static_cast<int>(cols - c);
      V::store_first(d + c, V::widen_bf16_first(s + c, n), n);
    }
  }
}

}  // namespace
}  // namespace tp::cpu
