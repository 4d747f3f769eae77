#pragma once
// The FP8 E4M3 kernels' loops (cpu_kernels.h), once over cpu::Vec<kIsa>: the GEMV
// (M = 1), the panel GEMM (M >= 2), the large-M outer-product GEMM and the decode.
// Included only by cpu_kernels_avx2.cpp and cpu_kernels_avx512.cpp, each compiled with
// its ISA's flags; everything here is in an anonymous namespace (cpu/vec.h says why).
// A chunk of x and of a weight row is kChunk = 4 kLanes codes: one integer vector of
// codes, four float vectors. B is a TU's blocking (its table): B::kIsa, the
// microkernel's kNr, kLargeM, and the large-M tile kLMr x kLNr with its kLKc, kLNc and
// B::tile (the register tile, hand-written per ISA).

#include <immintrin.h>

#include <cstdint>

#include "cpu/vec.h"
#include "quant/fp8/cpu_kernels.h"

namespace tp::detail {
namespace {

template <cpu::Isa kIsa>
using V = cpu::Vec<kIsa>;

template <cpu::Isa kIsa>
constexpr int64_t kChunkOf = 4 * V<kIsa>::kLanes;  // codes per integer vector -> 4 float vectors

// GEMM blocking: kNc weight rows x kKc packed columns decoded per panel (96 KB, L2),
// kMr x B::kNr output block per microkernel call.
constexpr int kMr = 4;
constexpr int64_t kNc = 24;
// Panel rows kPanelLd floats apart: not a multiple of 4 KB, so the rows a microkernel
// streams do not all fall into the same L1 sets.
constexpr int64_t kKc = 1024;
constexpr int64_t kPanelLd = kKc + 16;
constexpr int kGemvRows = 4;
constexpr int64_t kGemvBlock = 512;  // columns per pass of the GEMV (a multiple of 128 and kChunk)

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// `half` | 0x4000 in the int16 lanes where `hi` holds a NaN code (low 7 bits all ones)
// in its high byte: a NaN code came out of to_half as sign | 0x3f80, and 0x7f80 | sign
// is the float16 NaN that widens to c10's 0x7ff00000 | sign. AVX-512 selects by a mask
// register, AVX2 by a compare vector; the same bits either way.
#if defined(__AVX512F__)
inline __m512i mark_nan(__m512i hi, __m512i half) {
  const __m512i nan = _mm512_set1_epi16(0x7F00);
  const __m512i bit = _mm512_set1_epi16(0x4000);
  return _mm512_mask_blend_epi16(_mm512_cmpeq_epi16_mask(_mm512_and_si512(hi, nan), nan), half,
                                 _mm512_or_si512(half, bit));
}
#elif defined(__AVX2__)
inline __m256i mark_nan(__m256i hi, __m256i half) {
  const __m256i nan = _mm256_set1_epi16(0x7F00);
  const __m256i bit = _mm256_set1_epi16(0x4000);
  return _mm256_or_si256(half, _mm256_and_si256(_mm256_cmpeq_epi16(_mm256_and_si256(hi, nan), nan), bit));
}
#endif

// kChunk codes -> their float16 patterns, which are the values / 256: the even codes in
// `even`, the odd ones in `odd` (2 kLanes each).
template <cpu::Isa kIsa, bool kNan>
inline void to_half(typename V<kIsa>::I c, typename V<kIsa>::I& even, typename V<kIsa>::I& odd) {
  using Vf = V<kIsa>;
  const auto mask = Vf::set1_i16(static_cast<int16_t>(0xBF80));
  const auto even_hi = Vf::shift_left_i16(c, 8);  // even codes in the high bytes
  odd = Vf::and_i(Vf::shift_right_arith_i16(c, 1), mask);
  even = Vf::and_i(Vf::shift_right_arith_i16(even_hi, 1), mask);
  if (kNan) {
    odd = mark_nan(c, odd);
    even = mark_nan(even_hi, even);
  }
}

// A chunk's float16 patterns stored for vcvtph2ps to read from memory (cheaper than
// converting from registers: no lane extraction): even codes at h[0, 2 kLanes), odd at
// h[2 kLanes, 4 kLanes).
template <cpu::Isa kIsa, bool kNan>
inline void store_half(typename V<kIsa>::I c, uint16_t* h) {
  typename V<kIsa>::I even, odd;
  to_half<kIsa, kNan>(c, even, odd);
  V<kIsa>::store_i(h, even);
  V<kIsa>::store_i(h + 2 * V<kIsa>::kLanes, odd);
}

// Vector v (0..3) of a stored chunk in the packed order of x (L = kLanes): f[0] = codes
// 0, 2, .., 2L - 2; f[1] = 1, 3, .., 2L - 1; f[2] = 2L, 2L + 2, .., 4L - 2; f[3] = 2L + 1,
// .., 4L - 1.
template <cpu::Isa kIsa>
inline typename V<kIsa>::F half_vector(const uint16_t* h, int v) {
  constexpr int L = V<kIsa>::kLanes;
  return V<kIsa>::widen_f16(h + (v & 1) * 2 * L + (v >> 1) * L);
}

// ---- M = 1 ------------------------------------------------------------------------

// y[r] for the NR rows r0..r0+NR-1, one chunk of every row at a time, software-
// pipelined: while chunk c is widened from an L1 ring (vcvtph2ps from memory) and
// multiplied with x, chunk c + 1 is turned into float16 patterns (integer ops) and
// stored into the ring's other slot, so no reload waits on its store. Per scale group,
// each row's partial sum (of the values / 256) is multiplied by 256 and the scale
// into the row's total. (Widening from registers needs a lane extraction per vector:
// 19 instead of 17 vector ops per 64 codes, slower with the weight in L2; a whole
// block decoded ahead made the reloads wait on the stores. benchmarks/RESULTS.md, "Measurements behind the CPU kernels' shapes".)
// Cost at M = 1 (AVX-512, no NaN codes), per 64 codes of a row: 1 load, 1 shift + 2
// arithmetic shifts + 2 ANDs (to_half), 2 stores into the ring, 4 VCVTPH2PS from it, 4
// FMAs, and x's 4 vectors shared by the NR = 4 rows (1): 17, ~8.5 instructions per 32
// weights for the 32 bytes they are read from; a Zen 4 core reads ~4 bytes a cycle of
// DRAM (benchmarks/RESULTS.md, 2026-12-07, issue 47 part 3), so the decode is not the
// bound (an E4M3 -> bf16 decode for VDPBF16PS costs as much: the subnormal codes need a
// table, the sign a merge).
// The rows r0 + NR .. r0 + NR + ahead - 1 are prefetched block by block on the way:
// each row is a page of its own at K = 4096, and the hardware prefetchers stop at page
// boundaries, so without this every row would start with cold misses.
template <cpu::Isa kIsa, int NR, bool kNan>
void gemv_rows(const float* xp, const Fp8WeightView& w, int64_t r0, int ahead, float* y) {
  using Vf = V<kIsa>;
  using F = typename Vf::F;
  constexpr int L = Vf::kLanes;
  constexpr int64_t kChunk = kChunkOf<kIsa>;
  const int64_t k = w.k;
  const int64_t full = k / kChunk;
  const int64_t chunks = (k + kChunk - 1) / kChunk;
  const int64_t per_group = w.group >= k ? chunks : w.group / kChunk;
  constexpr int64_t kBlockChunks = kGemvBlock / kChunk;
  const uint8_t* rows[NR];
  const float* scales[NR];
  for (int r = 0; r < NR; ++r) {
    rows[r] = w.codes + (r0 + r) * w.ld;
    scales[r] = w.scale + (r0 + r) * w.scale_ld;
  }
  const F k256 = Vf::set1(256.0f);
  F total[NR], acc[NR][2];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) total[r] = acc[r][0] = acc[r][1] = Vf::zero();
  int64_t g = 0, in_group = 0;  // the scale group of chunk c, and its chunks so far
  alignas(64) uint16_t ring[2][NR][kChunk];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
    store_half<kIsa, kNan>(full > 0 ? Vf::load_i(rows[r]) : Vf::load_i_first(rows[r], static_cast<int>(k)), ring[0][r]);
  for (int64_t c = 0; c < chunks; ++c) {
    if (c % kBlockChunks == 0) {
      const int64_t end = imin((c + kBlockChunks) * kChunk, k);
      for (int r = 0; r < ahead; ++r) {
        const char* next = reinterpret_cast<const char*>(rows[0] + (NR + r) * w.ld);
        for (int64_t b = c * kChunk; b < end; b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
      }
    }
    const float* xc = xp + c * kChunk;
    const F x0 = Vf::load(xc), x1 = Vf::load(xc + L);
    const F x2 = Vf::load(xc + 2 * L), x3 = Vf::load(xc + 3 * L);
    if (c + 1 < chunks) {
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const int64_t cn = c + 1;
        store_half<kIsa, kNan>(cn < full ? Vf::load_i(rows[r] + cn * kChunk)
                                         : Vf::load_i_first(rows[r] + cn * kChunk, static_cast<int>(k - cn * kChunk)),
                               ring[cn & 1][r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const uint16_t* h = ring[c & 1][r];
      acc[r][0] = Vf::fma(half_vector<kIsa>(h, 0), x0, acc[r][0]);
      acc[r][1] = Vf::fma(half_vector<kIsa>(h, 1), x1, acc[r][1]);
      acc[r][0] = Vf::fma(half_vector<kIsa>(h, 2), x2, acc[r][0]);
      acc[r][1] = Vf::fma(half_vector<kIsa>(h, 3), x3, acc[r][1]);
    }
    if (++in_group == per_group || c + 1 == chunks) {  // the end of scale group g (no division per chunk)
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const F s = Vf::set1(scales[r][g]);
        total[r] = Vf::fma(Vf::mul(Vf::add(acc[r][0], acc[r][1]), k256), s, total[r]);
        acc[r][0] = acc[r][1] = Vf::zero();
      }
      in_group = 0;
      ++g;
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) y[r0 + r] = Vf::reduce(total[r]);
}

template <cpu::Isa kIsa, bool kNan>
void gemv(const float* xp, const Fp8WeightView& w, float* y, int64_t n0, int64_t n1) {
  int64_t r = n0;
  for (; r + kGemvRows <= n1; r += kGemvRows)
    gemv_rows<kIsa, kGemvRows, kNan>(xp, w, r, static_cast<int>(imin(kGemvRows, n1 - r - kGemvRows)), y);
  for (; r < n1; ++r) gemv_rows<kIsa, 1, kNan>(xp, w, r, r + 1 < n1 ? 1 : 0, y);
}

// ---- M >= 2 -----------------------------------------------------------------------

// out[p] = w_deq for the stored chunks h[0, len) (len a multiple of kChunk), in packed
// order, with the scale folded in as dequantize_weight does it: float(code) * scale,
// rounded once. The decode gives value / 256 exactly, so value / 256 * (256 * scale)
// is that same product with one rounding; only where 256 * scale overflows (scale >
// 2^120) does it take the two products.
template <cpu::Isa kIsa>
inline void scale_chunks(const uint16_t* h, int64_t len, float scale, float* out) {
  using Vf = V<kIsa>;
  constexpr int L = Vf::kLanes;
  constexpr int64_t kChunk = kChunkOf<kIsa>;
  const float folded = scale * 256.0f;
  if (folded - folded == 0.0f || scale - scale != 0.0f) {  // 256 * scale finite, or scale itself not
    const auto s = Vf::set1(folded);
    for (int64_t p = 0; p < len; p += kChunk)
      for (int v = 0; v < 4; ++v) Vf::store(out + p + v * L, Vf::mul(half_vector<kIsa>(h + p, v), s));
  } else {
    const auto k256 = Vf::set1(256.0f);
    const auto s = Vf::set1(scale);
    for (int64_t p = 0; p < len; p += kChunk)
      for (int v = 0; v < 4; ++v) Vf::store(out + p + v * L, Vf::mul(Vf::mul(half_vector<kIsa>(h + p, v), k256), s));
  }
}

// panel[r * ldp + p] = w_deq of rows r0 + r, packed columns kb + p (p < kl).
template <cpu::Isa kIsa, bool kNan>
void decode_panel(const Fp8WeightView& w, int64_t r0, int64_t rows, int64_t kb, int64_t kl, float* panel, int64_t ldp) {
  using Vf = V<kIsa>;
  constexpr int64_t kChunk = kChunkOf<kIsa>;
  const int64_t full = w.k / kChunk;
  alignas(64) uint16_t half[kKc];
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = w.codes + (r0 + r) * w.ld;
    const float* srow = w.scale + (r0 + r) * w.scale_ld;
    float* dst = panel + r * ldp;
    const int64_t p_full = imin(kl, full * kChunk - kb);  // columns of whole chunks
    for (int64_t p = 0; p < p_full; p += kChunk) store_half<kIsa, kNan>(Vf::load_i(src + kb + p), half + p);
    if (p_full < kl)
      store_half<kIsa, kNan>(Vf::load_i_first(src + kb + p_full, static_cast<int>(w.k - kb - p_full)), half + p_full);
    // Scale group by scale group (w.group is a multiple of kChunk, or covers the row).
    for (int64_t p0 = 0; p0 < kl;) {
      const int64_t g = w.group >= w.k ? 0 : (kb + p0) / w.group;
      const int64_t p1 = w.group >= w.k ? kl : imin(kl, (g + 1) * w.group - kb);
      scale_chunks<kIsa>(half + p0, p1 - p0, srow[g], dst + p0);
      p0 = p1;
    }
  }
}

// Asks for the codes of rows [r0, r0 + rows), columns [kb, kb + kl) to be brought into
// L2 while the current panel is multiplied: the panel walks 24 rows of 1 KB each, too
// short for the hardware prefetchers to ramp up on.
inline void prefetch_panel(const Fp8WeightView& w, int64_t r0, int64_t rows, int64_t kb, int64_t kl) {
  const int64_t end = imin(kb + kl, w.k);
  for (int64_t r = 0; r < rows; ++r) {
    const char* row = reinterpret_cast<const char*>(w.codes + (r0 + r) * w.ld);
    for (int64_t c = kb; c < end; c += 64) _mm_prefetch(row + c, _MM_HINT_T1);
  }
}

// y[i, j] (+)= sum_p x[i, p] * wp[j, p] for i < MR, j < NR, p < kl (kl a multiple of
// kLanes). Each row's NR sums come out of reduce4, four at a time.
template <cpu::Isa kIsa, int MR, int NR>
void micro(const float* x, int64_t ldx, const float* wp, int64_t ldw, int64_t kl, float* y, int64_t ldy,
           bool accumulate) {
  using Vf = V<kIsa>;
  using F = typename Vf::F;
  F c[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) c[i][j] = Vf::zero();
  for (int64_t p = 0; p < kl; p += Vf::kLanes) {
    F b[NR];
    for (int j = 0; j < NR; ++j) b[j] = Vf::load(wp + j * ldw + p);
    for (int i = 0; i < MR; ++i) {
      const F a = Vf::load(x + i * ldx + p);
      for (int j = 0; j < NR; ++j) c[i][j] = Vf::fma(a, b[j], c[i][j]);
    }
  }
  const F z = Vf::zero();
  for (int i = 0; i < MR; ++i) {
    alignas(16) float s[(NR + 3) / 4 * 4];
    const auto at = [&](int j) { return j < NR ? c[i][j < NR ? j : 0] : z; };
    for (int j = 0; j < NR; j += 4) _mm_store_ps(s + j, Vf::reduce4(at(j), at(j + 1), at(j + 2), at(j + 3)));
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = accumulate ? y[i * ldy + j] + s[j] : s[j];
  }
}

using MicroFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, bool);

// micro<MR, nr> for nr in J..NR.
template <cpu::Isa kIsa, int MR, int NR, int J = 1>
constexpr MicroFn micro_for(int nr) {
  if constexpr (J == NR) {
    return &micro<kIsa, MR, J>;
  } else {
    return nr == J ? &micro<kIsa, MR, J> : micro_for<kIsa, MR, NR, J + 1>(nr);
  }
}

// micro<mr, nr> for mr in I..kMr, nr in 1..NR.
template <cpu::Isa kIsa, int NR, int I = 1>
MicroFn micro_table(int mr, int nr) {
  if constexpr (I == kMr) {
    return micro_for<kIsa, I, NR>(nr);
  } else {
    return mr == I ? micro_for<kIsa, I, NR>(nr) : micro_table<kIsa, NR, I + 1>(mr, nr);
  }
}

template <class B, bool kNan>
void gemm(const float* xp, int64_t m, int64_t ld_xp, const Fp8WeightView& w, float* y, int64_t ld_y, int64_t n0,
          int64_t n1) {
  constexpr int64_t kChunk = kChunkOf<B::kIsa>;
  const int64_t kpad = (w.k + kChunk - 1) / kChunk * kChunk;
  alignas(64) float panel[kNc * kPanelLd];
  for (int64_t np = n0; np < n1; np += kNc) {
    const int64_t rows = imin(kNc, n1 - np);
    for (int64_t kb = 0; kb < kpad; kb += kKc) {
      const int64_t kl = imin(kKc, kpad - kb);
      decode_panel<B::kIsa, kNan>(w, np, rows, kb, kl, panel, kPanelLd);
      if (kb + kKc < kpad) {
        prefetch_panel(w, np, rows, kb + kKc, kKc);
      } else if (np + kNc < n1) {
        prefetch_panel(w, np + kNc, imin(kNc, n1 - np - kNc), 0, kKc);
      }
      for (int64_t i = 0; i < m; i += kMr) {
        const int mr = static_cast<int>(imin(kMr, m - i));
        for (int64_t j = 0; j < rows; j += B::kNr) {
          const int nr = static_cast<int>(imin(B::kNr, rows - j));
          micro_table<B::kIsa, B::kNr>(mr, nr)(xp + i * ld_xp + kb, ld_xp, panel + j * kPanelLd, kPanelLd, kl,
                                               y + i * ld_y + np + j, ld_y, kb > 0);
        }
      }
    }
  }
}

// ---- large M: outer products on a transposed panel ---------------------------------
//
// Past a few dozen x rows (B::kLargeM) the dot-product microkernel's per-block
// horizontal sums and its loads per FMA (AVX2: 7 per 12) fall behind a BLAS-style
// kernel: here the decoded panel is transposed into slivers of kLNr weight rows ([k]
// [kLNr], two vectors per k), and a kLMr x kLNr register tile (B::tile) accumulates
// x[i, k] (broadcast) * sliver[k] over a kLKc-column block: 2 kLMr FMAs per 2 vector
// loads and kLMr broadcasts, no horizontal sums.

// bp[s][p][j] = panel[s * kLNr + j][p] for the slivers of `rows` panel rows (rows past
// `rows` read as 0), p < kl (a multiple of 8): 8 x 8 transposes of ymm on either ISA.
template <int kLNr>
void transpose_slivers(const float* panel, int64_t ldp, int64_t rows, int64_t kl, float* bp) {
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t s = 0; s * kLNr < rows; ++s) {
    float* out = bp + s * kl * kLNr;
    for (int q = 0; q < kLNr / 8; ++q) {
      const int64_t r0 = s * kLNr + q * 8;
      for (int64_t p = 0; p < kl; p += 8) {
        __m256 v[8];
        for (int j = 0; j < 8; ++j) v[j] = r0 + j < rows ? _mm256_loadu_ps(panel + (r0 + j) * ldp + p) : zero;
        const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
        const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
        const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
        const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
        const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
        const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        const __m256 o[8] = {_mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
                             _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
                             _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
                             _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(out + (p + j) * kLNr + q * 8, o[j]);
      }
    }
  }
}

// y[i, 0..cols) (+)= the tile's sums t[i][0..cols) for i < mr; nothing of y past cols
// is read or written.
template <cpu::Isa kIsa, int kLNr>
void outer_store(const float* t, int mr, float* y, int64_t ldy, int cols, bool accumulate) {
  using Vf = V<kIsa>;
  constexpr int L = Vf::kLanes;
  for (int i = 0; i < mr; ++i) {
    float* yi = y + i * ldy;
    for (int v = 0; v < kLNr / L; ++v) {
      const int left = cols - L * v;
      auto o = Vf::load(t + i * kLNr + L * v);
      if (left >= L) {
        if (accumulate) o = Vf::add(o, Vf::load(yi + L * v));
        Vf::store(yi + L * v, o);
      } else if (left > 0) {
        if (accumulate) o = Vf::add(o, Vf::load_first(yi + L * v, left));
        Vf::store_first(yi + L * v, o, left);
      }
    }
  }
}

template <class B, bool kNan>
void gemm_large(const float* xp, int64_t m, int64_t ld_xp, const Fp8WeightView& w, float* y, int64_t ld_y, int64_t n0,
                int64_t n1) {
  constexpr int64_t kChunk = kChunkOf<B::kIsa>;
  constexpr int kLMr = B::kLMr, kLNr = B::kLNr;
  constexpr int64_t kLKc = B::kLKc, kLNc = B::kLNc, kLPanelLd = kLKc + 16;
  const int64_t kpad = (w.k + kChunk - 1) / kChunk * kChunk;
  alignas(64) float panel[kLNc * kLPanelLd];
  alignas(64) float bp[kLNc * kLKc];
  alignas(64) float t[kLMr * kLNr];
  for (int64_t np = n0; np < n1; np += kLNc) {
    const int64_t rows = imin(kLNc, n1 - np);
    for (int64_t kb = 0; kb < kpad; kb += kLKc) {
      const int64_t kl = imin(kLKc, kpad - kb);
      decode_panel<B::kIsa, kNan>(w, np, rows, kb, kl, panel, kLPanelLd);
      transpose_slivers<kLNr>(panel, kLPanelLd, rows, kl, bp);
      if (kb + kLKc < kpad) {
        prefetch_panel(w, np, rows, kb + kLKc, kLKc);
      } else if (np + kLNc < n1) {
        prefetch_panel(w, np + kLNc, imin(kLNc, n1 - np - kLNc), 0, kLKc);
      }
      for (int64_t i = 0; i < m; i += kLMr) {
        const int mr = static_cast<int>(imin(kLMr, m - i));
        for (int64_t s = 0; s * kLNr < rows; ++s) {
          B::tile(xp + i * ld_xp + kb, ld_xp, bp + s * kl * kLNr, kl, mr, t);
          outer_store<B::kIsa, kLNr>(t, mr, y + i * ld_y + np + s * kLNr, ld_y,
                                     static_cast<int>(imin(kLNr, rows - s * kLNr)), kb > 0);
        }
      }
    }
  }
}

// ---- entry points -------------------------------------------------------------------

// fp8_gemm_<isa>: the GEMV, the panel GEMM or the large-M GEMM by M.
template <class B>
void gemm_by_m(const float* xp, int64_t m, int64_t ld_xp, const Fp8WeightView& w, float* y, int64_t ld_y, int64_t n0,
               int64_t n1) {
  if (n0 >= n1 || m <= 0) return;
  if (m == 1) {
    w.nan_codes ? gemv<B::kIsa, true>(xp, w, y, n0, n1) : gemv<B::kIsa, false>(xp, w, y, n0, n1);
  } else if (m < B::kLargeM) {
    w.nan_codes ? gemm<B, true>(xp, m, ld_xp, w, y, ld_y, n0, n1) : gemm<B, false>(xp, m, ld_xp, w, y, ld_y, n0, n1);
  } else {
    w.nan_codes ? gemm_large<B, true>(xp, m, ld_xp, w, y, ld_y, n0, n1)
                : gemm_large<B, false>(xp, m, ld_xp, w, y, ld_y, n0, n1);
  }
}

// fp8_decode_<isa>: chunk by chunk through the GEMM panels' decode and scale fold.
template <cpu::Isa kIsa>
void decode(const uint8_t* codes, int64_t count, float scale, bool nan_codes, float* out) {
  using Vf = V<kIsa>;
  constexpr int L = Vf::kLanes;
  constexpr int64_t kChunk = kChunkOf<kIsa>;
  alignas(64) uint16_t h[kChunk];
  alignas(64) float tmp[kChunk];
  for (int64_t c = 0; c < count; c += kChunk) {
    const int64_t len = imin(kChunk, count - c);
    const auto codes_v = len == kChunk ? Vf::load_i(codes + c) : Vf::load_i_first(codes + c, static_cast<int>(len));
    nan_codes ? store_half<kIsa, true>(codes_v, h) : store_half<kIsa, false>(codes_v, h);
    scale_chunks<kIsa>(h, kChunk, scale, tmp);
    // Back to natural order: packed position v * L + j holds code (v / 2) * 2 * L + 2j + v % 2.
    for (int v = 0; v < 4; ++v)
      for (int j = 0; j < L; ++j) {
        const int64_t idx = (v / 2) * 2 * L + 2 * j + v % 2;
        if (idx < len) out[c + idx] = tmp[v * L + j];
      }
  }
}

}  // namespace
}  // namespace tp::detail
