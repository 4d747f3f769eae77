#pragma once
// Making and reading quantized checkpoints: the float weight -> the tensors a
// format stores, and back. Tests, examples and tp-bench make their checkpoints with
// these; the float64 reference of every quantized test is built from
// dequantize_weight (and quantize_activation for the formats that quantize
// activations).
//
// Stored tensors per format, keyed by the suffix after the layer's prefix (as Hugging
// Face checkpoints name them), for a weight of [N, K] = [out_features, in_features]:
//   fp8_tensor        weight f8e4m3 [N, K], weight_scale f32 [], input_scale f32 []
//   fp8_channel       weight f8e4m3 [N, K], weight_scale f32 [N, 1]
//   fp8_block         weight f8e4m3 [N, K], weight_scale_inv f32 [ceil(N/128), ceil(K/128)]
//                     (named weight_scale with QuantConfig::block_scale_name = kWeightScale)
//   int8_w8a8         weight i8 [N, K], weight_scale f32 [N, 1]
//   int8_weight_only  weight i8 [N, K], weight_scale f32 [N, 1]
//   int4_gptq         qweight i32 [K/8, N], scales f16 [K/g, N], qzeros i32 [K/g, N/8]
//                     (zero - 1 in v1, the zero itself in v2: QuantConfig::gptq_format)
//   int4_awq          qweight i32 [K, N/8], scales f16 [K/g, N], qzeros i32 [K/g, N/8]
//   int4_pack_quantized  weight_packed i32 [N, K/8], weight_scale f32 [N, K/g],
//                     weight_shape i64 [2], and weight_zero_point i32 [N/8, K/g] when asymmetric
//   mxfp4             blocks u8 [N, K/32, 16] (two E2M1 codes a byte, low nibble first),
//                     scales u8 [N, K/32] (E8M0: 2^(scale - 127))
// (the INT4 packings and zero-point conventions are described in src/quant/int4/packing.h).

#include <map>
#include <string>

#include <ATen/core/Tensor.h>

#include "tp/loader/checkpoint.h"
#include "tp/quant/quant_config.h"

namespace tp {

/// A format's stored tensors, by suffix ("weight", "weight_scale", "qweight", ...).
using QuantizedTensors = std::map<std::string, at::Tensor>;

/// Quantizes a floating-point weight [out_features, in_features] (any float dtype,
/// on CPU) into `config.format`'s stored tensors. kNone returns {"weight": weight}.
/// Shapes the format cannot store (K not a multiple of the INT4 group, N not a
/// multiple of 8 for the packed formats) are an error naming the constraint.
QuantizedTensors quantize_weight(const at::Tensor& weight, const QuantConfig& config);

/// The float32 weight [out_features, in_features] that `tensors` represent.
at::Tensor dequantize_weight(const QuantizedTensors& tensors, const QuantConfig& config);

/// What the format's kernel does to an activation x [..., in_features] before the
/// GEMM, as float32 (quantize then dequantize): per-token FP8 / INT8, 1x128 FP8
/// groups, or the static FP8 input_scale from `tensors`; x itself (as float32) for
/// the weight-only formats and kNone.
at::Tensor quantize_activation(const at::Tensor& x, const QuantizedTensors& tensors, const QuantConfig& config);

/// Adds every stored tensor to `checkpoint` as `prefix + "." + suffix`.
void add_to_checkpoint(Checkpoint& checkpoint, const std::string& prefix, const QuantizedTensors& tensors);

}  // namespace tp
