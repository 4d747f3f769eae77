// The FP8 E4M3 kernels for AVX-512 (F, BW, VL, DQ) + F16C: the AVX2 kernels' structure
// (see cpu_kernels.h) on 512-bit vectors, 64 codes per load. Compiled with the
// AVX-512 flags; entered only when cpu::isa() allows AVX-512. Everything but the
// exported functions stays in the anonymous namespace (ODR, as in the AVX2 file).

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// "(may be) used uninitialized" (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/fp8/cpu_kernels.h"

namespace tp::detail {

namespace {

constexpr int kLanes = 16;
constexpr int64_t kChunk = kFp8ChunkAvx512;  // codes per 512-bit load -> 4 float vectors

// GEMM blocking: kNc weight rows x kKc packed columns decoded per panel (96 KB, L2),
// kMr x kNr output block per microkernel call (24 accumulators of 32 registers).
constexpr int kMr = 4;
constexpr int kNr = 6;
constexpr int64_t kNc = 24;
// Panel rows kPanelLd floats apart: not a multiple of 4 KB, so the rows a microkernel
// streams do not all fall into the same L1 sets.
constexpr int64_t kKc = 1024;
constexpr int64_t kPanelLd = kKc + 16;
constexpr int kGemvRows = 4;
constexpr int64_t kLargeM = 80;      // from this many x rows on, the outer-product kernel (measured crossover)
constexpr int64_t kGemvBlock = 512;  // columns per pass of the GEMV (a multiple of 128 and kChunk)

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

inline __m512i load_codes(const uint8_t* p) { return _mm512_loadu_si512(p); }

// The partial last chunk of a row: codes past the row's end read as 0 (+0.0).
inline __m512i load_tail(const uint8_t* p, int64_t count) {
  return _mm512_maskz_loadu_epi8(static_cast<__mmask64>((~0ULL) >> (64 - count)), p);
}

// 64 codes -> their float16 patterns, which are the values / 256: the even codes in
// `even`, the odd ones in `odd` (32 each).
template <bool kNan>
inline void to_half(__m512i c, __m512i& even, __m512i& odd) {
  const __m512i mask = _mm512_set1_epi16(static_cast<short>(0xBF80));
  const __m512i even_hi = _mm512_slli_epi16(c, 8);  // even codes in the high bytes
  odd = _mm512_and_si512(_mm512_srai_epi16(c, 1), mask);
  even = _mm512_and_si512(_mm512_srai_epi16(even_hi, 1), mask);
  if (kNan) {
    // As in the AVX2 decode: NaN codes -> float16 0x7f80 | sign (c10's 0x7ff00000 | sign).
    const __m512i nan = _mm512_set1_epi16(0x7F00);
    const __m512i bit = _mm512_set1_epi16(0x4000);
    odd =
        _mm512_mask_blend_epi16(_mm512_cmpeq_epi16_mask(_mm512_and_si512(c, nan), nan), odd, _mm512_or_si512(odd, bit));
    even = _mm512_mask_blend_epi16(_mm512_cmpeq_epi16_mask(_mm512_and_si512(even_hi, nan), nan), even,
                                   _mm512_or_si512(even, bit));
  }
}

// A chunk's float16 patterns stored for vcvtph2ps to read from memory: even codes at
// h[0..31], odd at h[32..63].
template <bool kNan>
inline void store_half(__m512i c, uint16_t* h) {
  __m512i even, odd;
  to_half<kNan>(c, even, odd);
  _mm512_store_si512(h, even);
  _mm512_store_si512(h + 32, odd);
}

// Vector v (0..3) of a stored chunk in the packed order of x: f[0] = codes 0,2,..,30;
// f[1] = 1,3,..,31; f[2] = 32,34,..,62; f[3] = 33,..,63.
inline __m512 half_vector(const uint16_t* h, int v) {
  const int offset = (v & 1) * 32 + (v >> 1) * 16;
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h + offset)));
}

inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

inline __m256 fold(__m512 v) { return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)); }

// The four sums of a, b, c, d.
inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(fold(a), fold(b)), _mm256_hadd_ps(fold(c), fold(d)));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// ---- M = 1 ------------------------------------------------------------------------

// y[r] for the NR rows r0..r0+NR-1, one chunk of every row at a time, software-
// pipelined: while chunk c is widened from an L1 ring (vcvtph2ps from memory) and
// multiplied with x, chunk c + 1 is turned into float16 patterns (integer ops) and
// stored into the ring's other slot, so no reload waits on its store. Per scale group,
// each row's partial sum (of the values / 256) is multiplied by 256 and the scale
// into the row's total. (Widening from registers needs a lane extraction per vector:
// 19 instead of 17 vector ops per 64 codes, ~1.5x slower with the weight in L2; a
// whole block decoded ahead made the reloads wait on the stores.)
// The rows r0 + NR .. r0 + NR + ahead - 1 are prefetched block by block on the way:
// each row is a page of its own at K = 4096, and the hardware prefetchers stop at page
// boundaries, so without this every row would start with cold misses.
template <int NR, bool kNan>
void gemv_rows(const float* xp, const Fp8WeightView& w, int64_t r0, int ahead, float* y) {
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
  const __m512 k256 = _mm512_set1_ps(256.0f);
  __m512 total[NR], acc[NR][2];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) total[r] = acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  int64_t g = 0, in_group = 0;  // the scale group of chunk c, and its chunks so far
  alignas(64) uint16_t ring[2][NR][kChunk];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) store_half<kNan>(full > 0 ? load_codes(rows[r]) : load_tail(rows[r], k), ring[0][r]);
  for (int64_t c = 0; c < chunks; ++c) {
    if (c % kBlockChunks == 0) {
      const int64_t end = imin((c + kBlockChunks) * kChunk, k);
      for (int r = 0; r < ahead; ++r) {
        const char* next = reinterpret_cast<const char*>(rows[0] + (NR + r) * w.ld);
        for (int64_t b = c * kChunk; b < end; b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
      }
    }
    const float* xc = xp + c * kChunk;
    const __m512 x0 = _mm512_loadu_ps(xc), x1 = _mm512_loadu_ps(xc + 16);
    const __m512 x2 = _mm512_loadu_ps(xc + 32), x3 = _mm512_loadu_ps(xc + 48);
    if (c + 1 < chunks) {
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const int64_t cn = c + 1;
        store_half<kNan>(
            cn < full ? load_codes(rows[r] + cn * kChunk) : load_tail(rows[r] + cn * kChunk, k - cn * kChunk),
            ring[cn & 1][r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const uint16_t* h = ring[c & 1][r];
      acc[r][0] = _mm512_fmadd_ps(half_vector(h, 0), x0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(half_vector(h, 1), x1, acc[r][1]);
      acc[r][0] = _mm512_fmadd_ps(half_vector(h, 2), x2, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(half_vector(h, 3), x3, acc[r][1]);
    }
    if (++in_group == per_group || c + 1 == chunks) {  // the end of scale group g (no division per chunk)
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const __m512 s = _mm512_set1_ps(scales[r][g]);
        total[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_add_ps(acc[r][0], acc[r][1]), k256), s, total[r]);
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
      }
      in_group = 0;
      ++g;
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) y[r0 + r] = hsum(total[r]);
}

template <bool kNan>
void gemv(const float* xp, const Fp8WeightView& w, float* y, int64_t n0, int64_t n1) {
  int64_t r = n0;
  for (; r + kGemvRows <= n1; r += kGemvRows)
    gemv_rows<kGemvRows, kNan>(xp, w, r, static_cast<int>(imin(kGemvRows, n1 - r - kGemvRows)), y);
  for (; r < n1; ++r) gemv_rows<1, kNan>(xp, w, r, r + 1 < n1 ? 1 : 0, y);
}

// ---- M >= 2 -----------------------------------------------------------------------

// out[p] = w_deq for the stored chunks h[0, len) (len a multiple of kChunk), in packed
// order, with the scale folded in as dequantize_weight does it: float(code) * scale,
// rounded once. The decode gives value / 256 exactly, so value / 256 * (256 * scale)
// is that same product with one rounding; only where 256 * scale overflows (scale >
// 2^120) does it take the two products.
inline void scale_chunks(const uint16_t* h, int64_t len, float scale, float* out) {
  const float folded = scale * 256.0f;
  if (folded - folded == 0.0f || scale - scale != 0.0f) {  // 256 * scale finite, or scale itself not
    const __m512 s = _mm512_set1_ps(folded);
    for (int64_t p = 0; p < len; p += kChunk)
      for (int v = 0; v < 4; ++v) _mm512_storeu_ps(out + p + v * kLanes, _mm512_mul_ps(half_vector(h + p, v), s));
  } else {
    const __m512 k256 = _mm512_set1_ps(256.0f);
    const __m512 s = _mm512_set1_ps(scale);
    for (int64_t p = 0; p < len; p += kChunk)
      for (int v = 0; v < 4; ++v)
        _mm512_storeu_ps(out + p + v * kLanes, _mm512_mul_ps(_mm512_mul_ps(half_vector(h + p, v), k256), s));
  }
}

// panel[r * ldp + p] = w_deq of rows r0 + r, packed columns kb + p (p < kl).
template <bool kNan>
void decode_panel(const Fp8WeightView& w, int64_t r0, int64_t rows, int64_t kb, int64_t kl, float* panel, int64_t ldp) {
  const int64_t full = w.k / kChunk;
  alignas(64) uint16_t half[kKc];
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = w.codes + (r0 + r) * w.ld;
    const float* srow = w.scale + (r0 + r) * w.scale_ld;
    float* dst = panel + r * ldp;
    const int64_t p_full = imin(kl, full * kChunk - kb);  // columns of whole chunks
    for (int64_t p = 0; p < p_full; p += kChunk) store_half<kNan>(load_codes(src + kb + p), half + p);
    if (p_full < kl) store_half<kNan>(load_tail(src + kb + p_full, w.k - kb - p_full), half + p_full);
    // Scale group by scale group (w.group is a multiple of kChunk, or covers the row).
    for (int64_t p0 = 0; p0 < kl;) {
      const int64_t g = w.group >= w.k ? 0 : (kb + p0) / w.group;
      const int64_t p1 = w.group >= w.k ? kl : imin(kl, (g + 1) * w.group - kb);
      scale_chunks(half + p0, p1 - p0, srow[g], dst + p0);
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

// y[i, j] (+)= sum_p x[i, p] * wp[j, p] for i < MR, j < NR, p < kl (kl a multiple of 16).
template <int MR, int NR>
void micro(const float* x, int64_t ldx, const float* wp, int64_t ldw, int64_t kl, float* y, int64_t ldy,
           bool accumulate) {
  __m512 c[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) c[i][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kl; p += kLanes) {
    __m512 b[NR];
    for (int j = 0; j < NR; ++j) b[j] = _mm512_loadu_ps(wp + j * ldw + p);
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_loadu_ps(x + i * ldx + p);
      for (int j = 0; j < NR; ++j) c[i][j] = _mm512_fmadd_ps(a, b[j], c[i][j]);
    }
  }
  const __m512 z = _mm512_setzero_ps();
  for (int i = 0; i < MR; ++i) {
    alignas(16) float s[8];
    const auto at = [&](int j) { return j < NR ? c[i][j < NR ? j : 0] : z; };
    _mm_store_ps(s, hsum4(at(0), at(1), at(2), at(3)));
    if (NR > 4) _mm_store_ps(s + 4, hsum4(at(4), at(5), z, z));
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = accumulate ? y[i * ldy + j] + s[j] : s[j];
  }
}

using MicroFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, bool);

template <int MR>
constexpr MicroFn micro_for(int nr) {
  return nr == 1   ? &micro<MR, 1>
         : nr == 2 ? &micro<MR, 2>
         : nr == 3 ? &micro<MR, 3>
         : nr == 4 ? &micro<MR, 4>
         : nr == 5 ? &micro<MR, 5>
                   : &micro<MR, 6>;
}

MicroFn micro_table(int mr, int nr) {
  switch (mr) {
    case 1: return micro_for<1>(nr);
    case 2: return micro_for<2>(nr);
    case 3: return micro_for<3>(nr);
    default: return micro_for<4>(nr);
  }
}

template <bool kNan>
void gemm(const float* xp, int64_t m, int64_t ld_xp, const Fp8WeightView& w, float* y, int64_t ld_y, int64_t n0,
          int64_t n1) {
  const int64_t kpad = (w.k + kChunk - 1) / kChunk * kChunk;
  alignas(64) float panel[kNc * kPanelLd];
  for (int64_t np = n0; np < n1; np += kNc) {
    const int64_t rows = imin(kNc, n1 - np);
    for (int64_t kb = 0; kb < kpad; kb += kKc) {
      const int64_t kl = imin(kKc, kpad - kb);
      decode_panel<kNan>(w, np, rows, kb, kl, panel, kPanelLd);
      if (kb + kKc < kpad) {
        prefetch_panel(w, np, rows, kb + kKc, kKc);
      } else if (np + kNc < n1) {
        prefetch_panel(w, np + kNc, imin(kNc, n1 - np - kNc), 0, kKc);
      }
      for (int64_t i = 0; i < m; i += kMr) {
        const int mr = static_cast<int>(imin(kMr, m - i));
        for (int64_t j = 0; j < rows; j += kNr) {
          const int nr = static_cast<int>(imin(kNr, rows - j));
          micro_table(mr, nr)(xp + i * ld_xp + kb, ld_xp, panel + j * kPanelLd, kPanelLd, kl, y + i * ld_y + np + j,
                              ld_y, kb > 0);
        }
      }
    }
  }
}

// ---- large M: outer products on a transposed panel ---------------------------------
//
// As in the AVX2 file: the decoded panel transposed into slivers of 32 weight rows
// ([k][32], two vectors per k) and a 12 x 32 register tile of broadcast FMAs (24
// accumulators; 2 vector loads and 12 broadcasts per 24 FMAs), in its own file.
constexpr int kLMr = kFp8TileRows;  // the tile of fp8_outer_tile_avx512 (outer_tile_avx512.cpp)
constexpr int kLNr = kFp8TileCols;
constexpr int64_t kLKc = 128;
constexpr int64_t kLNc = 64;
constexpr int64_t kLPanelLd = kLKc + 16;

// bp[s][p][j] = panel[s * 32 + j][p] for the slivers of `rows` panel rows (rows past
// `rows` read as 0), p < kl (a multiple of 8): 8 x 8 transposes.
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

// y[i, 0..cols) (+)= the tile's sums for i < mr.
void outer_store(const float* t, int mr, float* y, int64_t ldy, int cols, bool accumulate) {
  const __mmask16 lo = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
  const __mmask16 hi = static_cast<__mmask16>(cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1);
  for (int i = 0; i < mr; ++i) {
    float* yi = y + i * ldy;
    __m512 v0 = _mm512_loadu_ps(t + i * kLNr), v1 = _mm512_loadu_ps(t + i * kLNr + 16);
    if (accumulate) {
      v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(lo, yi));
      v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(hi, yi + 16));
    }
    _mm512_mask_storeu_ps(yi, lo, v0);
    _mm512_mask_storeu_ps(yi + 16, hi, v1);
  }
}

template <bool kNan>
void gemm_large(const float* xp, int64_t m, int64_t ld_xp, const Fp8WeightView& w, float* y, int64_t ld_y, int64_t n0,
                int64_t n1) {
  const int64_t kpad = (w.k + kChunk - 1) / kChunk * kChunk;
  alignas(64) float panel[kLNc * kLPanelLd];
  alignas(64) float bp[kLNc * kLKc];
  alignas(64) float t[kLMr * kLNr];
  for (int64_t np = n0; np < n1; np += kLNc) {
    const int64_t rows = imin(kLNc, n1 - np);
    for (int64_t kb = 0; kb < kpad; kb += kLKc) {
      const int64_t kl = imin(kLKc, kpad - kb);
      decode_panel<kNan>(w, np, rows, kb, kl, panel, kLPanelLd);
      transpose_slivers(panel, kLPanelLd, rows, kl, bp);
      if (kb + kLKc < kpad) {
        prefetch_panel(w, np, rows, kb + kLKc, kLKc);
      } else if (np + kLNc < n1) {
        prefetch_panel(w, np + kLNc, imin(kLNc, n1 - np - kLNc), 0, kLKc);
      }
      for (int64_t i = 0; i < m; i += kLMr) {
        const int mr = static_cast<int>(imin(kLMr, m - i));
        for (int64_t s = 0; s * kLNr < rows; ++s) {
          fp8_outer_tile_avx512(xp + i * ld_xp + kb, ld_xp, bp + s * kl * kLNr, kl, mr, t);
          outer_store(t, mr, y + i * ld_y + np + s * kLNr, ld_y, static_cast<int>(imin(kLNr, rows - s * kLNr)), kb > 0);
        }
      }
    }
  }
}

}  // namespace

void fp8_gemm_avx512(const float* xp, int64_t m, int64_t ld_xp, const Fp8WeightView& w, float* y, int64_t ld_y,
                     int64_t n0, int64_t n1) {
  if (n0 >= n1 || m <= 0) return;
  if (m == 1) {
    w.nan_codes ? gemv<true>(xp, w, y, n0, n1) : gemv<false>(xp, w, y, n0, n1);
  } else if (m < kLargeM) {
    w.nan_codes ? gemm<true>(xp, m, ld_xp, w, y, ld_y, n0, n1) : gemm<false>(xp, m, ld_xp, w, y, ld_y, n0, n1);
  } else {
    w.nan_codes ? gemm_large<true>(xp, m, ld_xp, w, y, ld_y, n0, n1)
                : gemm_large<false>(xp, m, ld_xp, w, y, ld_y, n0, n1);
  }
}

void fp8_decode_avx512(const uint8_t* codes, int64_t count, float scale, bool nan_codes, float* out) {
  alignas(64) uint16_t h[kChunk];
  alignas(64) float tmp[kChunk];
  for (int64_t c = 0; c < count; c += kChunk) {
    const int64_t len = imin(kChunk, count - c);
    const __m512i codes_v = len == kChunk ? load_codes(codes + c) : load_tail(codes + c, len);
    nan_codes ? store_half<true>(codes_v, h) : store_half<false>(codes_v, h);
    scale_chunks(h, kChunk, scale, tmp);
    // Back to natural order: packed position v * kLanes + j holds code (v / 2) * 2 * kLanes + 2j + v % 2.
    for (int v = 0; v < 4; ++v)
      for (int j = 0; j < kLanes; ++j) {
        const int64_t idx = (v / 2) * 2 * kLanes + 2 * j + v % 2;
        if (idx < len) out[c + idx] = tmp[v * kLanes + j];
      }
  }
}

}  // namespace tp::detail
