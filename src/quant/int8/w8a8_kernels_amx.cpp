// The W8A8 kernel on AMX int8 tiles (TDPBSSD: signed x signed bytes, 64 products per
// int32 lane, exact), compiled with the AMX flags and entered only when
// cpu::amx_status().usable (w8a8_kernels.h: W8a8Kernel::kAmx).
//
// Roles: the tile A operand is the weight itself, 16 output rows x 64 bytes of K read
// in place from the registered [N, K] int8 tensor (row stride ld), so the weight is
// never copied; B is x, packed per call into AMX's 4-byte groups (w8a8_pack_x_amx);
// C [16 weight rows, 16 tokens] int32. A 2 x 2 block of C tiles (32 weight rows x 32
// tokens) takes all 8 tiles: 4 C, 2 A, 2 B. K runs in chunks of 4096 with the int32
// sums kept in a buffer between chunks (exact), so the weight rows of a block and the
// x of a chunk stay in L2 while every token block passes. The epilogue is the
// reference's (float(acc) * x_scale) * w_scale, row by row of the C tile (tokens along
// the vector), then transposed into y's [token, row] layout.

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// "(may be) used uninitialized" (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "cpu/amx_config.h"
#include "quant/int8/w8a8_kernels.h"

namespace tp::detail {

namespace {

constexpr int64_t kTileK = 64;           // bytes of K per tile step
constexpr int64_t kTileBytes = 16 * 64;  // one packed x tile, one C tile
constexpr int64_t kChunkBlocks = 64;     // tile steps per K chunk (4096 bytes of K)
constexpr int64_t kMacroTiles = 16;      // token tiles per pass over the weight (256 tokens)

// Tiles: cpu::weight_rows_config's 2 x 2 block.

// Where tile step kb of weight row `row` is: in place, or in the zero-padded copy of
// the partial last step (tail, [N, 64]).
struct WeightRows {
  const int8_t* data;
  int64_t ld;
  const int8_t* tail;
  int64_t full_blocks;  // steps read in place
};

// One 2 x 2 (or smaller) block over tile steps [kb0, kb1): C from acc (or zero on the
// first chunk), then back to acc. acc(i, j) = acc + ((tt + j) * 2 + i) * 256.
template <int NA, int NB>
void block(const WeightRows& w, int64_t row0, const uint8_t* xb, int64_t kblocks, int64_t tile0, int64_t kb0,
           int64_t kb1, int32_t* acc, bool first) {
  auto c_at = [&](int i, int j) { return acc + (j * 2 + i) * 256; };
  if (first) {
    _tile_zero(0);
    if constexpr (NB > 1) _tile_zero(1);
    if constexpr (NA > 1) _tile_zero(2);
    if constexpr (NA > 1 && NB > 1) _tile_zero(3);
  } else {
    _tile_loadd(0, c_at(0, 0), 64);
    if constexpr (NB > 1) _tile_loadd(1, c_at(0, 1), 64);
    if constexpr (NA > 1) _tile_loadd(2, c_at(1, 0), 64);
    if constexpr (NA > 1 && NB > 1) _tile_loadd(3, c_at(1, 1), 64);
  }
  const uint8_t* b0 = xb + tile0 * kblocks * kTileBytes;
  const uint8_t* b1 = b0 + kblocks * kTileBytes;
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    const bool in_place = kb < w.full_blocks;
    const int8_t* a0 = in_place ? w.data + row0 * w.ld + kb * kTileK : w.tail + row0 * kTileK;
    const int64_t lda = in_place ? w.ld : kTileK;
    _tile_loadd(4, a0, lda);
    if constexpr (NA > 1) _tile_loadd(5, a0 + 16 * lda, lda);
    _tile_loadd(6, b0 + kb * kTileBytes, 64);
    if constexpr (NB > 1) _tile_loadd(7, b1 + kb * kTileBytes, 64);
    _tile_dpbssd(0, 4, 6);
    if constexpr (NB > 1) _tile_dpbssd(1, 4, 7);
    if constexpr (NA > 1) _tile_dpbssd(2, 5, 6);
    if constexpr (NA > 1 && NB > 1) _tile_dpbssd(3, 5, 7);
  }
  _tile_stored(0, c_at(0, 0), 64);
  if constexpr (NB > 1) _tile_stored(1, c_at(0, 1), 64);
  if constexpr (NA > 1) _tile_stored(2, c_at(1, 0), 64);
  if constexpr (NA > 1 && NB > 1) _tile_stored(3, c_at(1, 1), 64);
}

using BlockFn = void (*)(const WeightRows&, int64_t, const uint8_t*, int64_t, int64_t, int64_t, int64_t, int32_t*,
                         bool);
constexpr BlockFn kBlocks[2][2] = {{block<1, 1>, block<1, 2>}, {block<2, 1>, block<2, 2>}};

// y[t, r] = (float(acc[r][t]) * x_scale[t]) * w_scale[r] for r < rows, t < tokens;
// acc is one C tile [16 rows][16 tokens], y points at (t0, r0).
void epilogue(const int32_t* acc, int rows, int tokens, const float* x_scale, const float* w_scale, float* y,
              int64_t ld_y) {
  const __mmask16 token_mask = static_cast<__mmask16>((1u << tokens) - 1u);
  const __m512 xs = _mm512_maskz_loadu_ps(token_mask, x_scale);
  __m512 r[16];
  for (int i = 0; i < 16; ++i) {
    r[i] = i < rows ? _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(acc + i * 16)), xs),
                                    _mm512_set1_ps(w_scale[i]))
                    : _mm512_setzero_ps();
  }
  cpu::transpose_16x16(r);
  const __mmask16 row_mask = static_cast<__mmask16>((1u << rows) - 1u);
  for (int t = 0; t < tokens; ++t) _mm512_mask_storeu_ps(y + t * ld_y, row_mask, r[t]);
}

}  // namespace

void w8a8_gemm_amx(const uint8_t* xb, int64_t m, const float* x_scale, const W8a8WeightView& w, const int8_t* w_tail,
                   float* y, int64_t ld_y, int64_t n0, int64_t n1) {
  const int64_t kblocks = (w.k + kTileK - 1) / kTileK;
  const WeightRows rows{w.data, w.ld, w_tail, w.k / kTileK};
  alignas(64) int32_t acc[kMacroTiles * 2 * 256];
  cpu::TileConfigCache config;
  for (int64_t tile0 = 0; tile0 * 16 < m; tile0 += kMacroTiles) {
    const int64_t tiles = std::min(kMacroTiles, (m - tile0 * 16 + 15) / 16);
    for (int64_t r0 = n0; r0 < n1; r0 += 32) {
      const int rows0 = static_cast<int>(std::min<int64_t>(16, n1 - r0));
      const int rows1 = static_cast<int>(std::clamp<int64_t>(n1 - r0 - 16, 0, 16));
      config.load(cpu::weight_rows_config(rows0, rows1));
      const int na = rows1 > 0 ? 2 : 1;
      for (int64_t kb0 = 0; kb0 < kblocks; kb0 += kChunkBlocks) {
        const int64_t kb1 = std::min(kblocks, kb0 + kChunkBlocks);
        for (int64_t tt = 0; tt < tiles; tt += 2) {
          const int nb = tiles - tt > 1 ? 2 : 1;
          kBlocks[na - 1][nb - 1](rows, r0, xb, kblocks, tile0 + tt, kb0, kb1, acc + tt * 2 * 256, kb0 == 0);
        }
      }
      for (int64_t tt = 0; tt < tiles; ++tt) {
        const int64_t t = (tile0 + tt) * 16;
        const int tokens = static_cast<int>(std::min<int64_t>(16, m - t));
        for (int i = 0; i < na; ++i) {
          epilogue(acc + (tt * 2 + i) * 256, i == 0 ? rows0 : rows1, tokens, x_scale + t, w.scale + r0 + 16 * i,
                   y + t * ld_y + r0 + 16 * i, ld_y);
        }
      }
    }
  }
}

}  // namespace tp::detail
