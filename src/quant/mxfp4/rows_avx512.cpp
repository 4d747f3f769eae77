// MXFP4's rows kernels (rows.h) built for AVX-512 (F, BW, VL, DQ, BF16): the float32 one
// (rows_body.h) on 16 lanes, VPERMPS reading the low 4 bits of each dword as the code, and
// the bf16 one (below) on VDPBF16PS. A chunk is 64 code bytes (128 weights, 4 blocks), a
// scale group 16 blocks.

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// "(may be) used uninitialized" (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "quant/mxfp4/rows_body.h"

namespace tp::detail {
namespace {

__m512i first_bytes(const uint8_t* p, int bytes) {
  return _mm512_maskz_loadu_epi8(bytes >= 64 ? ~__mmask64{0} : (__mmask64{1} << bytes) - 1, p);
}

// 2^(s - 127) for 16 scale bytes (n valid, the rest 0) as float32: s << 23, and 2^-127 (the
// subnormal 1 << 22) for s = 0.
__m512 scales16(const uint8_t* s, int n) {
  const __m128i bytes = _mm_maskz_loadu_epi8(n >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << n) - 1), s);
  const __m512i e = _mm512_slli_epi32(_mm512_cvtepu8_epi32(bytes), 23);
  return _mm512_castsi512_ps(_mm512_max_epu32(e, _mm512_set1_epi32(1 << 22)));
}

// Lane j of chunk q (0..3) of a group: block 4 q + j / 4.
__m512 chunk16(__m512 g, int q) {
  const __m512i idx =
      _mm512_add_epi32(_mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2),
                       _mm512_set1_epi32(4 * q));
  return _mm512_permutexvar_ps(idx, g);
}

struct Decode {
  static constexpr cpu::Isa kIsa = cpu::Isa::kAvx512;
  static constexpr int kR1 = 4, kR2 = 4, kR4 = 2;
  static __m512i codes(const uint8_t* p, int bytes) { return first_bytes(p, bytes); }
  static __m512 decode(__m512i v, int i) {
    const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                        -2.0f, -3.0f, -4.0f, -6.0f);
    return _mm512_permutexvar_ps(i == 0 ? v : _mm512_srli_epi32(v, 4 * i), table);
  }
  static __m512 group_scales(const uint8_t* s, int n) { return scales16(s, n); }
  static __m512 chunk_scales(__m512 g, int q) { return chunk16(g, q); }
};

// ---- bf16 layers: VDPBF16PS ------------------------------------------------------------

// The E2M1 values as bf16 bits, at index code and code + 16 (VPERMW reads 5 bits).
__m512i e2m1_bf16_table() {
  alignas(64) static const uint16_t kTable[32] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0,
                                                  0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0,
                                                  0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0,
                                                  0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0};
  return _mm512_load_si512(kTable);
}

// Rows [n0, n0 + R) against M rows of x pairs; SPLIT chains over the 4 nibble steps.
template <int M, int R, int SPLIT>
void rows_bf16(const uint32_t* xq, int64_t ld_xq, const Mxfp4CpuWeight& w, float* y, int64_t ld_y, int64_t n0,
               bool prefetch) {
  const int64_t ld = w.k / 2, nblocks = w.k / 32;
  const int64_t chunks = (w.k + 127) / 128, full = w.k / 128;
  const __m512i table = e2m1_bf16_table();
  const uint8_t* row[R];
  const uint8_t* srow[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    row[r] = w.blocks + (n0 + r) * ld;
    srow[r] = w.scales + (n0 + r) * nblocks;
  }
  __m512 total[M][R], group[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) group[r] = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) total[m][r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    const int q = static_cast<int>(c % 4);
    if (q == 0) {
      const int64_t left = nblocks - 4 * c;
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) group[r] = scales16(srow[r] + 4 * c, static_cast<int>(left < 16 ? left : 16));
    }
    __m512i v[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      v[r] =
          c < full ? _mm512_loadu_si512(row[r] + 64 * c) : first_bytes(row[r] + 64 * c, static_cast<int>(ld - 64 * c));
    if (prefetch) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(row[r] + R * ld + 64 * c), _MM_HINT_T0);
    }
    __m512 acc[SPLIT][M][R];
#pragma GCC unroll 8
    for (int s = 0; s < SPLIT; ++s)
#pragma GCC unroll 8
      for (int m = 0; m < M; ++m)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[s][m][r] = _mm512_setzero_ps();
    const uint32_t* xc = xq + 64 * c;
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      __m512bh e[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        e[r] = (__m512bh)_mm512_permutexvar_epi16(i == 0 ? v[r] : _mm512_srli_epi16(v[r], 4 * i), table);
#pragma GCC unroll 8
      for (int m = 0; m < M; ++m) {
        const __m512bh a = (__m512bh)_mm512_loadu_si512(xc + m * ld_xq + 16 * i);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[i % SPLIT][m][r] = _mm512_dpbf16_ps(acc[i % SPLIT][m][r], e[r], a);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 s = chunk16(group[r], q);
#pragma GCC unroll 8
      for (int m = 0; m < M; ++m) {
        __m512 a = acc[0][m][r];
#pragma GCC unroll 4
        for (int t = 1; t < SPLIT; ++t) a = _mm512_add_ps(a, acc[t][m][r]);
        total[m][r] = _mm512_fmadd_ps(a, s, total[m][r]);
      }
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) y[m * ld_y + n0 + r] = _mm512_reduce_add_ps(total[m][r]);
}

template <int M, int R, int SPLIT>
void rows_bf16_range(const uint32_t* xq, int64_t ld_xq, const Mxfp4CpuWeight& w, float* y, int64_t ld_y, int64_t n0,
                     int64_t n1) {
  int64_t n = n0;
  for (; n + R <= n1; n += R) rows_bf16<M, R, SPLIT>(xq, ld_xq, w, y, ld_y, n, n + 2 * R <= n1);
  for (; n < n1; ++n) rows_bf16<M, 1, 2>(xq, ld_xq, w, y, ld_y, n, false);
}

}  // namespace

void mxfp4_rows_f32_avx512(const float* xp, int64_t m, int64_t ld_xp, const Mxfp4CpuWeight& w, float* y, int64_t ld_y,
                           int64_t n0, int64_t n1) {
  rows_f32_by_m<Decode>(xp, m, ld_xp, w, y, ld_y, n0, n1);
}

void mxfp4_rows_bf16_avx512(const uint32_t* xq, int64_t m, int64_t ld_xq, const Mxfp4CpuWeight& w, float* y,
                            int64_t ld_y, int64_t n0, int64_t n1) {
  switch (m) {
    case 1: rows_bf16_range<1, 4, 1>(xq, ld_xq, w, y, ld_y, n0, n1); break;
    case 2: rows_bf16_range<2, 4, 1>(xq, ld_xq, w, y, ld_y, n0, n1); break;
    case 3: rows_bf16_range<3, 2, 1>(xq, ld_xq, w, y, ld_y, n0, n1); break;
    default: rows_bf16_range<4, 2, 1>(xq, ld_xq, w, y, ld_y, n0, n1); break;
  }
}

}  // namespace tp::detail
