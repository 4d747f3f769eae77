// The W8A8 kernels for AVX2 (vpmaddubsw with the sign trick) and AVX-VNNI (vpdpbusd on
// x + 128); see w8a8_kernels.h. Compiled with -mavx2 -mfma -mf16c; the AVX-VNNI
// functions carry their own target attribute and are entered only when the CPU has
// AVX-VNNI. Everything but the exported functions stays in the anonymous namespace,
// and no header with inline functions other TUs share is included (ODR).

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/int8/w8a8_kernels.h"

#define TP_AVX_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

namespace tp::detail {

namespace {

constexpr int64_t kChunk = 32;  // int8 products per 256-bit vector
constexpr int kMaxNr = 4;
constexpr int64_t kXBlockBytes = 256 << 10;  // x rows per block: ~256 KB of packed x (L2)

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

inline __m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

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
// (<= 32512, never saturating) -> int32 with vpmaddwd by ones.
// sums[i][j] (+)= the products of `count` chunks: x rows from column xoff, weight row j
// from w[j] (chunk c at w[j] + c * wstride). A function of its own with its vector
// accumulators local, so that the compiler keeps them in registers (GCC 12 leaves a
// vector array that a lambda captures or a helper takes by reference in memory).
template <int MR, int NR>
void tile_sign(const uint8_t* x, int64_t ld_x, int64_t xoff, const int8_t* const* w, int64_t wstride, int64_t count,
               int32_t (&sums)[MR][NR], bool add) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_si256();
  for (int64_t c = 0; c < count; ++c) {
    __m256i wv[NR], aw[NR];
    for (int j = 0; j < NR; ++j) {
      wv[j] = load(w[j] + c * wstride);
      aw[j] = _mm256_abs_epi8(wv[j]);
    }
    for (int i = 0; i < MR; ++i) {
      const __m256i xv = load(x + i * ld_x + xoff + c * kChunk);
      for (int j = 0; j < NR; ++j) {
        const __m256i p = _mm256_maddubs_epi16(aw[j], _mm256_sign_epi8(xv, wv[j]));
        acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(p, ones));
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) sums[i][j] = (add ? sums[i][j] : 0) + hsum(acc[i][j]);
}

// AVX-VNNI: (x + 128) (u8) x w (s8), 4 products per int32 lane, exact.
// sums[i][j] (+)= the products of `count` chunks: x rows from column xoff, weight row j
// from w[j] (chunk c at w[j] + c * wstride). A function of its own with its vector
// accumulators local, so that the compiler keeps them in registers (GCC 12 leaves a
// vector array that a lambda captures or a helper takes by reference in memory).
template <int MR, int NR>
TP_AVX_VNNI void tile_vnni(const uint8_t* x, int64_t ld_x, int64_t xoff, const int8_t* const* w, int64_t wstride,
                           int64_t count, int32_t (&sums)[MR][NR], bool add) {
  __m256i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_si256();
  for (int64_t c = 0; c < count; ++c) {
    __m256i wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = load(w[j] + c * wstride);
    for (int i = 0; i < MR; ++i) {
      const __m256i xv = load(x + i * ld_x + xoff + c * kChunk);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_dpbusd_avx_epi32(acc[i][j], xv, wv[j]);
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
TP_AVX_VNNI void micro_vnni(const Tile& t) {
  int32_t sums[MR][NR];
  tile_vnni<MR, NR>(t.x, t.ld_x, 0, t.rows, kChunk, t.full, sums, false);
  if (t.tail) tile_vnni<MR, NR>(t.x, t.ld_x, t.full * kChunk, t.tails, 0, 1, sums, true);
  epilogue<MR, NR>(t, sums, true);
}

using MicroFn = void (*)(const Tile&);

// The microkernel of each (mr, nr) a path uses: mr 1..4, nr 1..4.
template <template <int, int> class K>
MicroFn pick(int mr, int nr) {
  static constexpr MicroFn table[4][4] = {
      {K<1, 1>::fn, K<1, 2>::fn, K<1, 3>::fn, K<1, 4>::fn},
      {K<2, 1>::fn, K<2, 2>::fn, K<2, 3>::fn, K<2, 4>::fn},
      {K<3, 1>::fn, K<3, 2>::fn, K<3, 3>::fn, K<3, 4>::fn},
      {K<4, 1>::fn, K<4, 2>::fn, K<4, 3>::fn, K<4, 4>::fn},
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

void w8a8_gemm_avx2(const uint8_t* xp, int64_t m, int64_t ld_xp, const float* x_scale, const W8a8WeightView& w,
                    float* y, int64_t ld_y, int64_t n0, int64_t n1) {
  if (m <= 0 || n0 >= n1) return;
  // M = 1: four weight rows per pass over x; otherwise 3 x rows x 2 weight rows (6
  // accumulators, the |w| and w of each row, ones and temporaries: 4 x 2 spills).
  m == 1 ? drive<Sign>(xp, m, ld_xp, x_scale, w, y, ld_y, n0, n1, 1, 4)
         : drive<Sign>(xp, m, ld_xp, x_scale, w, y, ld_y, n0, n1, 3, 2);
}

void w8a8_gemm_avx2_vnni(const uint8_t* xp, int64_t m, int64_t ld_xp, const float* x_scale, const W8a8WeightView& w,
                         float* y, int64_t ld_y, int64_t n0, int64_t n1) {
  if (m <= 0 || n0 >= n1) return;
  // 4 x 3: 12 accumulators, 3 weight vectors, one x vector.
  m == 1 ? drive<Vnni>(xp, m, ld_xp, x_scale, w, y, ld_y, n0, n1, 1, 4)
         : drive<Vnni>(xp, m, ld_xp, x_scale, w, y, ld_y, n0, n1, 4, 3);
}

}  // namespace tp::detail
