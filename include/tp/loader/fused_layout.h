#pragma once
// How a fused projection (QKV, gate/up) is stored in a checkpoint. The layout is
// declared by the caller, never guessed from names or shapes; the layer checks the
// shapes against it at load time, so a wrong declaration is an error, not a
// scrambled weight.

#include <string>

#include <torch/arg.h>

namespace tp {

/// Storage layouts of a QKV projection's weight (rows = output features).
enum class QKVLayout {
  kSeparate,           ///< three tensors: q_proj [H*d, hidden], k_proj and v_proj [KV*d, hidden] (Hugging Face)
  kFused,              ///< one tensor [Q | K | V]: [(H + 2 KV) * d, hidden] (Phi-3, GPT-NeoX-style fused)
  kInterleavedGroups,  ///< one tensor, per KV group g: its H/KV query heads, then k head g, then v head g (Megatron)
};

/// Storage layouts of a gated MLP's gate and up projections.
enum class GateUpLayout {
  kSeparate,  ///< two tensors: gate_proj and up_proj, each [I, hidden]
  kFused,     ///< one tensor [gate | up]: [2 I, hidden]
};

const char* to_string(QKVLayout layout);
const char* to_string(GateUpLayout layout);

/// Where a QKV projection lives under a layer's checkpoint prefix, and how.
/// Example: qkv->load_weights(ckpt, "model.layers.0.self_attn",
///                            tp::QKVCheckpointLayout().layout(tp::QKVLayout::kFused));
struct QKVCheckpointLayout {
  TORCH_ARG(QKVLayout, layout) = QKVLayout::kSeparate;
  /// Tensor names under the prefix (without ".weight" / ".bias").
  TORCH_ARG(std::string, q_name) = "q_proj";
  TORCH_ARG(std::string, k_name) = "k_proj";
  TORCH_ARG(std::string, v_name) = "v_proj";
  /// The one tensor of kFused and kInterleavedGroups.
  TORCH_ARG(std::string, fused_name) = "qkv_proj";
};

/// Where a gate/up projection lives under a layer's checkpoint prefix, and how.
/// Example: gate_up->load_weights(ckpt, "model.layers.0.mlp",
///                                tp::GateUpCheckpointLayout().layout(tp::GateUpLayout::kFused));
struct GateUpCheckpointLayout {
  TORCH_ARG(GateUpLayout, layout) = GateUpLayout::kSeparate;
  TORCH_ARG(std::string, gate_name) = "gate_proj";
  TORCH_ARG(std::string, up_name) = "up_proj";
  TORCH_ARG(std::string, fused_name) = "gate_up_proj";
};

}  // namespace tp
