#pragma once
// Private: a GEMM over a weight whose rows a format decodes to exact bf16 values (its
// codes: int8, E4M3), with the scales applied to the partial sums instead of to each
// weight. Shared by the formats whose codes are bf16 values and whose checkpoints store
// the weight [N, K] row by row (FP8, INT8 weight-only), as cpu/panel_gemm.h is by the
// formats that decode to float32 and cpu/bf16_panel_gemm.h by those packed in panels:
//   y[t, n] = sum_g (P_g[n, t] * x_scale[g, t]) * scale[n, g]   (grouped: g = k / 128)
//   y[t, n] = (P[n, t] * x_scale[t]) * scale[n]                 (one group per row)
// with P_g the float32 sums of x (bf16) times the decoded codes over group g: exact
// products, float32 sums. Two loops over the same inputs, chosen by the caller:
// - AMX bf16 tiles (TDPBF16PS), cpu/row_decoded_gemm_amx.cpp, where amx_status().usable;
// - AVX-512 bf16 dot products (VDPBF16PS), cpu/row_decoded_gemm_avx512.cpp, where the CPU
//   has avx512_bf16 but no usable AMX (AMD Zen 4 / 5): x's 16 tokens of a pair tile are
//   one register, each decoded weight pair one broadcast, so no weight is transposed and
//   the decode is the format's widening alone. Register tile 24 weight rows x 16 tokens,
//   12 x 32 or 6 x 64 (24 accumulators); per chunk of 128 k the partial sums go into a
//   float buffer of the row block, transposed into y at the end.
// Both read x packed into pair tiles (pack_pair_tiles) and the activations' scales
// transposed, [groups, round_up(m, 16)].

#include <cstdint>

namespace tp::cpu {

/// K per decoded chunk at most (a multiple of the 128-k scale group).
inline constexpr int64_t kAmxRowsChunkK = 4096;

/// Writes the bf16 bit patterns of weight row `row`, columns [k0, k0 + kc) (kc <=
/// kAmxRowsChunkK), into out[0, round_up(kc, 32)), zeros past kc. The values must be
/// exact (codes, not code x scale). Written in a file compiled with the AVX-512 flags; it
/// may use avx512_bf16, which every CPU that runs either loop has.
using RowDecodeFn = void (*)(const void* weight, int64_t row, int64_t k0, int64_t kc, uint16_t* out);

/// The weight side: N, K, the decoder and its argument, and the scales.
struct RowDecodedWeight {
  int64_t n = 0;
  int64_t k = 0;
  RowDecodeFn decode = nullptr;
  const void* weight = nullptr;  ///< passed to decode
  const float* scale = nullptr;  ///< [n, scale_ld]: column 0, or column k / 128 when grouped
  int64_t scale_ld = 1;
  bool grouped = false;  ///< 128-k scale groups (x_scale then has ceil(k / 128) rows)
};

/// uint16 elements of x [m, k] packed by pack_pair_tiles.
int64_t pair_tiles_size(int64_t m, int64_t k);

/// x [m, k] bf16 bit patterns (row stride ld) -> xb: per 16 rows and 32 k, a 16 x 32 tile
/// whose row r holds, for each of the 16 rows j, x[16 t + j, 32 kb + 2 r .. + 1]; tiles
/// [ceil(m / 16), ceil(k / 32)] in that order, zero padded. Threaded over rows.
void pack_pair_tiles(const uint16_t* x, int64_t m, int64_t k, int64_t ld, uint16_t* xb);

/// y [m, n] (row stride ld_y) for weight rows [n0, n1); x_scale [groups, >= round_up(m,
/// 16)] (row stride x_scale_ld). Single-threaded. The AMX loop, and the AVX-512 bf16 one.
void amx_rows_gemm(const uint16_t* xb, int64_t m, const float* x_scale, int64_t x_scale_ld, const RowDecodedWeight& w,
                   float* y, int64_t ld_y, int64_t n0, int64_t n1);

void bf16_rows_gemm(const uint16_t* xb, int64_t m, const float* x_scale, int64_t x_scale_ld, const RowDecodedWeight& w,
                    float* y, int64_t ld_y, int64_t n0, int64_t n1);

/// Which loop runs a row-decoded GEMM.
enum class RowsLoop { kAmx, kAvx512Bf16 };

/// The loop over all rows of w, threaded over N (units of 32 rows, 24 for kAvx512Bf16).
void row_decoded_gemm_parallel(RowsLoop loop, const uint16_t* xb, int64_t m, const float* x_scale, int64_t x_scale_ld,
                               const RowDecodedWeight& w, float* y, int64_t ld_y);

}  // namespace tp::cpu
