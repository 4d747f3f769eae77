#include "tp/models/adapters.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "tp/comm/collective_status.h"
#include "tp/layers/loading/load_session.h"
#include "tp/loader/load_shard.h"
#include "tp/loader/safetensors_writer.h"
#include "tp/models/layer_options.h"

namespace tp {

namespace {

// PEFT's names: the base model's module paths under "base_model.model.".
const std::string kPeftPrefix = "base_model.model.";

// One layer an adapter can sit on: its LoRA and, per output segment, the module name (the
// checkpoint prefix of that segment's weight) PEFT gives it.
struct Site {
  LoRAImpl* lora = nullptr;
  std::vector<std::string> modules;
  at::Tensor weight;                        // the base layer's stored weight (merging)
  bool all_linear = true;                   // "all-linear" takes it (not the embedding, not the LM head: PEFT's rule)
  std::string no_merge;                     // why merging into it is refused ("" : it may be merged)
  std::string a_suffix = ".lora_A.weight";  // PEFT's name of its A after the module's
  Range rows, real;  // a vocabulary layer's: this rank's padded rows and real tokens of its weight
};

// A module tp holds but cannot adapt (yet): a target that names it is refused.
struct Unadaptable {
  std::string module, why;
};

struct Sites {
  std::vector<Site> sites;
  std::vector<Unadaptable> refused;
};

// A linear layer's site: per output segment, PEFT's module name.
Site linear_site(LoRAImpl& lora, std::vector<std::string> modules, at::Tensor weight) {
  Site site;
  site.lora = &lora;
  site.modules = std::move(modules);
  site.weight = std::move(weight);
  return site;
}

// The embedding's or the LM head's site: not in "all-linear", cut with the vocabulary.
template <class Layer>
Site vocab_site(Layer& layer, const std::string& module, const char* a_suffix, const std::string& no_merge) {
  Site site = linear_site(layer->lora(), {module}, layer->weight);
  site.all_linear = false;
  site.no_merge = no_merge;
  site.a_suffix = a_suffix;
  site.rows = layer->local_range();
  site.real = layer->vocab_range();
  return site;
}

Sites sites_of(CausalLMImpl& model) {
  Sites out;
  const auto& names = model.config.names;
  // A tied table is the head's weight too: merging into it would change both.
  const std::string tied = model.config.tie_word_embeddings
                               ? "the embedding and the LM head share one weight (tie_word_embeddings), so merging "
                                 "into it would change both; keep the adapter separate"
                               : "";
  out.sites.push_back(vocab_site(model.embed_tokens, names.embed, ".lora_embedding_A", tied));
  for (auto& layer : model.layers) {
    auto& l = *layer;
    const auto opts = decoder_layer_options(l.config, l.index, l.dtype, l.device);
    if (names.qkv.layout() == QKVLayout::kSeparate) {
      out.sites.push_back(
          linear_site(l.qkv->lora(),
                      {opts.qkv_prefix + "." + names.qkv.q_name(), opts.qkv_prefix + "." + names.qkv.k_name(),
                       opts.qkv_prefix + "." + names.qkv.v_name()},
                      l.qkv->weight));
    } else {
      out.refused.push_back({opts.qkv_prefix + "." + names.qkv.fused_name(), "a fused q/k/v tensor on disk"});
    }
    out.sites.push_back(linear_site(l.o_proj->lora(), {opts.o_prefix}, l.o_proj->weight));
    if (!l.moe.is_empty()) {
      out.refused.push_back({l.moe_prefix(), "a mixture of experts"});
      continue;
    }
    if (l.config.gated_mlp) {
      if (names.gate_up.layout() == GateUpLayout::kSeparate) {
        out.sites.push_back(linear_site(l.gate_up->lora(),
                                        {opts.gate_up_prefix + "." + names.gate_up.gate_name(),
                                         opts.gate_up_prefix + "." + names.gate_up.up_name()},
                                        l.gate_up->weight));
      } else {
        out.refused.push_back(
            {opts.gate_up_prefix + "." + names.gate_up.fused_name(), "a fused gate/up tensor on disk"});
      }
    } else {
      out.sites.push_back(linear_site(l.up_proj->lora(), {opts.up_prefix}, l.up_proj->weight));
    }
    out.sites.push_back(linear_site(l.down_proj->lora(), {opts.down_prefix}, l.down_proj->weight));
  }
  out.sites.push_back(vocab_site(model.lm_head, names.lm_head, ".lora_A.weight", tied));
  return out;
}

void check_model(const CausalLMImpl& model, const std::string& name) {
  TORCH_CHECK_VALUE(model.dp.size == 1, "CausalLM: adapter '", name,
                    "': LoRA is not supported with attention data parallelism yet (the MLP's rows are every group's)");
}

// The modules `config` targets, each checked adaptable; the targets that match nothing refused.
std::vector<std::pair<Site*, std::vector<bool>>> targeted(Sites& all, const PeftLoRAConfig& config,
                                                          const std::string& what) {
  for (const auto& r : all.refused)
    TORCH_CHECK_VALUE(!config.matches(r.module), what, ": it targets ", r.module, ", ", r.why,
                      ", which tp cannot put an adapter on yet");
  std::vector<std::pair<Site*, std::vector<bool>>> out;
  std::set<std::string> matched;
  for (auto& site : all.sites) {
    std::vector<bool> on;
    for (const auto& m : site.modules) on.push_back(config.matches(m) && (!config.all_linear || site.all_linear));
    if (std::find(on.begin(), on.end(), true) != on.end()) out.emplace_back(&site, on);
    for (const auto& t : config.target_modules) {
      PeftLoRAConfig one;  // PEFT's rule for this target alone
      one.target_modules = {t};
      for (const auto& m : site.modules)
        if (one.matches(m)) matched.insert(t);
    }
  }
  for (const auto& t : config.target_modules) {
    TORCH_CHECK_VALUE(matched.count(t) > 0, what, ": target_modules names '", t,
                      "', which matches no layer tp can adapt in this model (",
                      all.sites.empty() ? std::string("none") : all.sites.front().modules.front(), ", ...)");
  }
  TORCH_CHECK_VALUE(!out.empty(), what, ": its targets match no layer of this model");
  return out;
}

// PEFT saves the base's embedding and LM head beside an adapter on them (its
// save_embedding_layers, on by default for such targets) and puts them back into the model
// when it loads the folder. tp keeps one base under every adapter, so the folder's copy is
// read and must equal the base's own (this rank's rows, in the base's dtype); a resized or
// trained table is refused by name, never silently ignored.
void check_saved_base(const Checkpoint& checkpoint, const Site& site, const std::string& what) {
  const std::string tensor = kPeftPrefix + site.modules.front() + ".base_layer.weight";
  if (site.all_linear || !checkpoint.contains(tensor)) return;
  const auto& source = checkpoint.get(tensor, what);
  const int64_t hidden = site.weight.size(1);
  TORCH_CHECK_VALUE(source.shape().size() == 2 && source.shape()[1] == hidden, what, ": ", tensor, " has shape ",
                    c10::IntArrayRef(source.shape()), "; the base's ", site.modules.front(), " has ", hidden,
                    " columns");
  const at::Tensor mine = load_shard(source, ShardMode::kColumn, site.real, {}, what).to(site.weight.scalar_type());
  const at::Tensor base =
      site.weight.narrow(0, site.real.empty() ? 0 : site.real.begin - site.rows.begin, site.real.size());
  TORCH_CHECK_VALUE(mine.sizes() == base.sizes() && at::equal(mine, base), what, ": ", tensor,
                    " (PEFT's copy of the base's ", site.modules.front(),
                    ", saved with the adapter) differs from this model's own; the adapter was trained over another "
                    "(resized or trained) table, and tp keeps one base under every adapter: load that base instead");
}

}  // namespace

void load_adapter(CausalLMImpl& model, const std::string& folder, const std::string& name) {
  check_model(model, name);
  const std::string what = "adapter '" + name + "' (" + folder + ")";
  TORCH_CHECK_VALUE(model.adapter_configs.count(name) == 0, "CausalLM: it has an adapter '", name, "' already");
  auto all = sites_of(model);
  // The folder read and checked on each rank, a failure on any reaching every rank.
  PeftLoRAConfig config;
  Checkpoint checkpoint;
  std::vector<std::pair<Site*, std::vector<bool>>> on;
  run_collectively(model.comm, "CausalLM.load_adapter", [&] {
    config = PeftLoRAConfig::from_pretrained(folder);
    const std::string file = folder + "/adapter_model.safetensors";
    TORCH_CHECK_VALUE(std::filesystem::exists(file), what, ": no adapter_model.safetensors",
                      std::filesystem::exists(folder + "/adapter_model.bin")
                          ? " (adapter_model.bin is a pickle tp does not read: save with safe_serialization=True)"
                          : "");
    checkpoint = open_checkpoint(file);
    on = targeted(all, config, what);
    for (const auto& [site, mask] : on)
      for (size_t s = 0; s < mask.size(); ++s) {
        const std::string tensor = kPeftPrefix + site->modules[s] + site->a_suffix;
        TORCH_CHECK_VALUE(!mask[s] || checkpoint.contains(tensor), what, ": it targets ", site->modules[s],
                          " but holds no ", tensor);
      }
  });
  // Strict: every tensor of the file is read, but the layers num_layers leaves out.
  auto allow = LoadSessionOptions::default_allow_unread();
  for (auto i = static_cast<int64_t>(model.layers.size()); i < model.config.num_hidden_layers; ++i)
    allow.push_back(kPeftPrefix + model.config.layer_prefix(i) + ".*");
  LoadSession session(checkpoint, model.comm, LoadSessionOptions().allow_unread(allow));
  try {
    for (const auto& [site, mask] : on) {
      std::vector<std::string> prefixes;
      for (size_t s = 0; s < mask.size(); ++s) prefixes.push_back(mask[s] ? kPeftPrefix + site->modules[s] : "");
      site->lora->load(session.checkpoint(), name, config.lora, prefixes);
      site->lora->share_selection(model.adapter_selection);
      run_collectively(model.comm, "CausalLM.load_adapter",
                       [&] { check_saved_base(session.checkpoint(), *site, what); });
    }
    session.finish();
  } catch (...) {
    // All or nothing: the layers that took the adapter before the failure (the same on
    // every rank: each step is collective) give it back, so the model is as it was.
    for (auto& site : all.sites)
      if (site.lora->has(name)) site.lora->remove(name);
    throw;
  }
  model.adapter_configs[name] = config;
  if (model.adapter_configs.size() == 1) model.adapter_selection->select(name);
}

void add_adapter(CausalLMImpl& model, const std::string& name, const PeftLoRAConfig& config) {
  check_model(model, name);
  TORCH_CHECK_VALUE(model.adapter_configs.count(name) == 0, "CausalLM: it has an adapter '", name, "' already");
  auto all = sites_of(model);
  std::vector<std::pair<Site*, std::vector<bool>>> on;
  run_collectively(model.comm, "CausalLM.add_adapter", [&] { on = targeted(all, config, "adapter '" + name + "'"); });
  for (const auto& [site, mask] : on) {
    std::vector<std::string> segments;
    const auto names = site->lora->segment_names();
    for (size_t s = 0; s < mask.size(); ++s)
      if (mask[s]) segments.push_back(names[s]);
    site->lora->add(name, config.lora, segments);
    site->lora->share_selection(model.adapter_selection);
  }
  model.adapter_configs[name] = config;
  if (model.adapter_configs.size() == 1) model.adapter_selection->select(name);
}

std::map<std::string, at::Tensor> gather_adapter(const CausalLMImpl& model, const std::string& name) {
  TORCH_CHECK_VALUE(model.adapter_configs.count(name) > 0, "CausalLM: no adapter '", name, "'");
  auto all = sites_of(const_cast<CausalLMImpl&>(model));
  std::map<std::string, at::Tensor> out;
  for (auto& site : all.sites) {
    if (!site.lora->has(name)) continue;
    std::vector<std::string> prefixes;
    for (const auto& m : site.modules) prefixes.push_back(kPeftPrefix + m);
    const auto part = site.lora->gather(name, prefixes);
    out.insert(part.begin(), part.end());
  }
  return out;
}

void save_adapter(const CausalLMImpl& model, const std::string& folder, const std::string& name) {
  const auto tensors = gather_adapter(model, name);
  run_collectively(model.comm, "CausalLM.save_adapter", [&] {
    if (model.comm.rank() != 0) return;
    std::filesystem::create_directories(folder);
    std::ofstream config(folder + "/adapter_config.json");
    config << model.adapter_configs.at(name).to_json();
    TORCH_CHECK_VALUE(config.good(), "cannot write ", folder, "/adapter_config.json");
    std::map<std::string, at::Tensor> cpu;
    for (const auto& [k, v] : tensors) cpu[k] = v.cpu().contiguous();
    save_safetensors(folder + "/adapter_model.safetensors", cpu);
  });
}

namespace {

void merge(CausalLMImpl& model, const std::string& name, bool unmerge) {
  TORCH_CHECK_VALUE(model.adapter_configs.count(name) > 0, "CausalLM: no adapter '", name, "'");
  auto all = sites_of(model);
  // Every layer checked before any weight changes, on every rank alike.
  run_collectively(model.comm, unmerge ? "CausalLM.unmerge_adapter" : "CausalLM.merge_adapter", [&] {
    for (auto& site : all.sites) {
      if (!site.lora->has(name)) continue;
      TORCH_CHECK_VALUE(site.no_merge.empty(), "CausalLM: adapter '", name, "' cannot merge into ",
                        site.modules.front(), ": ", site.no_merge);
      TORCH_CHECK_VALUE(site.lora->merged(name) == unmerge, "CausalLM: adapter '", name, "' is ",
                        unmerge ? "not merged" : "merged already");
      const auto segments = site.lora->segment_names();
      for (const auto& segment : segments) {
        const at::Tensor a = site.lora->lora_A(name, segment);
        TORCH_CHECK_VALUE(!a.defined() || site.weight.scalar_type() == a.scalar_type(), "CausalLM: adapter '", name,
                          "' cannot merge into ", site.modules.front(), ": its base weight is ",
                          site.weight.scalar_type(), ", not the adapter's ", a.scalar_type(),
                          " (a quantized base keeps its adapter separate)");
      }
    }
  });
  for (auto& site : all.sites)
    if (site.lora->has(name)) site.lora->merge_into(name, site.weight, unmerge);
  model.adapter_selection->select(name);
}

}  // namespace

void merge_adapter(CausalLMImpl& model, const std::string& name) { merge(model, name, /*unmerge=*/false); }

void unmerge_adapter(CausalLMImpl& model, const std::string& name) { merge(model, name, /*unmerge=*/true); }

std::vector<std::string> adapter_names(const CausalLMImpl& model) {
  std::vector<std::string> out;
  for (const auto& [name, _] : model.adapter_configs) out.push_back(name);
  return out;
}

std::vector<at::Tensor> adapter_parameters(const CausalLMImpl& model, const std::string& name) {
  TORCH_CHECK_VALUE(model.adapter_configs.count(name) > 0, "CausalLM: no adapter '", name, "'");
  auto all = sites_of(const_cast<CausalLMImpl&>(model));
  std::vector<at::Tensor> out;
  for (auto& site : all.sites) {
    if (!site.lora->has(name)) continue;
    for (const auto& segment : site.lora->segment_names()) {
      const at::Tensor a = site.lora->lora_A(name, segment);
      if (!a.defined()) continue;
      out.push_back(a);
      out.push_back(site.lora->lora_B(name, segment));
    }
  }
  return out;
}

}  // namespace tp
