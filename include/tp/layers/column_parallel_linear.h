#pragma once
// ColumnParallelLinear: y = x W^T + b with W's rows (output features) sharded.
//
// Split states (llama.cpp's vocabulary): x is mirrored on every rank; W and b are
// split on dim 0; y is split on its last dim, or mirrored with gather_output.

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include "tp/comm/communicator.h"
#include "tp/loader/checkpoint.h"
#include "tp/quant/quant_config.h"
#include "tp/shard/segments.h"
#include "tp/shard/split.h"

namespace tp {
namespace detail {
class ColumnCore;
}

/// Options for ColumnParallelLinear. Sizes are GLOBAL (unsharded).
/// Example: tp::ColumnParallelLinear fc(tp::ColumnParallelLinearOptions(4096, 11008).bias(false), comm);
struct ColumnParallelLinearOptions {
  ColumnParallelLinearOptions(int64_t in_features, int64_t out_features);
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
  /// All-gather the output so every rank gets the whole y.
  TORCH_ARG(bool, gather_output) = false;
  TORCH_ARG(QuantConfig, quant) = {};
  /// How out_features is split (granularity, per-rank weights, rotation). The quant
  /// format's alignment is combined with the granularity.
  TORCH_ARG(SplitPolicy, split) = {};
  TORCH_ARG(at::ScalarType, dtype) = at::kFloat;
  TORCH_ARG(at::Device, device) = at::kCPU;
};

/// The module behind the ColumnParallelLinear holder.
class ColumnParallelLinearImpl : public torch::nn::Cloneable<ColumnParallelLinearImpl> {
 public:
  ColumnParallelLinearImpl(int64_t in_features, int64_t out_features, Communicator comm = {})
      : ColumnParallelLinearImpl(ColumnParallelLinearOptions(in_features, out_features), std::move(comm)) {}
  explicit ColumnParallelLinearImpl(ColumnParallelLinearOptions options, Communicator comm = {});

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  /// x: [..., in_features] -> [..., local out] (or [..., out_features] with gather_output).
  at::Tensor forward(const at::Tensor& x);

  /// Loads `prefix + ".weight"` (and ".bias") from the checkpoint, reading only this
  /// rank's rows. Example: fc->load_weights(ckpt, "model.layers.0.mlp.up_proj").
  void load_weights(const Checkpoint& checkpoint, const std::string& prefix);

  /// This rank's rows of the global output, [begin, end).
  Range local_range() const;
  /// Every rank's output range, in rank order.
  std::vector<Range> ranges() const;

  ColumnParallelLinearOptions options;
  Communicator comm;
  at::Tensor weight;  // [out_local, in_features] (for quantized formats, the stored weight)
  at::Tensor bias;    // [out_local], or undefined

 private:
  std::shared_ptr<detail::ColumnCore> core_;
};

/// A ModuleHolder for ColumnParallelLinearImpl (like torch::nn::Linear).
TORCH_MODULE(ColumnParallelLinear);

}  // namespace tp
