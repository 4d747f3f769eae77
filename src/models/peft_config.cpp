#include "tp/models/peft_config.h"

#include <c10/util/Exception.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "common/json_value.h"

namespace tp {

namespace {

using detail::JsonValue;

// Fields that only describe the folder or the training run: read for nothing.
const std::set<std::string> kDescriptive = {"auto_mapping",      "base_model_name_or_path", "revision",
                                            "task_type",         "inference_mode",          "peft_version",
                                            "qalora_group_size", "megatron_core",           "loftq_config"};

// Fields whose default (null, false, "none", {} or []) is the only value tp computes; any
// other value is refused by name: it changes what the adapter computes.
const std::map<std::string, const char*> kMustBeDefault = {
    {"bias", "a trained bias beside the adapter"},
    {"use_dora", "DoRA (weight-decomposed LoRA)"},
    {"fan_in_fan_out", "weights stored [in, out] (GPT-2's Conv1D)"},
    {"modules_to_save", "whole modules trained beside the adapter"},
    {"layers_to_transform", "an adapter on some layers only"},
    {"layers_pattern", "an adapter on some layers only"},
    {"layer_replication", "layers replicated by the adapter"},
    {"lora_bias", "a bias on lora_B"},
    {"trainable_token_indices", "trained embedding rows"},
    {"alora_invocation_tokens", "activated LoRA"},
    {"use_qalora", "QA-LoRA"},
    {"use_bdlora", "block-diagonal LoRA"},
    {"exclude_modules", "modules excluded from the targets"},
    {"megatron_config", "Megatron's parallel layers"},
    {"arrow_config", "Arrow routing"},
    {"astra_config", "ASTRA"},
    {"corda_config", "CorDA (it rewrites the base weights)"},
    {"eva_config", "EVA initialisation"},
    {"kasa_config", "KaSA"},
    {"lora_ga_config", "LoRA-GA (it rewrites the base weights)"},
    {"monteclora_config", "MonteCLoRA"},
    {"velora_config", "VeLoRA"},
    {"ensure_weight_tying", "tied adapters"},
};

bool is_default(const JsonValue& v) {
  switch (v.kind()) {
    case JsonValue::Kind::kNull: return true;
    case JsonValue::Kind::kBool: return !v.as_bool("");
    case JsonValue::Kind::kString: return v.as_string("") == "none" || v.as_string("").empty();
    case JsonValue::Kind::kArray: return v.as_array("").empty();
    case JsonValue::Kind::kObject: return v.keys("").empty();
    case JsonValue::Kind::kNumber: return false;
  }
  return false;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

namespace {

// PEFT's rule for a list of names: equal, or a suffix after a ".".
bool suffix_match(const std::string& name, const std::vector<std::string>& targets) {
  for (const auto& t : targets) {
    if (name == t) return true;
    if (name.size() > t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0 &&
        name[name.size() - t.size() - 1] == '.')
      return true;
  }
  return false;
}

}  // namespace

bool PeftLoRAConfig::matches_parameter(const std::string& key) const { return suffix_match(key, target_parameters); }

LoRAConfig PeftLoRAConfig::config_for(const std::string& key) const {
  LoRAConfig out = lora;
  // PEFT's get_pattern_key: the first key k (in the file's order) with key ~ "(.*\.)?(k)$".
  const auto match = [&](const std::string& pattern) {
    return std::regex_match(key, std::regex("(.*\\.)?(" + pattern + ")"));
  };
  for (const auto& [pattern, rank] : rank_pattern)
    if (match(pattern)) {
      out.rank(rank);
      break;
    }
  for (const auto& [pattern, alpha] : alpha_pattern)
    if (match(pattern)) {
      out.alpha(alpha);
      break;
    }
  return out;
}

bool PeftLoRAConfig::matches(const std::string& module) const {
  if (all_linear) return true;
  if (!target_regex.empty()) return std::regex_match(module, std::regex(target_regex));
  return suffix_match(module, target_modules);
}

PeftLoRAConfig PeftLoRAConfig::from_json(const std::string& text, const std::string& where) {
  const auto fail = [&](const std::string& msg) { C10_THROW_ERROR(ValueError, where + ": " + msg); };
  JsonValue root;
  try {
    root = JsonValue::parse(text, where.c_str());
  } catch (const detail::FormatError& e) {
    fail(e.what());
  }
  if (!root.is_object()) fail("an adapter_config.json is a JSON object");
  PeftLoRAConfig out;
  try {
    const JsonValue* type = root.find("peft_type");
    if (type == nullptr || type->as_string("peft_type") != "LORA")
      fail(c10::str("peft_type is ", type ? type->dump() : "absent",
                    "; tp reads LoRA adapters (peft_type \"LORA\") only"));
    const JsonValue* r = root.find("r");
    if (r == nullptr) fail("r (the adapter's rank) is absent");
    out.lora.rank(r->as_int("r"));
    const JsonValue* alpha = root.find("lora_alpha");
    out.lora.alpha(alpha && !alpha->is_null() ? alpha->as_double("lora_alpha") : 8.0);  // PEFT's default
    const JsonValue* rs = root.find("use_rslora");
    out.lora.use_rslora(rs && !rs->is_null() && rs->as_bool("use_rslora"));
    if (out.lora.rank() <= 0) fail(c10::str("r is ", out.lora.rank(), "; a rank is positive"));
    const JsonValue* dropout = root.find("lora_dropout");
    if (dropout && !dropout->is_null()) out.dropout = dropout->as_double("lora_dropout");
    const JsonValue* parameters = root.find("target_parameters");
    if (parameters != nullptr && !parameters->is_null())
      for (const auto& t : parameters->as_array("target_parameters"))
        out.target_parameters.push_back(t.as_string("target_parameters[]"));
    for (const auto* field : {"rank_pattern", "alpha_pattern"}) {
      const JsonValue* pattern = root.find(field);
      if (pattern == nullptr || pattern->is_null()) continue;
      const auto& keys = pattern->keys(field);
      const auto& values = pattern->values(field);
      for (size_t i = 0; i < keys.size(); ++i) {
        try {
          (void)std::regex(keys[i]);
        } catch (const std::regex_error& e) {
          fail(c10::str(field, " key \"", keys[i], "\" is not a regular expression: ", e.what()));
        }
        if (std::string(field) == "rank_pattern") {
          const int64_t r = values[i].as_int(field);
          if (r <= 0) fail(c10::str("rank_pattern gives \"", keys[i], "\" rank ", r, "; a rank is positive"));
          out.rank_pattern.emplace_back(keys[i], r);
        } else {
          out.alpha_pattern.emplace_back(keys[i], values[i].as_double(field));
        }
      }
    }
    const JsonValue* targets = root.find("target_modules");
    if ((targets == nullptr || targets->is_null()) && out.target_parameters.empty())
      fail("target_modules is absent: which modules the adapter is on");
    if (targets == nullptr || targets->is_null()) {
      // target_parameters alone
    } else if (targets->is_string()) {
      const std::string& t = targets->as_string("target_modules");
      if (t == "all-linear")
        out.all_linear = true;
      else
        out.target_regex = t;
    } else {
      for (const auto& t : targets->as_array("target_modules"))
        out.target_modules.push_back(t.as_string("target_modules[]"));
    }
    const JsonValue* init = root.find("init_lora_weights");
    if (init != nullptr && init->is_string() && init->as_string("") != "gaussian")
      fail(c10::str("init_lora_weights is ", init->dump(),
                    ": that initialisation rewrites the base weights, so the adapter belongs to a base this folder "
                    "does not hold; save it converted (PEFT's path_initial_model_for_weight_conversion)"));
    const auto& keys = root.keys("adapter_config.json");
    const auto& values = root.values("adapter_config.json");
    static const std::set<std::string> kRead = {"peft_type",         "r",
                                                "lora_alpha",        "use_rslora",
                                                "lora_dropout",      "target_modules",
                                                "init_lora_weights", "target_parameters",
                                                "rank_pattern",      "alpha_pattern"};
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::string& key = keys[i];
      if (kRead.count(key) || kDescriptive.count(key)) continue;
      const auto known = kMustBeDefault.find(key);
      if (is_default(values[i])) continue;
      if (known != kMustBeDefault.end())
        fail(c10::str(key, " is ", values[i].dump(), ": ", known->second, " is not supported by tp's LoRA"));
      fail(c10::str("field '", key, "' = ", values[i].dump(),
                    " is not one tp's LoRA reader knows; it refuses a value it would otherwise ignore"));
    }
  } catch (const detail::FormatError& e) {
    fail(e.what());
  }
  if (!out.target_regex.empty()) {
    try {
      (void)std::regex(out.target_regex);
    } catch (const std::regex_error& e) {
      fail(c10::str("target_modules \"", out.target_regex, "\" is not a regular expression: ", e.what()));
    }
  }
  return out;
}

PeftLoRAConfig PeftLoRAConfig::from_pretrained(const std::string& folder) {
  const std::string where = folder + "/adapter_config.json";
  std::ifstream in(where);
  TORCH_CHECK_VALUE(in.good(), "cannot read '", where, "': a PEFT adapter folder holds adapter_config.json");
  std::ostringstream text;
  text << in.rdbuf();
  return from_json(text.str(), where);
}

std::string PeftLoRAConfig::to_json() const {
  std::ostringstream os;
  os.precision(17);
  os << "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"r\": " << lora.rank()
     << ",\n  \"lora_alpha\": " << lora.alpha() << ",\n  \"use_rslora\": " << (lora.use_rslora() ? "true" : "false")
     << ",\n  \"lora_dropout\": " << dropout << ",\n  \"target_modules\": ";
  if (all_linear) {
    os << "\"all-linear\"";
  } else if (!target_regex.empty()) {
    os << json_string(target_regex);
  } else {
    os << "[";
    for (size_t i = 0; i < target_modules.size(); ++i) os << (i ? ", " : "") << json_string(target_modules[i]);
    os << "]";
  }
  const auto pattern = [&](const char* field, const auto& entries) {
    if (entries.empty()) return;
    os << ",\n  \"" << field << "\": {";
    for (size_t i = 0; i < entries.size(); ++i)
      os << (i ? ", " : "") << json_string(entries[i].first) << ": " << entries[i].second;
    os << "}";
  };
  pattern("rank_pattern", rank_pattern);
  pattern("alpha_pattern", alpha_pattern);
  if (!target_parameters.empty()) {
    os << ",\n  \"target_parameters\": [";
    for (size_t i = 0; i < target_parameters.size(); ++i) os << (i ? ", " : "") << json_string(target_parameters[i]);
    os << "]";
  }
  os << ",\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n  \"use_dora\": false,\n  \"modules_to_save\": null,\n"
     << "  \"init_lora_weights\": true,\n  \"inference_mode\": true,\n  \"base_model_name_or_path\": null\n}\n";
  return os.str();
}

}  // namespace tp
