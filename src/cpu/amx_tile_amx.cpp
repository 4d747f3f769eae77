// The AMX tile operations (cpu/amx.h), compiled with the AVX-512 and AMX flags;
// entered only when amx_status().usable.

#include <immintrin.h>

#include <cstdint>

#include "cpu/amx.h"
#include "cpu/amx_config.h"

namespace tp::cpu {

void amx_bf16_tile_16x16x32(const uint16_t* a, int64_t lda, const uint16_t* bp, int64_t ldb, float* c, int64_t ldc) {
  TileConfig cfg;
  cfg.set(0, 16, 16 * sizeof(float));     // c: 16 x 16 float32
  cfg.set(1, 16, 32 * sizeof(uint16_t));  // a: 16 x 32 bf16
  cfg.set(2, 16, 32 * sizeof(uint16_t));  // b: 16 pairs of rows x 16 columns
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_loadd(1, a, lda * static_cast<int64_t>(sizeof(uint16_t)));
  _tile_loadd(2, bp, ldb * static_cast<int64_t>(sizeof(uint16_t)));
  _tile_dpbf16ps(0, 1, 2);
  _tile_stored(0, c, ldc * static_cast<int64_t>(sizeof(float)));
  _tile_release();
}

}  // namespace tp::cpu
