#pragma once
// The layer boundary as one collective: the all-reduce of a row layer's partial sums,
// fused with what follows it in a decoder block - the row layer's bias (added once),
// the residual add, the next norm and the next layer's per-token activation
// quantization. The names follow FlashInfer's `allreduce_fusion` (allreduce_in,
// residual_in / residual_out, norm_out, quant_out, scale_out) and TensorRT-LLM's
// `AllReduceParams` / `AllReduceFusionOp` (bias, residual, norm_weight, eps).
//
// Where it runs (see docs/DESIGN.md, "The fused boundary"):
//   shm_one_shot / shm_two_shot  in the pass that reads the peers' partial sums: each
//                                rank finishes whole rows (two-shot: its share of the
//                                rows, then every rank copies the finished rows);
//   process_group, recursive_doubling, a user's group
//                                composed: the all-reduce, then the same row epilogue;
//   CUDA tensors                 the group's all-reduce (NCCL), then one epilogue kernel.
// Every path computes the epilogue with the same per-row code, so a strategy's result
// differs from another's only by the all-reduce's own summation order.

#include <cstdint>
#include <iosfwd>

#include <ATen/core/Tensor.h>

#include "tp/comm/all_reduce_strategy.h"

namespace tp {

/// The norm applied after the residual add (FlashInfer's pattern, TRT-LLM's fusion op).
/// With h the reduced sum (+ bias, + residual_in) in float32 and r = 1/sqrt(mean(h^2) + eps):
///   kNone           no norm: only residual_out
///   kRMS            norm_out = weight * (h * r).to(dtype)           (Llama's RMSNorm)
///   kRMSUnitOffset  norm_out = (h * r * (1 + weight)).to(dtype)      (Gemma's)
///   kRMSScaleFirst  norm_out = (weight * (h * r)).to(dtype)          (GPT-OSS's)
///   kLayerNorm      norm_out = (h - mean) / sqrt(var + eps) * weight + norm_bias (GPT-NeoX's)
/// the operations and roundings of tp::Norm's kinds of the same names.
enum class AllReduceFusionNorm { kNone, kRMS, kRMSUnitOffset, kRMSScaleFirst, kLayerNorm };

/// The quantization of norm_out for the next layer (its activation format), per token:
/// scale = amax(|row|) / qmax (1 for an all-zero row), code = round(x / scale) saturated.
///   kNone          no quant_out
///   kFp8PerToken   quant_out float8_e4m3fn, qmax 448 (fp8_channel's activations)
///   kInt8PerToken  quant_out int8 (round half to even, clamped to +-127), qmax 127
///                  (int8_w8a8's activations)
/// Bit for bit what tp::quantize_activation does for those formats (a test compares).
enum class AllReduceFusionQuant { kNone, kFp8PerToken, kInt8PerToken };

/// "none", "rms", "rms_unit_offset", "rms_scale_first", "layer_norm".
const char* to_string(AllReduceFusionNorm n);
/// "none", "fp8_per_token", "int8_per_token".
const char* to_string(AllReduceFusionQuant q);
std::ostream& operator<<(std::ostream& out, AllReduceFusionNorm n);
std::ostream& operator<<(std::ostream& out, AllReduceFusionQuant q);

/// What a fused all-reduce does besides summing. Tensors: same dtype and device as the
/// all-reduce's input, contiguous or not; `hidden` is the input's last dimension.
/// Example (a Llama block's o_proj boundary):
///   tp::AllReduceFusionParams p;
///   p.residual_in = x;                       // [b, s, hidden]
///   p.norm = tp::AllReduceFusionNorm::kRMS;
///   p.norm_weight = post_attention_layernorm->weight;
///   p.eps = 1e-5;
///   auto r = comm.all_reduce_fusion(o_proj->forward_partial(a), p);   // r.residual_out, r.norm_out
struct AllReduceFusionParams {
  /// [hidden] or undefined: the row layer's bias, counted once: rank 0's copy joins rank
  /// 0's partial sum, as the row layers' bias contract has it (the layer then leaves it
  /// out of its partial sum on every rank: RowParallelLinear::forward_partial), so ranks
  /// whose copies differ still agree bit for bit.
  at::Tensor bias;
  /// The input's shape, or undefined: added after the bias; residual_out is the new residual.
  at::Tensor residual_in;
  AllReduceFusionNorm norm = AllReduceFusionNorm::kNone;
  /// [hidden]; needed unless norm is kNone.
  at::Tensor norm_weight;
  /// [hidden]; kLayerNorm only (optional there).
  at::Tensor norm_bias;
  double eps = 1e-6;
  /// Needs a norm: the quantized value is norm_out.
  AllReduceFusionQuant quant_out = AllReduceFusionQuant::kNone;
  /// As for Communicator::all_reduce: kAuto resolves for the input's size and dtype.
  AllReduceStrategy strategy = AllReduceStrategy::kAuto;
  WirePrecision wire = WirePrecision::kDefault;
};

/// The outputs of a fused all-reduce (undefined where not asked for).
struct AllReduceFusionResult {
  /// The input's shape and dtype: the sum over ranks (with the bias), + residual_in, the
  /// addition rounded to the dtype as a separate tensor addition would be. Without
  /// residual_in it is the all-reduce's result (FlashInfer's allreduce_out).
  at::Tensor residual_out;
  /// The input's shape and dtype: the norm of residual_out.
  at::Tensor norm_out;
  /// The input's shape, float8_e4m3fn or int8: norm_out quantized per token.
  at::Tensor quant_out;
  /// [..., 1] float32 (the input's leading dimensions): quant_out's per-token scales,
  /// norm_out ~= quant_out * scale_out.
  at::Tensor scale_out;
};

}  // namespace tp
