#pragma once
// MoEParallelMLP: a mixture-of-experts MLP (Mixtral's sparse MoE block, Qwen3-MoE's) with
// expert tensor parallelism: every rank holds a column slice of every expert's gate / up
// projections and the matching row slice of its down projection (the intermediate
// dimension split alike for all experts), so the block's output on a rank is a partial
// sum and the block ends in one all-reduce, as a dense MLP does (Megatron-Core's expert
// tensor parallelism; vLLM's FusedMoE with tp_size > 1).
//
//   logits = x W_router^T            (mirrored: the router weight is on every rank)
//   p = softmax(logits) (float32), top-k experts per token, weights renormalised where the
//   model says (Mixtral always, Qwen3-MoE by norm_topk_prob)
//   y = sum over a token's chosen experts e: w_e * down_e(act(gate_e(x)) * up_e(x))
//
// With expert_parallel, the experts are distributed over the ranks instead (uneven
// counts allowed: 16 over 3 is 6, 5, 5), each whole on its owner: a rank computes its
// experts' contributions for the tokens routed to them, and the same all-reduce sums the
// owned contributions (on CPU that is the transport; a GPU all-to-all would send each
// token only to its experts' owners and back). The expert GEMMs are grouped: tokens sorted
// by expert, one GEMM pair per expert over its tokens (decode reads only the chosen
// experts' weights). Quantized experts and TP x EP on one group are not built yet.

#include <cstdint>
#include <map>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include "tp/comm/communicator.h"
#include "tp/loader/checkpoint.h"
#include "tp/shard/range.h"

namespace tp {

/// How a model's MoE checkpoint names its experts under the block's prefix.
struct MoECheckpointLayout {
  /// The router: "<prefix>.<router_name>.weight" [experts, hidden].
  TORCH_ARG(std::string, router_name) = "gate";
  /// Expert e's projections: "<prefix>.experts.<e>.<gate_name>.weight" [intermediate, hidden], ...
  TORCH_ARG(std::string, gate_name) = "gate_proj";
  TORCH_ARG(std::string, up_name) = "up_proj";
  TORCH_ARG(std::string, down_name) = "down_proj";
};

/// Options for MoEParallelMLP. Sizes are GLOBAL (intermediate_size: one expert's).
/// Example: tp::MoEParallelMLP moe(tp::MoEParallelMLPOptions(4096, 14336, 8, 2), comm);
struct MoEParallelMLPOptions {
  MoEParallelMLPOptions(int64_t hidden_size, int64_t intermediate_size, int64_t num_experts, int64_t top_k);
  TORCH_ARG(int64_t, hidden_size);
  TORCH_ARG(int64_t, intermediate_size);
  TORCH_ARG(int64_t, num_experts);
  TORCH_ARG(int64_t, top_k);
  /// Renormalise the top-k weights to sum to 1 (Mixtral: always; Qwen3-MoE: norm_topk_prob).
  TORCH_ARG(bool, normalize_top_k) = true;
  /// The routing weights cast back to the input's dtype before they scale the experts'
  /// outputs (Qwen3-MoE), or kept in float32 (Mixtral), as transformers computes them.
  TORCH_ARG(bool, weights_in_input_dtype) = false;
  /// Distribute the experts over the ranks (each whole on one rank) instead of splitting
  /// every expert's intermediate dimension.
  TORCH_ARG(bool, expert_parallel) = false;
  /// "silu", "gelu" or "gelu_tanh": act(gate) * up.
  TORCH_ARG(std::string, activation) = "silu";
  TORCH_ARG(at::ScalarType, dtype) = at::kFloat;
  TORCH_ARG(at::Device, device) = at::kCPU;
};

/// The module behind the MoEParallelMLP holder.
class MoEParallelMLPImpl : public torch::nn::Cloneable<MoEParallelMLPImpl> {
 public:
  explicit MoEParallelMLPImpl(MoEParallelMLPOptions options, Communicator comm = {});

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  /// x: [..., hidden] (mirrored) -> [..., hidden], the same on every rank (all-reduced).
  at::Tensor forward(const at::Tensor& x);
  /// The router's choice for tokens x [tokens, hidden]: (weights [tokens, top_k],
  /// expert ids int64 [tokens, top_k]), the same on every rank.
  std::pair<at::Tensor, at::Tensor> route(const at::Tensor& x) const;

  /// Loads the router (whole) and this rank's slice of every expert's projections
  /// (`prefix` + ".experts.<e>.<name>.weight"), collectively: an error on any rank is
  /// an error on every rank.
  void load_weights(const Checkpoint& checkpoint, const std::string& prefix, const MoECheckpointLayout& layout = {});
  /// Every tensor load_weights reads, whole, under its name (every rank calls it: it
  /// all-gathers the experts' slices).
  std::map<std::string, at::Tensor> gather_weights(const std::string& prefix,
                                                   const MoECheckpointLayout& layout = {}) const;

  /// This rank's slice of each expert's intermediate dimension (all of it under expert_parallel).
  Range local_range() const { return range_; }
  /// The experts this rank holds (all of them without expert_parallel).
  Range local_experts() const { return experts_; }

  MoEParallelMLPOptions options;
  Communicator comm;
  at::Tensor router_weight;   // [experts, hidden], mirrored
  at::Tensor gate_up_weight;  // [local experts, 2 * local intermediate, hidden]: per expert [gate | up]
  at::Tensor down_weight;     // [local experts, hidden, local intermediate]

 private:
  Range range_, experts_;
};

/// A ModuleHolder for MoEParallelMLPImpl.
TORCH_MODULE(MoEParallelMLP);

}  // namespace tp
