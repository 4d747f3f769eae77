#pragma once
// RowParallelLinear: y = x W^T + b with W's columns (input features) sharded.
//
// Split states: x is split on its last dim (input_is_parallel) or mirrored; W is
// split on dim 1; each rank's GEMM gives a partial sum of y, which is reduced to a
// mirrored y unless reduce_output(false). Bias contract: the full bias is added once,
// by rank 0, before the reduction, so a partial sum handed on unreduced still sums
// to the right answer wherever it is reduced later.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include "tp/comm/all_reduce_strategy.h"
#include "tp/comm/communicator.h"
#include "tp/comm/reduction.h"
#include "tp/layers/lora/lora.h"
#include "tp/layers/numerics/numerics.h"
#include "tp/loader/checkpoint.h"
#include "tp/quant/quant_config.h"
#include "tp/shard/split.h"

namespace tp {
class QuantMethod;
namespace detail {
class LinearStep;
}

/// Options for RowParallelLinear. Sizes are GLOBAL (unsharded).
/// Example: tp::RowParallelLinear down(tp::RowParallelLinearOptions(11008, 4096).bias(false), comm);
struct RowParallelLinearOptions {
  RowParallelLinearOptions(int64_t in_features, int64_t out_features);
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
  /// The input is already this rank's slice [..., local in] (the output of a
  /// ColumnParallelLinear); false: the whole x [..., in_features], sliced here.
  TORCH_ARG(bool, input_is_parallel) = true;
  /// AllReduce the partial sums; false hands the partial sum on (see the bias contract).
  TORCH_ARG(bool, reduce_output) = true;
  /// The AllReduce algorithm (kAuto: chosen per call).
  TORCH_ARG(AllReduceStrategy, all_reduce) = AllReduceStrategy::kAuto;
  /// The AllReduce's wire precision (kDefault: the communicator's; kBFloat16 halves
  /// the bytes of a float32 reduction, within the bound documented at WirePrecision).
  TORCH_ARG(WirePrecision, wire) = WirePrecision::kDefault;
  /// Sequence parallelism (Megatron's sequence_parallel): the partial sums are
  /// reduce-scattered along `sequence_dim` instead of all-reduced, so each rank gets
  /// its piece of the tokens, sequence_ranges(tokens, world)[rank]
  /// (tp/layers/sequence_parallel.h); the backward all-gathers the output gradient.
  /// Needs reduce_output (with reduce_output(false) there is no collective either way).
  TORCH_ARG(bool, sequence_parallel) = false;
  /// The token dimension of the output for sequence_parallel (negative counts from the end).
  TORCH_ARG(int64_t, sequence_dim) = 0;
  TORCH_ARG(QuantConfig, quant) = {};
  /// How in_features is split; combined with the quant format's alignment.
  TORCH_ARG(SplitPolicy, split) = {};
  TORCH_ARG(at::ScalarType, dtype) = at::kFloat;
  TORCH_ARG(at::Device, device) = at::kCPU;
  /// false: the parameters are allocated uninitialized (at::empty) and left unfilled, as
  /// torch.nn.utils.skip_init does, for a load_weights to fill (CausalLM::from_pretrained
  /// builds its layers so; LoadSession::expect_filled names any tensor a load left unfilled).
  /// true: reset_parameters() fills them at construction.
  TORCH_ARG(bool, init_weights) = true;
  /// The order of its sums (tp/layers/numerics/numerics.h): kAuto reads TP_NUMERICS.
  TORCH_ARG(Numerics, numerics) = Numerics::kAuto;
};

/// The module behind the RowParallelLinear holder.
class RowParallelLinearImpl : public torch::nn::Cloneable<RowParallelLinearImpl> {
 public:
  RowParallelLinearImpl(int64_t in_features, int64_t out_features, Communicator comm = {})
      : RowParallelLinearImpl(RowParallelLinearOptions(in_features, out_features), std::move(comm)) {}
  explicit RowParallelLinearImpl(RowParallelLinearOptions options, Communicator comm = {});

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  /// x: [..., local in] (input_is_parallel) or [..., in_features] -> [..., out_features],
  /// reduced over ranks unless reduce_output(false); with sequence_parallel, this rank's
  /// tokens of it. Differentiable at every TP size: the whole input is scattered
  /// (its gradient all-gathered), the reduction's backward is the identity, and every
  /// rank's bias gets the full gradient although only rank 0 adds it.
  at::Tensor forward(const at::Tensor& x);

  /// The partial sum forward would reduce, with the bias left out on every rank:
  /// x as for forward -> [..., out_features], this rank's share. For a caller that
  /// reduces it itself and adds `bias` once, in the reduction: Communicator::
  /// all_reduce_fusion with params.bias = bias (DecoderLayer's fused boundary). Not under
  /// invariant numerics (its sum is canonical, taken whole: use forward).
  at::Tensor forward_partial(const at::Tensor& x);

  /// Loads `prefix + ".weight"` (this rank's columns) and ".bias" (whole).
  void load_weights(const Checkpoint& checkpoint, const std::string& prefix);

  /// The whole weight [out_features, in_features], gathered from every rank's columns,
  /// and the bias (mirrored: this rank's copy), under the names load_weights reads:
  /// `prefix + ".weight"` (and ".bias"). Every rank calls it (it all-gathers) and gets
  /// the same tensors. Unquantized layers only.
  std::map<std::string, at::Tensor> gather_weights(const std::string& prefix) const;
  /// This layer's LoRA adapters (tp/layers/lora/lora.h), cut by its own plan; registered as
  /// its child "lora" (so parameters() lists them) on the first call.
  LoRAImpl& lora();
  /// This rank's columns of the global weight (= its slice of the input), [begin, end).
  Range local_range() const { return range_; }
  /// Every rank's input range, in rank order.
  const std::vector<Range>& ranges() const { return ranges_; }
  /// What the forward does with the partial sums, as the options spell it: all-reduce,
  /// reduce-scatter over tokens (sequence_parallel), or none (reduce_output(false)).
  const Reduction& output_reduction() const { return exit_; }

  RowParallelLinearOptions options;
  Communicator comm;
  at::Tensor weight;  // [out_features, in_local]
  at::Tensor bias;    // [out_features] on every rank (added by rank 0 only), or undefined

 private:
  // The input checked, and cut to this rank's columns unless input_is_parallel.
  at::Tensor local_input(const at::Tensor& input);

  Range range_;
  std::vector<Range> ranges_;
  std::shared_ptr<QuantMethod> method_;  // the format's weights and GEMM (hidden, as in the column layers)
  Reduction exit_;
  std::shared_ptr<const detail::LinearStep> step_;  // the GEMM and the collective (layers/step.h)
  std::shared_ptr<LoRAImpl> lora_;                  // adapters, read by the step
};

/// A ModuleHolder for RowParallelLinearImpl.
TORCH_MODULE(RowParallelLinear);

}  // namespace tp
