#pragma once
// Private: a GEMM on AVX-512 bf16 dot products (VDPBF16PS) over weight panels that a
// format decodes to its exact codes, with the scales applied to each scale group's
// partial sums. For bf16 layers on CPUs with avx512_bf16 and without usable AMX tiles
// (AMD Zen 4 / Zen 5, Cooper Lake): the vector-instruction sibling of the AMX paths
// (cpu/amx_rows_gemm.h, cpu/panel_gemm.h's bf16 tiles). Float32 layers never come here.
//
// What it computes, for x bf16 [m, K] and a weight of codes c (each an exact bf16 value:
// an int8 code, an E4M3 value, an INT4 code 0..15), column scales s and optional zero
// points z per scale group G, optional row scales t (the activations' own quantization
// scales, FP8) per x group:
//     y[r, n] = sum_G s[G, n] * t[r, G] * (P_G[r, n] - z[G, n] * X_G[r])
//     P_G[r, n] = sum_{k in G} x[r, k] * c[n, k]      (exact products, float32 sums)
//     X_G[r]   = sum_{k in G} x[r, k]                (float64, rounded once; with zeros only)
// so the float64 model is x times the format's dequantized weight (codes minus zero, times
// scale, unrounded), and the only roundings are the float32 sums (and, with zero points,
// the product z X_G, which the INT4 rows kernel has as well).
//
// Layout. VDPBF16PS multiplies the bf16 pairs of two registers lane by lane and adds
// both products into the lane's float32: so the weight is decoded into "pair rows", one
// per two k, 16 columns of a panel per register, lane j holding (c[n_j, k], c[n_j, k +
// 1]), and x's pair (x[r, k], x[r, k + 1]) is one 32-bit broadcast straight from x's row.
// For each step of up to 4 panels (64 columns) and each chunk of K (128 k at most, never
// across a scale group or an x group), the decoder writes the chunk's pair rows into a
// 16 KiB buffer that stays in L1 with the chunk's scales and zeros, and a register tile of
// 6 rows x 64 columns (24 accumulators) runs every row of x over it; the chunk's partial
// sums are scaled into y (float32) at once. So each weight is decoded once per call
// whatever M is. Measured in benchmarks/RESULTS.md, 2026-12-07 ("bf16 dot products").

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "cpu/features.h"

namespace tp::cpu {

/// Columns per panel (as cpu::kPanelWidth) and panels per step of the GEMM.
inline constexpr int64_t kBf16PanelWidth = 16;
inline constexpr int64_t kBf16PanelsPerStep = 4;
/// k per chunk at most; a pair row of a step is kBf16PanelsPerStep * 16 uint32.
inline constexpr int64_t kBf16ChunkK = 128;
inline constexpr int64_t kBf16PairLd = kBf16PanelsPerStep * kBf16PanelWidth;

/// Fewest rows of x for which bf16 layers take this GEMM (below it the formats' rows /
/// GEMV kernels, which stream the weight once at the memory limit):
/// benchmarks/RESULTS.md, 2026-12-07 ("bf16 dot products").
inline constexpr int64_t kBf16PanelMinM = 5;

/// Writes panels [p, p + np) (np <= 4) of k in [k0, k0 + kc) (kc <= kBf16ChunkK, inside
/// one scale group): pairs[q * kBf16PairLd + 16 j + l] = the bf16 bits of (c[16 (p + j) +
/// l, k0 + 2 q], c[.., k0 + 2 q + 1]) in (low, high) halves, q < ceil(kc / 2), k past kc
/// (and past K) zero; scale[16 j + l] and, where the weight has zero points, zero[16 j +
/// l] of that group. Columns past N: zero codes, finite scale and zero.
using Bf16PanelDecodeFn = void (*)(const void* weight, int64_t p, int64_t np, int64_t k0, int64_t kc,
                                   uint32_t* pairs, float* scale, float* zero);

/// The weight side: its shape, scale group, decoder and the decoder's argument.
struct Bf16PanelWeight {
  int64_t n = 0;
  int64_t k = 0;
  int64_t group = 0;  ///< k per scale group: >= k (one per column), or a multiple of 8 dividing k
  bool zeros = false;  ///< the decoder writes zero points (then x's group sums are needed)
  Bf16PanelDecodeFn decode = nullptr;
  const void* weight = nullptr;
};

/// The activations' own scales t[r, G] (FP8 formats): at scale[r * row_stride + (k / group)
/// * group_stride]; group >= K for one per row.
struct Bf16RowScales {
  const float* scale = nullptr;
  int64_t row_stride = 0;
  int64_t group_stride = 0;
  int64_t group = 0;
};

/// k per chunk for a weight with scale group `group` and rows scaled per `x_group` (0:
/// none): kBf16ChunkK, halved until it divides both groups that are below K.
int64_t bf16_panel_chunk(int64_t k, int64_t group, int64_t x_group);

/// Whether a bf16 layer's forward on x takes this GEMM: x bfloat16 on the CPU with at least
/// kBf16PanelMinM rows, `isa` (the level the caller dispatches at: cpu::isa(), so TP_CPU_ISA
/// can turn it off) AVX-512, the CPU has avx512_bf16 and the AMX tiles are not usable (where
/// they are, they go first).
bool bf16_panel_applies(const at::Tensor& x, Isa isa);

/// y (float32 [m, N], row stride ld_y) for panels [p0, p1): x bf16 bits [m, >= round_up(K,
/// 2)] (row stride ld_x, even; zero past K), x_sum [m, chunks] (row stride ld_sum; where
/// w.zeros), t optional. Single-threaded; only on a CPU with avx512_bf16.
void bf16_panel_gemm_range(const uint16_t* x, int64_t ld_x, int64_t m, const float* x_sum, int64_t ld_sum,
                           const Bf16RowScales& t, const Bf16PanelWeight& w, float* y, int64_t ld_y, int64_t p0,
                           int64_t p1);

/// y = the GEMM for x [m, K] (bfloat16, or int16 holding bf16 bits), threaded over panels;
/// returns float32 [m, N]. `t` as bf16_panel_gemm_range (nullptr: none). `what` names the
/// caller in errors.
at::Tensor bf16_panel_linear(const at::Tensor& x, const Bf16PanelWeight& w, const Bf16RowScales* t,
                             const char* what);

/// The byte codes of 16 weight rows, rows[l] (nullptr: a zero row) at k in [0, kc), as pair
/// rows: out[32 q + 2 l + h] = rows[l][2 q + h], zero past kc, for q < ceil(kc / 2). The
/// transpose shared by the formats whose weights are [N, K] bytes (INT8, FP8); kc <=
/// kBf16ChunkK. AVX-512 BW.
void bf16_pair_bytes_avx512(const uint8_t* const rows[16], int64_t kc, uint8_t* out);

}  // namespace tp::cpu
