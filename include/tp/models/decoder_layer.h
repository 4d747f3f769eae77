#pragma once
// DecoderLayer: one block of a decoder family over the tp layers. The Llama form,
//
//   h   = x + O(attention(RoPE(norm_q(Q)), RoPE(norm_k(K)), V))   Q, K, V = QKV(norm1(x))
//   out = h + down(act(gate) * up)                                gate, up = gate_up(norm2(h))
//
// (a mixture of experts in place of the MLP where the config says: MoEParallelMLP),
// and the variants the config selects (tp::ModelConfig): Gemma's sandwich norms
// (h = x + norm_post_attn(O(..)), out = h + norm_post_ff(down(..(norm_pre_ff(h))))), GPT-NeoX's
// ungated MLP (down(act(up(..)))) and parallel residual (out = x + O(..) + down(..(norm2(x))),
// the two partial sums added before one all-reduce), sliding-window attention, soft-capped
// attention scores, partial rotary.
//
// Split states: x, h and out are mirrored; Q/K/V by whole heads (QKVParallelLinear's
// plan, GQA and KV replication included), gate/up by intermediate columns; O and down
// give partial sums, all-reduced. norm_q / norm_k (Qwen3, Gemma 3) are per-head norms
// whose weight every rank applies to its own heads, so their gradient is summed over ranks.

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include <functional>

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include "tp/comm/communicator.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/gate_up_parallel_linear.h"
#include "tp/layers/moe/moe_parallel_mlp.h"
#include "tp/layers/qkv_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"
#include "tp/loader/checkpoint.h"
#include "tp/models/attention_dp.h"
#include "tp/models/kv_cache.h"
#include "tp/models/model_config.h"
#include "tp/models/norm.h"
#include "tp/quant/quant_method.h"

namespace tp {

/// The residual stream between decoder blocks, as one block hands it to the next: the
/// hidden state, and (when the block's last boundary was fused with it) the norm the next
/// block applies first, and that norm quantized per token for the next block's first GEMM.
/// A consumer given no `normed` normalizes `hidden` itself.
struct LayerStream {
  LayerStream() = default;
  explicit LayerStream(at::Tensor hidden_, at::Tensor normed_ = {}, at::Tensor codes_ = {}, at::Tensor scales_ = {})
      : hidden(std::move(hidden_)), normed(std::move(normed_)), codes(std::move(codes_)), scales(std::move(scales_)) {}
  at::Tensor hidden;  // [batch, seq, hidden], mirrored
  at::Tensor normed;  // next.norm(hidden), or undefined
  at::Tensor codes;   // normed quantized per token as next.quant says, or undefined
  at::Tensor scales;  // [batch, seq, 1] float32: normed ~= codes * scales
};

/// What follows a block: the norm its output goes through first (the next block's
/// input_layernorm, or the model's final norm; null: none to fuse) and the per-token
/// quantization the GEMM after that norm applies to its input (kNone: none).
struct NextNorm {
  Norm norm{nullptr};
  TokenQuant quant = TokenQuant::kNone;
};

/// The module of layer `index` of a decoder. Sizes, biases and every projection's
/// format come from `config` (tp::decoder_layer_options); weights are created in
/// `dtype` on `device`; with `init_weights` false, left uninitialized for a load to fill
/// (every layer's init_weights option).
class DecoderLayerImpl : public torch::nn::Cloneable<DecoderLayerImpl> {
 public:
  DecoderLayerImpl(ModelConfig config, int64_t index, at::ScalarType dtype, at::Device device, Communicator comm,
                   bool init_weights = true);
  /// Under attention data parallelism (tp/models/attention_dp.h): the attention over
  /// dp.attention, on its group's tokens; the MLP or experts over dp.world, on every group's.
  DecoderLayerImpl(ModelConfig config, int64_t index, at::ScalarType dtype, at::Device device, AttentionDataParallel dp,
                   bool init_weights = true);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// x: [batch, seq, hidden] (mirrored); cos, sin: [batch, seq, rotary_dim] for the
  /// tokens' positions. With a cache, the new keys and values are appended at
  /// cache->length (not advanced here) and attention reads every cached position;
  /// without one the sequence attends causally to itself.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, KVCache* cache = nullptr);
  /// The same on a stream: in.hidden is x, and in.normed / in.codes, when given, are
  /// input_layernorm(x) (quantized as input_quant(x) says) computed by the block before.
  /// Where the boundary is fused (fuse_boundary), the block's last collective also applies
  /// `next.norm` (and next.quant) to the output, so the stream returned carries them; Gemma's
  /// sandwich norms and the unfused path return the hidden state alone. CausalLM chains
  /// its blocks this way; equal to forward up to the dtype's rounding of the norms.
  LayerStream forward(const LayerStream& in, const NextNorm& next, const at::Tensor& cos, const at::Tensor& sin,
                      KVCache* cache = nullptr);
  /// The per-token quantization this block's first GEMM (qkv) gives an input like x, for
  /// the block before to hand over in its stream (QKVParallelLinear::input_quant).
  TokenQuant input_quant(const at::Tensor& x) const;

  /// The attention between QKV and O, as forward runs it: q, k, v are qkv's split
  /// pieces [batch, seq, local heads * head_dim] (the q/k norms, RoPE, the cache and
  /// GQA attention, sliding window and soft cap applied here) -> [batch, seq, local q heads * head_dim], O's input.
  /// (The Python DecoderLayer composes its children around it.)
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                       const at::Tensor& sin, KVCache* cache = nullptr);

  /// Loads prefix() + "." + every tensor of the block, this rank's shards only
  /// (a LoadSession's checkpoint records them for its unread-tensor report).
  void load_weights(const Checkpoint& checkpoint);
  /// Every tensor load_weights reads, whole (the shards all-gathered: every rank calls
  /// this), under the same names.
  std::map<std::string, at::Tensor> gather_weights() const;

  /// The MLP of the block on its (normed) input: down(act(gate) * up), or down(act(up))
  /// for an ungated MLP (a partial sum under the parallel residual: down does not reduce).
  /// Under attention data parallelism: over every rank, on every group's tokens (x is this
  /// group's), the result this group's, reduced.
  at::Tensor mlp(const at::Tensor& x);
  /// The same before the MLP's reduction, without down's bias (mlp_bias()): this rank's share.
  at::Tensor mlp_partial(const at::Tensor& x);
  /// The bias the MLP's reduction adds once (down_proj's), or undefined.
  at::Tensor mlp_bias() const;

  /// Whether forward ends each row layer (o_proj, down_proj, the MoE block) in one fused
  /// collective (Communicator::all_reduce_fusion: the reduction, the row layer's bias,
  /// the residual add and the next norm in one pass) when it can: without autograd
  /// recording (the fused collective has no backward), under the default numerics, in
  /// float32 / bfloat16 / float16. Otherwise, or when false, the unfused path (the
  /// results are equal up to the dtype's rounding). tp-bench turns it off to compare.
  bool fuse_boundary = true;

  /// "<names.layers>.{index}", e.g. "model.layers.3"
  std::string prefix() const;
  /// Whether q and k have per-head norms (Qwen3, Gemma 3).
  bool qk_norm() const { return config.qk_norm; }

  ModelConfig config;
  int64_t index;
  at::ScalarType dtype;
  at::Device device;
  Communicator comm;  // every rank: the MLP's (and, without attention data parallelism, the attention's)
  /// The attention's groups (AttentionDataParallel::none(comm) without them).
  AttentionDataParallel dp;
  bool init_weights = true;
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Norm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};  // Gemma only
  Norm q_norm{nullptr}, k_norm{nullptr};                                         // qk_norm only
  at::Tensor sinks;  // [local query heads]: this rank's heads' attention sinks (attention_sinks only)
  QKVParallelLinear qkv{nullptr};
  RowParallelLinear o_proj{nullptr};
  GateUpParallelLinear gate_up{nullptr};  // a gated MLP
  ColumnParallelLinear up_proj{nullptr};  // an ungated one (GPT-NeoX's dense_h_to_4h)
  RowParallelLinear down_proj{nullptr};
  MoEParallelMLP moe{nullptr};  // a mixture-of-experts layer's MLP (Mixtral, Qwen3-MoE), instead of the above
  /// Where moe's tensors live: its prefix and names.
  std::string moe_prefix() const;
  MoECheckpointLayout moe_layout() const;
  /// Invariant numerics: the GQA expansion of k and v to this rank's query heads, whose
  /// gradient is the canonical sum over each group's heads across ranks; empty otherwise
  /// (index_select, its gradient summed per rank).
  std::function<at::Tensor(const at::Tensor& kv)> expand_kv;

 private:
  // forward's boundaries after attention (`a`, O's input): each row layer's reduction
  // fused with its bias, the residual and the next norm (models/decoder_boundary.cpp), or
  // each a separate pass.
  LayerStream forward_fused(const at::Tensor& x, const at::Tensor& a, const NextNorm& next);
  at::Tensor forward_unfused(const at::Tensor& x, const at::Tensor& a);
  // The MLP over every rank on every attention group's tokens (attention data parallelism).
  at::Tensor mlp_over_groups(const at::Tensor& x);
  bool fuses(const at::Tensor& x) const;
  // The MLP's first GEMM's per-token quantization (none for MoE blocks), and its partial
  // sum from a boundary's stream (its codes when it has them).
  TokenQuant mlp_input_quant(const at::Tensor& x) const;
  at::Tensor mlp_partial_from(const LayerStream& in);
  // Sets expand_kv and the norms' canonical scale (invariant numerics).
  void use_invariant_heads();
};

/// A ModuleHolder for DecoderLayerImpl.
TORCH_MODULE(DecoderLayer);

}  // namespace tp
