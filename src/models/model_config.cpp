// ModelConfig: config.json -> sizes, biases, RoPE, dtype (docs/checkpoint_formats.md §2).
// The quantization_config half is in quantization_config.cpp.

#include "tp/models/model_config.h"

#include <c10/util/Exception.h>

#include <fstream>
#include <sstream>

#include "common/json_value.h"
#include "models/config_fields.h"

namespace tp {

const char* to_string(ModelType type) {
  switch (type) {
    case ModelType::kLlama: return "llama";
    case ModelType::kQwen2: return "qwen2";
    case ModelType::kQwen3: return "qwen3";
  }
  return "?";
}

const char* to_string(RopeType type) { return type == RopeType::kLlama3 ? "llama3" : "default"; }

namespace {

using detail::ConfigFields;
using detail::JsonValue;

at::ScalarType parse_dtype(const ConfigFields& f, const std::string& key) {
  const std::string name = f.string(key, "float32");
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  if (name == "float64") return at::kDouble;
  f.fail(key, "\"" + name + "\" is not a dtype tp reads; expected float32, bfloat16, float16 or float64");
}

// rope_type and its parameters from one object (transformers 5's rope_parameters, or
// 4.x's rope_scaling with the top-level rope_theta).
void parse_rope_object(const ConfigFields& rope, RopeParameters& out) {
  // Older files say "type" instead of "rope_type".
  const std::string key = rope.has("rope_type") ? "rope_type" : (rope.has("type") ? "type" : "rope_type");
  const std::string type = rope.string(key, "default");
  if (type == "default") {
    out.type = RopeType::kDefault;
  } else if (type == "llama3") {
    out.type = RopeType::kLlama3;
    out.factor = rope.required_double("factor");
    out.low_freq_factor = rope.required_double("low_freq_factor");
    out.high_freq_factor = rope.required_double("high_freq_factor");
    out.original_max_position_embeddings = rope.required_int("original_max_position_embeddings");
    if (!(out.factor > 0)) rope.fail("factor", "must be > 0");
    if (!(out.high_freq_factor > out.low_freq_factor))
      rope.fail("high_freq_factor", "must be greater than low_freq_factor");
    if (out.original_max_position_embeddings <= 0) rope.fail("original_max_position_embeddings", "must be > 0");
  } else {
    rope.fail(key, "\"" + type + "\" is not supported; tp reads the RoPE types default and llama3");
  }
}

void parse_rope(const ConfigFields& f, ModelConfig& c) {
  RopeParameters rope;
  if (f.has("rope_parameters")) {
    // transformers 5: one object; it holds rope_theta (a top-level one is a 4.x leftover).
    const auto p = f.object("rope_parameters");
    parse_rope_object(p, rope);
    rope.theta = p.has("rope_theta") ? p.required_double("rope_theta") : f.number("rope_theta", 10000.0);
  } else {
    // transformers 4.x: rope_theta at the top, rope_scaling null for plain RoPE.
    rope.theta = f.number("rope_theta", 10000.0);
    if (f.has("rope_scaling")) parse_rope_object(f.object("rope_scaling"), rope);
  }
  if (!(rope.theta > 0)) f.fail("rope_theta", "must be > 0");
  c.rope = rope;
}

ModelConfig parse_model(const JsonValue& root, const std::string& where, const JsonValue* quantize_config_json) {
  const ConfigFields f(root, where, "");
  ModelConfig c;
  c.source = where;
  const std::string type = f.required_string("model_type");
  if (type == "llama") {
    c.model_type = ModelType::kLlama;
  } else if (type == "qwen2") {
    c.model_type = ModelType::kQwen2;
  } else if (type == "qwen3") {
    c.model_type = ModelType::kQwen3;
  } else {
    f.fail("model_type", "\"" + type + "\" is not supported; tp reads llama, qwen2 and qwen3");
  }
  c.hidden_size = f.required_positive("hidden_size");
  c.intermediate_size = f.required_positive("intermediate_size");
  c.num_hidden_layers = f.required_positive("num_hidden_layers");
  c.num_attention_heads = f.required_positive("num_attention_heads");
  c.num_key_value_heads =
      f.has("num_key_value_heads") ? f.required_positive("num_key_value_heads") : c.num_attention_heads;
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.fail("num_key_value_heads", std::to_string(c.num_key_value_heads) +
                                      " does not divide num_attention_heads=" + std::to_string(c.num_attention_heads));
  c.vocab_size = f.required_positive("vocab_size");
  c.max_position_embeddings = f.has("max_position_embeddings") ? f.required_positive("max_position_embeddings")
                                                               : (c.model_type == ModelType::kLlama ? 2048 : 32768);
  // Qwen2 has no head_dim: it is always hidden / heads.
  if (f.has("head_dim") && c.model_type != ModelType::kQwen2) {
    c.head_dim = f.required_positive("head_dim");
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      f.fail("hidden_size", std::to_string(c.hidden_size) + " is not a multiple of num_attention_heads=" +
                                std::to_string(c.num_attention_heads) + " and the config has no head_dim");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  switch (c.model_type) {
    case ModelType::kLlama:
      c.qkv_bias = c.o_bias = f.boolean("attention_bias", false);
      c.mlp_bias = f.boolean("mlp_bias", false);
      if (f.integer("pretraining_tp", 1) < 1) f.fail("pretraining_tp", "must be >= 1");
      break;
    case ModelType::kQwen2:
      // The architecture fixes them: q/k/v biased, o and the MLP not.
      c.qkv_bias = true;
      c.o_bias = false;
      c.mlp_bias = false;
      break;
    case ModelType::kQwen3:
      c.qkv_bias = c.o_bias = f.boolean("attention_bias", false);
      c.mlp_bias = false;
      break;
  }
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  if (!(c.rms_norm_eps > 0)) f.fail("rms_norm_eps", "must be > 0");
  const std::string act = f.string("hidden_act", "silu");
  if (act != "silu") f.fail("hidden_act", "\"" + act + "\" is not supported; the Llama / Qwen MLP tp builds uses silu");
  if (c.model_type != ModelType::kLlama) {
    // Sliding-window attention is a different attention: refuse rather than compute full attention.
    if (f.boolean("use_sliding_window", false))
      f.fail("use_sliding_window", "true is not supported (tp builds full attention)");
    if (f.has("layer_types")) {
      const auto& types = f.array("layer_types");
      for (size_t i = 0; i < types.size(); ++i) {
        const auto& t = types[i].as_string(f.path("layer_types[" + std::to_string(i) + "]"));
        if (t != "full_attention")
          f.fail("layer_types[" + std::to_string(i) + "]",
                 "= \"" + t + "\" is not supported (tp builds full_attention)");
      }
    }
  }
  parse_rope(f, c);
  // transformers 5 writes dtype, 4.x torch_dtype.
  c.dtype = parse_dtype(f, f.has("dtype") ? "dtype" : "torch_dtype");
  if (f.has("quantization_config")) {
    c.quantization = detail::QuantizationParser::parse(f.object("quantization_config"));
  } else if (quantize_config_json != nullptr) {
    // AutoGPTQ-era folders may carry the config only in quantize_config.json.
    const std::string qwhere =
        where.substr(0, where.size() - std::string("config.json").size()) + "quantize_config.json";
    c.quantization = detail::QuantizationParser::parse(ConfigFields(*quantize_config_json, qwhere, ""));
  }
  return c;
}

std::string read_file(const std::string& path, bool required) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    TORCH_CHECK_VALUE(!required, "ModelConfig: cannot open '", path,
                      "': a Hugging Face checkpoint folder has a config.json beside its safetensors files");
    return {};
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

JsonValue parse_json(const std::string& text, const std::string& where) {
  try {
    return JsonValue::parse(text, where.c_str());
  } catch (const detail::FormatError& e) {
    C10_THROW_ERROR(ValueError, c10::str("ModelConfig: ", e.what()));
  }
}

}  // namespace

ModelConfig ModelConfig::from_json(const std::string& text, const std::string& where) {
  const JsonValue root = parse_json(text, where);
  try {
    return parse_model(root, where, nullptr);
  } catch (const detail::FormatError& e) {
    C10_THROW_ERROR(ValueError, c10::str("ModelConfig: ", e.what()));
  }
}

ModelConfig ModelConfig::from_pretrained(const std::string& folder) {
  std::string dir = folder;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string where = dir + "/config.json";
  const JsonValue root = parse_json(read_file(where, true), where);
  const std::string qtext = read_file(dir + "/quantize_config.json", false);
  JsonValue qroot;
  const bool has_q = !qtext.empty();
  if (has_q) qroot = parse_json(qtext, dir + "/quantize_config.json");
  try {
    return parse_model(root, where, has_q ? &qroot : nullptr);
  } catch (const detail::FormatError& e) {
    C10_THROW_ERROR(ValueError, c10::str("ModelConfig: ", e.what()));
  }
}

}  // namespace tp
