#pragma once
// Private: a float32 GEMM over weight panels that a format decodes on the fly, shared
// by the weight-only integer kernels (src/quant/int4, src/quant/int8).
//
// Why it is shared and lives here: from M of a few rows up, a weight-only GEMM is an
// ordinary float32 GEMM whose B operand (the weight) is unpacked by a format-specific
// decoder instead of a BLAS packing routine. The blocking, the register microkernels
// and the threading do not depend on the format, so INT4 and INT8 (and any other
// weight-only format that decodes exactly to float32) plug in a decoder and reuse the
// rest; like cpu/features.h, it is a CPU building block, not a format.
//
// The weight W [N, K] (y = x W^T) is cut into panels of kPanelWidth = 16 output
// columns. For each panel (two at a time on AVX-512) and each chunk of K, the
// decoder writes the exact float32 weights into a small buffer that stays in L1
//     buf[kk * ld_buf + j] = W[16 p + j, k0 + kk]      (kk < kc, j < 16 np)
// and a register microkernel (6 rows x 16 columns on AVX2, 8 x 32 on AVX-512) runs
// every row of x over it, x packed once per call so that a tile's broadcasts read
// one contiguous stream. So each weight is decoded once per call whatever M is, and
// the arithmetic is float32 x times the exactly decoded float32 weight, accumulated
// in float32 in k order (one accumulator per output element).
//
// Entry points are plain functions over raw pointers; the per-ISA ones live in
// cpu/panel_gemm_avx2.cpp / _avx512.cpp (compiled with those ISA flags) and must only
// be called when cpu::isa() allows it.

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "cpu/features.h"

namespace tp::cpu {

/// Output columns per weight panel in every CPU weight-only layout.
inline constexpr int64_t kPanelWidth = 16;

/// Writes the exact float32 weights of panels [p, p + np) for k in [k0, k0 + kc)
/// into buf (row kk at buf + kk * ld_buf, panel j's 16 columns at offset 16 j).
/// `weight` is the format's own description of its packed weight. The GEMM asks
/// for chunks k0 = 0, 256, 512, ... with kc = min(256, K - k0), so both are
/// multiples of 8 when K is. Columns past N must decode to zeros.
using PanelDecodeFn = void (*)(const void* weight, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                               int64_t ld_buf);

/// The weight side of a panel GEMM: N, K, the decoder and its argument.
struct PanelWeight {
  int64_t n = 0;                   ///< output columns (the last panel may be partial)
  int64_t k = 0;                   ///< input features
  PanelDecodeFn decode = nullptr;  ///< the decoder for the ISA the GEMM runs with
  const void* weight = nullptr;    ///< passed to decode
};

/// Rows of x the microkernel of `isa` holds in registers (1 scalar, 6 AVX2, 8
/// AVX-512), and panels it takes at a time (1, or 2 on AVX-512).
int64_t panel_rows_per_tile(Isa isa);
int64_t panel_gemm_panels_per_step(Isa isa);

/// x [m, K] (row stride ld_x) repacked for the microkernels of `isa`: blocks of
/// R = panel_rows_per_tile(isa) rows, each [K, R] (the R rows of one k side by
/// side, so a tile's broadcasts read one contiguous stream), the last block padded
/// with zero rows. Returns ceil(m / R) * K * R floats.
std::vector<float> panel_pack_x(const float* x, int64_t m, int64_t ld_x, int64_t k, Isa isa);

/// y[r, c] = sum_k x[r, k] * W[c, k] for r < m and the columns of panels [p0, p1)
/// (those below N). xp: x [m, K] packed by panel_pack_x for `isa`; y: [m, N] with row
/// stride ld_y. Single-threaded: callers split panels across threads. `isa` selects
/// the microkernel and must be the ISA `w.decode` was written for.
void panel_gemm(const float* xp, int64_t m, const PanelWeight& w, float* y, int64_t ld_y, int64_t p0, int64_t p1,
                Isa isa);

/// panel_gemm over all `panels` of w for x [m, K] (row stride ld_x, packed here),
/// threaded over N with at::parallel_for.
void panel_gemm_parallel(const float* x, int64_t m, int64_t ld_x, const PanelWeight& w, float* y, int64_t ld_y,
                         int64_t panels, Isa isa);

/// Runs fn(p0, p1) over chunks covering panels [0, panels) on ATen's intra-op
/// threads (at::parallel_for; this file is compiled with -fopenmp, without which
/// that header template runs everything on the calling thread). Threads take chunks in turn from a shared counter
/// rather than one fixed share each, so a thread that the OS preempts (a busy
/// machine) delays only its chunk. Chunks are multiples of `align` panels and hold
/// at least ~2^18 multiply-adds (m rows x K), so a small layer stays on one thread.
void parallel_over_panels(int64_t panels, int64_t m, int64_t k, int64_t align,
                          const std::function<void(int64_t p0, int64_t p1)>& fn);

/// The float32 weight [N, K] as w.decode writes it (for tests and checks).
at::Tensor panel_decode_all(const PanelWeight& w, int64_t panels, Isa isa);

/// Throws (naming `what`) unless this CPU can run `isa`'s kernels.
void check_isa(Isa isa, const char* what);

/// The tensor side of a weight-only linear: checks x ([..., k], float32, bfloat16 or
/// float16, CPU), converts it to contiguous float32 [m, k] (exactly), calls
/// run(x, m, y) with y [m, n] float32 to fill, and returns y as [..., n] in x's dtype
/// (rounded once).
at::Tensor linear_through_f32(const at::Tensor& x, int64_t n, int64_t k, const char* what,
                              const std::function<void(const float* x, int64_t m, float* y)>& run);

/// Fewest rows of x for which bf16 layers take the AMX tiles (below it the formats'
/// rows kernels, which stream the weight once at the memory limit, are as fast:
/// benchmarks/RESULTS.md, 2026-12-03 (evening), "Thresholds").
inline constexpr int64_t kPanelAmxMinM = 5;

/// Whether a weight-only layer runs x on the AMX bf16 tiles: x bfloat16 with at least
/// kPanelAmxMinM rows, `isa` avx512 (the decoder's), and amx_status().usable.
bool panel_amx_bf16_applies(const at::Tensor& x, Isa isa);

/// y = x W^T for bfloat16 x [..., K] on AMX bf16 tiles, threaded over panels: W decoded by
/// w.decode (the AVX-512 decoder) and rounded to bfloat16 (to nearest even: the bf16
/// layer's dequantized weight, as at::linear on it would take it), the products exact and
/// summed in float32 by TDPBF16PS, y rounded to bfloat16 once. Only where
/// panel_amx_bf16_applies (cpu/panel_gemm_amx.cpp).
at::Tensor panel_linear_amx_bf16(const at::Tensor& x, const PanelWeight& w, int64_t panels, const char* what);

/// The tiles' loop for panels [p0, p1) (single-threaded): xa bf16 [m, >= round_up(K, 32)]
/// (row stride ld_xa, zero past K), y [m, N] float32 (row stride ld_y).
void panel_gemm_amx_bf16_range(const uint16_t* xa, int64_t m, int64_t ld_xa, const PanelWeight& w, float* y,
                               int64_t ld_y, int64_t p0, int64_t p1);

/// The microkernels: y[r, c] (+)= sum_{kk < kc} x[r, kk] * buf[kk, c] for r < m and
/// c < ncols (<= 16 np, the valid columns); `accumulate` adds to y instead of
/// overwriting it. xp points at k0 of the first packed block (panel_pack_x), block
/// b at xp + b * ld_block (= K * R). np is 1 (scalar, AVX2) or 1..2 (AVX-512).
void panel_microkernel_scalar(const float* xp, int64_t m, int64_t ld_block, const float* buf, int64_t np, int64_t kc,
                              int64_t ld_buf, float* y, int64_t ld_y, int64_t ncols, bool accumulate);
void panel_microkernel_avx2(const float* xp, int64_t m, int64_t ld_block, const float* buf, int64_t np, int64_t kc,
                            int64_t ld_buf, float* y, int64_t ld_y, int64_t ncols, bool accumulate);
void panel_microkernel_avx512(const float* xp, int64_t m, int64_t ld_block, const float* buf, int64_t np, int64_t kc,
                              int64_t ld_buf, float* y, int64_t ld_y, int64_t ncols, bool accumulate);

}  // namespace tp::cpu
