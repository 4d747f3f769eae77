#include "tp/layers/moe/router.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <limits>

namespace tp {

const char* to_string(MoEScoring scoring) {
  switch (scoring) {
    case MoEScoring::kSoftmax: return "softmax";
    case MoEScoring::kSoftmaxOfTopK: return "softmax_of_top_k";
    case MoEScoring::kSigmoid: return "sigmoid";
  }
  return "?";
}

void check_router_options(const MoERouterOptions& o, int64_t num_experts, int64_t top_k, const std::string& layer) {
  TORCH_CHECK_VALUE(top_k >= 1 && top_k <= num_experts, layer, ": top_k=", top_k,
                    " must be in [1, num_experts=", num_experts, "]");
  const bool sigmoid = o.scoring() == MoEScoring::kSigmoid;
  TORCH_CHECK_VALUE(sigmoid || (o.num_groups() == 1 && !o.score_correction_bias() && o.scaling_factor() == 1.0), layer,
                    ": grouped routing, a score correction bias and a scaling factor belong to sigmoid scoring; "
                    "the router's scoring is ",
                    to_string(o.scoring()));
  TORCH_CHECK_VALUE(o.num_groups() >= 1 && num_experts % o.num_groups() == 0, layer, ": num_groups=", o.num_groups(),
                    " must divide num_experts=", num_experts);
  if (o.num_groups() > 1) {
    const int64_t per_group = num_experts / o.num_groups();
    TORCH_CHECK_VALUE(o.top_k_groups() >= 1 && o.top_k_groups() <= o.num_groups(), layer,
                      ": top_k_groups=", o.top_k_groups(), " must be in [1, num_groups=", o.num_groups(), "]");
    // A group's score is the sum of its two best experts, and the chosen groups must hold
    // top_k experts in all.
    TORCH_CHECK_VALUE(per_group >= 2, layer, ": grouped routing scores a group by its two best experts; ", num_experts,
                      " experts in ", o.num_groups(), " groups leave ", per_group, " per group");
    TORCH_CHECK_VALUE(o.top_k_groups() * per_group >= top_k, layer, ": top_k=", top_k, " experts cannot come from ",
                      o.top_k_groups(), " groups of ", per_group);
  }
}

std::pair<at::Tensor, at::Tensor> moe_route(const at::Tensor& logits, const at::Tensor& correction, int64_t top_k,
                                            const MoERouterOptions& o, at::ScalarType input_dtype) {
  at::Tensor weights, experts;
  switch (o.scoring()) {
    case MoEScoring::kSoftmax: {
      // transformers' TopKRouter: the softmax in float32 whatever the dtype, top-k, the
      // weights renormalised in float32.
      std::tie(weights, experts) = at::topk(at::softmax(logits.to(at::kFloat), -1), top_k, -1);
      if (o.normalize_top_k()) weights = weights / weights.sum(-1, /*keepdim=*/true);
      break;
    }
    case MoEScoring::kSoftmaxOfTopK: {
      // GPT-OSS: the top k logits, their softmax in the logits' own dtype.
      at::Tensor top;
      std::tie(top, experts) = at::topk(logits, top_k, -1);
      weights = at::softmax(top, -1);
      break;
    }
    case MoEScoring::kSigmoid: {
      const at::Tensor scores = at::sigmoid(logits.to(at::kFloat));
      at::Tensor choice = scores.detach();
      if (correction.defined()) choice = choice + correction.to(at::kFloat);
      if (o.num_groups() > 1) {
        const int64_t tokens = choice.size(0), experts_n = choice.size(1), per = experts_n / o.num_groups();
        const at::Tensor grouped = choice.view({tokens, o.num_groups(), per});
        const at::Tensor group_scores = std::get<0>(at::topk(grouped, 2, -1)).sum(-1);
        const at::Tensor groups = std::get<1>(at::topk(group_scores, o.top_k_groups(), -1));
        const at::Tensor keep = at::zeros_like(group_scores, at::kBool).scatter_(1, groups, true);
        choice = choice.masked_fill(
            keep.unsqueeze(-1).expand({tokens, o.num_groups(), per}).reshape({tokens, experts_n}).logical_not(),
            -std::numeric_limits<float>::infinity());
      }
      // Unsorted, as DeepSeek-V3's and GLM's routers take them: the order of the k weights
      // is the order their float32 sum below adds them in.
      experts = std::get<1>(at::topk(choice, top_k, -1, /*largest=*/true, /*sorted=*/false));
      weights = scores.gather(1, experts);
      if (o.normalize_top_k()) weights = weights / (weights.sum(-1, /*keepdim=*/true) + 1e-20);
      if (o.scaling_factor() != 1.0) weights = weights * o.scaling_factor();
      break;
    }
  }
  if (o.weights_in_input_dtype()) weights = weights.to(input_dtype);
  return {weights, experts};
}

}  // namespace tp
