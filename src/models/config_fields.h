#pragma once
// Private: typed reads of config.json's fields, every error naming the file, the
// field's path and the value found (c10::ValueError).

#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/json_value.h"
#include "tp/models/model_config.h"

namespace tp::detail {

/// One JSON object of a config file, with where it is ("quantization_config.").
class ConfigFields {
 public:
  ConfigFields(const JsonValue& object, std::string where, std::string prefix)
      : object_(object), where_(std::move(where)), prefix_(std::move(prefix)) {
    if (!object_.is_object())
      TORCH_CHECK_VALUE(false, "ModelConfig: ", where_, ": ",
                        prefix_.empty() ? "the file" : prefix_.substr(0, prefix_.size() - 1),
                        " must be a JSON object; found ", object_.dump());
  }

  /// Present and not null (null means "the default" in Hugging Face configs for the fields
  /// their config classes resolve, such as head_dim or num_key_value_heads).
  bool has(const std::string& key) const {
    const auto* v = object_.find(key);
    return v != nullptr && !v->is_null();
  }
  /// The field's path for messages ("quantization_config.bits").
  std::string path(const std::string& key) const { return prefix_ + key; }
  const std::string& where() const { return where_; }
  const JsonValue* find(const std::string& key) const { return object_.find(key); }
  const std::vector<std::string>& keys() const { return object_.keys(prefix_); }

  /// "ModelConfig: <file>: <path> = <value> <message>"; the value is left out when absent.
  [[noreturn]] void fail(const std::string& key, const std::string& message) const {
    const auto* v = object_.find(key);
    C10_THROW_ERROR(ValueError, c10::str("ModelConfig: ", where_, ": ", path(key),
                                         v != nullptr ? " = " + v->dump() : "", " ", message));
  }

  std::string required_string(const std::string& key) const { return get(key, JsonValue::Kind::kString).as_string(""); }
  std::string string(const std::string& key, const std::string& fallback) const {
    return has(key) ? required_string(key) : fallback;
  }
  bool boolean(const std::string& key, bool fallback) const {
    return has(key) ? get(key, JsonValue::Kind::kBool).as_bool("") : fallback;
  }
  double required_double(const std::string& key) const {
    const auto& v = get(key, JsonValue::Kind::kNumber);
    try {
      return v.as_double(path(key));
    } catch (const FormatError& e) {
      fail(key, e.what());
    }
  }
  /// `fallback` when absent. A null is an error naming the field, as it is in transformers,
  /// whose modules compute with the None they are given (an RMSNorm with eps=None fails):
  /// a value nobody wrote must not become a default silently.
  double number(const std::string& key, double fallback) const {
    refuse_null(key, "a number");
    return has(key) ? required_double(key) : fallback;
  }
  /// `fallback` when absent or null, for the fields whose null means "none" (Gemma's soft caps).
  double number_or_null(const std::string& key, double fallback) const {
    return has(key) ? required_double(key) : fallback;
  }
  int64_t required_int(const std::string& key) const {
    const auto& v = get(key, JsonValue::Kind::kNumber);
    try {
      return v.as_int(path(key));
    } catch (const FormatError&) {
      fail(key, "must be an integer");
    }
  }
  /// `fallback` when absent; null is an error (as number()).
  int64_t integer(const std::string& key, int64_t fallback) const {
    refuse_null(key, "an integer");
    return has(key) ? required_int(key) : fallback;
  }
  int64_t required_positive(const std::string& key) const {
    const int64_t v = required_int(key);
    if (v <= 0) fail(key, "must be a positive integer");
    return v;
  }
  ConfigFields object(const std::string& key) const {
    return ConfigFields(get(key, JsonValue::Kind::kObject), where_, prefix_ + key + ".");
  }
  const std::vector<JsonValue>& array(const std::string& key) const {
    return get(key, JsonValue::Kind::kArray).as_array("");
  }
  /// A list of strings; a single string is accepted as a list of one (compressed-tensors
  /// allows it for targets / ignore).
  std::vector<std::string> strings(const std::string& key) const {
    if (!has(key)) return {};
    const auto& v = *object_.find(key);
    if (v.is_string()) return {v.as_string("")};
    std::vector<std::string> out;
    const auto& items = array(key);
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) fail(key, "must be a list of strings; element " + std::to_string(i) + " is not");
      out.push_back(items[i].as_string(""));
    }
    return out;
  }

 private:
  void refuse_null(const std::string& key, const char* what) const {
    const auto* v = object_.find(key);
    if (v != nullptr && v->is_null())
      fail(key, std::string("must be ") + what +
                    "; transformers would compute with the None (leave the field out for its default)");
  }

  const JsonValue& get(const std::string& key, JsonValue::Kind kind) const {
    const auto* v = object_.find(key);
    if (v == nullptr || v->is_null()) fail(key, "is required but absent");
    if (v->kind() != kind) fail(key, std::string("must be ") + JsonValue::kind_name(kind));
    return *v;
  }

  const JsonValue& object_;
  std::string where_;
  std::string prefix_;
};

/// The family's part of config.json (model_families.cpp): norms, activation, residual
/// form, attention variants, RoPE, biases, checkpoint names and fused layouts. Runs after
/// the sizes (model_type, hidden_size, heads, head_dim) are read.
void read_family(const ConfigFields& f, ModelConfig& c);

/// The registered family whose model_type is `model_type` (model_families.cpp), or null.
const ModelFamily* find_family(const std::string& model_type);

/// quantization_config -> CheckpointQuantization (quantization_config.cpp).
struct QuantizationParser {
  static CheckpointQuantization parse(const ConfigFields& config);
};

}  // namespace tp::detail
