#pragma once
// DecoderConfig: the shape of a Llama / Qwen2 / Qwen3 decoder and the format of its
// linear layers, read from a Hugging Face folder's config.json.
//
// Interim: the model is built from this small struct until tp::ModelConfig (issue 14)
// lands; then DecoderConfig is filled from a ModelConfig instead of parsing the file
// itself. Fields are named as config.json names them; the rules for absent fields are
// those of docs/checkpoint_formats.md §2.

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "tp/quant/quant_config.h"

namespace tp {

/// Rotary position embedding parameters (transformers 5's `rope_parameters`, or 4's
/// top-level `rope_theta` + `rope_scaling`).
struct RopeParameters {
  /// "default" (plain RoPE) or "llama3" (Llama 3.1's frequency-dependent scaling).
  std::string type = "default";
  double theta = 10000.0;
  /// llama3 only: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings.
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
};

/// A decoder-only causal LM of the Llama family.
struct DecoderConfig {
  std::string model_type;  ///< "llama", "qwen2" or "qwen3"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  ///< absent: hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  bool qkv_bias = false;             ///< llama/qwen3: attention_bias; qwen2: always
  bool o_bias = false;               ///< llama/qwen3: attention_bias; qwen2: never
  bool mlp_bias = false;             ///< llama's mlp_bias
  bool qk_norm = false;              ///< qwen3: RMSNorm over each head of q and k, before RoPE
  bool tie_word_embeddings = false;  ///< the LM head is the embedding table
  double rms_norm_eps = 1e-6;
  RopeParameters rope;
  at::ScalarType dtype = at::kFloat;  ///< the checkpoint's dtype ("dtype" / "torch_dtype")
  /// The format of the decoder's linear layers (quantization_config); none when absent.
  QuantConfig quant;
  /// Linear layers left in the model dtype (modules_to_not_convert), by module name.
  std::vector<std::string> unquantized;

  /// The format of linear layer `module` ("model.layers.3.mlp.down_proj").
  QuantConfig quant_for(const std::string& module) const;

  /// Reads `folder`/config.json. Unknown architectures, activations, RoPE types,
  /// sliding-window attention and quantization methods this build cannot run are
  /// errors naming the field and the value.
  static DecoderConfig from_pretrained(const std::string& folder);
  /// The same from config.json's text; `what` names it in errors.
  static DecoderConfig from_json(const std::string& text, const std::string& what = "config.json");
};

}  // namespace tp
