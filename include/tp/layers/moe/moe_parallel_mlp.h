#pragma once
// MoEParallelMLP: a mixture-of-experts MLP (Mixtral's sparse MoE block, Qwen-MoE's with
// its shared expert, DeepSeek-V3 / GLM-4.5's grouped sigmoid routing, GPT-OSS's experts
// with biases) split over a group of ranks two ways, composable:
//
//   expert tensor parallelism  every rank of an expert's group holds a column slice of the
//                              expert's gate / up projections and the matching row slice
//                              of its down projection (Megatron-Core's expert tensor
//                              parallelism; vLLM's FusedMoE with tp_size > 1);
//   expert parallelism         the experts are distributed over expert_parallel_size
//                              groups of consecutive ranks (uneven counts: 16 over 3 is
//                              6, 5, 5), each expert read and held only in its group.
//
// world = expert_parallel_size x (ranks per expert): 1 x world is pure expert TP, world x 1
// pure EP, 2 x 2 on four ranks both. Every rank's output is then a partial sum (its
// experts' slices, for the tokens routed to them), and the block ends in one all-reduce
// over the whole group, as a dense MLP does; on CPU that all-reduce is the transport, where
// a GPU all-to-all would send each token only to its experts' owners and back.
//
//   (weights, experts) = route(x W_router^T)        mirrored: every rank routes alike (router.h)
//   y = sum over a token's chosen experts e of  weight_e * down_e(act(gate_e(x)) * up_e(x))
//     + [sigmoid(x W_gate^T)] * shared(x)            the shared expert, split over every rank
//
// The expert GEMMs are grouped: the (token, slot) pairs sorted by expert, one pass per
// expert over its weights for its tokens, through the expert's own QuantMethod (every
// format the dense layers take, its CPU kernel included); a decode step reads only the
// chosen experts' weights. Gradients reach x, the router, the shared expert's gate and
// every unquantized expert weight (quantized weights are frozen, as in the dense layers).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include "tp/comm/communicator.h"
#include "tp/comm/reduction.h"
#include "tp/layers/moe/checkpoint_layout.h"
#include "tp/layers/moe/expert_lora.h"
#include "tp/layers/moe/router.h"
#include "tp/loader/checkpoint.h"
#include "tp/quant/quant_config.h"
#include "tp/shard/range.h"

namespace tp {

class QuantMethod;

/// Options for MoEParallelMLP. Sizes are GLOBAL (intermediate_size: one expert's).
/// Example: tp::MoEParallelMLP moe(tp::MoEParallelMLPOptions(4096, 14336, 8, 2), comm);
///          tp::MoEParallelMLPOptions(2048, 768, 128, 8).expert_parallel_size(2)   // TP 2 x EP 2 on 4 ranks
struct MoEParallelMLPOptions {
  MoEParallelMLPOptions(int64_t hidden_size, int64_t intermediate_size, int64_t num_experts, int64_t top_k);
  TORCH_ARG(int64_t, hidden_size);
  TORCH_ARG(int64_t, intermediate_size);
  TORCH_ARG(int64_t, num_experts);
  TORCH_ARG(int64_t, top_k);
  TORCH_ARG(MoERouterOptions, router) = {};
  /// How many groups the experts are distributed over (expert parallelism); each group's
  /// world / expert_parallel_size consecutive ranks split each of its experts (expert
  /// tensor parallelism). 1: every rank holds a slice of every expert; 0: as many groups
  /// as ranks (each expert whole on one rank). Must divide the world size.
  TORCH_ARG(int64_t, expert_parallel_size) = 1;
  /// Per-rank weights for unequal devices (empty: even; else one finite positive weight
  /// per rank): the experts go to the groups by the sums of their ranks' weights, each
  /// expert's intermediate rows to a group's ranks by theirs, the shared expert's rows to
  /// every rank by its weight (tp::split's largest remainder; tp/models/model_split.h).
  TORCH_ARG(std::vector<double>, split_weights) = {};
  /// Where the leftover units start (SplitPolicy::rotation): the experts' and each
  /// expert's rows at this rank, the shared expert's at the next.
  TORCH_ARG(int64_t, split_rotation) = 0;
  /// The experts' format (gate, up and down alike), as the dense layers' quant option.
  TORCH_ARG(QuantConfig, quant) = {};
  /// Biases on every expert's gate / up and down projections (GPT-OSS).
  TORCH_ARG(bool, expert_bias) = false;
  /// "silu", "gelu", "gelu_tanh": act(gate) * up; "swiglu_oai" (GPT-OSS):
  /// (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = clamp(gate, max=limit).
  TORCH_ARG(std::string, activation) = "silu";
  TORCH_ARG(double, swiglu_alpha) = 1.702;
  TORCH_ARG(double, swiglu_limit) = 7.0;
  /// A shared expert every token goes through, of this intermediate size, split over
  /// every rank of the group (0: none).
  TORCH_ARG(int64_t, shared_expert_intermediate_size) = 0;
  /// The shared expert's output scaled by sigmoid(x W_gate^T), W_gate [1, hidden] (Qwen-MoE).
  TORCH_ARG(bool, shared_expert_gate) = false;
  TORCH_ARG(QuantConfig, shared_expert_quant) = {};
  /// All-reduce the ranks' partial sums (the combine); false hands the partial sum on, to
  /// be reduced later (e.g. by a fused all-reduce + residual + norm), as with
  /// RowParallelLinear's reduce_output: each expert's down bias is added by one rank only.
  TORCH_ARG(bool, reduce_output) = true;
  TORCH_ARG(at::ScalarType, dtype) = at::kFloat;
  TORCH_ARG(at::Device, device) = at::kCPU;
  /// false: the parameters are allocated uninitialized (at::empty) and left unfilled, as
  /// torch.nn.utils.skip_init does, for a load_weights to fill (CausalLM::from_pretrained
  /// builds its layers so; LoadSession::expect_filled names any tensor a load left unfilled).
  /// true: reset_parameters() fills them at construction.
  TORCH_ARG(bool, init_weights) = true;
};

namespace detail {
class ExpertShard;
}

/// Where one forward's time went on this rank (MoEParallelMLPImpl::timings, recorded
/// while record_timings is set): what tp-bench --rows moe prints.
struct MoETimings {
  double route_s = 0;        ///< the router: logits, scores, top-k, and sorting the tokens by expert
  double experts_s = 0;      ///< the routed experts' GEMMs and activations, this rank's slices
  double shared_s = 0;       ///< the shared expert and its gate
  double reduce_s = 0;       ///< the block's all-reduce
  int64_t experts_run = 0;   ///< experts this rank ran (had tokens)
  int64_t weight_bytes = 0;  ///< bytes of the expert tensors those passes read (each once), shared expert included
};

/// The module behind the MoEParallelMLP holder. Parameters: router_weight [experts,
/// hidden] (router_bias, the score_correction_bias buffer where the router has them),
/// mirrored; experts.<e>.gate_up.* (this rank's [gate | up] rows of expert e, in the
/// format's tensors) and experts.<e>.down.* for each expert e this rank holds (global
/// ids); shared_expert.gate_up.* / shared_expert.down.* and shared_expert_gate_weight;
/// lora.<adapter>.* (the routed experts' LoRA adapters, tp/layers/moe/expert_lora.h).
class MoEParallelMLPImpl : public torch::nn::Cloneable<MoEParallelMLPImpl> {
 public:
  explicit MoEParallelMLPImpl(MoEParallelMLPOptions options, Communicator comm = {});

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;
  /// A copy with the same sharding and every tensor copied (collective: every rank clones).
  std::shared_ptr<torch::nn::Module> clone(const std::optional<at::Device>& device = std::nullopt) const override;

  /// x: [..., hidden] (mirrored) -> [..., hidden], the same on every rank (all-reduced).
  at::Tensor forward(const at::Tensor& x);
  /// The partial sum forward reduces: this rank's experts' (and shared expert's) share,
  /// [..., hidden], for a caller that reduces it itself (DecoderLayer's fused boundary).
  /// timings, when recorded, leave out the reduction.
  at::Tensor forward_partial(const at::Tensor& x);
  /// The router's choice for tokens x [tokens, hidden]: (weights [tokens, top_k],
  /// expert ids int64 [tokens, top_k]), the same on every rank.
  std::pair<at::Tensor, at::Tensor> route(const at::Tensor& x) const;

  /// Loads the router (whole), this rank's experts (their slices), and the shared
  /// expert's slice, from `layout`'s names under `prefix`. Strict and collective: every
  /// tensor under `prefix` must be read by some rank, and an error on any rank is an
  /// error on every rank.
  void load_weights(const Checkpoint& checkpoint, const std::string& prefix, const MoECheckpointLayout& layout = {});
  /// Every tensor load_weights reads, whole, under its name in `layout` (every rank
  /// calls it: it all-gathers the experts' slices). Unquantized experts only.
  std::map<std::string, at::Tensor> gather_weights(const std::string& prefix,
                                                   const MoECheckpointLayout& layout = {}) const;

  /// This rank's slice of each of its experts' intermediate dimension.
  Range local_range() const { return range_; }
  /// The experts this rank holds.
  Range local_experts() const { return experts_; }
  /// This rank's slice of the shared expert's intermediate dimension (empty without one).
  Range shared_expert_range() const { return shared_range_; }
  /// The resolved expert-parallel size (options' 0 is the world size) and this rank's
  /// place: its expert group, and its rank inside the group.
  int64_t expert_parallel_size() const { return ep_; }
  int64_t expert_group() const { return comm.rank() / (comm.world_size() / ep_); }
  int64_t rank_in_expert_group() const { return comm.rank() % (comm.world_size() / ep_); }
  /// The experts' format ("none", "int4_gptq:g128:sym", ...).
  std::string quant_name() const;
  /// The combine: an all-reduce over the whole group, or none (reduce_output(false)).
  const Reduction& output_reduction() const { return combine_; }
  /// The routed experts' LoRA adapters (none until added or loaded).
  ExpertLoRAImpl& lora() { return *lora_; }
  const ExpertLoRAImpl& lora() const { return *lora_; }
  /// The shared expert's LoRA adapters on `projection`: "gate_up" (segments gate and up:
  /// PEFT's shared_expert.gate_proj and up_proj, cut as a column layer's) or "down" (a row
  /// layer's); its stored weight there (this rank's slice, for merging). An error without a
  /// shared expert.
  LoRAImpl& shared_expert_lora(const std::string& projection) const;
  at::Tensor shared_expert_weight(const std::string& projection) const;

  /// While true, each forward records where its time went in `timings` (steady clock;
  /// the all-reduce waits for the slowest rank).
  bool record_timings = false;
  MoETimings timings;

  MoEParallelMLPOptions options;
  Communicator comm;
  at::Tensor router_weight;              // [experts, hidden], mirrored
  at::Tensor router_bias;                // [experts] or undefined
  at::Tensor score_correction_bias;      // [experts] buffer or undefined
  at::Tensor shared_expert_gate_weight;  // [1, hidden] or undefined

 private:
  Range range_, experts_, shared_range_;
  int64_t ep_ = 1;
  // One per expert this rank holds (experts_), then the shared expert's, if any.
  std::vector<std::shared_ptr<detail::ExpertShard>> experts_shards_;
  std::shared_ptr<detail::ExpertShard> shared_;
  Reduction combine_;
  ExpertLoRA lora_{nullptr};
};

/// A ModuleHolder for MoEParallelMLPImpl.
TORCH_MODULE(MoEParallelMLP);

/// One rank's place in a mixture: its experts, its rows of each, its rows of the shared
/// expert (empty without one).
struct MoEPlacement {
  Range experts, rows, shared_rows;
};

/// Rank `rank`'s place among `world` ranks under `options` (its expert_parallel_size,
/// 0 meaning world; split_weights; quant alignment): what MoEParallelMLP holds there, for
/// a model's split plan. A cut that cannot be made is a c10::ValueError naming the layer.
MoEPlacement moe_placement(const MoEParallelMLPOptions& options, int64_t world, int64_t rank);

}  // namespace tp
