#include "tp/models/layer_options.h"

#include <c10/util/Exception.h>

#include "tp/models/model_split.h"
#include "tp/quant/quant_method.h"

#include <vector>

namespace tp {

namespace {

// One format for the checkpoint modules a fused layer reads: its parts when they are
// separate tensors, or the one fused tensor.
QuantConfig fused_quant(const ModelConfig& config, const std::string& prefix, const std::vector<std::string>& parts,
                        const char* layer) {
  const QuantConfig first = config.quant_config(prefix + "." + parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    const QuantConfig other = config.quant_config(prefix + "." + parts[i]);
    TORCH_CHECK_VALUE(other == first, "decoder_layer_options: ", config.source, " stores '", prefix, ".", parts[0],
                      "' as ", to_string(first), " but '", prefix, ".", parts[i], "' as ", to_string(other), "; ",
                      layer, " reads them into one fused weight of one format (", config.quantization.describe(), ")");
  }
  return first;
}

std::vector<std::string> qkv_parts(const QKVCheckpointLayout& l) {
  if (l.layout() == QKVLayout::kSeparate) return {l.q_name(), l.k_name(), l.v_name()};
  return {l.fused_name()};
}

std::vector<std::string> gate_up_parts(const GateUpCheckpointLayout& l) {
  if (l.layout() == GateUpLayout::kSeparate) return {l.gate_name(), l.up_name()};
  return {l.fused_name()};
}

// The experts' format: one for every expert's gate, up and down (a checkpoint that
// quantizes them differently is refused, naming the first that differs), and a router
// stored unquantized.
QuantConfig moe_quant(const ModelConfig& c, const std::string& block) {
  const auto& layout = c.names.moe_layout;
  const std::string router = block + "." + layout.router_name();
  TORCH_CHECK_VALUE(c.quant_config(router).format == QuantFormat::kNone, block, ": the router '", router,
                    "' is quantized (", to_string(c.quant_config(router)),
                    ") by the checkpoint's quantization_config; tp reads an unquantized router (",
                    c.quantization.describe(), ")");
  if (layout.experts() == ExpertLayout::kFused) return c.quant_config(block + ".experts");
  const auto names = [&](int64_t e) {
    const std::string p = block + ".experts." + std::to_string(e) + ".";
    return std::vector<std::string>{p + layout.gate_name(), p + layout.up_name(), p + layout.down_name()};
  };
  const std::string first = names(0).front();
  const QuantConfig quant = c.quant_config(first);
  for (int64_t e = 0; e < c.moe.num_experts; ++e) {
    for (const auto& name : names(e)) {
      const QuantConfig q = c.quant_config(name);
      TORCH_CHECK_VALUE(q == quant, block, ": the checkpoint's quantization_config gives '", name, "' ", to_string(q),
                        " but '", first, "' ", to_string(quant),
                        "; tp needs one format for every expert's projections (", c.quantization.describe(), ")");
    }
  }
  return quant;
}

// The shared expert's format (gate, up and down alike).
QuantConfig shared_expert_quant(const ModelConfig& c, const std::string& block) {
  if (c.moe.shared_expert_intermediate_size == 0) return {};
  const std::string p = block + "." + c.names.moe_layout.shared_expert_name() + ".";
  const QuantConfig quant = c.quant_config(p + "gate_proj");
  for (const char* name : {"up_proj", "down_proj"}) {
    TORCH_CHECK_VALUE(c.quant_config(p + name) == quant, block, ": the shared expert's ", name, " is ",
                      to_string(c.quant_config(p + name)), " but its gate_proj ", to_string(quant),
                      "; tp needs one format for the shared expert's projections");
  }
  const std::string gate = block + "." + c.names.moe_layout.shared_expert_gate_name();
  TORCH_CHECK_VALUE(!c.moe.shared_expert_gate || c.quant_config(gate).format == QuantFormat::kNone, block,
                    ": the shared expert's gate '", gate, "' is quantized; tp reads it unquantized");
  return quant;
}

}  // namespace

RowParallelLinearOptions DecoderLayerOptions::o_proj(const QKVParallelLinearImpl& qkv) const {
  TORCH_CHECK_VALUE(qkv.options.num_heads() * qkv.options.head_dim() == o.in_features(),
                    "DecoderLayerOptions::o_proj: the QKV layer has ", qkv.options.num_heads(), " heads of ",
                    qkv.options.head_dim(), "; layer ", layer, "'s o_proj reads ", o.in_features(), " features");
  auto options = o;
  options.split(qkv.attention_output_split());
  return options;
}

DecoderLayerOptions decoder_layer_options(const ModelConfig& config, int64_t layer, at::ScalarType dtype,
                                          at::Device device) {
  TORCH_CHECK_VALUE(layer >= 0 && layer < config.num_hidden_layers, "decoder_layer_options: layer ", layer,
                    " is out of range (", config.source, " has num_hidden_layers=", config.num_hidden_layers, ")");
  DecoderLayerOptions out;
  out.layer = layer;
  const auto& n = config.names;
  const std::string prefix = config.layer_prefix(layer);
  out.qkv_prefix = prefix + "." + n.attention;
  out.o_prefix = out.qkv_prefix + "." + n.o_proj;
  out.gate_up_prefix = prefix + "." + n.mlp;
  out.up_prefix = out.gate_up_prefix + "." + n.up_proj;
  out.down_prefix = out.gate_up_prefix + "." + n.down_proj;
  const bool reduce = !config.parallel_residual;

  out.qkv = QKVParallelLinearOptions(config.hidden_size, config.head_dim, config.num_attention_heads,
                                     config.num_key_value_heads)
                .bias(config.qkv_bias)
                .quant(fused_quant(config, out.qkv_prefix, qkv_parts(n.qkv), "QKVParallelLinear"))
                .dtype(dtype)
                .numerics(config.numerics)
                .device(device);
  out.o = RowParallelLinearOptions(config.q_size(), config.hidden_size)
              .bias(config.o_bias)
              .reduce_output(reduce)
              .quant(config.quant_config(out.o_prefix))
              .dtype(dtype)
              .numerics(config.numerics)
              .device(device);
  out.gate_up = GateUpParallelLinearOptions(config.hidden_size, config.intermediate_size)
                    .bias(config.mlp_bias)
                    .quant(fused_quant(config, out.gate_up_prefix, gate_up_parts(n.gate_up), "GateUpParallelLinear"))
                    .dtype(dtype)
                    .numerics(config.numerics)
                    .device(device);
  out.up = ColumnParallelLinearOptions(config.hidden_size, config.intermediate_size)
               .bias(config.mlp_bias)
               .quant(config.quant_config(out.up_prefix))
               .dtype(dtype)
               .numerics(config.numerics)
               .device(device);
  out.down = RowParallelLinearOptions(config.intermediate_size, config.hidden_size)
                 .bias(config.mlp_bias)
                 .reduce_output(reduce)
                 .quant(config.quant_config(out.down_prefix))
                 .dtype(dtype)
                 .numerics(config.numerics)
                 .device(device);
  out.qkv.split(model_split_policy(config, layer, SplitKind::kAttention));
  // O's cut follows the query heads: they are cut on its quant groups too, where whole runs
  // of KV groups allow it (else as before: the heads alone, and O refuses a cut off its groups).
  const int64_t o_groups = tp_alignment(out.o.quant(), ShardMode::kRow);
  const int64_t q_group = config.num_attention_heads / config.num_key_value_heads * config.head_dim;
  if (config.num_key_value_heads % (combine_granularity(q_group, o_groups) / q_group) == 0)
    out.qkv.query_granularity(o_groups);
  // The MLP's column layer and down (row) must cut the intermediate dimension alike: one
  // granularity that satisfies both formats' alignments.
  const QuantConfig& column = config.gated_mlp ? out.gate_up.quant() : out.up.quant();
  const auto mlp = model_split_policy(config, layer, SplitKind::kMlp)
                       .with_granularity(combine_granularity(tp_alignment(column, ShardMode::kColumn),
                                                             tp_alignment(out.down.quant(), ShardMode::kRow)));
  out.gate_up.split(mlp);
  out.up.split(mlp);
  out.down.split(mlp);
  return out;
}

MoEParallelMLPOptions moe_layer_options(const ModelConfig& c, int64_t layer, at::ScalarType dtype, at::Device device) {
  TORCH_CHECK_VALUE(c.is_moe(layer), "moe_layer_options: layer ", layer, " of ", c.source,
                    " is not a mixture of experts");
  const auto& m = c.moe;
  const std::string block = c.layer_prefix(layer) + "." + c.names.moe;
  return MoEParallelMLPOptions(c.hidden_size, m.intermediate_size, m.num_experts, m.top_k)
      .router(m.router)
      .expert_parallel_size(m.expert_parallel_size)
      .split_weights(c.split_weights)
      .split_rotation(model_split_policy(c, layer, SplitKind::kMlp).rotation)
      .quant(moe_quant(c, block))
      .activation(m.activation.empty() ? to_string(c.hidden_act) : m.activation)
      .swiglu_alpha(m.swiglu_alpha)
      .swiglu_limit(m.swiglu_limit)
      .expert_bias(m.expert_bias)
      .shared_expert_intermediate_size(m.shared_expert_intermediate_size)
      .shared_expert_gate(m.shared_expert_gate)
      .shared_expert_quant(shared_expert_quant(c, block))
      .dtype(dtype)
      .device(device);
}

DecoderLayerOptions decoder_layer_options(const ModelConfig& config, int64_t layer) {
  return decoder_layer_options(config, layer, config.dtype);
}

}  // namespace tp
