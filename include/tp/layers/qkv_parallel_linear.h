#pragma once
// QKVParallelLinear: the fused query/key/value projection, column-parallel by heads.
//
// The output is [Q | K | V]; each rank owns whole heads: whole KV heads plus the
// query heads that read them (GQA). When world > num_kv_heads, each KV head is
// replicated on world / num_kv_heads ranks and its query heads are split among them.

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
#include "tp/shard/heads.h"
#include "tp/shard/split.h"

namespace tp {
namespace detail {
class ColumnCore;
}

/// Options for QKVParallelLinear. Sizes are GLOBAL.
/// Example: tp::QKVParallelLinear qkv(tp::QKVParallelLinearOptions(4096, 128, 32, 8), comm);
struct QKVParallelLinearOptions {
  QKVParallelLinearOptions(int64_t hidden_size, int64_t head_dim, int64_t num_heads, int64_t num_kv_heads);
  TORCH_ARG(int64_t, hidden_size);
  TORCH_ARG(int64_t, head_dim);
  TORCH_ARG(int64_t, num_heads);
  TORCH_ARG(int64_t, num_kv_heads);
  /// Llama has no QKV bias; Qwen2 has one.
  TORCH_ARG(bool, bias) = false;
  /// All-gather so every rank gets the whole [Q | K | V] (replicated KV heads once).
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
  /// Weights/rotation over KV-head groups; granularity in elements (combined with the
  /// quant alignment) restricts which head boundaries are allowed.
  TORCH_ARG(SplitPolicy, split) = {};
  /// The query heads' boundaries also fall on multiples of this many elements of the q
  /// dimension (tp::plan_heads' q_granularity): the row alignment of the O projection that
  /// reads them, so its cut is whole quant groups (decoder_layer_options sets it).
  TORCH_ARG(int64_t, query_granularity) = 1;
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

/// The module behind the QKVParallelLinear holder.
class QKVParallelLinearImpl : public torch::nn::Cloneable<QKVParallelLinearImpl> {
 public:
  explicit QKVParallelLinearImpl(QKVParallelLinearOptions options, Communicator comm = {});

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  /// x: [..., hidden_size] -> [..., (local_q_heads + 2 * local_kv_heads) * head_dim],
  /// or the whole [..., (num_heads + 2 * num_kv_heads) * head_dim] with gather_output.
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
  /// Splits a forward output into (q, k, v), each [..., heads * head_dim].
  std::tuple<at::Tensor, at::Tensor, at::Tensor> split(const at::Tensor& y) const;

  /// Loads `prefix + ".q_proj"`, ".k_proj", ".v_proj" (".weight", and ".bias" with
  /// bias), reading only this rank's heads.
  /// Example: qkv->load_weights(ckpt, "model.layers.0.self_attn").
  void load_weights(const Checkpoint& checkpoint, const std::string& prefix);
  /// The same from a declared storage layout: separate q/k/v tensors, one fused
  /// [Q|K|V] tensor, or Megatron's per-KV-group interleaving. Either way only this
  /// rank's rows are read (an interleaved rank reads one block per group it
  /// touches). Shapes are checked against the layout; a mismatch is an error
  /// naming the layer, the layout and both shapes.
  /// Example: qkv->load_weights(ckpt, "model.layers.0.self_attention",
  ///   tp::QKVCheckpointLayout().layout(tp::QKVLayout::kInterleavedGroups).fused_name("linear_qkv"));
  void load_weights(const Checkpoint& checkpoint, const std::string& prefix, const QKVCheckpointLayout& layout);

  /// The whole q, k and v weights (and biases) gathered from every rank's heads,
  /// replicated KV heads once, under the names load_weights reads with `layout`:
  /// `prefix + ".q_proj.weight"` etc. (kSeparate, the default) or one
  /// `prefix + "." + fused_name + ".weight"` ([Q|K|V] for kFused, per KV group for
  /// kInterleavedGroups). Every rank calls it (it
  /// all-gathers) and gets the same tensors. Unquantized layers only.
  /// Example: tp::save_safetensors(path, qkv->gather_weights("model.layers.0.self_attn"));
  /// This layer's LoRA adapters (tp/layers/lora/lora.h), cut by its own plan; registered as
  /// its child "lora" (so parameters() lists them) on the first call.
  LoRAImpl& lora();
  std::map<std::string, at::Tensor> gather_weights(const std::string& prefix,
                                                   const QKVCheckpointLayout& layout = {}) const;
  /// Which heads this rank owns.
  const HeadPlan& head_plan() const { return head_plan_; }
  /// Every rank's query heads and KV heads (global indices, in rank order; replicated KV
  /// heads appear under every rank that holds them).
  /// How the input enters (none: mirrored; all_gather over tokens: sequence_parallel) and
  /// what the output gets (none: this rank's columns; all_gather: gather_output), as the
  /// options spell them (tp/comm/reduction.h).
  const Reduction& input_reduction() const;
  const Reduction& output_reduction() const;
  std::vector<Range> q_head_ranges() const;
  std::vector<Range> kv_head_ranges() const;
  int64_t local_q_heads() const { return head_plan_.q_heads.size(); }
  int64_t local_kv_heads() const { return head_plan_.kv_heads.size(); }
  /// The split policy that makes a RowParallelLinear over num_heads * head_dim input
  /// features (the O projection) own exactly this rank's query heads, uneven GQA
  /// splits included: granularity head_dim, weights = every rank's query-head count.
  /// Example: RowParallelLinearOptions(q_size, hidden).split(qkv->attention_output_split())
  SplitPolicy attention_output_split() const;

  QKVParallelLinearOptions options;
  Communicator comm;
  at::Tensor weight;  // [local (q + 2 kv) * head_dim, hidden_size]
  at::Tensor bias;    // [local (q + 2 kv) * head_dim], or undefined

 private:
  HeadPlan head_plan_;
  std::shared_ptr<detail::ColumnCore> core_;
};

/// A ModuleHolder for QKVParallelLinearImpl.
TORCH_MODULE(QKVParallelLinear);

}  // namespace tp
