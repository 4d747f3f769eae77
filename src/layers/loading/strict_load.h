#pragma once
// Strict loading of one layer: the layer reads exactly the tensors its format defines
// under its checkpoint prefixes. A tensor there that it would leave unread (a bias for
// a layer built with bias=false, a scale for an unquantized layer, a tensor of another
// format) is an error naming the tensor, the layer and the fix, never silently ignored.

#include <functional>
#include <string>
#include <vector>

#include "tp/loader/checkpoint.h"
#include "tp/loader/tensor_source.h"

namespace tp::detail {

/// What a layer is, for the fix in an error about a tensor it would leave unread.
struct LayerFacts {
  std::string layer;       // "ColumnParallelLinear", with the checkpoint layout for a fused one
  bool bias = false;       // whether it was built with a bias
  std::string quant;       // QuantMethod::name(): "none", "fp8_block", "int4_gptq:g128", ...
  bool trainable = false;  // QuantMethod::trainable(): plain weights, which read no quantized tensor
};

/// Runs `load(view)`, `view` a view of `checkpoint` that records what the load reads,
/// then checks that it read every tensor named `prefix + "." + ...` for each of
/// `prefixes`, except those the checkpoint's own logs allow to stay unread
/// (Checkpoint::may_stay_unread: a LoadSession's allow list). Any other is an error.
void load_strictly(const Checkpoint& checkpoint, const std::vector<std::string>& prefixes, const LayerFacts& facts,
                   const std::function<void(const Checkpoint&)>& load);

/// A bias must be a float tensor (float64, float32, float16 or bfloat16) of shape [n].
void check_bias(const std::string& layer, const TensorSource& source, int64_t n);

}  // namespace tp::detail
