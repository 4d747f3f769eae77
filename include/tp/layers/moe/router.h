#pragma once
// The router of a mixture-of-experts block: which top_k experts each token goes to, and
// with what weight, as each model family computes it (transformers' routers, operation
// for operation, so a float64 model routes every token as transformers does):
//
//   kSoftmax       p = softmax(logits) in float32, the top k of p, renormalised to sum to 1
//                  where the model says (Mixtral always, Qwen*-MoE by norm_topk_prob)
//   kSoftmaxOfTopK the top k of the logits (with the router's bias), softmax over those k
//                  in the logits' dtype (GPT-OSS)
//   kSigmoid       s = sigmoid(logits) in float32; the experts are chosen by s + a
//                  correction bias (DeepSeek-V3's e_score_correction_bias), first among the
//                  top_k_groups best groups (a group's score: the sum of its two best
//                  experts) when num_groups > 1; the weights are s of the chosen experts,
//                  renormalised where the model says, times scaling_factor (DeepSeek-V3,
//                  GLM-4.5)
//
// The router's weight is mirrored (every rank holds it whole and routes every token the
// same), so every rank of a tensor- or expert-parallel group agrees on the routing.

#include <cstdint>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

namespace tp {

/// How a router turns its logits into expert scores (see the file comment).
enum class MoEScoring { kSoftmax, kSoftmaxOfTopK, kSigmoid };
/// "softmax", "softmax_of_top_k", "sigmoid".
const char* to_string(MoEScoring scoring);

/// The router of MoEParallelMLP: its scoring and the options each family sets.
/// Example (DeepSeek-V3): tp::MoERouterOptions().scoring(tp::MoEScoring::kSigmoid).num_groups(8)
///                            .top_k_groups(4).score_correction_bias(true).scaling_factor(2.5)
struct MoERouterOptions {
  TORCH_ARG(MoEScoring, scoring) = MoEScoring::kSoftmax;
  /// Renormalise the chosen experts' weights to sum to 1 (kSoftmax: Mixtral always,
  /// Qwen-MoE by norm_topk_prob; kSigmoid: DeepSeek-V3's norm_topk_prob).
  TORCH_ARG(bool, normalize_top_k) = true;
  /// The routing weights cast to the input's dtype before they scale the experts'
  /// outputs (Qwen-MoE), or kept in the scores' float32 (Mixtral, DeepSeek-V3).
  TORCH_ARG(bool, weights_in_input_dtype) = false;
  /// The logits computed in float32 from float32 copies of x and the router weight,
  /// whatever the layer's dtype (DeepSeek-V3, GLM-4.5), not in the layer's dtype.
  TORCH_ARG(bool, logits_in_float32) = false;
  /// The router has a bias [experts] (GPT-OSS: "<router>.bias").
  TORCH_ARG(bool, bias) = false;
  /// kSigmoid: a per-expert correction [experts] added to the scores to choose the
  /// experts, not to weigh them ("<router>.e_score_correction_bias").
  TORCH_ARG(bool, score_correction_bias) = false;
  /// kSigmoid: the experts in num_groups equal groups; a token's experts come from its
  /// top_k_groups best groups. 1: no grouping.
  TORCH_ARG(int64_t, num_groups) = 1;
  TORCH_ARG(int64_t, top_k_groups) = 1;
  /// kSigmoid: the weights' multiplier (routed_scaling_factor).
  TORCH_ARG(double, scaling_factor) = 1.0;
};

/// Checks `options` for `num_experts` experts and `top_k` choices; the message names
/// `layer` and the numbers.
void check_router_options(const MoERouterOptions& options, int64_t num_experts, int64_t top_k,
                          const std::string& layer);

/// The routing of tokens whose router logits are `logits` [tokens, experts] (the bias
/// already added): (weights [tokens, top_k], expert ids int64 [tokens, top_k]).
/// `correction` [experts] or undefined: kSigmoid's score_correction_bias. `input_dtype`:
/// the dtype weights_in_input_dtype casts to. Differentiable in the logits.
std::pair<at::Tensor, at::Tensor> moe_route(const at::Tensor& logits, const at::Tensor& correction, int64_t top_k,
                                            const MoERouterOptions& options, at::ScalarType input_dtype);

}  // namespace tp
