// The W8A8 kernels for AVX-512 BW (vpmaddubsw with the sign trick) and AVX-512 VNNI
// (vpdpbusd on x + 128); see w8a8_kernels.h. The structure of the AVX2 file on 512-bit
// vectors. Compiled with the AVX-512 flags (VNNI included); the VNNI kernel is entered
// only when the CPU has AVX512_VNNI, the other only needs F + BW. Everything but the
// exported functions stays in the anonymous namespace (ODR, as in the AVX2 file).

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// "(may be) used uninitialized" (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/int8/w8a8_kernels.h"

namespace tp::detail {

namespace {

constexpr int64_t kChunk = 64;  // int8 products per 512-bit vector
constexpr int kMaxNr = 8;
constexpr int64_t kXBlockBytes = 256 << 10;  // x rows per block: ~256 KB of packed x (L2)

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

inline __m512i load(const void* p) { return _mm512_loadu_si512(p); }

inline int32_t hsum(__m512i v) { return _mm512_reduce_add_epi32(v); }

// The operands of one register tile: NR weight rows (full chunks read in place, the
// partial last chunk from a zero-padded copy) and MR rows of packed x.
struct Tile {
  const uint8_t* x;
  int64_t ld_x;
  const int8_t* rows[kMaxNr];
  const int8_t* tails[kMaxNr];
  int64_t full;  // whole chunks per row
  bool tail;     // a partial chunk follows
  const float* x_scale;
  const float* w_scale;
  const int32_t* row_sum;
  float* y;
  int64_t ld_y;
};

// y[i, j] = float(acc) * x_scale[i] * w_scale[j]; acc less 128 * row_sum for VNNI.
template <int MR, int NR>
inline void epilogue(const Tile& t, const int32_t (&acc)[MR][NR], bool offset) {
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      int32_t a = acc[i][j];
      if (offset) a = static_cast<int32_t>(static_cast<uint32_t>(a) - 128u * static_cast<uint32_t>(t.row_sum[j]));
      t.y[i * t.ld_y + j] = static_cast<float>(a) * t.x_scale[i] * t.w_scale[j];
    }
}

// Sign trick: |w| (u8, <= 128) x (x with w's sign) (s8, |.| <= 127) -> int16 pairs
// (<= 32512, never saturating) -> int32 with vpmaddwd by ones. AVX-512 has no vpsignb:
// x is negated under the mask of w's sign bits (where w = 0, |w| = 0 zeroes the product).
// sums[i][j] (+)= the products of `count` chunks: x rows from column xoff, weight row j
// from w[j] (chunk c at w[j] + c * wstride). A function of its own with its vector
// accumulators local, so that the compiler keeps them in registers (GCC 12 leaves a
// vector array that a lambda captures or a helper takes by reference in memory).
template <int MR, int NR>
void tile_sign(const uint8_t* x, int64_t ld_x, int64_t xoff, const int8_t* const* w, int64_t wstride, int64_t count,
               int32_t (&sums)[MR][NR], bool add) {
  const __m512i ones = _mm512_set1_epi16(1);
  const __m512i zero = _mm512_setzero_si512();
  __m512i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_si512();
  for (int64_t c = 0; c < count; ++c) {
    __m512i aw[NR];
    __mmask64 neg[NR];
    for (int j = 0; j < NR; ++j) {
      const __m512i wv = load(w[j] + c * wstride);
      aw[j] = _mm512_abs_epi8(wv);
      neg[j] = _mm512_movepi8_mask(wv);
    }
    for (int i = 0; i < MR; ++i) {
      const __m512i xv = load(x + i * ld_x + xoff + c * kChunk);
      for (int j = 0; j < NR; ++j) {
        const __m512i p = _mm512_maddubs_epi16(aw[j], _mm512_mask_sub_epi8(xv, neg[j], zero, xv));
        acc[i][j] = _mm512_add_epi32(acc[i][j], _mm512_madd_epi16(p, ones));
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) sums[i][j] = (add ? sums[i][j] : 0) + hsum(acc[i][j]);
}

// AVX-512 VNNI: (x + 128) (u8) x w (s8), 4 products per int32 lane, exact.
// sums[i][j] (+)= the products of `count` chunks: x rows from column xoff, weight row j
// from w[j] (chunk c at w[j] + c * wstride). A function of its own with its vector
// accumulators local, so that the compiler keeps them in registers (GCC 12 leaves a
// vector array that a lambda captures or a helper takes by reference in memory).
template <int MR, int NR>
void tile_vnni(const uint8_t* x, int64_t ld_x, int64_t xoff, const int8_t* const* w, int64_t wstride, int64_t count,
               int32_t (&sums)[MR][NR], bool add) {
  __m512i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_si512();
  for (int64_t c = 0; c < count; ++c) {
    __m512i wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = load(w[j] + c * wstride);
    for (int i = 0; i < MR; ++i) {
      const __m512i xv = load(x + i * ld_x + xoff + c * kChunk);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], xv, wv[j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) sums[i][j] = (add ? sums[i][j] : 0) + hsum(acc[i][j]);
}

// One register tile: the whole chunks read in place, the partial last chunk from the
// zero-padded copies, then the epilogue.
template <int MR, int NR>
void micro_sign(const Tile& t) {
  int32_t sums[MR][NR];
  tile_sign<MR, NR>(t.x, t.ld_x, 0, t.rows, kChunk, t.full, sums, false);
  if (t.tail) tile_sign<MR, NR>(t.x, t.ld_x, t.full * kChunk, t.tails, 0, 1, sums, true);
  epilogue<MR, NR>(t, sums, false);
}

template <int MR, int NR>
void micro_vnni(const Tile& t) {
  int32_t sums[MR][NR];
  tile_vnni<MR, NR>(t.x, t.ld_x, 0, t.rows, kChunk, t.full, sums, false);
  if (t.tail) tile_vnni<MR, NR>(t.x, t.ld_x, t.full * kChunk, t.tails, 0, 1, sums, true);
  epilogue<MR, NR>(t, sums, true);
}

using MicroFn = void (*)(const Tile&);

// The microkernel of each (mr, nr) a path uses: 1 x 1..8 (M = 1), 2..4 x 1..6.
template <template <int, int> class K>
MicroFn pick(int mr, int nr) {
  static constexpr MicroFn table[4][8] = {
      {K<1, 1>::fn, K<1, 2>::fn, K<1, 3>::fn, K<1, 4>::fn, K<1, 5>::fn, K<1, 6>::fn, K<1, 7>::fn, K<1, 8>::fn},
      {K<2, 1>::fn, K<2, 2>::fn, K<2, 3>::fn, K<2, 4>::fn, K<2, 5>::fn, K<2, 6>::fn, nullptr, nullptr},
      {K<3, 1>::fn, K<3, 2>::fn, K<3, 3>::fn, K<3, 4>::fn, K<3, 5>::fn, K<3, 6>::fn, nullptr, nullptr},
      {K<4, 1>::fn, K<4, 2>::fn, K<4, 3>::fn, K<4, 4>::fn, K<4, 5>::fn, K<4, 6>::fn, nullptr, nullptr},
  };
  return table[mr - 1][nr - 1];
}
template <int MR, int NR>
struct Sign {
  static constexpr MicroFn fn = &micro_sign<MR, NR>;
};
template <int MR, int NR>
struct Vnni {
  static constexpr MicroFn fn = &micro_vnni<MR, NR>;
};

// Rows [n0, n1) for all m rows: x in blocks of rows that stay in L2; per block, each
// tile of nr weight rows (in L1) meets every x row of the block.
template <template <int, int> class K>
void drive(const uint8_t* xp, int64_t m, int64_t ld_xp, const float* x_scale, const W8a8WeightView& w, float* y,
           int64_t ld_y, int64_t n0, int64_t n1, int mr_max, int nr_max) {
  const int64_t full = w.k / kChunk, rest = w.k % kChunk;
  int64_t mb = kXBlockBytes / (ld_xp > 0 ? ld_xp : 1) / mr_max * mr_max;
  if (mb < mr_max) mb = mr_max;
  alignas(32) int8_t tails[kMaxNr][kChunk];
  Tile t;
  t.ld_x = ld_xp;
  t.full = full;
  t.tail = rest != 0;
  t.ld_y = ld_y;
  for (int64_t i0 = 0; i0 < m; i0 += mb) {
    const int64_t i1 = imin(m, i0 + mb);
    for (int64_t r = n0; r < n1; r += nr_max) {
      const int nr = static_cast<int>(imin(nr_max, n1 - r));
      for (int j = 0; j < nr; ++j) {
        t.rows[j] = w.data + (r + j) * w.ld;
        if (rest != 0) {
          std::memset(tails[j], 0, kChunk);
          std::memcpy(tails[j], t.rows[j] + full * kChunk, static_cast<size_t>(rest));
        }
        t.tails[j] = tails[j];
      }
      t.w_scale = w.scale + r;
      t.row_sum = w.row_sum != nullptr ? w.row_sum + r : nullptr;
      for (int64_t i = i0; i < i1; i += mr_max) {
        const int mr = static_cast<int>(imin(mr_max, i1 - i));
        t.x = xp + i * ld_xp;
        t.x_scale = x_scale + i;
        t.y = y + i * ld_y + r;
        pick<K>(mr, nr)(t);
      }
    }
  }
}

}  // namespace

void w8a8_gemm_avx512(const uint8_t* xp, int64_t m, int64_t ld_xp, const float* x_scale, const W8a8WeightView& w,
                      float* y, int64_t ld_y, int64_t n0, int64_t n1) {
  if (m <= 0 || n0 >= n1) return;
  // M = 1: eight weight rows per pass over x; otherwise 4 x rows x 4 weight rows
  // (16 accumulators, 4 |w|, 4 sign masks).
  m == 1 ? drive<Sign>(xp, m, ld_xp, x_scale, w, y, ld_y, n0, n1, 1, 8)
         : drive<Sign>(xp, m, ld_xp, x_scale, w, y, ld_y, n0, n1, 4, 4);
}

void w8a8_gemm_avx512_vnni(const uint8_t* xp, int64_t m, int64_t ld_xp, const float* x_scale, const W8a8WeightView& w,
                           float* y, int64_t ld_y, int64_t n0, int64_t n1) {
  if (m <= 0 || n0 >= n1) return;
  // 4 x 4: 16 accumulators (GCC 12 handles 4 x 6 with a store per vpdpbusd, 1.7x slower).
  m == 1 ? drive<Vnni>(xp, m, ld_xp, x_scale, w, y, ld_y, n0, n1, 1, 8)
         : drive<Vnni>(xp, m, ld_xp, x_scale, w, y, ld_y, n0, n1, 4, 4);
}

}  // namespace tp::detail
