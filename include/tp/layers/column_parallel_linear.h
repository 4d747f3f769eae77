#pragma once
// ColumnParallelLinear: y = x W^T + b with W's rows (output features) sharded.
//
// Split states (llama.cpp's vocabulary): x is mirrored on every rank; W and b are
// split on dim 0; y is split on its last dim, or mirrored with gather_output.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include "tp/comm/communicator.h"
#include "tp/comm/reduction.h"
#include "tp/layers/lora/lora.h"
#include "tp/layers/numerics/numerics.h"
#include "tp/loader/checkpoint.h"
#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
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
  /// Sequence parallelism (Megatron's sequence_parallel): x is this rank's piece of
  /// the tokens along `sequence_dim` (any per-rank counts, zero included; they are
  /// exchanged, one small all-gather per forward) and is all-gathered before the GEMM;
  /// the backward reduce-scatters the input gradient back to the pieces. The output
  /// covers every token. See tp/layers/sequence_parallel.h for the token split rule.
  TORCH_ARG(bool, sequence_parallel) = false;
  /// The token dimension of x for sequence_parallel (negative counts from the end;
  /// it must not be the feature dim).
  TORCH_ARG(int64_t, sequence_dim) = 0;
  TORCH_ARG(QuantConfig, quant) = {};
  /// How out_features is split (granularity, per-rank weights, rotation). The quant
  /// format's alignment is combined with the granularity.
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
  /// The per-token quantization this layer's GEMM applies to an input like x before it
  /// multiplies (int8_w8a8's, fp8_channel's on the CPU under the default numerics, a
  /// mirrored input), which forward_quantized takes done already; kNone when there is none
  /// to take (then use forward).
  TokenQuant input_quant(const at::Tensor& x) const;
  /// forward of the input x whose input_quant(x) quantization is `codes` [..., in] and
  /// `scales` [..., 1] float32 (Communicator::all_reduce_fusion's quant_out and
  /// scale_out): forward(x)'s output bit for bit, without the quantization pass and
  /// without a backward (refused while autograd would record).
  at::Tensor forward_quantized(const at::Tensor& codes, const at::Tensor& scales);

  /// Loads `prefix + ".weight"` (and ".bias") from the checkpoint, reading only this
  /// rank's rows. Example: fc->load_weights(ckpt, "model.layers.0.mlp.up_proj").
  void load_weights(const Checkpoint& checkpoint, const std::string& prefix);

  /// The whole weight and bias, gathered from every rank's shard, under the names
  /// load_weights reads: `prefix + ".weight"` [out_features, in_features] (and
  /// ".bias"). Every rank calls it (it all-gathers) and gets the same full tensors.
  /// Unquantized layers only (a quantized layer's weights are frozen: they are still
  /// the checkpoint's). Example: tp::save_safetensors(path, fc->gather_weights("model.mlp.up_proj"));
  std::map<std::string, at::Tensor> gather_weights(const std::string& prefix) const;
  /// This layer's LoRA adapters (tp/layers/lora/lora.h), cut by its own plan; registered as
  /// its child "lora" (so parameters() lists them) on the first call.
  LoRAImpl& lora();
  /// This rank's rows of the global output, [begin, end).
  /// How the input enters (none: mirrored; all_gather over tokens: sequence_parallel) and
  /// what the output gets (none: this rank's columns; all_gather: gather_output), as the
  /// options spell them (tp/comm/reduction.h).
  const Reduction& input_reduction() const;
  const Reduction& output_reduction() const;
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
