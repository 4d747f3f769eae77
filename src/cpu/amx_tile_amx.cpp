// The AMX tile operations (cpu/amx.h), compiled with the AVX-512 and AMX flags;
// entered only when amx_status().usable.

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/amx.h"

namespace tp::cpu {

namespace {

// The 64-byte tile configuration (palette 1): per tile, rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace

void amx_bf16_tile_16x16x32(const uint16_t* a, int64_t lda, const uint16_t* bp, int64_t ldb, float* c, int64_t ldc) {
  TileConfig cfg;
  cfg.rows[0] = 16, cfg.bytes_per_row[0] = 16 * sizeof(float);     // c: 16 x 16 float32
  cfg.rows[1] = 16, cfg.bytes_per_row[1] = 32 * sizeof(uint16_t);  // a: 16 x 32 bf16
  cfg.rows[2] = 16, cfg.bytes_per_row[2] = 32 * sizeof(uint16_t);  // b: 16 pairs of rows x 16 columns
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_loadd(1, a, lda * static_cast<int64_t>(sizeof(uint16_t)));
  _tile_loadd(2, bp, ldb * static_cast<int64_t>(sizeof(uint16_t)));
  _tile_dpbf16ps(0, 1, 2);
  _tile_stored(0, c, ldc * static_cast<int64_t>(sizeof(float)));
  _tile_release();
}

}  // namespace tp::cpu
