#pragma once
// Private: MXFP4's rows kernels, for M <= kMxfp4RowsMaxM (decode): the weight streams once,
// each row's codes decoded in registers, never written out. Above kMxfp4RowsMaxM the panel
// GEMM of cpu_kernels.cpp runs.
//
// What they compute, per row n of W and row m of x (blocks b of 32 k, E8M0 scale s_b):
//     y[m, n] = sum_b 2^(s_b - 127) * P_b,   P_b = sum_{k in b} x[m, k] * E2M1(code[n, k])
// The products are exact (an E2M1 value has 2 significant bits: x * e fits float32's 24 for
// bf16 x, and is exact inside an FMA for float32 x), P_b is summed in float32 in the lanes
// of one block, and 2^(s_b - 127) is exact in float32 for every s_b < 255 (2^-127 is a
// subnormal), so the scale product rounds only where it leaves the normal range. So these
// are as exact as the panel GEMM on the decoded weight: float32 sums, in another order.
// (VDPBF16PS reads bf16 subnormals as zero: a bf16 x below 2^-126 in magnitude counts as
// 0 on the bf16 path, as in the bf16 panel GEMM, cpu/bf16_panel_gemm.h.)
//
// Layout the kernels read: the stored blocks [N, K / 2] bytes (element 2i in the low nibble
// of byte i) and scales [N, K / 32], as they are. A "chunk" is one vector of codes: 4 L
// bytes = 8 L elements = L / 4 blocks (L = float32 lanes; dword lane j of a chunk holds its
// elements 8 j .. 8 j + 7, all of block j / 4). x is packed once per call into the order the
// decoded vectors come out in (mxfp4_pack_x_*), so no lane moves across the vector.
//
// Kernels (the dispatcher, rows.cpp, picks by dtype and ISA):
// - bf16 layers, AVX-512 with avx512_bf16 ("mxfp4 rows/avx512_bf16"): per chunk, nibble i of
//   each 16-bit half (one shift), then VPERMW on a 32-entry table of the E2M1 values as
//   bf16 (the codes' 5th bit indexes a copy of the table), then VDPBF16PS with x's pairs.
//   Per 128 weights of a row at M = 1: 1 load, 3 shifts, 4 VPERMW, 4 VDPBF16PS (x from
//   memory), 1 VPERMPS + 1 FMA for the scales (and 3 per 4 chunks to widen 16 scale bytes
//   to 2^(s - 127)), 1 prefetch: ~15.75, i.e. ~3.9 instructions per 32 weights, against
//   the 17 bytes (16 code bytes + 1 scale byte) they are read from. 4 rows at once are 4
//   independent chains of 4 VDPBF16PS per chunk, enough to cover its latency.
// - float32 (and float16, converted exactly) layers, AVX-512 ("mxfp4 rows/avx512"): nibble
//   i by a 32-bit shift, VPERMPS on the 16 E2M1 floats (it reads the low 4 bits), FMA with
//   x. Per 128 weights: 1 load, 7 shifts, 8 VPERMPS, 8 FMA, 1 add, 1 VPERMPS + 1 FMA
//   (scales), 0.75: ~27.75, ~6.9 per 32 weights. Float32 layers keep float32 arithmetic.
// - AVX2 ("mxfp4 rows/avx2"), every dtype: as AVX-512's float path on 8 lanes, the
//   magnitude from VPERMPS on 8 floats (low 3 bits) and the sign bit moved into place
//   (shift, and, xor): ~5 + 1 per 8 weights, ~24 per 32.

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "cpu/features.h"
#include "quant/mxfp4/mxfp4.h"

namespace tp::detail {

/// Largest M the rows kernels take.
inline constexpr int64_t kMxfp4RowsMaxM = 4;

/// y [M, N] (x's dtype) for x [M, K] with 1 <= M <= kMxfp4RowsMaxM (float32, bfloat16 or
/// float16, contiguous), at `isa` (avx2 or avx512; the caller checks the CPU has it).
at::Tensor mxfp4_rows_linear(const at::Tensor& x, const Mxfp4CpuWeight& w, cpu::Isa isa);

// ---- Per-ISA entry points (rows_avx2.cpp, rows_avx512.cpp) ---------------------------

/// Rows [n0, n1) of y [m, N] (row stride ld_y) from xp, x packed by mxfp4_pack_x_f32 with
/// `lanes` = the ISA's float lanes (row stride ld_xp floats).
void mxfp4_rows_f32_avx2(const float* xp, int64_t m, int64_t ld_xp, const Mxfp4CpuWeight& w, float* y, int64_t ld_y,
                         int64_t n0, int64_t n1);
void mxfp4_rows_f32_avx512(const float* xp, int64_t m, int64_t ld_xp, const Mxfp4CpuWeight& w, float* y, int64_t ld_y,
                           int64_t n0, int64_t n1);
/// The same from bf16 pairs packed by mxfp4_pack_x_bf16 (row stride ld_xq uint32); the CPU
/// must have avx512_bf16.
void mxfp4_rows_bf16_avx512(const uint32_t* xq, int64_t m, int64_t ld_xq, const Mxfp4CpuWeight& w, float* y,
                            int64_t ld_y, int64_t n0, int64_t n1);

/// xp[c * 8 L + i * L + j] = x[8 L c + 8 j + i] for chunks c of 8 L elements (L = lanes),
/// zero past k; m rows of x (row stride ld_x) to rows of xp (row stride ld_xp >= round_up(k, 8 L)).
void mxfp4_pack_x_f32(const float* x, int64_t m, int64_t ld_x, int64_t k, int64_t lanes, float* xp, int64_t ld_xp);
/// xq[c * 64 + i * 16 + j] = the bf16 pair (x[128 c + 8 j + i], x[128 c + 8 j + 4 + i]) (low,
/// high halves), zero past k; x bf16 bits [m, k] (row stride ld_x), xq rows ld_xq >= round_up(k, 128) / 2.
void mxfp4_pack_x_bf16(const uint16_t* x, int64_t m, int64_t ld_x, int64_t k, uint32_t* xq, int64_t ld_xq);

}  // namespace tp::detail
