// The FP8 E4M3 kernels for AVX2 + FMA + F16C (see cpu_kernels.h for the decode and the
// packed order of x). Compiled with -mavx2 -mfma -mf16c; entered only when cpu::isa()
// allows AVX2. Everything but the exported functions stays in the anonymous namespace,
// and no header with inline functions other TUs share is included (ODR: a copy of
// such a function compiled here could be picked for the whole program).

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/fp8/cpu_kernels.h"

namespace tp::detail {

namespace {

constexpr int kLanes = 8;
constexpr int64_t kChunk = kFp8ChunkAvx2;  // codes per 256-bit load -> 4 float vectors

// GEMM blocking: kNc weight rows x kKc packed columns decoded per panel (96 KB, L2),
// kMr x kNr output block per microkernel call.
constexpr int kMr = 4;
constexpr int kNr = 3;
constexpr int64_t kNc = 24;
// Panel rows kPanelLd floats apart: not a multiple of 4 KB, so the rows a microkernel
// streams do not all fall into the same L1 sets.
constexpr int64_t kKc = 1024;
constexpr int64_t kPanelLd = kKc + 16;
constexpr int kGemvRows = 4;
constexpr int64_t kLargeM = 56;      // from this many x rows on, the outer-product kernel (measured crossover)
constexpr int64_t kGemvBlock = 512;  // columns per pass of the GEMV (a multiple of 128 and kChunk)

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

inline __m256i load_codes(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// The partial last chunk of a row: codes past the row's end read as 0 (+0.0).
inline __m256i load_tail(const uint8_t* p, int64_t count) {
  alignas(32) uint8_t buf[kChunk];
  std::memset(buf, 0, sizeof(buf));
  std::memcpy(buf, p, static_cast<size_t>(count));
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
}

// 32 codes -> their float16 patterns, which are the values / 256: the even codes in
// `even`, the odd ones in `odd` (16 each).
template <bool kNan>
inline void to_half(__m256i c, __m256i& even, __m256i& odd) {
  const __m256i mask = _mm256_set1_epi16(static_cast<short>(0xBF80));
  const __m256i even_hi = _mm256_slli_epi16(c, 8);  // even codes in the high bytes
  odd = _mm256_and_si256(_mm256_srai_epi16(c, 1), mask);
  even = _mm256_and_si256(_mm256_srai_epi16(even_hi, 1), mask);
  if (kNan) {
    // A NaN code (low 7 bits all ones) came out as sign | 0x3f80; 0x7f80 | sign is the
    // float16 NaN that widens to c10's 0x7ff00000 | sign.
    const __m256i nan = _mm256_set1_epi16(0x7F00);
    const __m256i bit = _mm256_set1_epi16(0x4000);
    odd = _mm256_or_si256(odd, _mm256_and_si256(_mm256_cmpeq_epi16(_mm256_and_si256(c, nan), nan), bit));
    even = _mm256_or_si256(even, _mm256_and_si256(_mm256_cmpeq_epi16(_mm256_and_si256(even_hi, nan), nan), bit));
  }
}

// A chunk's float16 patterns stored for vcvtph2ps to read from memory (cheaper than
// converting from registers: no lane extraction): even codes at h[0..15], odd at
// h[16..31].
template <bool kNan>
inline void store_half(__m256i c, uint16_t* h) {
  __m256i even, odd;
  to_half<kNan>(c, even, odd);
  _mm256_store_si256(reinterpret_cast<__m256i*>(h), even);
  _mm256_store_si256(reinterpret_cast<__m256i*>(h + 16), odd);
}

// Vector v (0..3) of a stored chunk in the packed order of x: f[0] = codes 0,2,..,14;
// f[1] = 1,3,..,15; f[2] = 16,18,..,30; f[3] = 17,..,31.
inline __m256 half_vector(const uint16_t* h, int v) {
  const int offset = (v & 1) * 16 + (v >> 1) * 8;
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h + offset)));
}

// 32 codes -> the 4 vectors of value / 256 (the decode test's path).
template <bool kNan>
inline void decode(__m256i c, __m256 (&f)[4]) {
  alignas(32) uint16_t h[kChunk];
  store_half<kNan>(c, h);
  for (int v = 0; v < 4; ++v) f[v] = half_vector(h, v);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The four sums of a, b, c, d.
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
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
  const __m256 k256 = _mm256_set1_ps(256.0f);
  __m256 total[NR], acc[NR][2];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) total[r] = acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  int64_t g = 0, in_group = 0;  // the scale group of chunk c, and its chunks so far
  alignas(32) uint16_t ring[2][NR][kChunk];
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
    const __m256 x0 = _mm256_loadu_ps(xc), x1 = _mm256_loadu_ps(xc + 8);
    const __m256 x2 = _mm256_loadu_ps(xc + 16), x3 = _mm256_loadu_ps(xc + 24);
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
      acc[r][0] = _mm256_fmadd_ps(half_vector(h, 0), x0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(half_vector(h, 1), x1, acc[r][1]);
      acc[r][0] = _mm256_fmadd_ps(half_vector(h, 2), x2, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(half_vector(h, 3), x3, acc[r][1]);
    }
    if (++in_group == per_group || c + 1 == chunks) {  // the end of scale group g (no division per chunk)
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const __m256 s = _mm256_set1_ps(scales[r][g]);
        total[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_add_ps(acc[r][0], acc[r][1]), k256), s, total[r]);
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
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
    const __m256 s = _mm256_set1_ps(folded);
    for (int64_t p = 0; p < len; p += kChunk)
      for (int v = 0; v < 4; ++v) _mm256_storeu_ps(out + p + v * kLanes, _mm256_mul_ps(half_vector(h + p, v), s));
  } else {
    const __m256 k256 = _mm256_set1_ps(256.0f);
    const __m256 s = _mm256_set1_ps(scale);
    for (int64_t p = 0; p < len; p += kChunk)
      for (int v = 0; v < 4; ++v)
        _mm256_storeu_ps(out + p + v * kLanes, _mm256_mul_ps(_mm256_mul_ps(half_vector(h + p, v), k256), s));
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

// y[i, j] (+)= sum_p x[i, p] * wp[j, p] for i < MR, j < NR, p < kl (kl a multiple of 8).
template <int MR, int NR>
void micro(const float* x, int64_t ldx, const float* wp, int64_t ldw, int64_t kl, float* y, int64_t ldy,
           bool accumulate) {
  __m256 c[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) c[i][j] = _mm256_setzero_ps();
  for (int64_t p = 0; p < kl; p += kLanes) {
    __m256 b[NR];
    for (int j = 0; j < NR; ++j) b[j] = _mm256_loadu_ps(wp + j * ldw + p);
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_loadu_ps(x + i * ldx + p);
      for (int j = 0; j < NR; ++j) c[i][j] = _mm256_fmadd_ps(a, b[j], c[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    const __m256 z = _mm256_setzero_ps();
    alignas(16) float s[4];
    _mm_store_ps(s, hsum4(c[i][0], NR > 1 ? c[i][NR > 1 ? 1 : 0] : z, NR > 2 ? c[i][NR > 2 ? 2 : 0] : z, z));
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = accumulate ? y[i * ldy + j] + s[j] : s[j];
  }
}

using MicroFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, bool);

template <int MR>
constexpr MicroFn micro_for(int nr) {
  return nr == 1 ? &micro<MR, 1> : nr == 2 ? &micro<MR, 2> : &micro<MR, 3>;
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
// Past a few dozen x rows the dot-product microkernel's per-block horizontal sums and
// its 7 loads per 12 FMAs fall behind a BLAS-style kernel: here the decoded panel is
// transposed into slivers of 16 weight rows ([k][16], two vectors per k), and a 6 x 16
// register tile accumulates x[i, k] (broadcast) * sliver[k] over a 256-column block:
// 12 FMAs per 2 vector loads and 6 broadcasts, no horizontal sums.
constexpr int kLMr = 6;
constexpr int kLNr = 16;
constexpr int64_t kLKc = 256;
constexpr int64_t kLNc = 48;
constexpr int64_t kLPanelLd = kLKc + 16;

// bp[s][p][j] = panel[s * 16 + j][p] for the slivers of `rows` panel rows (rows past
// `rows` read as 0), p < kl (a multiple of 8).
void transpose_slivers(const float* panel, int64_t ldp, int64_t rows, int64_t kl, float* bp) {
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t s = 0; s * kLNr < rows; ++s) {
    float* out = bp + s * kl * kLNr;
    for (int half = 0; half < 2; ++half) {
      const int64_t r0 = s * kLNr + half * 8;
      for (int64_t p = 0; p < kl; p += 8) {
        __m256 v[8];
        for (int j = 0; j < 8; ++j) v[j] = r0 + j < rows ? _mm256_loadu_ps(panel + (r0 + j) * ldp + p) : zero;
        // 8 x 8 transpose.
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
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(out + (p + j) * kLNr + half * 8, o[j]);
      }
    }
  }
}

// y[i, 0..cols) (+)= sum_p x[i, p] * b[p][0..cols) for i < MR. The accumulators are
// named variables: GCC 12 keeps an array of them in memory (a store per FMA) here.
template <int MR>
void micro_outer(const float* x, int64_t ldx, const float* b, int64_t kl, float* y, int64_t ldy, int cols,
                 bool accumulate) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  const float* x0 = x;
  const float* x1 = x + ldx;
  const float* x2 = x + 2 * ldx;
  const float* x3 = x + 3 * ldx;
  const float* x4 = x + 4 * ldx;
  const float* x5 = x + 5 * ldx;
  // Unrolled by 4 (kl is a multiple of kChunk): fewer loop and address operations on
  // the ports the FMAs use.
#define TP_FP8_OUTER_STEP(q)                                                                 \
  {                                                                                          \
    const __m256 b0 = _mm256_loadu_ps(b + (q)*kLNr), b1 = _mm256_loadu_ps(b + (q)*kLNr + 8); \
    __m256 a = _mm256_broadcast_ss(x0 + (q));                                                \
    c00 = _mm256_fmadd_ps(a, b0, c00);                                                       \
    c01 = _mm256_fmadd_ps(a, b1, c01);                                                       \
    if constexpr (MR > 1) {                                                                  \
      a = _mm256_broadcast_ss(x1 + (q));                                                     \
      c10 = _mm256_fmadd_ps(a, b0, c10);                                                     \
      c11 = _mm256_fmadd_ps(a, b1, c11);                                                     \
    }                                                                                        \
    if constexpr (MR > 2) {                                                                  \
      a = _mm256_broadcast_ss(x2 + (q));                                                     \
      c20 = _mm256_fmadd_ps(a, b0, c20);                                                     \
      c21 = _mm256_fmadd_ps(a, b1, c21);                                                     \
    }                                                                                        \
    if constexpr (MR > 3) {                                                                  \
      a = _mm256_broadcast_ss(x3 + (q));                                                     \
      c30 = _mm256_fmadd_ps(a, b0, c30);                                                     \
      c31 = _mm256_fmadd_ps(a, b1, c31);                                                     \
    }                                                                                        \
    if constexpr (MR > 4) {                                                                  \
      a = _mm256_broadcast_ss(x4 + (q));                                                     \
      c40 = _mm256_fmadd_ps(a, b0, c40);                                                     \
      c41 = _mm256_fmadd_ps(a, b1, c41);                                                     \
    }                                                                                        \
    if constexpr (MR > 5) {                                                                  \
      a = _mm256_broadcast_ss(x5 + (q));                                                     \
      c50 = _mm256_fmadd_ps(a, b0, c50);                                                     \
      c51 = _mm256_fmadd_ps(a, b1, c51);                                                     \
    }                                                                                        \
  }
  for (int64_t p = 0; p < kl; p += 4) {
    TP_FP8_OUTER_STEP(p)
    TP_FP8_OUTER_STEP(p + 1)
    TP_FP8_OUTER_STEP(p + 2)
    TP_FP8_OUTER_STEP(p + 3)
  }
#undef TP_FP8_OUTER_STEP
  alignas(32) float t[6][kLNr];
  _mm256_store_ps(t[0], c00);
  _mm256_store_ps(t[0] + 8, c01);
  _mm256_store_ps(t[1], c10);
  _mm256_store_ps(t[1] + 8, c11);
  _mm256_store_ps(t[2], c20);
  _mm256_store_ps(t[2] + 8, c21);
  _mm256_store_ps(t[3], c30);
  _mm256_store_ps(t[3] + 8, c31);
  _mm256_store_ps(t[4], c40);
  _mm256_store_ps(t[4] + 8, c41);
  _mm256_store_ps(t[5], c50);
  _mm256_store_ps(t[5] + 8, c51);
  for (int i = 0; i < MR; ++i) {
    float* yi = y + i * ldy;
    if (cols == kLNr) {
      const __m256 lo = _mm256_load_ps(t[i]), hi = _mm256_load_ps(t[i] + 8);
      _mm256_storeu_ps(yi, accumulate ? _mm256_add_ps(lo, _mm256_loadu_ps(yi)) : lo);
      _mm256_storeu_ps(yi + 8, accumulate ? _mm256_add_ps(hi, _mm256_loadu_ps(yi + 8)) : hi);
    } else {
      for (int j = 0; j < cols; ++j) yi[j] = accumulate ? yi[j] + t[i][j] : t[i][j];
    }
  }
}

// The full 6 x 16 tile in assembly: GCC 12 spills one of the 12 accumulators (and
// adds moves) when the loop is unrolled, which costs ~6% at M = 256. Accumulators in
// ymm0-11, the two sliver vectors in ymm12-13, the broadcast in ymm14; 4 columns per
// iteration (kl is a multiple of kChunk). Leaves the sums in t[12][8].
void micro_outer_6x16_asm(const float* x, int64_t ldx, const float* b, int64_t kl, float* t) {
  const float* x3 = x + 3 * ldx;
  int64_t iters = kl / 4;
  const int64_t ld = ldx * static_cast<int64_t>(sizeof(float));
#define TP_STEP(off_b, off_x)                 \
  "vmovups " #off_b                           \
  "(%[b]), %%ymm12\n\t"                       \
  "vmovups " #off_b                           \
  "+32(%[b]), %%ymm13\n\t"                    \
  "vbroadcastss " #off_x                      \
  "(%[x0]), %%ymm14\n\t"                      \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm0\n\t"  \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm1\n\t"  \
  "vbroadcastss " #off_x                      \
  "(%[x0],%[ld],1), %%ymm14\n\t"              \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm2\n\t"  \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm3\n\t"  \
  "vbroadcastss " #off_x                      \
  "(%[x0],%[ld],2), %%ymm14\n\t"              \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm4\n\t"  \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm5\n\t"  \
  "vbroadcastss " #off_x                      \
  "(%[x3]), %%ymm14\n\t"                      \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm6\n\t"  \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm7\n\t"  \
  "vbroadcastss " #off_x                      \
  "(%[x3],%[ld],1), %%ymm14\n\t"              \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm8\n\t"  \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm9\n\t"  \
  "vbroadcastss " #off_x                      \
  "(%[x3],%[ld],2), %%ymm14\n\t"              \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm10\n\t" \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm11\n\t"
  __asm__ volatile(
      "vxorps %%ymm0, %%ymm0, %%ymm0\n\t"
      "vxorps %%ymm1, %%ymm1, %%ymm1\n\t"
      "vxorps %%ymm2, %%ymm2, %%ymm2\n\t"
      "vxorps %%ymm3, %%ymm3, %%ymm3\n\t"
      "vxorps %%ymm4, %%ymm4, %%ymm4\n\t"
      "vxorps %%ymm5, %%ymm5, %%ymm5\n\t"
      "vxorps %%ymm6, %%ymm6, %%ymm6\n\t"
      "vxorps %%ymm7, %%ymm7, %%ymm7\n\t"
      "vxorps %%ymm8, %%ymm8, %%ymm8\n\t"
      "vxorps %%ymm9, %%ymm9, %%ymm9\n\t"
      "vxorps %%ymm10, %%ymm10, %%ymm10\n\t"
      "vxorps %%ymm11, %%ymm11, %%ymm11\n\t"
      "test %[n], %[n]\n\t"
      "jz 2f\n\t"
      "1:\n\t"
      TP_STEP(0, 0)
      TP_STEP(64, 4)
      TP_STEP(128, 8)
      TP_STEP(192, 12)
      "add $256, %[b]\n\t"
      "add $16, %[x0]\n\t"
      "add $16, %[x3]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "2:\n\t"
      "vmovups %%ymm0, 0(%[t])\n\t"
      "vmovups %%ymm1, 32(%[t])\n\t"
      "vmovups %%ymm2, 64(%[t])\n\t"
      "vmovups %%ymm3, 96(%[t])\n\t"
      "vmovups %%ymm4, 128(%[t])\n\t"
      "vmovups %%ymm5, 160(%[t])\n\t"
      "vmovups %%ymm6, 192(%[t])\n\t"
      "vmovups %%ymm7, 224(%[t])\n\t"
      "vmovups %%ymm8, 256(%[t])\n\t"
      "vmovups %%ymm9, 288(%[t])\n\t"
      "vmovups %%ymm10, 320(%[t])\n\t"
      "vmovups %%ymm11, 352(%[t])\n\t"
      : [b] "+r"(b), [x0] "+r"(x), [x3] "+r"(x3), [n] "+r"(iters)
      : [ld] "r"(ld), [t] "r"(t)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
        "xmm13", "xmm14", "cc", "memory");
#undef TP_STEP
}

// The 6 x 16 tile through the assembly loop, then the same epilogue as micro_outer.
void micro_outer_6(const float* x, int64_t ldx, const float* b, int64_t kl, float* y, int64_t ldy, int cols,
                   bool accumulate) {
  alignas(32) float t[6][kLNr];
  micro_outer_6x16_asm(x, ldx, b, kl, &t[0][0]);
  for (int i = 0; i < 6; ++i) {
    float* yi = y + i * ldy;
    if (cols == kLNr) {
      const __m256 lo = _mm256_load_ps(t[i]), hi = _mm256_load_ps(t[i] + 8);
      _mm256_storeu_ps(yi, accumulate ? _mm256_add_ps(lo, _mm256_loadu_ps(yi)) : lo);
      _mm256_storeu_ps(yi + 8, accumulate ? _mm256_add_ps(hi, _mm256_loadu_ps(yi + 8)) : hi);
    } else {
      for (int j = 0; j < cols; ++j) yi[j] = accumulate ? yi[j] + t[i][j] : t[i][j];
    }
  }
}

using OuterFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int, bool);
constexpr OuterFn kOuter[kLMr] = {&micro_outer<1>, &micro_outer<2>, &micro_outer<3>,
                                  &micro_outer<4>, &micro_outer<5>, &micro_outer_6};

template <bool kNan>
void gemm_large(const float* xp, int64_t m, int64_t ld_xp, const Fp8WeightView& w, float* y, int64_t ld_y, int64_t n0,
                int64_t n1) {
  const int64_t kpad = (w.k + kChunk - 1) / kChunk * kChunk;
  alignas(64) float panel[kLNc * kLPanelLd];
  alignas(64) float bp[kLNc * kLKc];
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
        const OuterFn fn = kOuter[imin(kLMr, m - i) - 1];
        for (int64_t s = 0; s * kLNr < rows; ++s) {
          fn(xp + i * ld_xp + kb, ld_xp, bp + s * kl * kLNr, kl, y + i * ld_y + np + s * kLNr, ld_y,
             static_cast<int>(imin(kLNr, rows - s * kLNr)), kb > 0);
        }
      }
    }
  }
}

}  // namespace

void fp8_gemm_avx2(const float* xp, int64_t m, int64_t ld_xp, const Fp8WeightView& w, float* y, int64_t ld_y,
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

void fp8_decode_avx2(const uint8_t* codes, int64_t count, float scale, bool nan_codes, float* out) {
  alignas(64) uint16_t h[kChunk];
  alignas(64) float tmp[kChunk];
  for (int64_t c = 0; c < count; c += kChunk) {
    const int64_t len = imin(kChunk, count - c);
    const __m256i codes_v = len == kChunk ? load_codes(codes + c) : load_tail(codes + c, len);
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
