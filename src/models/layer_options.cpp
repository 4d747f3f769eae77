#include "tp/models/layer_options.h"

#include <c10/util/Exception.h>

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
  return out;
}

DecoderLayerOptions decoder_layer_options(const ModelConfig& config, int64_t layer) {
  return decoder_layer_options(config, layer, config.dtype);
}

}  // namespace tp
