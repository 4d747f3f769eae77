#pragma once
// The options of a decoder layer's four tensor-parallel projections, from a
// ModelConfig: sizes, bias flags and each projection's quant format, with the
// checkpoint prefix each loads from.

#include <cstdint>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/gate_up_parallel_linear.h"
#include "tp/layers/moe/moe_parallel_mlp.h"
#include "tp/layers/qkv_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"
#include "tp/models/model_config.h"

namespace tp {

/// Layer `layer`'s projections, as the checkpoint stores them (Llama's names; each
/// family's are in config.names, the fused layouts in names.qkv / names.gate_up):
///   qkv      QKVParallelLinear from  "<prefix>.self_attn" (q_proj, k_proj, v_proj)
///   o        RowParallelLinear from  "<prefix>.self_attn.o_proj"
///   gate_up  GateUpParallelLinear from "<prefix>.mlp" (gate_proj, up_proj), a gated MLP
///   up       ColumnParallelLinear from "<prefix>.mlp.<names.up_proj>", an ungated one
///   down     RowParallelLinear from  "<prefix>.mlp.down_proj"
/// with prefix = "model.layers.<layer>". Under the parallel residual (GPT-NeoX) o and down
/// do not reduce: the block adds their partial sums and reduces once.
/// Example:
///   auto opts = tp::decoder_layer_options(config, i, at::kBFloat16);
///   tp::QKVParallelLinear qkv(opts.qkv, comm);
///   tp::RowParallelLinear o(opts.o_proj(*qkv), comm);      // O owns exactly qkv's query heads
///   qkv->load_weights(ckpt, opts.qkv_prefix);
///   o->load_weights(ckpt, opts.o_prefix);
struct DecoderLayerOptions {
  int64_t layer = 0;
  std::string qkv_prefix, o_prefix, gate_up_prefix, up_prefix, down_prefix;
  QKVParallelLinearOptions qkv{1, 1, 1, 1};
  /// Without the attention split: build O with o_proj(qkv), which sets it. (A split of
  /// O's in_features that differs from qkv's query heads is wrong whenever the heads
  /// do not divide evenly: Llama's 4 KV groups at TP 3 give q heads 6, 3, 3.)
  RowParallelLinearOptions o{1, 1};
  GateUpParallelLinearOptions gate_up{1, 1};
  ColumnParallelLinearOptions up{1, 1};
  RowParallelLinearOptions down{1, 1};

  /// `o` with the split that gives it exactly `qkv`'s query heads on every rank.
  RowParallelLinearOptions o_proj(const QKVParallelLinearImpl& qkv) const;
};

/// The options of layer `layer` in `dtype` on `device`: sizes, biases
/// (qkv: config.qkv_bias, o: o_bias, gate_up / down: mlp_bias) and quant formats
/// (config.quant_config of each checkpoint module; q/k/v, and gate/up, share one
/// layer, so they must share one format: a checkpoint that quantizes them
/// differently is an error naming both).
DecoderLayerOptions decoder_layer_options(const ModelConfig& config, int64_t layer, at::ScalarType dtype,
                                          at::Device device = at::kCPU);
/// The same in the checkpoint's dtype (config.dtype).
DecoderLayerOptions decoder_layer_options(const ModelConfig& config, int64_t layer);

/// A mixture-of-experts layer's MoEParallelMLP options (config.is_moe(layer)): sizes,
/// router, activation, expert_parallel_size, split_weights, and one format for every
/// expert's projections and one for the shared expert's (a checkpoint that quantizes
/// them differently, or quantizes the router, is an error naming both tensors).
MoEParallelMLPOptions moe_layer_options(const ModelConfig& config, int64_t layer, at::ScalarType dtype,
                                        at::Device device = at::kCPU);

}  // namespace tp
