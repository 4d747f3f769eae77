#pragma once
// The CUDA GEMM entry points of the quant methods (private to the library and its
// tests). Every function takes CUDA tensors, runs on the current torch CUDA stream,
// and computes y = x w^T (+ bias) with x: [..., K], w: [N, K], y: [..., N].
// Where cuBLASLt has no kernel for a combination on this GPU, each falls back to a
// correct path (dequantize + bf16/fp32 GEMM) and says so once on stderr
// (TORCH_WARN_ONCE), so the result is right either way and the slow path is visible.

#include <optional>
#include <utility>

#include <ATen/core/Tensor.h>

namespace tp::cuda {

/// bf16 / fp16 / fp32: cuBLASLt with the bias epilogue (fp32 accumulation; fp32
/// inputs use strict fp32, as at::linear does by default).
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias);

/// How FP8 scales are laid out.
enum class Fp8Scaling {
  kPerTensor,   ///< x_scale, w_scale: one fp32 each
  kPerChannel,  ///< x_scale: [M] (per token), w_scale: [N] (per output feature)
  kBlock,       ///< x_scale: [M, K/128] (1x128 groups), w_scale: [ceil(N/128), K/128] (128x128 blocks)
};
const char* to_string(Fp8Scaling s);

/// Dynamic symmetric quantization of a 2-D activation in groups of `group`
/// columns (group = 0: whole rows, i.e. per token). q: [M, K] int8 or E4M3;
/// scale: [M, K/group] fp32, so that x ~= q * scale.
std::pair<at::Tensor, at::Tensor> quantize_groups(const at::Tensor& x2d, at::ScalarType qtype, int64_t group);

/// FP8 E4M3 x FP8 E4M3 -> out_dtype with the dequantization scales applied by cuBLASLt
/// (scale pointers / outer-vector / block scale modes). x_q: [M, K], w_q: [N, K].
at::Tensor fp8_gemm(const at::Tensor& x_q, const at::Tensor& x_scale, const at::Tensor& w_q, const at::Tensor& w_scale,
                    Fp8Scaling scaling, const std::optional<at::Tensor>& bias, at::ScalarType out_dtype);

/// Quantizes x to match `scaling` and runs fp8_gemm; y has x's dtype and leading shape.
/// Per tensor: with `input_scale` (a static checkpoint scale, one fp32) x / input_scale
/// is saturated to E4M3; without it the scale is x's amax / 448, computed on the
/// device. Per channel: one dynamic scale per token; block: per 1x128 group.
at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& w_q, const at::Tensor& w_scale, Fp8Scaling scaling,
                      const std::optional<at::Tensor>& bias,
                      const std::optional<at::Tensor>& input_scale = std::nullopt);

/// INT8 W8A8: int8 x int8 -> int32 (cuBLASLt IMMA), then y = acc * x_scale[m] * w_scale[n]
/// (+ bias) in one small kernel. x_q: [M, K], x_scale: [M], w_q: [N, K], w_scale: [N].
at::Tensor int8_gemm(const at::Tensor& x_q, const at::Tensor& x_scale, const at::Tensor& w_q, const at::Tensor& w_scale,
                     const std::optional<at::Tensor>& bias, at::ScalarType out_dtype);

/// Per-token dynamic int8 quantization of x, then int8_gemm; y has x's dtype and shape.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& w_q, const at::Tensor& w_scale,
                       const std::optional<at::Tensor>& bias);

// ---- Weight-only (layout in src/gpu/kernels.h) ----------------------------------------

/// Packs unpacked 4-bit codes q: [N, K] (uint8 or int, values 0..15) into the
/// kernel layout [N, K/2] uint8 (even k in the low nibble). Works on CPU or CUDA.
at::Tensor pack_int4(const at::Tensor& q);

/// The weight-only GEMM: the GEMV kernel for M <= 16 (when K and group are multiples
/// of 32), else dequantize + cuBLASLt. qweight: [N, K] int8 (bits 8) or [N, K/2]
/// uint8 (bits 4); scales, zeros: [N, K/group] (zeros optional: 0 for int8, 8 for int4).
at::Tensor weight_only_linear(const at::Tensor& x, const at::Tensor& qweight, int bits, const at::Tensor& scales,
                              const std::optional<at::Tensor>& zeros, int64_t group,
                              const std::optional<at::Tensor>& bias);

/// The dequantized weight [N, K] in `dtype` (on qweight's device).
at::Tensor dequantize_weight_only(const at::Tensor& qweight, int bits, const at::Tensor& scales,
                                  const std::optional<at::Tensor>& zeros, int64_t group, at::ScalarType dtype);

}  // namespace tp::cuda
