#pragma once
// ModelConfig: what a Hugging Face checkpoint folder says about itself in config.json
// (docs/checkpoint_formats.md): the decoder's sizes, biases, RoPE parameters, dtype,
// and its quantization_config turned into a QuantConfig per linear layer.

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "tp/quant/quant_config.h"

namespace tp {

namespace detail {
struct QuantizationParser;
}

/// The decoder families tp reads (config.json's model_type).
enum class ModelType { kLlama, kQwen2, kQwen3 };
/// "llama", "qwen2", "qwen3".
const char* to_string(ModelType type);

/// The RoPE variants tp reads (rope_type).
enum class RopeType {
  kDefault,  ///< inv_freq[i] = theta^(-2i / head_dim)
  kLlama3,   ///< Llama 3.1's frequency-band scaling (factor, low/high_freq_factor, original max positions)
};
/// "default", "llama3".
const char* to_string(RopeType type);

/// Rotary position embedding parameters, from transformers 5's `rope_parameters` or
/// transformers 4's top-level `rope_theta` + `rope_scaling` (either spelling).
struct RopeParameters {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  /// kLlama3 only (read from the config, every one of them required there).
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
};

/// Which linear layers of a checkpoint are quantized, and how: config.json's
/// quantization_config, read once. Supported: compressed-tensors (config_groups of
/// float-quantized FP8 per tensor / channel / 128x128 block, int-quantized W8A8 and
/// W8A16, pack-quantized W4A16 sym / asym; `ignore`), GPTQ (4 bits, group 32/64/128,
/// sym or asym, checkpoint_format gptq = v1 or gptq_v2 = v2; desc_act refused), AWQ
/// GEMM (zero_point) and HF fine-grained FP8 (weight_block_size [128, 128], dynamic
/// activations). Anything else is an error naming the field and its value.
class CheckpointQuantization {
 public:
  /// An unquantized checkpoint.
  CheckpointQuantization() = default;

  /// quantization_config's quant_method ("compressed-tensors", "gptq", "awq", "fp8"),
  /// or "none".
  const std::string& method() const { return method_; }
  bool quantized() const { return method_ != "none"; }

  /// The format of the linear layer `module` (its checkpoint name without ".weight",
  /// e.g. "model.layers.0.mlp.down_proj"); QuantConfig{} (kNone) for a layer stored
  /// unquantized. A layer that two compressed-tensors groups claim is an error.
  QuantConfig for_module(const std::string& module) const;

  /// One line per rule, for messages and repr: "gptq: int4_gptq:g128:sym:v2 for every
  /// decoder linear; lm_head unquantized".
  std::string describe() const;

  // How a name is matched, and the rules read from the config.
  enum class Match {
    kExact,         ///< the module name itself
    kRegex,         ///< compressed-tensors "re:<regex>": Python's re.match (anchored at the start)
    kLinear,        ///< compressed-tensors "Linear": every linear layer
    kTransformers,  ///< transformers' modules_to_not_convert: prefix up to a '.' (regex allowed) or suffix
    kSubstring,     ///< AutoAWQ's modules_to_not_convert: any substring
    kLmHead,        ///< the name "lm_head"
  };
  struct Pattern {
    Match match = Match::kExact;
    std::string text;
    bool matches(const std::string& module) const;
  };
  struct Rule {
    std::string name;  // "group_0", or the method
    std::vector<Pattern> targets;
    QuantConfig config;
  };

 private:
  friend struct detail::QuantizationParser;
  std::string method_ = "none";
  std::vector<Rule> rules_;      // a module takes the config of the rule whose targets match it
  std::vector<Pattern> ignore_;  // modules left unquantized whatever the rules say
};

/// config.json of a Llama / Qwen2 / Qwen3 checkpoint.
/// Example:
///   auto config = tp::ModelConfig::from_pretrained("/models/Qwen3-8B");
///   auto opts = tp::decoder_layer_options(config, 0);   // tp/models/layer_options.h
struct ModelConfig {
  /// Reads `folder`/config.json (and, for GPTQ checkpoints whose config.json has no
  /// quantization_config, `folder`/quantize_config.json).
  static ModelConfig from_pretrained(const std::string& folder);
  /// Parses config.json's text; `where` names it in errors.
  static ModelConfig from_json(const std::string& text, const std::string& where = "config.json");

  ModelType model_type = ModelType::kLlama;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  /// num_key_value_heads (absent: num_attention_heads).
  int64_t num_key_value_heads = 0;
  /// head_dim (absent, and always for Qwen2: hidden_size / num_attention_heads).
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  /// Biases of q/k/v (Llama and Qwen3: attention_bias; Qwen2: always).
  bool qkv_bias = false;
  /// Bias of o_proj (Llama and Qwen3: attention_bias; Qwen2: never).
  bool o_bias = false;
  /// Biases of gate/up/down (Llama: mlp_bias; Qwen: never).
  bool mlp_bias = false;
  /// The LM head is model.embed_tokens.weight (no lm_head.weight in the files).
  bool tie_word_embeddings = false;
  double rms_norm_eps = 1e-6;
  RopeParameters rope;
  /// dtype (transformers 5) or torch_dtype (4.x) the tensors were saved in (absent: float32).
  at::ScalarType dtype = at::kFloat;
  /// quantization_config (absent: unquantized).
  CheckpointQuantization quantization;
  /// Where it was read from ("/models/x/config.json"), for messages.
  std::string source;

  /// Query width num_attention_heads * head_dim (q_proj's out_features, o_proj's in_features).
  int64_t q_size() const { return num_attention_heads * head_dim; }
  /// Key / value width num_key_value_heads * head_dim.
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
  /// The format of a linear layer, by checkpoint name (quantization.for_module).
  QuantConfig quant_config(const std::string& module) const { return quantization.for_module(module); }
};

}  // namespace tp
