#pragma once
// The W8A8 kernels' loops (w8a8_kernels.h), once over cpu::Vec<kIsa>: the sign-trick
// tile (vpmaddubsw), the VNNI tile (vpdpbusd on x + 128), the register-tile
// microkernels and the driver that blocks x for L2. Included only by
// w8a8_kernels_avx2.cpp and w8a8_kernels_avx512.cpp, each compiled with its ISA's
// flags; everything here is in an anonymous namespace (cpu/vec.h says why). A chunk of
// K is one vector of bytes: 32 (AVX2) or 64 (AVX-512) products per row pair.

#include <cstdint>
#include <cstring>

#include "cpu/vec.h"
#include "quant/int8/w8a8_kernels.h"

// The VNNI functions' target. AVX512_VNNI is in the AVX-512 TU's flags; AVX-VNNI is
// not in the AVX2 TU's (Haswell to Zen 4 lack it), so there the VNNI functions carry it
// themselves. Either way they are entered only when the CPU has it.
#if defined(__AVX512F__)
#define TP_W8A8_VNNI
#elif defined(__AVX2__)
#define TP_W8A8_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#endif

namespace tp::detail {
namespace {

template <cpu::Isa kIsa>
using V = cpu::Vec<kIsa>;

#if defined(__AVX512F__)
/// acc + the 4 u8 x s8 products of each int32 lane, not saturating (AVX512_VNNI).
inline __m512i dpbusd(__m512i acc, __m512i u, __m512i s) { return _mm512_dpbusd_epi32(acc, u, s); }
#elif defined(__AVX2__)
/// acc + the 4 u8 x s8 products of each int32 lane, not saturating (AVX-VNNI, VEX).
TP_W8A8_VNNI inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
#endif

// int8 products per chunk: one vector of bytes.
template <cpu::Isa kIsa>
constexpr int64_t kChunk = sizeof(typename V<kIsa>::I);
// Weight rows per register tile at most, on either ISA (AVX-512's M = 1 tile).
constexpr int kMaxNr = 8;
constexpr int64_t kXBlockBytes = 256 << 10;  // x rows per block: ~256 KB of packed x (L2)

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

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
template <cpu::Isa kIsa, int MR, int NR>
void tile_sign(const uint8_t* x, int64_t ld_x, int64_t xoff, const int8_t* const* w, int64_t wstride, int64_t count,
               int32_t (&sums)[MR][NR], bool add) {
  using Vf = V<kIsa>;
  using I = typename Vf::I;
  const I ones = Vf::set1_i16(1);
  I acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = Vf::zero_i();
  for (int64_t c = 0; c < count; ++c) {
    I aw[NR];
    typename Vf::SignI8 sw[NR];
    for (int j = 0; j < NR; ++j) {
      const I wv = Vf::load_i(w[j] + c * wstride);
      aw[j] = Vf::abs_i8(wv);
      sw[j] = Vf::sign_i8(wv);
    }
    for (int i = 0; i < MR; ++i) {
      const I xv = Vf::load_i(x + i * ld_x + xoff + c * kChunk<kIsa>);
      for (int j = 0; j < NR; ++j) {
        const I p = Vf::maddubs_i16(aw[j], Vf::apply_sign_i8(xv, sw[j]));
        acc[i][j] = Vf::add_i(acc[i][j], Vf::madd_i16(p, ones));
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) sums[i][j] = (add ? sums[i][j] : 0) + Vf::reduce_i(acc[i][j]);
}

// VNNI: (x + 128) (u8) x w (s8), 4 products per int32 lane, exact.
// sums[i][j] (+)= the products of `count` chunks, as tile_sign's.
template <cpu::Isa kIsa, int MR, int NR>
TP_W8A8_VNNI void tile_vnni(const uint8_t* x, int64_t ld_x, int64_t xoff, const int8_t* const* w, int64_t wstride,
                            int64_t count, int32_t (&sums)[MR][NR], bool add) {
  using Vf = V<kIsa>;
  using I = typename Vf::I;
  I acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = Vf::zero_i();
  for (int64_t c = 0; c < count; ++c) {
    I wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = Vf::load_i(w[j] + c * wstride);
    for (int i = 0; i < MR; ++i) {
      const I xv = Vf::load_i(x + i * ld_x + xoff + c * kChunk<kIsa>);
      for (int j = 0; j < NR; ++j) acc[i][j] = dpbusd(acc[i][j], xv, wv[j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) sums[i][j] = (add ? sums[i][j] : 0) + Vf::reduce_i(acc[i][j]);
}

// One register tile: the whole chunks read in place, the partial last chunk from the
// zero-padded copies, then the epilogue.
template <cpu::Isa kIsa, int MR, int NR>
void micro_sign(const Tile& t) {
  int32_t sums[MR][NR];
  tile_sign<kIsa, MR, NR>(t.x, t.ld_x, 0, t.rows, kChunk<kIsa>, t.full, sums, false);
  if (t.tail) tile_sign<kIsa, MR, NR>(t.x, t.ld_x, t.full * kChunk<kIsa>, t.tails, 0, 1, sums, true);
  epilogue<MR, NR>(t, sums, false);
}

template <cpu::Isa kIsa, int MR, int NR>
TP_W8A8_VNNI void micro_vnni(const Tile& t) {
  int32_t sums[MR][NR];
  tile_vnni<kIsa, MR, NR>(t.x, t.ld_x, 0, t.rows, kChunk<kIsa>, t.full, sums, false);
  if (t.tail) tile_vnni<kIsa, MR, NR>(t.x, t.ld_x, t.full * kChunk<kIsa>, t.tails, 0, 1, sums, true);
  epilogue<MR, NR>(t, sums, true);
}

using MicroFn = void (*)(const Tile&);

// The two paths' microkernels, Sign<kIsa>::At<MR, NR>::fn and Vnni's, for a TU's table
// of the (mr, nr) each path uses (tiles[mr - 1][nr - 1]; the ISA's register budget).
template <cpu::Isa kIsa>
struct Sign {
  template <int MR, int NR>
  struct At {
    static constexpr MicroFn fn = &micro_sign<kIsa, MR, NR>;
  };
};
template <cpu::Isa kIsa>
struct Vnni {
  template <int MR, int NR>
  struct At {
    static constexpr MicroFn fn = &micro_vnni<kIsa, MR, NR>;
  };
};

// Rows [n0, n1) for all m rows: x in blocks of rows that stay in L2; per block, each
// tile of nr weight rows (in L1) meets every x row of the block.
template <cpu::Isa kIsa, int kCols>
void drive(const MicroFn (&tiles)[4][kCols], const uint8_t* xp, int64_t m, int64_t ld_xp, const float* x_scale,
           const W8a8WeightView& w, float* y, int64_t ld_y, int64_t n0, int64_t n1, int mr_max, int nr_max) {
  static_assert(kCols <= kMaxNr, "a tile of more weight rows than Tile holds");
  constexpr int64_t kC = kChunk<kIsa>;
  const int64_t full = w.k / kC, rest = w.k % kC;
  int64_t mb = kXBlockBytes / (ld_xp > 0 ? ld_xp : 1) / mr_max * mr_max;
  if (mb < mr_max) mb = mr_max;
  alignas(32) int8_t tails[kMaxNr][kC];
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
          std::memset(tails[j], 0, kC);
          std::memcpy(tails[j], t.rows[j] + full * kC, static_cast<size_t>(rest));
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
        tiles[mr - 1][nr - 1](t);
      }
    }
  }
}

// A path's register tiles: nr_m1 weight rows at M = 1, mr x rows x nr weight rows else.
struct Shape {
  int nr_m1, mr, nr;
};

// One path's kernel (w8a8_kernels.h): its tiles table and shape, the ISA's choice.
template <cpu::Isa kIsa, int kCols>
void gemm(const MicroFn (&tiles)[4][kCols], Shape shape, const uint8_t* xp, int64_t m, int64_t ld_xp,
          const float* x_scale, const W8a8WeightView& w, float* y, int64_t ld_y, int64_t n0, int64_t n1) {
  if (m <= 0 || n0 >= n1) return;
  m == 1 ? drive<kIsa>(tiles, xp, m, ld_xp, x_scale, w, y, ld_y, n0, n1, 1, shape.nr_m1)
         : drive<kIsa>(tiles, xp, m, ld_xp, x_scale, w, y, ld_y, n0, n1, shape.mr, shape.nr);
}

}  // namespace
}  // namespace tp::detail

#undef TP_W8A8_VNNI
