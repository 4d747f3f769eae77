#pragma once
// LoRA adapters on a whole tp::CausalLM, in PEFT's folder format (adapter_config.json and
// adapter_model.safetensors, tensors named "base_model.model.<module>.lora_A.weight", the
// embedding's ".lora_embedding_A"): loaded strictly onto the model's linear layers, its
// embedding and its LM head (each cut by its layer's own plan: tp/layers/lora/lora.h), made
// fresh for training, gathered and saved back in PEFT's layout from any TP size. Which adapter each row of a batch takes is the model's
// `adapter_selection` (every layer's LoRA reads it).
//
// Example:
//   auto model = tp::CausalLMImpl::from_pretrained(folder, {}, comm);
//   tp::load_adapter(*model, "/adapters/math", "math");
//   tp::load_adapter(*model, "/adapters/code", "code");
//   model->adapter_selection->select_rows({"math", "code", ""});   // row 2: the base alone
//   at::Tensor logits = model->forward(ids);                        // ids [3, seq]

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tp/layers/lora/lora.h"
#include "tp/models/causal_lm.h"
#include "tp/models/peft_config.h"

namespace tp {

/// Adapter `name` from PEFT's `folder` onto every layer it targets, each rank reading only
/// its slices. Strict and collective: a tensor nothing reads (an adapter on a module tp
/// cannot adapt: a mixture's experts, a fused on-disk q/k/v or gate/up),
/// a targeted module without its tensors, a wrong shape or a non-finite value fails on
/// every rank, naming the tensor. The first adapter a model gets is selected for every row.
void load_adapter(CausalLMImpl& model, const std::string& folder, const std::string& name);
/// A fresh adapter on the modules `config` targets (A random, the same on every rank; B
/// zeros: the model's output is unchanged until B is trained).
void add_adapter(CausalLMImpl& model, const std::string& name, const PeftLoRAConfig& config);
/// Adapter `name`'s tensors, whole, under PEFT's names (collective: every rank calls it
/// and gets all of them).
std::map<std::string, at::Tensor> gather_adapter(const CausalLMImpl& model, const std::string& name);
/// gather_adapter, written by rank 0 as a PEFT folder (adapter_config.json and
/// adapter_model.safetensors) that loads at any TP size, into tp or PEFT. Collective.
void save_adapter(const CausalLMImpl& model, const std::string& folder, const std::string& name);
/// Adapter `name` merged into every unquantized base weight it is on (this rank's slices:
/// no communication), and selected for every row: the base then computes it, at the base's
/// cost. unmerge_adapter takes it back out. Refused for a quantized base (its adapter
/// stays separate) and for a tied embedding / LM head (merging would change both).
void merge_adapter(CausalLMImpl& model, const std::string& name);
void unmerge_adapter(CausalLMImpl& model, const std::string& name);
/// The adapters the model holds (their configurations: model.adapter_configs).
std::vector<std::string> adapter_names(const CausalLMImpl& model);
/// Adapter `name`'s local A and B tensors, in module order (what an optimizer trains).
std::vector<at::Tensor> adapter_parameters(const CausalLMImpl& model, const std::string& name);

}  // namespace tp
