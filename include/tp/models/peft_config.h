#pragma once
// PEFT's adapter_config.json for a LoRA adapter, as tp reads and writes it
// (tp/models/adapters.h loads and saves the folders).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tp/layers/lora/lora.h"

namespace tp {

/// An adapter folder's adapter_config.json as tp reads it: PEFT's LoraConfig, with every
/// field that changes the arithmetic either taken or refused by name (DoRA, a bias on the
/// adapter, per-module rank or alpha patterns, fan_in_fan_out, modules_to_save, an
/// initialisation that rewrote the base weights (PiSSA, OLoRA, ...), and any field this
/// reader does not know that holds a value).
struct PeftLoRAConfig {
  LoRAConfig lora;
  /// PEFT's target_modules: a list (a module matches a name it equals or ends with after a
  /// "."), or one regular expression matched against the whole module name.
  std::vector<std::string> target_modules;
  std::string target_regex;
  bool all_linear = false;  ///< "all-linear": every linear layer but the LM head
  /// PEFT's target_parameters: stacked expert tensors ("experts.gate_up_proj",
  /// "experts.down_proj"); a parameter matches a name it equals or ends with after a ".".
  std::vector<std::string> target_parameters;
  /// PEFT's rank_pattern / alpha_pattern, in file order: a module or parameter whose name
  /// matches "(.*\.)?(<key>)$" takes the first matching key's rank / alpha (PEFT 0.22 writes
  /// them itself when it converts transformers 4 expert targets into fused ones).
  std::vector<std::pair<std::string, int64_t>> rank_pattern;
  std::vector<std::pair<std::string, double>> alpha_pattern;
  /// lora_dropout (training only; tp applies none, so training with it differs from PEFT's).
  double dropout = 0.0;

  bool matches(const std::string& module) const;
  /// Whether target_parameters takes the parameter `key` ("<module>.<parameter>").
  bool matches_parameter(const std::string& key) const;
  /// `lora` with the patterns' rank and alpha for module or parameter `key`.
  LoRAConfig config_for(const std::string& key) const;
  static PeftLoRAConfig from_json(const std::string& text, const std::string& where);
  static PeftLoRAConfig from_pretrained(const std::string& folder);
  /// adapter_config.json's text for a folder PEFT's PeftModel.from_pretrained loads.
  std::string to_json() const;
};

}  // namespace tp
