#pragma once
// Private: tp's own CPU kernels for int8_w8a8: int8 activations (quantized per token by
// the INT8 method, values in -127..127) times int8 weights (per output channel), the
// products accumulated exactly in int32, then
//   y[i, r] = float(acc[i, r]) * x_scale[i] * w_scale[r]
// in float32, in that order (the order of the reference epilogue, so y matches it bit
// for bit: integer sums do not depend on their order).
//
// Code paths (W8a8Kernel), chosen at run time from cpu::isa() and the CPU's VNNI flags:
// - kAvx2, kAvx512 (no VNNI): vpmaddubsw multiplies u8 x s8 pairs into saturating
//   int16 sums. With u = |w| (0..128) and s = x carrying w's sign (vpsignb; |x| <= 127)
//   every pair sum is at most 2 * 128 * 127 = 32512 < 32767, so nothing saturates for
//   any int8 weight, -128 included; vpmaddwd with ones widens to int32.
//   4 integer ops per 32 (64) products and row pair.
// - kAvx2Vnni (AVX-VNNI, VEX), kAvx512Vnni: vpdpbusd (u8 x s8, 4 products into int32,
//   not saturating) on x + 128 (0..255) and the raw weight; the sum over k of 128 w[r, k]
//   that this adds is subtracted in the epilogue (row_sum, computed once per weight,
//   w8a8_row_sums). One op per 32 (64) products and row pair.
//   kAvx512Vnni from crossover_min_m(Crossover::kW8a8Panels) rows (cpu/crossovers.h: 13
//   built in on AMD, below which a panel of 16 tokens is mostly padding and the dot
//   products are faster) takes the panel kernel instead
//   (w8a8_panels_avx512.cpp): x packed per call into panels of 16 tokens x 4 bytes of K,
//   the weight's 4-byte groups broadcast from the rows in place, an accumulator per
//   (16 tokens, channel), so no horizontal sums (oneDNN's int8 blocking, operands
//   swapped to leave the weight as stored).
// - kAmx: AMX int8 tiles (TDPBSSD, signed x signed, exact int32), where
//   cpu::amx_status().usable; the weight is read in place as the tiles' A operand and
//   x packed per call (w8a8_kernels_amx.cpp). The choice for M >= kW8a8AmxMinM.
// - kScalar: the portable reference.
// Blocking (dot-product tiles): a register tile of 4 x rows x 2-6 weight rows (1 x 4-8
// at M = 1) over the whole K; x rows in blocks that stay in L2, the weight rows of a tile
// in L1 while every x row of the block passes; threads split N.
//
// Exactness bounds: |acc| <= 127 * 128 * K, and the VNNI paths' |acc + 128 row_sum| <=
// 255 * 128 * K, must fit int32: K <= 65536 for VNNI (larger K takes the sign kernel),
// K <= 131072 at all.

#include <cstdint>
#include <utility>

namespace at {
class Tensor;
}

namespace tp::detail {

/// A W8A8 code path; see the header comment.
enum class W8a8Kernel { kScalar, kAvx2, kAvx2Vnni, kAvx512, kAvx512Vnni, kAmx };

/// "scalar", "avx2", "avx2_vnni", "avx512", "avx512_vnni", "amx".
const char* to_string(W8a8Kernel kernel);
/// Whether this CPU can run `kernel` (also under the TP_CPU_ISA cap).
bool w8a8_kernel_supported(W8a8Kernel kernel);
/// The fastest vector kernel cpu::isa() and the CPU's features allow.
W8a8Kernel w8a8_best_kernel();
/// The kernel for M rows: AMX from kW8a8AmxMinM rows where usable, else the above.
W8a8Kernel w8a8_best_kernel(int64_t m);

/// Fewest rows of x for which the AMX kernel is chosen: below it a tile of 16 tokens is
/// mostly padding and the VNNI kernel, already at the memory limit, is as fast
/// (benchmarks/RESULTS.md, 2026-12-03 (evening), "Thresholds").
constexpr int64_t kW8a8AmxMinM = 4;

/// An int8 weight as the kernels read it (a view; the caller owns the memory).
struct W8a8WeightView {
  const int8_t* data = nullptr;  ///< [n, k], row stride ld
  int64_t n = 0;
  int64_t k = 0;
  int64_t ld = 0;
  const float* scale = nullptr;      ///< [n] per output channel
  const int32_t* row_sum = nullptr;  ///< [n] sum_k data[r, k]; the VNNI kernels need it
};

/// Tokens per panel of the panel kernel.
constexpr int64_t kW8a8PanelTokens = 16;

/// The largest K the kernels take: past it int32 sums of int8 products could overflow.
constexpr int64_t kW8a8MaxK = 131072;

/// Columns of packed x: round_up(k, kW8a8KPad).
constexpr int64_t kW8a8KPad = 64;

/// q [m, k] int8 (row stride ld_q) -> xp [m, round_up(k, 64)], zero padded; with
/// `offset` (the VNNI kernels) every byte is q + 128 (= q ^ 0x80, padding 128).
/// Throws if q holds -128 (the quantizer's range is -127..127; the sign kernels rely
/// on it).
void w8a8_pack_x(const int8_t* q, int64_t m, int64_t k, int64_t ld_q, bool offset, uint8_t* xp);

/// Bytes of one panel of the panel kernel: ceil(k / 4) steps of 16 tokens x 4 bytes.
inline int64_t w8a8_panel_bytes(int64_t k) { return (k + 3) / 4 * kW8a8PanelTokens * 4; }
/// q [m, k] int8 (row stride ld_q) -> xp, ceil(m / 16) panels of w8a8_panel_bytes(k):
/// panel t's step s holds, for each of its 16 tokens j, the 4 bytes
/// q[16 t + j, 4 s .. 4 s + 3] + 128 as u8; bytes past k and tokens past m are 0.
/// Throws if q holds -128, as w8a8_pack_x.
void w8a8_pack_x_panels(const int8_t* q, int64_t m, int64_t k, int64_t ld_q, uint8_t* xp);

/// q [m, k] int8 (row stride ld_q) -> xb, AMX's B layout for the kAmx kernel: per 16
/// rows t and 64 columns kb, a 1024-byte tile whose row r holds, for each of the 16 rows
/// j, the 4 bytes q[16 t + j, 64 kb + 4 r .. + 3]; tiles [ceil(m / 16), ceil(k / 64)]
/// in that order, zero padded. Returns ceil(m / 16) * ceil(k / 64) * 1024 bytes.
int64_t w8a8_amx_x_bytes(int64_t m, int64_t k);
void w8a8_pack_x_amx(const int8_t* q, int64_t m, int64_t k, int64_t ld_q, int8_t* xb);

// The per-path kernels: y[i, r] for i < m, r in [n0, n1) (each writes only its own
// columns of y, so threads can split [0, n)). The SIMD ones take x packed by
// w8a8_pack_x (offset for the VNNI ones, ld_xp >= round_up(k, 64)); the scalar one the
// int8 q as is.
void w8a8_gemm_scalar(const int8_t* q, int64_t m, int64_t ld_q, const float* x_scale, const W8a8WeightView& w, float* y,
                      int64_t ld_y, int64_t n0, int64_t n1);
void w8a8_gemm_avx2(const uint8_t* xp, int64_t m, int64_t ld_xp, const float* x_scale, const W8a8WeightView& w,
                    float* y, int64_t ld_y, int64_t n0, int64_t n1);
void w8a8_gemm_avx2_vnni(const uint8_t* xp, int64_t m, int64_t ld_xp, const float* x_scale, const W8a8WeightView& w,
                         float* y, int64_t ld_y, int64_t n0, int64_t n1);
void w8a8_gemm_avx512(const uint8_t* xp, int64_t m, int64_t ld_xp, const float* x_scale, const W8a8WeightView& w,
                      float* y, int64_t ld_y, int64_t n0, int64_t n1);
void w8a8_gemm_avx512_vnni(const uint8_t* xp, int64_t m, int64_t ld_xp, const float* x_scale, const W8a8WeightView& w,
                           float* y, int64_t ld_y, int64_t n0, int64_t n1);
/// The kAvx512Vnni path from the w8a8_panels crossover: xp packed by w8a8_pack_x_panels;
/// needs w.row_sum.
void w8a8_gemm_avx512_vnni_panels(const uint8_t* xp, int64_t m, const float* x_scale, const W8a8WeightView& w, float* y,
                                  int64_t ld_y, int64_t n0, int64_t n1);
/// xb packed by w8a8_pack_x_amx; w_tail [n, 64]: the weight's last k % 64 columns zero
/// padded (null when 64 divides k). The weight rows are otherwise read in place.
void w8a8_gemm_amx(const uint8_t* xb, int64_t m, const float* x_scale, const W8a8WeightView& w, const int8_t* w_tail,
                   float* y, int64_t ld_y, int64_t n0, int64_t n1);

/// Per-token symmetric int8 of x [M, K] float32, bit for bit the INT8 method's
/// quantization (and quantize_activation's): scale [M, 1] = amax / 127 (1 where amax is
/// not > 0), q = round-half-even(x / scale) clamped to -127..127 (a NaN gives 0, as
/// ATen's float -> int8 conversion does), in one pass of plain C++ instead of six ATen
/// ops that each open a parallel region. x may also be bfloat16 / float16 (widened
/// exactly first, as x.to(float) does). Returns {q int8 [M, K], scale float32 [M, 1]}.
std::pair<at::Tensor, at::Tensor> w8a8_quantize_per_token(const at::Tensor& x);

/// sum_k w[r, k] as int32 [N], for the VNNI kernels (computed once per weight).
at::Tensor w8a8_row_sums(const at::Tensor& w);

/// y = (acc * x_scale) * w_scale with tp's kernels, threaded over N with ATen's pool.
/// q: [M, K] int8 in -127..127; x_scale: [M] or [M, 1] float32; w: [N, K] int8;
/// w_scale: [N] or [N, 1] float32; row_sums: w8a8_row_sums(w) (may be undefined: then
/// computed here, costing a pass over w). Returns [M, N] float32.
at::Tensor w8a8_linear_cpu(const at::Tensor& q, const at::Tensor& x_scale, const at::Tensor& w,
                           const at::Tensor& w_scale, const at::Tensor& row_sums, W8a8Kernel kernel);
/// The same with w8a8_best_kernel(M).
at::Tensor w8a8_linear_cpu(const at::Tensor& q, const at::Tensor& x_scale, const at::Tensor& w,
                           const at::Tensor& w_scale, const at::Tensor& row_sums);

}  // namespace tp::detail
