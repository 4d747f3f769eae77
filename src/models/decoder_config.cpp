#include "tp/models/decoder_config.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "common/json_reader.h"
#include "models/json_value.h"

namespace tp {
namespace {

using detail::JsonValue;

// Field access with the file and the field in every message.
struct Fields {
  const JsonValue& obj;
  std::string what;  // "config.json" or "config.json: rope_parameters"

  const JsonValue* get(const char* key) const {
    const JsonValue* v = obj.find(key);
    return v && !v->is_null() ? v : nullptr;
  }
  double number(const char* key) const {
    const JsonValue* v = get(key);
    TORCH_CHECK_VALUE(v, what, ": the field '", key, "' is missing");
    TORCH_CHECK_VALUE(v->kind == JsonValue::Kind::kNumber, what, ": '", key, "' must be a number");
    return v->number;
  }
  double number_or(const char* key, double fallback) const { return get(key) ? number(key) : fallback; }
  int64_t integer(const char* key) const {
    const double v = number(key);
    TORCH_CHECK_VALUE(v == std::floor(v) && std::abs(v) < 9.0e15, what, ": '", key, "' must be an integer; got ",
                      get(key)->text);
    return static_cast<int64_t>(v);
  }
  int64_t integer_or(const char* key, int64_t fallback) const { return get(key) ? integer(key) : fallback; }
  bool boolean_or(const char* key, bool fallback) const {
    const JsonValue* v = get(key);
    if (!v) return fallback;
    TORCH_CHECK_VALUE(v->kind == JsonValue::Kind::kBool, what, ": '", key, "' must be true or false");
    return v->boolean;
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    const JsonValue* v = get(key);
    if (!v) return fallback;
    TORCH_CHECK_VALUE(v->kind == JsonValue::Kind::kString, what, ": '", key, "' must be a string");
    return v->text;
  }
};

at::ScalarType parse_dtype(const std::string& name, const std::string& what) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  if (name == "float64") return at::kDouble;
  TORCH_CHECK_VALUE(false, what, ": dtype '", name, "' is not one of float32, bfloat16, float16, float64");
}

RopeParameters parse_rope(const Fields& top) {
  RopeParameters rope;
  // transformers 5: one object holding everything; 4: rope_theta + rope_scaling (null: plain).
  const JsonValue* params = top.get("rope_parameters");
  const JsonValue* scaling = top.get("rope_scaling");
  TORCH_CHECK_VALUE(!params || params->kind == JsonValue::Kind::kObject, top.what,
                    ": 'rope_parameters' must be an object");
  TORCH_CHECK_VALUE(!scaling || scaling->kind == JsonValue::Kind::kObject, top.what,
                    ": 'rope_scaling' must be an object or null");
  const JsonValue empty{};
  const Fields p{params ? *params : scaling ? *scaling : empty,
                 top.what + (params ? ": rope_parameters" : scaling ? ": rope_scaling" : "")};
  rope.theta = params ? p.number("rope_theta") : top.number_or("rope_theta", 10000.0);
  rope.type = p.string_or("rope_type", p.string_or("type", "default"));
  if (rope.type == "default") return rope;
  TORCH_CHECK_VALUE(rope.type == "llama3", p.what, ": rope_type '", rope.type,
                    "' is not supported (supported: default, llama3)");
  rope.factor = p.number("factor");
  rope.low_freq_factor = p.number("low_freq_factor");
  rope.high_freq_factor = p.number("high_freq_factor");
  rope.original_max_position_embeddings = p.integer("original_max_position_embeddings");
  TORCH_CHECK_VALUE(rope.high_freq_factor != rope.low_freq_factor, p.what,
                    ": llama3 needs high_freq_factor != low_freq_factor; both are ", rope.low_freq_factor);
  return rope;
}

// quantization_config -> the decoder's QuantConfig (interim: the formats tp's layers
// read today; tp::ModelConfig takes this over, with compressed-tensors and GPTQ v2).
void parse_quantization(const Fields& top, DecoderConfig& c) {
  const JsonValue* q = top.get("quantization_config");
  if (!q) return;
  const Fields f{*q, top.what + ": quantization_config"};
  const std::string method = f.string_or("quant_method", "");
  auto not_converted = [&](const char* key) {
    if (const JsonValue* list = f.get(key)) {
      TORCH_CHECK_VALUE(list->kind == JsonValue::Kind::kArray, f.what, ": '", key, "' must be a list");
      for (const auto& item : list->items) c.unquantized.push_back(item.text);
    }
  };
  if (method == "fp8") {
    const JsonValue* block = f.get("weight_block_size");
    TORCH_CHECK_VALUE(block && block->items.size() == 2 && block->items[0].number == 128 &&
                          block->items[1].number == 128,
                      f.what, ": HF FP8 is supported with weight_block_size [128, 128] (tp's fp8_block)");
    TORCH_CHECK_VALUE(f.string_or("activation_scheme", "dynamic") == "dynamic", f.what,
                      ": activation_scheme '", f.string_or("activation_scheme", ""), "' (supported: dynamic)");
    c.quant = QuantConfig{QuantFormat::kFp8Block};
    not_converted("modules_to_not_convert");
  } else if (method == "gptq") {
    TORCH_CHECK_VALUE(f.integer_or("bits", 4) == 4, f.what, ": bits ", f.integer_or("bits", 4), " (supported: 4)");
    TORCH_CHECK_VALUE(!f.boolean_or("desc_act", false), f.what,
                      ": desc_act true (act-order) is not supported: its groups are not contiguous");
    const std::string format = f.string_or("checkpoint_format", "gptq");
    TORCH_CHECK_VALUE(format == "gptq", f.what, ": checkpoint_format '", format,
                      "' is not read yet (v1 'gptq' is; v2 comes with tp::ModelConfig)");
    const int64_t group = f.integer_or("group_size", 128);
    c.quant = QuantConfig{QuantFormat::kInt4Gptq, group, f.boolean_or("sym", true)};
  } else if (method == "awq") {
    TORCH_CHECK_VALUE(f.string_or("version", "gemm") == "gemm", f.what, ": AWQ version '", f.string_or("version", ""),
                      "' (supported: gemm)");
    c.quant = QuantConfig{QuantFormat::kInt4Awq, f.integer_or("group_size", 128), /*symmetric=*/false};
    not_converted("modules_to_not_convert");
  } else {
    TORCH_CHECK_VALUE(false, f.what, ": quant_method '", method,
                      "' is not read by this build's DecoderConfig (fp8, gptq v1, awq gemm; compressed-tensors comes "
                      "with tp::ModelConfig)");
  }
}

}  // namespace

QuantConfig DecoderConfig::quant_for(const std::string& module) const {
  if (module == "lm_head" || module.find("embed_tokens") != std::string::npos) return {};
  for (const auto& name : unquantized) {
    if (module == name || module.find(name) != std::string::npos) return {};
  }
  return quant;
}

DecoderConfig DecoderConfig::from_json(const std::string& text, const std::string& what) {
  detail::JsonValue root;
  try {
    root = detail::parse_json(text, what.c_str());
  } catch (const detail::FormatError& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
  TORCH_CHECK_VALUE(root.kind == JsonValue::Kind::kObject, what, ": expected a JSON object");
  const Fields f{root, what};
  DecoderConfig c;
  c.model_type = f.string_or("model_type", "");
  TORCH_CHECK_VALUE(c.model_type == "llama" || c.model_type == "qwen2" || c.model_type == "qwen3", what,
                    ": model_type '", c.model_type, "' is not supported (llama, qwen2, qwen3)");
  c.hidden_size = f.integer("hidden_size");
  c.intermediate_size = f.integer("intermediate_size");
  c.num_hidden_layers = f.integer("num_hidden_layers");
  c.num_attention_heads = f.integer("num_attention_heads");
  c.num_key_value_heads = f.integer_or("num_key_value_heads", c.num_attention_heads);
  TORCH_CHECK_VALUE(c.num_attention_heads > 0 && c.hidden_size > 0, what,
                    ": hidden_size and num_attention_heads must be positive");
  c.head_dim = f.integer_or("head_dim", c.hidden_size / c.num_attention_heads);
  c.vocab_size = f.integer("vocab_size");
  c.max_position_embeddings = f.integer_or("max_position_embeddings", 0);
  c.rms_norm_eps = f.number("rms_norm_eps");
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", false);
  const bool attention_bias = f.boolean_or("attention_bias", false);
  if (c.model_type == "qwen2") {
    c.qkv_bias = true;  // Qwen2's q, k, v always have a bias, o never (no config field)
    c.o_bias = false;
  } else {
    c.qkv_bias = c.o_bias = attention_bias;
  }
  c.mlp_bias = c.model_type == "llama" && f.boolean_or("mlp_bias", false);
  c.qk_norm = c.model_type == "qwen3";
  c.rope = parse_rope(f);
  c.dtype = parse_dtype(f.string_or("dtype", f.string_or("torch_dtype", "float32")), what);
  const std::string act = f.string_or("hidden_act", "silu");
  TORCH_CHECK_VALUE(act == "silu", what, ": hidden_act '", act, "' is not supported (silu)");
  TORCH_CHECK_VALUE(!f.boolean_or("use_sliding_window", false), what,
                    ": use_sliding_window true is a different attention (not supported)");
  parse_quantization(f, c);
  return c;
}

DecoderConfig DecoderConfig::from_pretrained(const std::string& folder) {
  const std::string path = folder + "/config.json";
  std::ifstream in(path);
  TORCH_CHECK_VALUE(static_cast<bool>(in), "DecoderConfig: cannot open ", path);
  std::ostringstream text;
  text << in.rdbuf();
  return from_json(text.str(), path);
}

}  // namespace tp
