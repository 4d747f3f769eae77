#pragma once
// Private: a GEMM on AVX-512 bf16 dot products (VDPBF16PS) over weight panels that a
// format decodes to its exact codes, with the scales applied to each scale group's
// partial sums: for the formats packed in 16-column panels (INT4; cpu/row_decoded_gemm.h
// is the loop for those stored row by row). When it runs: cpu/bf16_dot.h.
//
// What it computes, for x bf16 [m, K] and a weight of codes c (each an exact bf16 value:
// an INT4 code 0..15), column scales s and optional zero points z per scale group G:
//     y[r, n] = sum_G s[G, n] * (P_G[r, n] - z[G, n] * X_G[r])
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
// across a scale group), the decoder writes the chunk's pair rows into a 16 KiB buffer
// that stays in L1 with the chunk's scales and zeros, and a register tile of 6 rows x 64
// columns (24 accumulators) runs every row of x over it; the chunk's partial sums are
// scaled into y (float32) at once. So each weight is decoded once per call whatever M is.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace tp::cpu {

/// Columns per panel (as cpu::kPanelWidth) and panels per step of the GEMM.
inline constexpr int64_t kBf16PanelWidth = 16;
inline constexpr int64_t kBf16PanelsPerStep = 4;
/// k per chunk at most; a pair row of a step is kBf16PanelsPerStep * 16 uint32.
inline constexpr int64_t kBf16ChunkK = 128;
inline constexpr int64_t kBf16PairLd = kBf16PanelsPerStep * kBf16PanelWidth;

/// Writes panels [p, p + np) (np <= 4) of k in [k0, k0 + kc) (kc <= kBf16ChunkK, inside
/// one scale group): pairs[q * kBf16PairLd + 16 j + l] = the bf16 bits of (c[16 (p + j) +
/// l, k0 + 2 q], c[.., k0 + 2 q + 1]) in (low, high) halves, q < ceil(kc / 2), k past kc
/// (and past K) zero; scale[16 j + l] and, where the weight has zero points, zero[16 j +
/// l] of that group. Columns past N: zero codes, finite scale and zero.
using Bf16PanelDecodeFn = void (*)(const void* weight, int64_t p, int64_t np, int64_t k0, int64_t kc, uint32_t* pairs,
                                   float* scale, float* zero);

/// The weight side: its shape, scale group, decoder and the decoder's argument.
struct Bf16PanelWeight {
  int64_t n = 0;
  int64_t k = 0;
  int64_t group = 0;   ///< k per scale group: >= k (one per column), or an even number dividing k
  bool zeros = false;  ///< the decoder writes zero points (then x's group sums are needed)
  Bf16PanelDecodeFn decode = nullptr;
  const void* weight = nullptr;
};

/// k per chunk for a weight with scale group `group`: kBf16ChunkK, halved until it divides
/// the group where the group is below K.
int64_t bf16_panel_chunk(int64_t k, int64_t group);

/// y (float32 [m, N], row stride ld_y) for panels [p0, p1): x bf16 bits [m, >= round_up(K,
/// 2)] (row stride ld_x, even; zero past K), x_sum [m, chunks] (row stride ld_sum; where
/// w.zeros). Single-threaded; only on a CPU with avx512_bf16.
void bf16_panel_gemm_range(const uint16_t* x, int64_t ld_x, int64_t m, const float* x_sum, int64_t ld_sum,
                           const Bf16PanelWeight& w, float* y, int64_t ld_y, int64_t p0, int64_t p1);

/// y = the GEMM for x [..., K] bfloat16, threaded over panels; returns bfloat16 [..., N]
/// (rounded once). `what` names the caller in errors.
at::Tensor bf16_panel_linear(const at::Tensor& x, const Bf16PanelWeight& w, const char* what);

}  // namespace tp::cpu
