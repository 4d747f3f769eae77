// ModelConfig: config.json -> sizes, biases, RoPE, dtype (docs/checkpoint_formats.md §2).
// The quantization_config half is in quantization_config.cpp.

#include "tp/models/model_config.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "common/json_value.h"
#include "models/config_fields.h"

namespace tp {

const char* to_string(RopeType type) {
  switch (type) {
    case RopeType::kDefault: return "default";
    case RopeType::kLlama3: return "llama3";
    case RopeType::kLinear: return "linear";
    case RopeType::kLongRope: return "longrope";
    case RopeType::kYarn: return "yarn";
  }
  return "?";
}

const char* to_string(NormKind kind) {
  switch (kind) {
    case NormKind::kRMS: return "rms";
    case NormKind::kRMSUnitOffset: return "rms_unit_offset";
    case NormKind::kRMSScaleFirst: return "rms_scale_first";
    case NormKind::kLayerNorm: return "layer_norm";
  }
  return "?";
}

const char* to_string(Activation act) {
  switch (act) {
    case Activation::kSilu: return "silu";
    case Activation::kGelu: return "gelu";
    case Activation::kGeluTanh: return "gelu_tanh";
    case Activation::kGeluNew: return "gelu_new";
    case Activation::kGeluFast: return "gelu_fast";
  }
  return "?";
}

namespace {

using detail::ConfigFields;
using detail::JsonValue;

at::ScalarType parse_dtype(const ConfigFields& f, const std::string& key) {
  const std::string name = f.string(key, "float32");
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  if (name == "float64") return at::kDouble;
  f.fail(key, "is not a dtype tp reads; expected float32, bfloat16, float16 or float64");
}

ModelType parse_model_type(const ConfigFields& f) {
  const std::string type = f.required_string("model_type");
  if (const auto* family = detail::find_family(type)) return family->type;
  if (type == "gemma3" || f.has("vision_config"))
    f.fail(f.has("vision_config") ? "vision_config" : "model_type",
           "is a multimodal folder (a vision tower beside the language model): tp reads text decoders only; "
           "Gemma 3's text model is model_type gemma3_text");
  std::string known;
  for (const auto& family : model_families()) known += std::string(known.empty() ? "" : ", ") + family.model_type;
  f.fail("model_type", "is not supported; tp reads " + known);
}

ModelConfig parse_model(const JsonValue& root, const std::string& where, const JsonValue* quantize_config_json) {
  const ConfigFields f(root, where, "");
  ModelConfig c;
  c.source = where;
  c.model_type = parse_model_type(f);
  c.hidden_size = f.required_positive("hidden_size");
  c.intermediate_size = f.required_positive("intermediate_size");
  c.num_hidden_layers = f.required_positive("num_hidden_layers");
  c.num_attention_heads = f.required_positive("num_attention_heads");
  c.num_key_value_heads =
      f.has("num_key_value_heads") ? f.required_positive("num_key_value_heads") : c.num_attention_heads;
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.fail("num_key_value_heads", "does not divide num_attention_heads=" + std::to_string(c.num_attention_heads));
  c.vocab_size = f.required_positive("vocab_size");
  c.max_position_embeddings = f.has("max_position_embeddings") ? f.required_positive("max_position_embeddings")
                                                               : (c.model_type == ModelType::kLlama ? 2048 : 32768);
  // Qwen2 and GPT-NeoX have no head_dim: it is always hidden / heads.
  if (f.has("head_dim") && c.model_type != ModelType::kQwen2 && c.model_type != ModelType::kGptNeoX) {
    c.head_dim = f.required_positive("head_dim");
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      f.fail("hidden_size", "is not a multiple of num_attention_heads=" + std::to_string(c.num_attention_heads) +
                                " and the config has no head_dim");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  // The family: its names, layouts, norms, activation, residual form, attention and RoPE.
  detail::read_family(f, c);
  if (!(c.norm_eps > 0)) f.fail(c.norm == NormKind::kLayerNorm ? "layer_norm_eps" : "rms_norm_eps", "must be > 0");
  if (c.rotary_dim <= 0 || c.rotary_dim > c.head_dim || c.rotary_dim % 2 != 0)
    f.fail(f.has("partial_rotary_factor") ? "partial_rotary_factor" : "head_dim",
           "gives a rotary dimension of " + std::to_string(c.rotary_dim) + " for head_dim " +
               std::to_string(c.head_dim) + "; it must be even and in (0, head_dim]");
  if (c.attention_scale == 0) c.attention_scale = std::pow(static_cast<double>(c.head_dim), -0.5);
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
