#pragma once
// Private: tp's own CPU kernels for the FP8 E4M3 weights of fp8_tensor, fp8_channel and
// fp8_block. The E4M3 decode is fused into the GEMV / GEMM: the weight is read as one
// byte per element and never copied to float32 whole.
//
// Decode. An E4M3 code b (sign s, exponent e, mantissa m) is, with its 7 low bits moved
// one place right into a 16-bit word, the float16 bit pattern of b's value / 256 (the
// two formats differ only in exponent bias, 15 - 7 = 8, and float16 subnormals cover
// E4M3 subnormals exactly):
//   h = ((b << 8) >>arith 1) & 0xBF80         (2 integer ops on 16-bit lanes)
//   float(b) = cvtph2ps(h) * 256              (F16C; exact)
// so one 256-bit load of 32 codes is 32 float16 words after an arithmetic shift and a
// mask (odd codes) or a shift more (even codes), then four float vectors through
// vcvtph2ps. The two NaN codes (0x7f, 0xff) would decode to +-480 that way: where a
// weight holds them (Fp8WeightView::nan_codes, checked once when the weight is
// prepared) a variant of the decode turns them into the float16 NaN whose float32 is
// exactly c10's (0x7ff00000 | sign). Every code decodes bit for bit as
// c10::Float8_e4m3fn -> float does (the tests check all 256).
//
// Order. The decode yields the even codes of a chunk in one vector and the odd ones in
// the next; instead of shuffling every weight chunk back, the activations are permuted
// once per call into that order ("packed x", fp8_pack_x): a dot product does not care
// about the order of its terms.
//
// Kernels (one body over cpu::Vec, cpu_kernels_body.h, built per ISA by
// cpu_kernels_avx2.cpp / cpu_kernels_avx512.cpp with their blocking tables):
// - M = 1: GEMV over 4 weight rows at a time, software-pipelined: each chunk's float16
//   patterns go to a two-slot L1 ring while the previous chunk is widened from it and
//   multiplied with x; the row (or 128-column block) scale multiplies each row's
//   partial sum. Per 64 codes: 5 integer ops, 4 conversions, 4 FMAs (17 vector ops),
//   so with 2 cores it is compute- and memory-bound at once (~60 % of the read
//   bandwidth at K = 4096).
// - M >= 2: a panel of 24 weight rows x 1024 columns is decoded once into an
//   L2-resident float32 buffer with its scales folded in (w_deq exactly as
//   dequantize_weight computes it: float(code) * scale), then a register-blocked
//   microkernel (4 x-rows x 3 / 6 weight rows, vectors along K) multiplies every M row
//   with it; partial sums are reduced into y after each panel. From a few dozen M rows
//   on, an outer-product register tile on a transposed panel instead.
// The scalar kernel (cpu_kernels.cpp) is the portable reference and the fallback.

#include <cstdint>
#include <utility>

namespace at {
class Tensor;
}

namespace tp::cpu {
enum class Isa;
}

namespace tp::detail {

/// An FP8 E4M3 weight as the kernels read it (a view; the caller owns the memory):
///   w_deq[r, c] = float(e4m3(codes[r * ld + c])) * scale[r * scale_ld + c / group]
struct Fp8WeightView {
  const uint8_t* codes = nullptr;  ///< [n, k] E4M3 bit patterns, row stride ld
  int64_t n = 0;
  int64_t k = 0;
  int64_t ld = 0;
  const float* scale = nullptr;  ///< [n, ceil(k / group)], row stride scale_ld
  int64_t scale_ld = 0;
  int64_t group = 0;       ///< columns per scale: 128 (fp8_block), or >= k (one per row)
  bool nan_codes = false;  ///< some code is 0x7f / 0xff: the NaN-exact decode must run
};

/// Columns per packed chunk of x for the AVX2 (32) and AVX-512 (64) kernels.
constexpr int64_t kFp8ChunkAvx2 = 32;
constexpr int64_t kFp8ChunkAvx512 = 64;

/// x [m, k] (row stride ld_x) -> xp [m, round_up(k, chunk)] (row stride ld_xp) in the
/// chunk order of the SIMD decode (chunk = kFp8ChunkAvx2 or kFp8ChunkAvx512), zero
/// padded to round_up(k, chunk).
void fp8_pack_x(const float* x, int64_t m, int64_t k, int64_t ld_x, int64_t chunk, int64_t ld_xp, float* xp);

// The per-ISA kernels: y[i, r] = sum_c x[i, c] w_deq[r, c] for i < m, r in [n0, n1).
// The SIMD kernels take x packed for their chunk (row stride ld_xp >= round_up(k,
// chunk)); the scalar one takes x as is. w.group must be >= w.k or a multiple of the
// chunk. Each writes only its own columns of y, so threads can split [0, n).
void fp8_gemm_scalar(const float* x, int64_t m, int64_t ld_x, const Fp8WeightView& w, float* y, int64_t ld_y,
                     int64_t n0, int64_t n1);
void fp8_gemm_avx2(const float* xp, int64_t m, int64_t ld_xp, const Fp8WeightView& w, float* y, int64_t ld_y,
                   int64_t n0, int64_t n1);
void fp8_gemm_avx512(const float* xp, int64_t m, int64_t ld_xp, const Fp8WeightView& w, float* y, int64_t ld_y,
                     int64_t n0, int64_t n1);

/// The large-M AVX-512 GEMM's register tile (outer_tile_avx512.cpp): t[i][j] (t: mr rows
/// of kFp8TileCols floats) = sum over p < kl of x[i * ldx + p] * b[p * kFp8TileCols + j],
/// for i < mr, 1 <= mr <= kFp8TileRows.
constexpr int kFp8TileRows = 12;
constexpr int kFp8TileCols = 32;
void fp8_outer_tile_avx512(const float* x, int64_t ldx, const float* b, int64_t kl, int mr, float* t);

// out[i] = float(e4m3(codes[i])) * scale for i < count, in order: the decode and scale
// fold the kernels use (the GEMM panels' exactly), bit for bit c10's conversion times
// scale with one float32 rounding. Without nan_codes, the NaN codes (0x7f, 0xff)
// decode to garbage; every other code decodes the same either way.
void fp8_decode_scalar(const uint8_t* codes, int64_t count, float scale, bool nan_codes, float* out);
void fp8_decode_avx2(const uint8_t* codes, int64_t count, float scale, bool nan_codes, float* out);
void fp8_decode_avx512(const uint8_t* codes, int64_t count, float scale, bool nan_codes, float* out);

/// Whether any code of `codes` (float8_e4m3fn or uint8, any shape) is a NaN (0x7f,
/// 0xff); computed once when a weight is prepared, for Fp8WeightView::nan_codes.
bool fp8_has_nan_codes(const at::Tensor& codes);

/// How an FP8 format quantizes activations (see src/quant/fp8/method.cpp): static with
/// the layer's input_scale (fp8_tensor), per token (fp8_channel), per 1x128 group along
/// K (fp8_block).
enum class Fp8Activation { kStatic, kPerToken, kGroup128 };

/// The activations' quantize-dequantize, bit for bit what quantize_activation computes
/// (scale = amax / 448, or 1 for an all-zero token / group; x / scale clamped to +-448,
/// rounded to E4M3, times scale), in one pass of plain C++ instead of ~10 ATen ops,
/// each of which would open a parallel region. x: [M, K] float32, bfloat16 or float16
/// (widened exactly first, as x.to(float) does); input_scale: the static scale
/// (kStatic only). Returns [M, K] float32.
at::Tensor fp8_fake_quant_cpu(const at::Tensor& x, Fp8Activation kind, float input_scale = 1.0f);

/// Rows of x from which bf16 FP8 layers take the AMX bf16 tiles where
/// cpu::amx_status().usable (benchmarks/RESULTS.md, 2026-12-03 (evening), "Thresholds").
constexpr int64_t kFp8AmxMinM = 5;

/// The activations' E4M3 values for the AMX kernel, the same q and scale as
/// fp8_fake_quant_cpu (which returns q * scale) bit for bit: q [M, K] as bf16 bit
/// patterns (int16; every E4M3 value is exactly a bf16), and the scales transposed for
/// the kernel, [groups, round_up(M, 16)] float32 (groups = ceil(K / 128) for kGroup128,
/// else 1; padding 0).
std::pair<at::Tensor, at::Tensor> fp8_quantize_codes_cpu(const at::Tensor& x, Fp8Activation kind,
                                                         float input_scale = 1.0f);

/// fp8_quantize_codes_cpu's (q, x_scale) for kPerToken from activations quantized already
/// (the fused boundary's quant_out): codes [M, K] float8_e4m3fn, scales [M, 1] float32.
/// The same bits fp8_quantize_codes_cpu gives the activations they quantize.
std::pair<at::Tensor, at::Tensor> fp8_codes_from_e4m3(const at::Tensor& codes, const at::Tensor& scales);

/// y = sum over scale groups of (x_scale * w_scale) * (q . e4m3(w)) on AMX bf16 tiles
/// (cpu/row_decoded_gemm.h with fp8_decode_row_bf16): exact products, float32 sums, one group per row (group >= K)
/// or 128-k groups (fp8_block: x_scale then has ceil(K / 128) rows). q, x_scale from
/// fp8_quantize_codes_cpu; w, scale, group as fp8_linear_cpu takes them; w must hold no
/// NaN code. Threaded over N. Returns [M, N] float32. Only where amx_status().usable.
at::Tensor fp8_linear_amx(const at::Tensor& q, const at::Tensor& x_scale, const at::Tensor& w, const at::Tensor& scale,
                          int64_t group);
/// The row decoder of an Fp8WeightView for the row-decoded GEMMs (cpu/row_decoded_gemm.h's
/// RowDecodeFn; no NaN codes), in cpu_kernels_avx512.cpp.
void fp8_decode_row_bf16(const void* view, int64_t row, int64_t k0, int64_t kc, uint16_t* out);
/// The same on byte tables (VPERMI2B), bit for bit; only where cpu::features().avx512vbmi.
void fp8_decode_row_bf16_vbmi(const void* view, int64_t row, int64_t k0, int64_t kc, uint16_t* out);

/// fp8_linear_amx's GEMM on AVX-512 bf16 dot products (cpu/row_decoded_gemm.h's
/// kAvx512Bf16 loop), for CPUs with avx512_bf16 and no usable AMX: the same arguments and
/// model, exact products, float32 sums. Threaded over N; returns [M, N] float32.
at::Tensor fp8_linear_bf16dot(const at::Tensor& q, const at::Tensor& x_scale, const at::Tensor& w,
                              const at::Tensor& scale, int64_t group);

/// y = x w_deq^T with tp's kernels for `isa` (threaded over N with ATen's pool).
/// x: [M, K] float32 (the activations, already quantized-dequantized as
/// quantize_activation does); w: [N, K] float8_e4m3fn; scale: [N, ceil(K / group)]
/// float32; nan_codes: fp8_has_nan_codes(w). Returns [M, N] float32.
at::Tensor fp8_linear_cpu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, int64_t group,
                          bool nan_codes, cpu::Isa isa);
/// The same at cpu::isa().
at::Tensor fp8_linear_cpu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, int64_t group,
                          bool nan_codes);

}  // namespace tp::detail
