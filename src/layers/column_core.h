#pragma once
// ColumnCore: what every column-parallel layer shares.
//
// The output dimension is a list of named segments (one for ColumnParallelLinear;
// q,k,v for QKV; gate,up for GateUp), each split on its own; a rank's local output
// is the concatenation of its piece of every segment. The core owns the weights
// (through the QuantMethod), the bias, the forward, the gather and the loading.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "layers/linear_function.h"
#include "layers/numerics/invariant_linear.h"
#include "layers/step.h"
#include "tp/comm/communicator.h"
#include "tp/comm/reduction.h"
#include "tp/layers/lora/lora.h"
#include "tp/layers/numerics/numerics.h"
#include "tp/loader/checkpoint.h"
#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
#include "tp/shard/segments.h"
#include "tp/shard/split.h"

namespace torch::nn {
class Module;
}

namespace tp::detail {

class ColumnCore {
 public:
  /// `plans[r]` is rank r's plan of the output dimension (every rank's is kept so
  /// a gather knows everyone's sizes). Registers "weight" (via the method) and,
  /// with `bias`, "bias" on `owner`.
  ColumnCore(std::string layer, Communicator comm, std::vector<SegmentPlan> plans, int64_t in_features,
             std::shared_ptr<QuantMethod> method, bool bias, const at::TensorOptions& options,
             torch::nn::Module& owner);

  const SegmentPlan& plan() const { return plans_[comm_.rank()]; }
  const std::vector<SegmentPlan>& plans() const { return plans_; }
  const QuantMethod& method() const { return *method_; }
  int64_t in_features() const { return in_features_; }
  /// The parameters registered on the owner: the stored weight, and the bias
  /// (undefined without one). Layers expose them as their `weight` / `bias`.
  const at::Tensor& weight() const { return weight_; }
  const at::Tensor& bias() const { return bias_; }

  /// Fresh random weights and bias (global fan-in).
  void reset_parameters();
  /// x: [..., in] -> [..., local_out], or [..., global_out] when the output reduction is an
  /// all-gather (gather_output: segments in global order, each whole). Differentiable at
  /// every TP size: x enters through copy_to_parallel (its gradient is summed over ranks),
  /// or, when the input reduction is the sequence-parallel all-gather, x is this rank's
  /// tokens and enters through it (the gradient is reduce-scattered back). The GEMM and
  /// the entry are the layer's step (layers/step.h).
  at::Tensor forward(const at::Tensor& x) const;
  /// The per-token quantization the layer's GEMM gives an input like x first, when
  /// forward_quantized takes it done already (the default step, a mirrored input); kNone otherwise.
  TokenQuant input_quant(const at::Tensor& x) const;
  /// forward of the input whose input_quant() quantization is codes [..., in] and
  /// scales [..., 1]: the same output, bit for bit, without a backward.
  at::Tensor forward_quantized(const at::Tensor& codes, const at::Tensor& scales) const;
  /// How the input enters (none: mirrored; all_gather: sequence parallelism) and what
  /// the output gets (none: this rank's columns; all_gather: gather_output).
  const Reduction& input_reduction() const { return entry_; }
  const Reduction& output_reduction() const { return exit_; }
  /// The step's name ("default/column", "invariant/column").
  std::string step_name() const { return step_->name(); }
  /// The layer's LoRA adapters (tp/layers/lora/lora.h), cut by this plan; made by set_step.
  const std::shared_ptr<LoRAImpl>& lora() const { return lora_; }
  /// Whether some local rows are copies of rows other ranks hold (replicated KV heads).
  bool has_replicas() const { return replicas_ != nullptr; }
  /// The layer's reductions and, under invariant numerics, the plan of its sums (null
  /// otherwise): its step, chosen once (make_column_core calls it).
  void set_step(Reduction entry, Reduction exit, std::shared_ptr<const InvariantPlan> invariant);
  /// The whole weight [global_out, in] and bias [global_out] (undefined without one)
  /// from every rank's shard, segments in global order, replicated rows once. Every
  /// rank calls it and gets the same tensors.
  std::pair<at::Tensor, at::Tensor> gather_parameters() const;
  /// Splits an output into its segments: local pieces, or whole segments when
  /// `gathered`.
  std::vector<at::Tensor> split(const at::Tensor& y, bool gathered) const;
  /// Loads segment i from checkpoint tensors `prefixes[i] + ".weight"` (and
  /// ".bias" when the layer has one).
  void load(const Checkpoint& checkpoint, const std::vector<std::string>& prefixes);
  /// Loads from explicit parts (a fused or interleaved checkpoint layout): each part
  /// reads one range of rows of `part.prefix + ".weight"` (and ".bias") into its
  /// local offset; the parts must tile the local output exactly. `what` names the
  /// layer and the layout in errors.
  /// Strict and collective (docs/DESIGN.md): a tensor under a part's prefix that the
  /// layer would not read is an error, and an error on any rank is thrown on every rank.
  void load_parts(const Checkpoint& checkpoint, const std::vector<WeightPart>& parts, const std::string& what);

 private:
  /// The global [..., global_out] from every rank's [..., local_out] along `dim`
  /// (differentiable: each piece's gradient goes back to the rank it was taken from).
  at::Tensor gather(const at::Tensor& y_local, int64_t dim) const;
  // load_parts' work on this rank alone.
  void load_local(const Checkpoint& checkpoint, const std::vector<WeightPart>& parts, const std::string& what);

  std::string layer_;
  Communicator comm_;
  std::vector<SegmentPlan> plans_;
  int64_t in_features_;
  std::shared_ptr<QuantMethod> method_;
  at::Tensor weight_;                           // as registered by the method
  at::Tensor bias_;                             // [local_out] or undefined
  std::shared_ptr<const ReplicaSum> replicas_;  // null when no row is replicated
  Reduction entry_, exit_;
  std::shared_ptr<const LinearStep> step_;  // the GEMM and the input's collective
  std::shared_ptr<LoRAImpl> lora_;          // the adapters added to the step's output
};

/// What the column layers' options share (their sizes differ; these do not).
struct ColumnSpec {
  int64_t in_features = 0;
  bool bias = false;
  QuantConfig quant;
  SplitPolicy split;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  /// Invariant numerics (tp/layers/numerics/numerics.h; kAuto resolved at construction).
  Numerics numerics = Numerics::kAuto;
  /// Under invariant numerics: the size of each segment that an even split cuts on the
  /// kInvariantChunk grid (0: none, the split as the layer asks: QKV's heads;
  /// invariant_split_policy), and the granularity of the segments' boundaries (0: the
  /// split policy's; QKV: head_dim).
  int64_t invariant_size = 0;
  int64_t boundary_granularity = 0;
  /// The reductions the options spell: gather_output (an all-gather of the output's
  /// columns), sequence_parallel (an all-gather of the input's tokens along sequence_dim).
  bool gather_output = false;
  bool sequence_parallel = false;
  int64_t sequence_dim = 0;
};

/// Rank `rank`'s plan of the output dimension under `policy` (the layer's split policy
/// with the format's alignment already combined in).
using ColumnPlanner = std::function<SegmentPlan(int64_t rank, const SplitPolicy& policy)>;

/// Every column layer's reset(): makes the QuantMethod of spec.quant, combines its
/// alignment with spec.split, plans every rank's output with `plan_of` (a ShardError
/// becomes a c10::ValueError naming `layer`), and registers the weights and bias on
/// `owner` with this rank's local shapes.
std::shared_ptr<ColumnCore> make_column_core(const std::string& layer, const ColumnSpec& spec, const Communicator& comm,
                                             const ColumnPlanner& plan_of, torch::nn::Module& owner);

}  // namespace tp::detail
