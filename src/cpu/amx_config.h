#pragma once
// Private to the *_amx.cpp files: AMX's 64-byte tile configuration (palette 1) and the
// 16 x 16 float32 transpose their epilogues use. Include only from a file compiled with
// the AMX flags (src/CMakeLists.txt, TP_AMX_FLAGS), and run only when
// cpu::amx_status().usable.

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace tp::cpu {

/// Per tile: rows and bytes per row; a tile left at 0 x 0 is unused.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};

  void set(int tile, int n_rows, int bytes) {
    rows[tile] = static_cast<uint8_t>(n_rows);
    bytes_per_row[tile] = static_cast<uint16_t>(bytes);
  }
};

/// Loads a configuration only when it differs from the one loaded last through this
/// object (LDTILECFG also zeroes every tile, so a changed shape must not be reloaded
/// mid-accumulation; callers reload between blocks only).
class TileConfigCache {
 public:
  void load(const TileConfig& cfg) {
    if (loaded_ && std::memcmp(&cfg, &current_, sizeof cfg) == 0) return;
    current_ = cfg;
    loaded_ = true;
    _tile_loadconfig(&current_);
  }
  ~TileConfigCache() {
    if (loaded_) _tile_release();  // the OS need not save tile state this thread no longer uses
  }

 private:
  TileConfig current_;
  bool loaded_ = false;
};

/// The kernels' 2 x 2 block of tiles with the weight as the A operand: C(i, j) = 2 i + j
/// for weight tile i and token tile j, A(i) = 4 + i, B(j) = 6 + j; weight tile i has
/// rows_i rows (0: unused), every row 64 bytes (64 int8 or 32 bf16 of k, 16 float32 / int32
/// of C), B 16 rows.
inline TileConfig weight_rows_config(int rows0, int rows1) {
  TileConfig cfg;
  const int rows[2] = {rows0, rows1};
  for (int i = 0; i < 2; ++i) {
    if (rows[i] == 0) continue;
    cfg.set(2 * i, rows[i], 64);
    cfg.set(2 * i + 1, rows[i], 64);
    cfg.set(4 + i, rows[i], 64);
  }
  cfg.set(6, 16, 64);
  cfg.set(7, 16, 64);
  return cfg;
}

/// r[j] <- column j of the 16 x 16 matrix whose rows are r[0..15].
inline void transpose_16x16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // Per 128-bit lane L: r[4 g + c] holds column 4 L + c of rows 4 g .. 4 g + 3.
  for (int g = 0; g < 16; g += 4) {
    const __m512d a = _mm512_castps_pd(t[g]), b = _mm512_castps_pd(t[g + 1]);
    const __m512d c = _mm512_castps_pd(t[g + 2]), d = _mm512_castps_pd(t[g + 3]);
    r[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // Lanes 0 and 2 (0x88) or 1 and 3 (0xdd) of rows 0-3 and 4-7 (and 8-11, 12-15) ...
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_shuffle_f32x4(r[c], r[c + 4], 0x88);
    t[c + 4] = _mm512_shuffle_f32x4(r[c], r[c + 4], 0xdd);
    t[c + 8] = _mm512_shuffle_f32x4(r[c + 8], r[c + 12], 0x88);
    t[c + 12] = _mm512_shuffle_f32x4(r[c + 8], r[c + 12], 0xdd);
  }
  // ... then the same across the two halves: column c, c + 8 (from t[c]), c + 4, c + 12.
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm512_shuffle_f32x4(t[c], t[c + 8], 0x88);
    r[c + 8] = _mm512_shuffle_f32x4(t[c], t[c + 8], 0xdd);
    r[c + 4] = _mm512_shuffle_f32x4(t[c + 4], t[c + 12], 0x88);
    r[c + 12] = _mm512_shuffle_f32x4(t[c + 4], t[c + 12], 0xdd);
  }
}

}  // namespace tp::cpu
