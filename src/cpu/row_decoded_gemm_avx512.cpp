// The row-decoded GEMM on AVX-512 bf16 dot products (cpu/row_decoded_gemm.h, bf16_rows_gemm),
// compiled with the AVX-512 flags (avx512_bf16 among them) and entered only where the CPU
// has avx512_bf16.
//
// Per block of 24 weight rows and chunk of k, the format decodes the rows into a buffer
// that stays in L1 (24 x 128 bf16, 6 KiB); then for every 16 tokens (one pair tile of x
// per 32 k, one register per pair of k) the tile multiplies each row's decoded pair,
// broadcast, into the tokens' accumulators. Per pair of k: NV loads of x, R broadcasts,
// R x NV dot products. The chunk's partial sums go into a float buffer [24 rows, tokens]
// (scaled there when the scales are grouped), which is transposed into y once per block.

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// "(may be) used uninitialized" (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/row_decoded_gemm.h"

// No templates or inline functions shared with other translation units here (no
// std::min): the linker could keep this file's AVX-512 copy of one for every caller.

namespace tp::cpu {

namespace {

constexpr int64_t kBlockRows = 24;
constexpr int64_t kTokenTiles = 32;  // 16-token tiles per pass (512 tokens)
constexpr int64_t kTileK = 32;       // k per pair tile of x
constexpr int64_t kTileElems = 512;  // uint16 per pair tile (16 tokens x 32 k)

int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

uint32_t pair_at(const uint16_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Rows [0, R) of the decoded block (row stride ldw) times NV token vectors (x's pair
// tiles vstride apart, pair q at 32 q), `pairs` pairs; the sums added into yb (row
// stride ldy), times ws[r * ws_ld] x xs[16 v ..] where ws is set (grouped scales).
template <int R, int NV>
void tile(const uint16_t* x, int64_t vstride, const uint16_t* wr, int64_t ldw, int64_t pairs, float* yb, int64_t ldy,
          const float* ws, int64_t ws_ld, const float* xs) {
  __m512 c[R][NV];
#pragma GCC unroll 24
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) c[r][v] = _mm512_setzero_ps();
  for (int64_t q = 0; q < pairs; ++q) {
    __m512bh xv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) xv[v] = (__m512bh)_mm512_loadu_si512(x + v * vstride + 32 * q);
#pragma GCC unroll 24
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair_at(wr + r * ldw + 2 * q)));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], xv[v], a);
    }
  }
#pragma GCC unroll 24
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* out = yb + r * ldy + 16 * v;
      const __m512 prev = _mm512_loadu_ps(out);
      if (ws != nullptr) {
        const __m512 scaled = _mm512_mul_ps(c[r][v], _mm512_loadu_ps(xs + 16 * v));
        _mm512_storeu_ps(out, _mm512_fmadd_ps(scaled, _mm512_set1_ps(ws[r * ws_ld]), prev));
      } else {
        _mm512_storeu_ps(out, _mm512_add_ps(prev, c[r][v]));
      }
    }
  }
}

// tile<R, 1> on 8 tokens (the low half of a pair tile's rows): for at most 8 tokens, half
// the dot products of a 16-token tile, on 256-bit registers.
template <int R>
void tile8(const uint16_t* x, const uint16_t* wr, int64_t ldw, int64_t pairs, float* yb, int64_t ldy, const float* ws,
           int64_t ws_ld, const float* xs) {
  __m256 c[R];
#pragma GCC unroll 24
  for (int r = 0; r < R; ++r) c[r] = _mm256_setzero_ps();
  for (int64_t q = 0; q < pairs; ++q) {
    const __m256bh xv = (__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * q));
#pragma GCC unroll 24
    for (int r = 0; r < R; ++r)
      c[r] = _mm256_dpbf16_ps(c[r], xv, (__m256bh)_mm256_set1_epi32(static_cast<int>(pair_at(wr + r * ldw + 2 * q))));
  }
#pragma GCC unroll 24
  for (int r = 0; r < R; ++r) {
    float* out = yb + r * ldy;
    const __m256 prev = _mm256_loadu_ps(out);
    if (ws != nullptr) {
      const __m256 scaled = _mm256_mul_ps(c[r], _mm256_loadu_ps(xs));
      _mm256_storeu_ps(out, _mm256_fmadd_ps(scaled, _mm256_set1_ps(ws[r * ws_ld]), prev));
    } else {
      _mm256_storeu_ps(out, _mm256_add_ps(prev, c[r]));
    }
  }
}

}  // namespace

void bf16_rows_gemm(const uint16_t* xb, int64_t m, const float* x_scale, int64_t x_scale_ld, const RowDecodedWeight& w,
                    float* y, int64_t ld_y, int64_t n0, int64_t n1) {
  // 128 k: a 64-token group's x (16 KiB) and the decoded rows (6 KiB) stay in L1 together.
  const int64_t chunk = 128;
  const int64_t steps_total = (w.k + kTileK - 1) / kTileK;
  const int64_t vstride = steps_total * kTileElems;
  const int64_t tiles_m = (m + 15) / 16;
  const int64_t ldw = chunk + 32;  // rows 64 bytes off a power of two apart
  std::vector<uint16_t> wmem(static_cast<size_t>(kBlockRows * ldw + 32), 0);
  uint16_t* wbuf = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(wmem.data()) + 63) & ~uintptr_t{63});
  std::vector<float> ybuf(static_cast<size_t>(kBlockRows * min64(tiles_m, kTokenTiles) * 16));
  for (int64_t t0 = 0; t0 < tiles_m; t0 += kTokenTiles) {
    const int64_t nt = min64(kTokenTiles, tiles_m - t0), ldy = nt * 16;
    const int64_t tokens = min64(ldy, m - t0 * 16);
    for (int64_t r0 = n0; r0 < n1; r0 += kBlockRows) {
      const int64_t rows = min64(kBlockRows, n1 - r0);
      for (int64_t i = 0; i < kBlockRows * ldy; ++i) ybuf[i] = 0.0f;
      for (int64_t k0 = 0; k0 < w.k; k0 += chunk) {
        const int64_t kc = min64(chunk, w.k - k0), pairs = (kc + kTileK - 1) / kTileK * kTileK / 2;
        for (int64_t r = 0; r < rows; ++r) w.decode(w.weight, r0 + r, k0, kc, wbuf + r * ldw);
        for (int64_t r = rows; r < kBlockRows; ++r)
          for (int64_t i = 0; i < 2 * pairs; ++i) wbuf[r * ldw + i] = 0;
        const int64_t g = k0 / 128;
        const float* ws = w.grouped ? w.scale + r0 * w.scale_ld + g : nullptr;
        const uint16_t* xc = xb + (t0 * steps_total + k0 / kTileK) * kTileElems;
        for (int64_t v0 = 0; v0 < nt;) {
          const int64_t nv = nt - v0;
          const uint16_t* xv = xc + v0 * vstride;
          const float* xs = x_scale + g * x_scale_ld + (t0 + v0) * 16;
          float* yb = ybuf.data() + 16 * v0;
          if (nv == 1 && tokens - 16 * v0 <= 8) {
            tile8<kBlockRows>(xv, wbuf, ldw, pairs, yb, ldy, ws, w.scale_ld, xs);
            v0 += 1;
          } else if (nv >= 4) {
            for (int64_t rr = 0; rr < kBlockRows; rr += 6)
              tile<6, 4>(xv, vstride, wbuf + rr * ldw, ldw, pairs, yb + rr * ldy, ldy, ws ? ws + rr * w.scale_ld : ws,
                         w.scale_ld, xs);
            v0 += 4;
          } else if (nv == 3) {
            for (int64_t rr = 0; rr < kBlockRows; rr += 8)
              tile<8, 3>(xv, vstride, wbuf + rr * ldw, ldw, pairs, yb + rr * ldy, ldy, ws ? ws + rr * w.scale_ld : ws,
                         w.scale_ld, xs);
            v0 += 3;
          } else if (nv == 2) {
            for (int64_t rr = 0; rr < kBlockRows; rr += 12)
              tile<12, 2>(xv, vstride, wbuf + rr * ldw, ldw, pairs, yb + rr * ldy, ldy, ws ? ws + rr * w.scale_ld : ws,
                          w.scale_ld, xs);
            v0 += 2;
          } else {
            tile<24, 1>(xv, vstride, wbuf, ldw, pairs, yb, ldy, ws, w.scale_ld, xs);
            v0 += 1;
          }
        }
      }
      // [rows, tokens] -> y [tokens, rows], with the one-group scales: (P * x_scale) * scale.
      float ws[kBlockRows];
      for (int64_t r = 0; r < rows; ++r) ws[r] = w.grouped ? 1.0f : w.scale[(r0 + r) * w.scale_ld];
      for (int64_t t = 0; t < tokens; ++t) {
        float* dst = y + (t0 * 16 + t) * ld_y + r0;
        const float xs = x_scale[t0 * 16 + t];
        if (w.grouped) {
          for (int64_t r = 0; r < rows; ++r) dst[r] = ybuf[r * ldy + t];
        } else {
          for (int64_t r = 0; r < rows; ++r) dst[r] = ybuf[r * ldy + t] * xs * ws[r];
        }
      }
    }
  }
}

}  // namespace tp::cpu
