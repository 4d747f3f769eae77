#pragma once
// MXFP4's float32 rows kernel (rows.h), once over cpu::Vec and a TU's decode traits D:
// D::codes(p, bytes) loads one chunk's codes (4 L bytes, zeros past `bytes`), D::decode(v,
// i) gives nibble i (0..7) of each dword lane as its E2M1 value, D::group_scales(s, n)
// widens the scale bytes of L blocks (n valid, the rest read as 0) to 2^(s - 127), and
// D::chunk_scales(g, q) spreads those of chunk q (0..3) of the group over its lanes (lane
// j: block q L / 4 + j / 4). Included only by rows_avx2.cpp and rows_avx512.cpp, each
// compiled with its ISA's flags; everything here is in an anonymous namespace (cpu/vec.h
// says why).

#include <immintrin.h>

#include <cstdint>

#include "cpu/vec.h"
#include "quant/mxfp4/rows.h"

namespace tp::detail {
namespace {

// Rows [n0, n0 + R) of W against M rows of x; SPLIT accumulator chains over the nibbles
// (FMA latency, when M * R is small). `prefetch`: rows n0 + R .. n0 + 2R - 1 exist, and
// their chunk c is asked for while chunk c of these rows is used (a row is K / 2 bytes:
// the hardware prefetchers stop at page boundaries and start cold on each row).
template <class D, int M, int R, int SPLIT>
void rows_f32(const float* xp, int64_t ld_xp, const Mxfp4CpuWeight& w, float* y, int64_t ld_y, int64_t n0,
              bool prefetch) {
  using Vf = cpu::Vec<D::kIsa>;
  using F = typename Vf::F;
  using I = typename Vf::I;
  constexpr int L = Vf::kLanes;
  constexpr int64_t kChunk = 8 * L, kBytes = 4 * L, kBlocksPerChunk = L / 4;
  const int64_t ld = w.k / 2, nblocks = w.k / 32;
  const int64_t chunks = (w.k + kChunk - 1) / kChunk, full = w.k / kChunk;
  const uint8_t* row[R];
  const uint8_t* srow[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    row[r] = w.blocks + (n0 + r) * ld;
    srow[r] = w.scales + (n0 + r) * nblocks;
  }
  F total[M][R], group[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) group[r] = Vf::zero();
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) total[m][r] = Vf::zero();
  for (int64_t c = 0; c < chunks; ++c) {
    const int q = static_cast<int>(c % 4);
    if (q == 0) {
      const int64_t left = nblocks - c * kBlocksPerChunk;
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        group[r] = D::group_scales(srow[r] + c * kBlocksPerChunk, static_cast<int>(left < L ? left : L));
    }
    I v[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      v[r] =
          c < full ? Vf::load_i(row[r] + c * kBytes) : D::codes(row[r] + c * kBytes, static_cast<int>(ld - c * kBytes));
    if (prefetch) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(row[r] + R * ld + c * kBytes), _MM_HINT_T0);
    }
    F acc[SPLIT][M][R];
#pragma GCC unroll 8
    for (int s = 0; s < SPLIT; ++s)
#pragma GCC unroll 8
      for (int m = 0; m < M; ++m)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[s][m][r] = Vf::zero();
    const float* xc = xp + c * kChunk;
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      F e[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) e[r] = D::decode(v[r], i);
#pragma GCC unroll 8
      for (int m = 0; m < M; ++m) {
        const F a = Vf::load(xc + m * ld_xp + i * L);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[i % SPLIT][m][r] = Vf::fma(e[r], a, acc[i % SPLIT][m][r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const F s = D::chunk_scales(group[r], q);
#pragma GCC unroll 8
      for (int m = 0; m < M; ++m) {
        F a = acc[0][m][r];
#pragma GCC unroll 4
        for (int t = 1; t < SPLIT; ++t) a = Vf::add(a, acc[t][m][r]);
        total[m][r] = Vf::fma(a, s, total[m][r]);
      }
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) y[m * ld_y + n0 + r] = Vf::reduce(total[m][r]);
}

template <class D, int M, int R, int SPLIT>
void rows_f32_range(const float* xp, int64_t ld_xp, const Mxfp4CpuWeight& w, float* y, int64_t ld_y, int64_t n0,
                    int64_t n1) {
  int64_t n = n0;
  for (; n + R <= n1; n += R) rows_f32<D, M, R, SPLIT>(xp, ld_xp, w, y, ld_y, n, n + 2 * R <= n1);
  for (; n < n1; ++n) rows_f32<D, M, 1, 2>(xp, ld_xp, w, y, ld_y, n, false);
}

// By M (1..kMxfp4RowsMaxM): D::kR1 rows at once with two chains at M = 1, D::kR2 at M = 2,
// D::kR4 from M = 3 (the ISA's register budget).
template <class D>
void rows_f32_by_m(const float* xp, int64_t m, int64_t ld_xp, const Mxfp4CpuWeight& w, float* y, int64_t ld_y,
                   int64_t n0, int64_t n1) {
  switch (m) {
    case 1: rows_f32_range<D, 1, D::kR1, 2>(xp, ld_xp, w, y, ld_y, n0, n1); break;
    case 2: rows_f32_range<D, 2, D::kR2, 1>(xp, ld_xp, w, y, ld_y, n0, n1); break;
    case 3: rows_f32_range<D, 3, D::kR4, 1>(xp, ld_xp, w, y, ld_y, n0, n1); break;
    default: rows_f32_range<D, 4, D::kR4, 1>(xp, ld_xp, w, y, ld_y, n0, n1); break;
  }
}

}  // namespace
}  // namespace tp::detail
