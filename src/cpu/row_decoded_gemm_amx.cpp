// The AMX row-decoded GEMM (cpu/row_decoded_gemm.h), compiled with the AMX flags and
// entered only when amx_status().usable.
//
// A is the weight (16 rows x 32 k of bf16), decoded by the format per block of 32 rows
// and chunk of 4096 k into a buffer that stays in L2 while every token block passes; B is
// x packed in VNNI pairs (amx_pack_pairs); C [16 weight rows, 16 tokens] float32. A 2 x 2
// block of C tiles (32 rows x 32 tokens) takes all 8 tiles: 4 C, 2 A, 2 B. The partial
// sums of each scale group (128 k, or the whole chunk) are scaled into a float buffer of
// the block, transposed into y's [token, row] layout at the end. (Decoding 128 rows per
// block so that x is reused from L2 was measured and not kept: benchmarks/RESULTS.md,
// 2026-12-03 (evening).)

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "cpu/amx_config.h"
#include "cpu/row_decoded_gemm.h"

// No templates or inline functions shared with other translation units here (no
// std::min): the linker could keep this file's AMX copy of one for every caller.

namespace tp::cpu {

namespace {

constexpr int64_t kTileK = 32;           // bf16 k per tile step
constexpr int64_t kTileElems = 16 * 32;  // bf16 per packed x tile
constexpr int64_t kChunkK = kAmxRowsChunkK;
constexpr int64_t kGroupSteps = 128 / kTileK;
constexpr int64_t kMacroTiles = 16;  // token tiles per pass over the weight (256 tokens)
// Row stride of the decoded block: 64 bytes past a multiple of 4 KiB, so that a tile's 16
// rows do not all fall into one L1 set.
constexpr int64_t kBlockLd = kChunkK + 32;

int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// C(i, j) = 2 i + j, A(i) = 4 + i, B(j) = 6 + j; steps [kb0, kb1) of the chunk; C stored
// to c + (2 i + j) * 256 ([16 rows][16 tokens]).
template <int NA, int NB>
void block(const uint16_t* wa, int64_t lda, const uint16_t* b0, const uint16_t* b1, int64_t kb0, int64_t kb1,
           float* c) {
  _tile_zero(0);
  if constexpr (NB > 1) _tile_zero(1);
  if constexpr (NA > 1) _tile_zero(2);
  if constexpr (NA > 1 && NB > 1) _tile_zero(3);
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    _tile_loadd(4, wa + kb * kTileK, lda * 2);
    if constexpr (NA > 1) _tile_loadd(5, wa + 16 * lda + kb * kTileK, lda * 2);
    _tile_loadd(6, b0 + kb * kTileElems, 64);
    if constexpr (NB > 1) _tile_loadd(7, b1 + kb * kTileElems, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NB > 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (NA > 1) _tile_dpbf16ps(2, 5, 6);
    if constexpr (NA > 1 && NB > 1) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  if constexpr (NB > 1) _tile_stored(1, c + 256, 64);
  if constexpr (NA > 1) _tile_stored(2, c + 512, 64);
  if constexpr (NA > 1 && NB > 1) _tile_stored(3, c + 768, 64);
}

using BlockFn = void (*)(const uint16_t*, int64_t, const uint16_t*, const uint16_t*, int64_t, int64_t, float*);
constexpr BlockFn kBlocks[2][2] = {{block<1, 1>, block<1, 2>}, {block<2, 1>, block<2, 2>}};

}  // namespace

void amx_rows_gemm(const uint16_t* xb, int64_t m, const float* x_scale, int64_t x_scale_ld, const RowDecodedWeight& w,
                   float* y, int64_t ld_y, int64_t n0, int64_t n1) {
  const bool grouped = w.grouped;
  const int64_t steps_total = (w.k + kTileK - 1) / kTileK;
  std::vector<uint16_t> wmem(static_cast<size_t>(32 * kBlockLd + 32));
  uint16_t* wa = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(wmem.data()) + 63) & ~uintptr_t{63});
  alignas(64) float acc[kMacroTiles * 2 * 256];
  alignas(64) float c[4 * 256];
  TileConfigCache config;
  for (int64_t tile0 = 0; tile0 * 16 < m; tile0 += kMacroTiles) {
    const int64_t tiles = min64(kMacroTiles, (m - tile0 * 16 + 15) / 16);
    for (int64_t r0 = n0; r0 < n1; r0 += 32) {
      const int rows[2] = {static_cast<int>(min64(16, n1 - r0)),
                           static_cast<int>(n1 - r0 > 16 ? min64(16, n1 - r0 - 16) : 0)};
      const int na = rows[1] > 0 ? 2 : 1;
      config.load(weight_rows_config(rows[0], rows[1]));
      for (int64_t i = 0; i < tiles * 2 * 256; ++i) acc[i] = 0.0f;
      for (int64_t k0 = 0; k0 < w.k; k0 += kChunkK) {
        const int64_t kc = min64(kChunkK, w.k - k0), steps = (kc + kTileK - 1) / kTileK;
        for (int r = 0; r < rows[0] + rows[1]; ++r) w.decode(w.weight, r0 + r, k0, kc, wa + r * kBlockLd);
        for (int64_t tt = 0; tt < tiles; tt += 2) {
          const int nb = tiles - tt > 1 ? 2 : 1;
          const uint16_t* b0 = xb + ((tile0 + tt) * steps_total + k0 / kTileK) * kTileElems;
          const uint16_t* b1 = b0 + steps_total * kTileElems;
          const int64_t group_steps = grouped ? kGroupSteps : steps;
          for (int64_t s0 = 0; s0 < steps; s0 += group_steps) {
            kBlocks[na - 1][nb - 1](wa, kBlockLd, b0, b1, s0, min64(steps, s0 + group_steps), c);
            const int64_t g = (k0 + s0 * kTileK) / 128;  // the scale group (grouped only)
            for (int i = 0; i < na; ++i) {
              for (int j = 0; j < nb; ++j) {
                float* a = acc + ((tt + j) * 2 + i) * 256;
                const float* p = c + (2 * i + j) * 256;
                if (!grouped) {
                  for (int e = 0; e < 256; e += 16)
                    _mm512_store_ps(a + e, _mm512_add_ps(_mm512_load_ps(a + e), _mm512_load_ps(p + e)));
                  continue;
                }
                const __m512 xs = _mm512_loadu_ps(x_scale + g * x_scale_ld + (tile0 + tt + j) * 16);
                for (int r = 0; r < rows[i]; ++r) {
                  const float ws = w.scale[(r0 + 16 * i + r) * w.scale_ld + g];
                  _mm512_store_ps(a + r * 16, _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(p + r * 16), xs),
                                                              _mm512_set1_ps(ws), _mm512_load_ps(a + r * 16)));
                }
              }
            }
          }
        }
      }
      // acc [rows][tokens] -> y [tokens][rows], with the one-group scales.
      for (int64_t tt = 0; tt < tiles; ++tt) {
        const int64_t t = (tile0 + tt) * 16;
        const int tokens = static_cast<int>(min64(16, m - t));
        const __m512 xs = _mm512_loadu_ps(x_scale + t);
        for (int i = 0; i < na; ++i) {
          __m512 v[16];
          const float* a = acc + (tt * 2 + i) * 256;
          for (int r = 0; r < 16; ++r) {
            if (r >= rows[i]) {
              v[r] = _mm512_setzero_ps();
            } else if (grouped) {
              v[r] = _mm512_load_ps(a + r * 16);
            } else {
              const float ws = w.scale[(r0 + 16 * i + r) * w.scale_ld];
              v[r] = _mm512_mul_ps(_mm512_mul_ps(_mm512_load_ps(a + r * 16), xs), _mm512_set1_ps(ws));
            }
          }
          transpose_16x16(v);
          const __mmask16 mask = static_cast<__mmask16>((1u << rows[i]) - 1u);
          for (int e = 0; e < tokens; ++e) _mm512_mask_storeu_ps(y + (t + e) * ld_y + r0 + 16 * i, mask, v[e]);
        }
      }
    }
  }
}

}  // namespace tp::cpu
