#include "tp/layers/gather_weights.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "layers/layer_common.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/gate_up_parallel_linear.h"
#include "tp/layers/moe/moe_parallel_mlp.h"
#include "tp/layers/qkv_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"
#include "tp/layers/vocab/parallel_lm_head.h"
#include "tp/layers/vocab/vocab_parallel_embedding.h"

namespace tp {
namespace {

void merge(std::map<std::string, at::Tensor>& into, std::map<std::string, at::Tensor>&& from) {
  for (auto& [name, t] : from) {
    TORCH_CHECK_VALUE(into.emplace(name, std::move(t)).second, "gather_weights: two tensors are named '", name,
                      "' (a fused layer writes under its parent's path; rename one of the modules)");
  }
}

// `path`: the module's own path; `fused_prefix`: what a fused layer here writes under.
void visit(const torch::nn::Module& m, const std::string& path, const std::string& fused_prefix,
           std::map<std::string, at::Tensor>& out) {
  if (const auto* l = dynamic_cast<const ColumnParallelLinearImpl*>(&m)) return merge(out, l->gather_weights(path));
  if (const auto* l = dynamic_cast<const RowParallelLinearImpl*>(&m)) return merge(out, l->gather_weights(path));
  if (const auto* l = dynamic_cast<const QKVParallelLinearImpl*>(&m))
    return merge(out, l->gather_weights(fused_prefix));
  if (const auto* l = dynamic_cast<const GateUpParallelLinearImpl*>(&m))
    return merge(out, l->gather_weights(fused_prefix));
  if (const auto* l = dynamic_cast<const VocabParallelEmbeddingImpl*>(&m)) return merge(out, l->gather_weights(path));
  if (const auto* l = dynamic_cast<const ParallelLMHeadImpl*>(&m)) return merge(out, l->gather_weights(path));
  if (const auto* l = dynamic_cast<const MoEParallelMLPImpl*>(&m)) return merge(out, l->gather_weights(path));
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> own;
  for (const auto& p : m.named_parameters(/*recurse=*/false)) own[detail::join_name(path, p.key())] = p.value().clone();
  for (const auto& b : m.named_buffers(/*recurse=*/false)) own[detail::join_name(path, b.key())] = b.value().clone();
  merge(out, std::move(own));
  for (const auto& child : m.named_children()) {
    const auto child_path = detail::join_name(path, child.key());
    visit(*child.value(), child_path, path, out);
  }
}

}  // namespace

std::map<std::string, at::Tensor> gather_weights(const torch::nn::Module& module, const std::string& prefix) {
  std::map<std::string, at::Tensor> out;
  visit(module, prefix, prefix, out);
  return out;
}

}  // namespace tp
