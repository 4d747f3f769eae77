#include "tp/models/adapters.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
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

// A mixture of experts' routed experts: PEFT's target_parameters "<module>.gate_up_proj" and
// "<module>.down_proj" (transformers 5's stacked tensors), each a ParamWrapper.
struct ExpertSite {
  ExpertLoRAImpl* lora = nullptr;
  std::string module;  // "model.layers.<i>.mlp.experts"
  bool interleaved = false;
};

// A module tp holds but cannot adapt (yet): a target that names it is refused. `linear`:
// PEFT's "all-linear" takes it (a torch.nn.Linear in transformers' model).
struct Unadaptable {
  std::string module, why;
  bool linear = true;
};

struct Sites {
  std::vector<Site> sites;
  std::vector<ExpertSite> experts;
  std::vector<Unadaptable> refused;
};

// PEFT's names of an expert adapter's tensors: with both projections targeted, the
// ParamWrapper of gate_up_proj (the tensor transformers registers first) is wrapped by
// down_proj's, so its tensors sit under "<module>.base_layer".
std::pair<std::string, std::string> expert_prefixes(const ExpertSite& site, bool gate_up, bool down) {
  const std::string module = kPeftPrefix + site.module;
  return {gate_up ? (down ? module + ".base_layer" : module) : "", down ? module : ""};
}

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
      // transformers 5's module names (PEFT's), whatever the checkpoint calls the block.
      const std::string mlp = l.prefix() + ".mlp";
      const auto layout = l.moe_layout();
      out.experts.push_back({&l.moe->lora(), mlp + ".experts", layout.interleaved_gate_up()});
      out.refused.push_back({mlp + ".experts",
                             "stacked expert tensors (PEFT adapts them through target_parameters: "
                             "\"experts.gate_up_proj\", \"experts.down_proj\")",
                             false});
      out.refused.push_back({mlp + "." + layout.router_name(), "the router", false});
      const auto& mo = l.moe->options;
      if (mo.shared_expert_intermediate_size() > 0) {
        const std::string shared = mlp + "." + layout.shared_expert_name();
        out.sites.push_back(linear_site(l.moe->shared_expert_lora("gate_up"),
                                        {shared + ".gate_proj", shared + ".up_proj"},
                                        l.moe->shared_expert_weight("gate_up")));
        out.sites.push_back(linear_site(l.moe->shared_expert_lora("down"), {shared + ".down_proj"},
                                        l.moe->shared_expert_weight("down")));
      }
      if (mo.shared_expert_gate())
        out.refused.push_back({mlp + "." + layout.shared_expert_gate_name(), "the shared expert's gate"});
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

// The config of a linear site's targeted segments: one rank and alpha per layer (a fused
// q/k/v or gate/up holds one adapter), refused by name where the patterns give them several.
LoRAConfig site_config(const Site& site, const std::vector<bool>& on, const PeftLoRAConfig& config,
                       const std::string& what) {
  std::optional<LoRAConfig> out;
  std::string first;
  for (size_t s = 0; s < on.size(); ++s) {
    if (!on[s]) continue;
    const LoRAConfig c = config.config_for(site.modules[s]);
    if (!out) {
      out = c;
      first = site.modules[s];
      continue;
    }
    TORCH_CHECK_VALUE(c.rank() == out->rank() && c.alpha() == out->alpha(), what,
                      ": rank_pattern / alpha_pattern give ", first, " rank ", out->rank(), " alpha ", out->alpha(),
                      " and ", site.modules[s], " rank ", c.rank(), " alpha ", c.alpha(),
                      "; tp holds them in one fused layer, with one rank per adapter");
  }
  return *out;
}

// An expert site's configs of gate_up_proj and down_proj (nullopt: not targeted).
std::pair<std::optional<LoRAConfig>, std::optional<LoRAConfig>> expert_configs(const ExpertSite& site,
                                                                               std::pair<bool, bool> which,
                                                                               const PeftLoRAConfig& config) {
  return {which.first ? std::optional(config.config_for(site.module + ".gate_up_proj")) : std::nullopt,
          which.second ? std::optional(config.config_for(site.module + ".down_proj")) : std::nullopt};
}

struct Targets {
  std::vector<std::pair<Site*, std::vector<bool>>> linear;             // a site and which of its segments
  std::vector<std::pair<ExpertSite*, std::pair<bool, bool>>> experts;  // (gate_up, down)
};

// The modules `config` targets, each checked adaptable; the targets that match nothing refused.
Targets targeted(Sites& all, const PeftLoRAConfig& config, const std::string& what) {
  for (const auto& r : all.refused)
    TORCH_CHECK_VALUE(config.all_linear ? !r.linear : !config.matches(r.module), what, ": it targets ", r.module, ", ",
                      r.why, ", which tp cannot put an adapter on", r.linear ? " yet" : "");
  Targets targets;
  for (auto& site : all.experts) {
    const bool gate_up = config.matches_parameter(site.module + ".gate_up_proj");
    const bool down = config.matches_parameter(site.module + ".down_proj");
    if (gate_up || down) targets.experts.push_back({&site, {gate_up, down}});
  }
  for (const auto& t : config.target_parameters) {
    PeftLoRAConfig one;
    one.target_parameters = {t};
    const bool found = std::any_of(all.experts.begin(), all.experts.end(), [&](const ExpertSite& site) {
      return one.matches_parameter(site.module + ".gate_up_proj") || one.matches_parameter(site.module + ".down_proj");
    });
    TORCH_CHECK_VALUE(found, what, ": target_parameters names '", t,
                      "', which matches no stacked expert tensor of this model (",
                      all.experts.empty() ? std::string("it has no mixture of experts")
                                          : all.experts.front().module + ".gate_up_proj, ...",
                      ")");
  }
  auto& out = targets.linear;
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
  TORCH_CHECK_VALUE(!out.empty() || !targets.experts.empty(), what, ": its targets match no layer of this model");
  return targets;
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
  Targets on;
  run_collectively(model.comm, "CausalLM.load_adapter", [&] {
    config = PeftLoRAConfig::from_pretrained(folder);
    const std::string file = folder + "/adapter_model.safetensors";
    TORCH_CHECK_VALUE(std::filesystem::exists(file), what, ": no adapter_model.safetensors",
                      std::filesystem::exists(folder + "/adapter_model.bin")
                          ? " (adapter_model.bin is a pickle tp does not read: save with safe_serialization=True)"
                          : "");
    checkpoint = open_checkpoint(file);
    on = targeted(all, config, what);
    for (const auto& [site, mask] : on.linear) site_config(*site, mask, config, what);  // refused here, on every rank
    for (const auto& [site, mask] : on.linear)
      for (size_t s = 0; s < mask.size(); ++s) {
        const std::string tensor = kPeftPrefix + site->modules[s] + site->a_suffix;
        TORCH_CHECK_VALUE(!mask[s] || checkpoint.contains(tensor), what, ": it targets ", site->modules[s],
                          " but holds no ", tensor);
      }
    for (const auto& [site, which] : on.experts) {
      const auto [gate_up, down] = expert_prefixes(*site, which.first, which.second);
      for (const auto& [prefix, param] : {std::pair{gate_up, ".gate_up_proj"}, std::pair{down, ".down_proj"}})
        TORCH_CHECK_VALUE(prefix.empty() || checkpoint.contains(prefix + ".lora_A.weight"), what, ": it targets ",
                          site->module, param, " but holds no ", prefix, ".lora_A.weight");
    }
  });
  // Strict: every tensor of the file is read, but the layers num_layers leaves out.
  auto allow = LoadSessionOptions::default_allow_unread();
  for (auto i = static_cast<int64_t>(model.layers.size()); i < model.config.num_hidden_layers; ++i)
    allow.push_back(kPeftPrefix + model.config.layer_prefix(i) + ".*");
  LoadSession session(checkpoint, model.comm, LoadSessionOptions().allow_unread(allow));
  try {
    for (const auto& [site, which] : on.experts) {
      const auto [gate_up, down] = expert_prefixes(*site, which.first, which.second);
      const auto [gate_up_config, down_config] = expert_configs(*site, which, config);
      site->lora->load(session.checkpoint(), name, gate_up_config, gate_up, down_config, down, site->interleaved);
      site->lora->share_selection(model.adapter_selection);
    }
    for (const auto& [site, mask] : on.linear) {
      std::vector<std::string> prefixes;
      for (size_t s = 0; s < mask.size(); ++s) prefixes.push_back(mask[s] ? kPeftPrefix + site->modules[s] : "");
      site->lora->load(session.checkpoint(), name, site_config(*site, mask, config, what), prefixes);
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
    for (auto& site : all.experts)
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
  Targets on;
  run_collectively(model.comm, "CausalLM.add_adapter", [&] {
    on = targeted(all, config, "adapter '" + name + "'");
    for (const auto& [site, mask] : on.linear) site_config(*site, mask, config, "adapter '" + name + "'");
  });
  for (const auto& [site, which] : on.experts) {
    const auto [gate_up_config, down_config] = expert_configs(*site, which, config);
    site->lora->add(name, gate_up_config, down_config);
    site->lora->share_selection(model.adapter_selection);
  }
  for (const auto& [site, mask] : on.linear) {
    std::vector<std::string> segments;
    const auto names = site->lora->segment_names();
    for (size_t s = 0; s < mask.size(); ++s)
      if (mask[s]) segments.push_back(names[s]);
    site->lora->add(name, site_config(*site, mask, config, "adapter '" + name + "'"), segments);
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
  for (auto& site : all.experts) {
    if (!site.lora->has(name)) continue;
    const bool gate_up = site.lora->lora_A(name, "gate_up").defined(), down = site.lora->lora_A(name, "down").defined();
    const auto [gu, d] = expert_prefixes(site, gate_up, down);
    const auto part = site.lora->gather(name, gu, d, site.interleaved);
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
    for (const auto& site : all.experts)
      TORCH_CHECK_VALUE(!site.lora->has(name), "CausalLM: adapter '", name, "' cannot merge into ", site.module,
                        ": merging into the experts' stacked tensors is not supported yet; keep the adapter separate");
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
  for (auto& site : all.experts) {
    if (!site.lora->has(name)) continue;
    for (const char* projection : {"gate_up", "down"}) {
      const at::Tensor a = site.lora->lora_A(name, projection);
      if (!a.defined()) continue;
      out.push_back(a);
      out.push_back(site.lora->lora_B(name, projection));
    }
  }
  return out;
}

}  // namespace tp
