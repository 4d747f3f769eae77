#pragma once
// Saving what was trained: a module tree's tensors as full (unsharded) tensors under
// Hugging Face names, ready for save_safetensors / save_sharded_safetensors, and
// loadable again at any TP size.

#include <map>
#include <string>

#include <ATen/core/Tensor.h>

namespace torch::nn {
class Module;
}

namespace tp {

/// Every tensor of `module` and its descendants, whole, by name. Names are module
/// paths joined with "." after `prefix`, as torch's named_parameters gives them, except
/// that the tp layers gather their shards (every rank must call this, in the same
/// order: it all-gathers) and write what their load_weights reads:
///   ColumnParallelLinear / RowParallelLinear at path P: P.weight, P.bias;
///   QKVParallelLinear at P: parent(P).q_proj / .k_proj / .v_proj (.weight, .bias),
///     replicated KV heads once; GateUpParallelLinear at P: parent(P).gate_proj /
///     .up_proj - the fused layers are named after the projections they fuse, as vLLM
///     does ("model.layers.0.self_attn.qkv_proj" writes "model.layers.0.self_attn.q_proj.weight"),
///     so a tree shaped like the Hugging Face model gives its names;
///   VocabParallelEmbedding / an untied ParallelLMHead at P: P.weight, [vocab, hidden]
///     without padding rows (a tied head writes nothing: the embedding has the weight);
///   MoEParallelMLP at P: P.gate.weight and every expert whole, P.experts.<e>.gate_proj /
///     .up_proj / .down_proj (the per-expert layout), the shared expert's.
///   (tp::CausalLM's own gather_weights() gives its Hugging Face names.)
/// When `module` itself is a fused layer, `prefix` is what its load_weights takes.
/// Other modules contribute their own parameters and buffers, copied. Every rank gets
/// every tensor (the whole model in memory: call it where that fits), so rank 0 can
/// write the file:
///   auto tensors = tp::gather_weights(*model);
///   if (comm.rank() == 0) tp::save_sharded_safetensors(dir, tensors, 4ll << 30);
/// Quantized layers refuse (their weights are frozen, still the checkpoint's).
std::map<std::string, at::Tensor> gather_weights(const torch::nn::Module& module, const std::string& prefix = "");

}  // namespace tp
