// The panel GEMM on AMX bf16 tiles (cpu/panel_gemm.h, panel_gemm_amx_bf16), compiled with
// the AMX flags and entered only when amx_status().usable.
//
// For each pair of panels (32 output columns) and chunk of 4096 k, the format's decoder
// writes float32 weights 256 k at a time; they are rounded to bf16 (to nearest even, as
// c10::BFloat16 rounds: the bf16 layer's dequantized weight) straight into AMX's B
// layout, VNNI pairs (row r of a tile holds, per column c, W[c, 2 r] and W[c, 2 r + 1]),
// one 1 KiB tile per 32 k and panel. Then every block of 32 rows of x passes over them:
// 2 A tiles (x rows, bf16, 32 k), 2 B tiles, 4 C tiles (float32 [rows, columns]), and C
// is stored straight into y (and loaded back from it for the next chunk; float32 round
// trips exactly). So each weight is decoded once per call whatever M is.

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "cpu/amx_config.h"
#include "cpu/panel_gemm.h"

// No templates or inline functions shared with other translation units here (no
// std::min, no c10 checks): the linker could keep this file's AMX copy of one for every
// caller. Everything local is in the anonymous namespace.

namespace tp::cpu {

namespace {

constexpr int64_t kDecodeK = 256;        // k per decoder call (panel_gemm.h's contract)
constexpr int64_t kChunkK = 4096;        // k per pass of the rows of x over decoded tiles
constexpr int64_t kTileK = 32;           // bf16 k per tile step
constexpr int64_t kTileElems = 16 * 32;  // bf16 per B tile

int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// bf16 bits of float32 v, rounded to nearest even (finite values; the decoders' are).
__m512i to_bf16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
}

// buf [kc, 32] float32 (k rows, panel j's columns at 16 j) -> B tiles of k steps
// [kb0, ...): wb + (kb * 2 + j) * kTileElems, rows past kc zero.
void to_tiles(const float* buf, int64_t kc, int64_t kk0, uint16_t* wb) {
  for (int64_t r = 0; r < (kc + 1) / 2; ++r) {
    const int64_t k = kk0 + 2 * r;  // k within the chunk
    uint16_t* row = wb + (k / kTileK) * 2 * kTileElems + ((k % kTileK) / 2) * 32;
    for (int j = 0; j < 2; ++j) {
      const __m512i lo = to_bf16_bits(_mm512_load_ps(buf + (2 * r) * 32 + 16 * j));
      const __m512i hi =
          2 * r + 1 < kc ? to_bf16_bits(_mm512_load_ps(buf + (2 * r + 1) * 32 + 16 * j)) : _mm512_setzero_si512();
      _mm512_storeu_si512(row + j * kTileElems, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}

// Tiles: C(i, j) = 2 i + j for row tile i and panel j, A(i) = 4 + i, B(j) = 6 + j.
TileConfig block_config(const int rows[2], const int cols[2]) {
  TileConfig cfg;
  for (int i = 0; i < 2; ++i) {
    if (rows[i] > 0) cfg.set(4 + i, rows[i], 64);
    if (cols[i] > 0) cfg.set(6 + i, 16, 4 * cols[i]);
    for (int j = 0; j < 2; ++j)
      if (rows[i] > 0 && cols[j] > 0) cfg.set(2 * i + j, rows[i], 4 * cols[j]);
  }
  return cfg;
}

// One block: rows of x [row0, row0 + 16 NA), panels 0..NB of the pair, k steps [0, steps).
template <int NA, int NB>
void block(const uint16_t* xa, int64_t ld_xa, const uint16_t* wb, int64_t steps, float* y, int64_t ld_y,
           bool accumulate) {
  const int64_t ldc = ld_y * 4, lda = ld_xa * 2;
  float* c10 = y + 16 * ld_y;
  if (accumulate) {
    _tile_loadd(0, y, ldc);
    if constexpr (NB > 1) _tile_loadd(1, y + 16, ldc);
    if constexpr (NA > 1) _tile_loadd(2, c10, ldc);
    if constexpr (NA > 1 && NB > 1) _tile_loadd(3, c10 + 16, ldc);
  } else {
    _tile_zero(0);
    if constexpr (NB > 1) _tile_zero(1);
    if constexpr (NA > 1) _tile_zero(2);
    if constexpr (NA > 1 && NB > 1) _tile_zero(3);
  }
  for (int64_t kb = 0; kb < steps; ++kb) {
    _tile_loadd(4, xa + kb * kTileK, lda);
    if constexpr (NA > 1) _tile_loadd(5, xa + 16 * ld_xa + kb * kTileK, lda);
    _tile_loadd(6, wb + kb * 2 * kTileElems, 64);
    if constexpr (NB > 1) _tile_loadd(7, wb + (kb * 2 + 1) * kTileElems, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NB > 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (NA > 1) _tile_dpbf16ps(2, 5, 6);
    if constexpr (NA > 1 && NB > 1) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, y, ldc);
  if constexpr (NB > 1) _tile_stored(1, y + 16, ldc);
  if constexpr (NA > 1) _tile_stored(2, c10, ldc);
  if constexpr (NA > 1 && NB > 1) _tile_stored(3, c10 + 16, ldc);
}

using BlockFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t, bool);
constexpr BlockFn kBlocks[2][2] = {{block<1, 1>, block<1, 2>}, {block<2, 1>, block<2, 2>}};

}  // namespace

void panel_gemm_amx_bf16_range(const uint16_t* xa, int64_t m, int64_t ld_xa, const PanelWeight& w, float* y,
                               int64_t ld_y, int64_t p0, int64_t p1) {
  alignas(64) float buf[kDecodeK * 2 * kPanelWidth];
  std::vector<uint16_t> wb(static_cast<size_t>(kChunkK / kTileK * 2 * kTileElems) + 32);
  uint16_t* tiles = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(wb.data()) + 63) & ~uintptr_t{63});
  TileConfigCache config;
  for (int64_t p = p0; p < p1; p += 2) {
    const int64_t np = min64(2, p1 - p);
    const int64_t c0 = kPanelWidth * p;
    const int cols[2] = {static_cast<int>(min64(16, w.n - c0)),
                         np > 1 ? static_cast<int>(min64(16, w.n - c0 - 16)) : 0};
    const int nb = cols[1] > 0 ? 2 : 1;
    for (int64_t k0 = 0; k0 < w.k; k0 += kChunkK) {
      const int64_t kc = min64(kChunkK, w.k - k0);
      const int64_t steps = (kc + kTileK - 1) / kTileK;
      for (int64_t d = 0; d < kc; d += kDecodeK) {
        const int64_t dc = min64(kDecodeK, kc - d);
        w.decode(w.weight, p, np, k0 + d, dc, buf, 2 * kPanelWidth);
        if (np == 1)  // the second panel's columns: zero
          for (int64_t kk = 0; kk < dc; ++kk) _mm512_store_ps(buf + kk * 32 + 16, _mm512_setzero_ps());
        to_tiles(buf, dc, d, tiles);
      }
      // The last step's rows past kc: zero (x is zero padded there too, but 0 * NaN garbage is not 0).
      if (kc % kTileK != 0) {
        const int64_t from = kc / kTileK * kTileK + (kc % kTileK + 1) / 2 * 2;
        for (int64_t k = from; k < steps * kTileK; k += 2)
          for (int j = 0; j < 2; ++j)
            _mm512_storeu_si512(tiles + (k / kTileK * 2 + j) * kTileElems + ((k % kTileK) / 2) * 32,
                                _mm512_setzero_si512());
      }
      for (int64_t r0 = 0; r0 < m; r0 += 32) {
        const int rows[2] = {static_cast<int>(min64(16, m - r0)),
                             static_cast<int>(m - r0 > 16 ? min64(16, m - r0 - 16) : 0)};
        config.load(block_config(rows, cols));
        kBlocks[rows[1] > 0 ? 1 : 0][nb - 1](xa + r0 * ld_xa + k0, ld_xa, tiles, steps, y + r0 * ld_y + c0, ld_y,
                                             k0 > 0);
      }
    }
  }
}

}  // namespace tp::cpu
