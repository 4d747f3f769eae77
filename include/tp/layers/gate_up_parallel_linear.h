#pragma once
// GateUpParallelLinear: the fused gate and up projections of a gated MLP,
// column-parallel. The local output is [gate_local | up_local], with both segments
// split the same way, so SiLU(gate) * up needs no communication.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include "tp/comm/communicator.h"
#include "tp/comm/reduction.h"
#include "tp/layers/lora/lora.h"
#include "tp/layers/numerics/numerics.h"
#include "tp/loader/checkpoint.h"
#include "tp/loader/fused_layout.h"
#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
#include "tp/shard/range.h"
#include "tp/shard/split.h"

namespace tp {
namespace detail {
class ColumnCore;
}

/// Options for GateUpParallelLinear. Sizes are GLOBAL.
/// Example: tp::GateUpParallelLinear gate_up(tp::GateUpParallelLinearOptions(4096, 14336), comm);
struct GateUpParallelLinearOptions {
  GateUpParallelLinearOptions(int64_t hidden_size, int64_t intermediate_size);
  TORCH_ARG(int64_t, hidden_size);
  TORCH_ARG(int64_t, intermediate_size);
  TORCH_ARG(bool, bias) = false;
  /// All-gather so every rank gets the whole [gate | up].
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
  /// How intermediate_size is split (the same for gate and up).
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

/// The module behind the GateUpParallelLinear holder.
class GateUpParallelLinearImpl : public torch::nn::Cloneable<GateUpParallelLinearImpl> {
 public:
  GateUpParallelLinearImpl(int64_t hidden_size, int64_t intermediate_size, Communicator comm = {})
      : GateUpParallelLinearImpl(GateUpParallelLinearOptions(hidden_size, intermediate_size), std::move(comm)) {}
  explicit GateUpParallelLinearImpl(GateUpParallelLinearOptions options, Communicator comm = {});

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  /// x: [..., hidden_size] -> [..., 2 * local intermediate] ([gate | up]), or
  /// [..., 2 * intermediate_size] with gather_output.
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
  /// Splits a forward output into (gate, up).
  std::tuple<at::Tensor, at::Tensor> split(const at::Tensor& y) const;

  /// Loads `prefix + ".gate_proj"` and ".up_proj", reading only this rank's rows.
  /// Example: gate_up->load_weights(ckpt, "model.layers.0.mlp").
  void load_weights(const Checkpoint& checkpoint, const std::string& prefix);
  /// The same from a declared storage layout: separate gate/up tensors or one
  /// [gate|up] tensor (`fused_name`). Shapes are checked against the layout.
  /// Example: gate_up->load_weights(ckpt, "model.layers.0.mlp",
  ///   tp::GateUpCheckpointLayout().layout(tp::GateUpLayout::kFused));
  void load_weights(const Checkpoint& checkpoint, const std::string& prefix, const GateUpCheckpointLayout& layout);

  /// The whole gate and up weights (and biases) gathered from every rank's rows, under
  /// the names load_weights reads with `layout`: `prefix + ".gate_proj.weight"` and
  /// ".up_proj.weight" (kSeparate, the default), or one [gate|up] tensor (kFused).
  /// Every rank calls it (it all-gathers) and gets the same tensors. Unquantized only.
  /// This layer's LoRA adapters (tp/layers/lora/lora.h), cut by its own plan; registered as
  /// its child "lora" (so parameters() lists them) on the first call.
  LoRAImpl& lora();
  std::map<std::string, at::Tensor> gather_weights(const std::string& prefix,
                                                   const GateUpCheckpointLayout& layout = {}) const;
  /// This rank's slice of the intermediate dimension (the down projection's input).
  /// How the input enters (none: mirrored; all_gather over tokens: sequence_parallel) and
  /// what the output gets (none: this rank's columns; all_gather: gather_output), as the
  /// options spell them (tp/comm/reduction.h).
  const Reduction& input_reduction() const;
  const Reduction& output_reduction() const;
  Range local_range() const;

  GateUpParallelLinearOptions options;
  Communicator comm;
  at::Tensor weight;  // [2 * local intermediate, hidden_size]
  at::Tensor bias;    // [2 * local intermediate], or undefined

 private:
  std::shared_ptr<detail::ColumnCore> core_;
};

/// A ModuleHolder for GateUpParallelLinearImpl.
TORCH_MODULE(GateUpParallelLinear);

}  // namespace tp
