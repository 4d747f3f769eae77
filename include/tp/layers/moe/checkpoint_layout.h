#pragma once
// Where a mixture-of-experts block's tensors are in a checkpoint: the router, the experts
// (one tensor per expert and projection, or one stacked 3-D tensor per projection) and
// the shared expert, under the block's prefix. Declared, never guessed: MoEParallelMLP
// checks the shapes against it when it loads.

#include <string>

#include <torch/arg.h>

namespace tp {

/// How a checkpoint stores the experts of a block.
enum class ExpertLayout {
  /// One 2-D tensor per expert and projection: "<prefix>.experts.<e>.<gate_name>.weight"
  /// [intermediate, hidden] (and the format's other tensors beside it), as transformers 4
  /// and most published checkpoints write them.
  kPerExpert,
  /// One 3-D tensor per projection, experts first: "<prefix>.experts.<gate_up_name>"
  /// [experts, 2 * intermediate, hidden] (each expert's gate rows, then its up rows) and
  /// "<prefix>.experts.<down_name>" [experts, hidden, intermediate], as transformers 5
  /// holds them (save_pretrained(save_original_format=False)). A format's other tensors
  /// are "<name>_<suffix>" ("gate_up_proj_bias", "gate_up_proj_blocks", ...).
  kFused,
};
/// "per_expert", "fused".
const char* to_string(ExpertLayout layout);

/// How a model's MoE checkpoint names its tensors under the block's prefix.
struct MoECheckpointLayout {
  /// The router: "<prefix>.<router_name>.weight" [experts, hidden] (".bias",
  /// ".e_score_correction_bias" where the router has them).
  TORCH_ARG(std::string, router_name) = "gate";
  TORCH_ARG(ExpertLayout, experts) = ExpertLayout::kPerExpert;
  /// kPerExpert: expert e's projections "<prefix>.experts.<e>.<gate_name>", ...
  TORCH_ARG(std::string, gate_name) = "gate_proj";
  TORCH_ARG(std::string, up_name) = "up_proj";
  /// Both layouts: the down projection ("<prefix>.experts.<e>.<down_name>" or the 3-D
  /// "<prefix>.experts.<down_name>").
  TORCH_ARG(std::string, down_name) = "down_proj";
  /// kFused: the gate/up tensor.
  TORCH_ARG(std::string, gate_up_name) = "gate_up_proj";
  /// kFused: gate and up rows alternate (gate 0, up 0, gate 1, ...: GPT-OSS) instead of
  /// all gate rows, then all up rows.
  TORCH_ARG(bool, interleaved_gate_up) = false;
  /// kFused: the unquantized weights are stored [experts, in, out] (GPT-OSS's
  /// gate_up_proj [experts, hidden, 2 * intermediate], down_proj [experts, intermediate,
  /// hidden]); quantized tensors keep their format's [experts, out, ...] layout.
  TORCH_ARG(bool, transposed) = false;
  /// The shared expert: "<prefix>.<shared_expert_name>.gate_proj/up_proj/down_proj"
  /// (Qwen-MoE "shared_expert", DeepSeek-V3 / GLM-4.5 "shared_experts"), and its gate
  /// "<prefix>.<shared_expert_gate_name>.weight" [1, hidden] (Qwen-MoE).
  TORCH_ARG(std::string, shared_expert_name) = "shared_expert";
  TORCH_ARG(std::string, shared_expert_gate_name) = "shared_expert_gate";
};

}  // namespace tp
