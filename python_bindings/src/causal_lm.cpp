// Bindings: CausalLM (a whole decoder from a Hugging Face folder), its KV cache, and its
// children (the decoder layers, their norms and projections). The tp package wraps the
// model in a torch.nn.Module (tp.CausalLM) whose children wrap these, so its parameters
// are the C++ modules' own tensors. A child is handed out as a shared_ptr that aliases
// the model's: it keeps the whole model (and its communicator) alive, and the model's
// GIL-releasing deleter still runs last.

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>

#include "bindings.h"
#include "tp/comm/communicator.h"
#include "tp/models/adapters.h"
#include "tp/models/causal_lm.h"
#include "tp/models/decoder_layer.h"
#include "tp/models/kv_cache.h"
#include "tp/models/norm.h"

namespace py = pybind11;

namespace tp::python {
namespace {

/// `child` of a module owned by `owner`, sharing the owner's lifetime.
template <class Owner, class Holder>
std::shared_ptr<typename Holder::ContainedType> child_of(const std::shared_ptr<Owner>& owner, const Holder& child) {
  using Impl = typename Holder::ContainedType;
  return child.is_empty() ? std::shared_ptr<Impl>() : std::shared_ptr<Impl>(owner, child.ptr().get());
}

void bind_children(py::module_& m) {
  py::class_<NormImpl, std::shared_ptr<NormImpl>>(
      m, "Norm", "A model's norm: RMSNorm, Gemma's (1 + w) RMSNorm or LayerNorm (mirrored on every rank).")
      .def(
          "forward", [](NormImpl& norm, const at::Tensor& x) { return norm.forward(x); }, py::arg("input"))
      .def_property_readonly("weight", [](const NormImpl& norm) { return norm.weight; })
      .def_property_readonly("bias",
                             [](const NormImpl& norm) -> std::optional<at::Tensor> {
                               if (!norm.bias.defined()) return std::nullopt;
                               return norm.bias;
                             })
      .def_property_readonly("kind", [](const NormImpl& norm) { return to_string(norm.options.kind()); })
      .def_property_readonly("size", [](const NormImpl& norm) { return norm.options.size(); })
      .def_property_readonly("eps", [](const NormImpl& norm) { return norm.options.eps(); })
      .def("named_parameters", &own_parameters<NormImpl>)
      .def("__repr__", [](const NormImpl& n) { return to_repr([&](std::ostream& o) { n.pretty_print(o); }); });

  using Layer = std::shared_ptr<DecoderLayerImpl>;
  py::class_<DecoderLayerImpl, Layer>(m, "DecoderLayer", "One decoder block of a CausalLM.")
      .def_readonly("index", &DecoderLayerImpl::index)
      .def_property_readonly("qk_norm", &DecoderLayerImpl::qk_norm)
      .def_property_readonly("head_dim", [](const DecoderLayerImpl& l) { return l.config.head_dim; })
      .def_property_readonly("input_layernorm", [](const Layer& l) { return child_of(l, l->input_layernorm); })
      .def_property_readonly("post_attention_layernorm",
                             [](const Layer& l) { return child_of(l, l->post_attention_layernorm); })
      .def_property_readonly("pre_feedforward_layernorm",
                             [](const Layer& l) { return child_of(l, l->pre_feedforward_layernorm); })
      .def_property_readonly("post_feedforward_layernorm",
                             [](const Layer& l) { return child_of(l, l->post_feedforward_layernorm); })
      .def_property_readonly("sandwich_norms", [](const DecoderLayerImpl& l) { return l.config.sandwich_norms; })
      .def_property_readonly("gated_mlp", [](const DecoderLayerImpl& l) { return l.config.gated_mlp; })
      .def_property_readonly("parallel_residual", [](const DecoderLayerImpl& l) { return l.config.parallel_residual; })
      .def_property_readonly("hidden_act", [](const DecoderLayerImpl& l) { return to_string(l.config.hidden_act); })
      .def_property_readonly("communicator",
                             [](const DecoderLayerImpl& l) { return release_gil_on_delete(new Communicator(l.comm)); })
      .def_property_readonly("attention_sinks", [](const DecoderLayerImpl& l) { return l.sinks.defined(); })
      .def_property_readonly("sinks",
                             [](const DecoderLayerImpl& l) -> std::optional<at::Tensor> {
                               if (!l.sinks.defined()) return std::nullopt;
                               return l.sinks;
                             })
      .def_property_readonly("q_heads",
                             [](const DecoderLayerImpl& l) {
                               const auto r = l.qkv->head_plan().q_heads;
                               return py::make_tuple(r.begin, r.end);
                             })
      .def_property_readonly("q_norm", [](const Layer& l) { return child_of(l, l->q_norm); })
      .def_property_readonly("k_norm", [](const Layer& l) { return child_of(l, l->k_norm); })
      .def_property_readonly("qkv", [](const Layer& l) { return child_of(l, l->qkv); })
      .def_property_readonly("o_proj", [](const Layer& l) { return child_of(l, l->o_proj); })
      .def_property_readonly("gate_up", [](const Layer& l) { return child_of(l, l->gate_up); })
      .def_property_readonly("up_proj", [](const Layer& l) { return child_of(l, l->up_proj); })
      .def_property_readonly("moe", [](const Layer& l) { return child_of(l, l->moe); })
      .def_property_readonly("down_proj", [](const Layer& l) { return child_of(l, l->down_proj); })
      .def(
          "attention",
          [](DecoderLayerImpl& l, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
             const at::Tensor& sin) { return l.attention(q, k, v, cos, sin); },
          py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cos"), py::arg("sin"),
          py::call_guard<py::gil_scoped_release>(), "DecoderLayerImpl::attention: qkv's pieces -> O's input.")
      .def("__repr__",
           [](const DecoderLayerImpl& l) { return "tp::DecoderLayer(index=" + std::to_string(l.index) + ")"; });
}

}  // namespace

void init_causal_lm(py::module_& m) {
  using Release = py::call_guard<py::gil_scoped_release>;
  bind_children(m);
  py::class_<KVCache>(m, "KVCache", "Keys and values per layer (this rank's KV heads) for incremental decoding.")
      .def_readwrite("length", &KVCache::length, "Positions filled so far (the next token's position).")
      .def_property_readonly("capacity", &KVCache::capacity)
      .def_property_readonly(
          "bytes",
          [](const KVCache& c) {
            int64_t bytes = 0;
            for (const auto* side : {&c.keys, &c.values})
              for (const auto& t : *side) bytes += t.numel() * static_cast<int64_t>(t.element_size());
            return bytes;
          },
          "What this rank's keys and values hold, in bytes.");

  py::class_<LayerShare>(m, "LayerShare", "What one rank holds of one decoder layer.")
      .def_readonly("q_heads", &LayerShare::q_heads)
      .def_readonly("kv_heads", &LayerShare::kv_heads)
      .def_readonly("mlp_rows", &LayerShare::mlp_rows)
      .def_readonly("experts", &LayerShare::experts)
      .def_readonly("expert_rows", &LayerShare::expert_rows)
      .def_readonly("shared_rows", &LayerShare::shared_rows);
  py::class_<SplitPlan>(m, "SplitPlan", "Every rank's share of a model (CausalLM.split_plan()); str() prints it.")
      .def_readonly("weights", &SplitPlan::weights)
      .def_readonly("world", &SplitPlan::world)
      .def_readonly("layers", &SplitPlan::layers, "[layer][rank] LayerShare")
      .def_readonly("vocab_rows", &SplitPlan::vocab_rows)
      .def_readonly("split_bytes", &SplitPlan::split_bytes)
      .def_readonly("whole_bytes", &SplitPlan::whole_bytes)
      .def("__str__", &SplitPlan::to_string);

  py::class_<CausalLMImpl, std::shared_ptr<CausalLMImpl>>(
      m, "CausalLM", "A decoder from a Hugging Face folder, tensor-parallel; logits split over the vocabulary.")
      .def_static(
          "from_pretrained",
          [](const std::string& folder, const Communicator& comm, std::optional<at::ScalarType> dtype,
             int64_t pad_vocab_to_multiple_of, int64_t num_layers, int64_t expert_parallel_size,
             const std::string& numerics, const std::vector<double>& split_weights, int64_t attention_dp) {
            auto options = CausalLMOptions()
                               .dtype(dtype.value_or(at::ScalarType::Undefined))
                               .pad_vocab_to_multiple_of(pad_vocab_to_multiple_of)
                               .num_layers(num_layers)
                               .expert_parallel_size(expert_parallel_size)
                               .numerics(parse_numerics(numerics))
                               .split_weights(split_weights)
                               .attention_data_parallel_size(attention_dp);
            std::shared_ptr<CausalLMImpl> model;
            {
              py::gil_scoped_release no_gil;  // collective: ranks that are threads must all get there
              model = CausalLMImpl::from_pretrained(folder, options, comm);
            }
            // The model holds the communicator: destroyed without the GIL (release_gil_on_delete).
            return std::shared_ptr<CausalLMImpl>(model.get(), [keep = model](CausalLMImpl*) mutable {
              if (PyGILState_Check()) {
                py::gil_scoped_release no_gil;
                keep.reset();
              } else {
                keep.reset();
              }
            });
          },
          py::arg("folder"), py::arg("communicator"), py::arg("dtype") = std::nullopt,
          py::arg("pad_vocab_to_multiple_of") = 1, py::arg("num_layers") = 0, py::arg("expert_parallel_size") = 1,
          py::arg("numerics") = "auto", py::arg("split_weights") = std::vector<double>{},
          py::arg("attention_data_parallel_size") = 1)
      .def(
          "forward",
          [](CausalLMImpl& model, const at::Tensor& ids, KVCache* cache, int64_t logits_to_keep) {
            return model.forward(ids, cache, logits_to_keep);
          },
          py::arg("ids"), py::arg("cache") = nullptr, py::arg("logits_to_keep") = 0, Release())
      .def("gather_logits", &CausalLMImpl::gather_logits, py::arg("local_logits"), Release())
      .def(
          "argmax", [](CausalLMImpl& model, const at::Tensor& local) { return model.lm_head->argmax(local); },
          py::arg("local_logits"), Release())
      .def(
          "cross_entropy",
          [](CausalLMImpl& model, const at::Tensor& local, const at::Tensor& target, int64_t ignore_index) {
            return model.lm_head->cross_entropy(local, target, ignore_index);
          },
          py::arg("local_logits"), py::arg("target"), py::arg("ignore_index") = -100, Release())
      .def_property_readonly("embed_tokens",
                             [](const std::shared_ptr<CausalLMImpl>& lm) { return child_of(lm, lm->embed_tokens); })
      .def_property_readonly("norm", [](const std::shared_ptr<CausalLMImpl>& lm) { return child_of(lm, lm->norm); })
      .def_property_readonly("lm_head",
                             [](const std::shared_ptr<CausalLMImpl>& lm) { return child_of(lm, lm->lm_head); })
      .def_property_readonly("layers",
                             [](const std::shared_ptr<CausalLMImpl>& lm) {
                               std::vector<std::shared_ptr<DecoderLayerImpl>> out;
                               for (const auto& layer : lm->layers) out.push_back(child_of(lm, layer));
                               return out;
                             })
      .def("rotary_tables", &CausalLMImpl::rotary_tables, py::arg("positions"),
           "[(cos, sin) of the model's RoPE, of the sliding layers' (Gemma 3; else the same)], each [batch, seq, "
           "rotary_dim] for positions [batch, seq], in the model dtype.")
      .def("rotary_table_of", &CausalLMImpl::rotary_table_of, py::arg("layer"),
           "Which of rotary_tables layer `layer` reads.")
      .def("finish_logits", &CausalLMImpl::finish_logits, py::arg("local_logits"),
           "The family's final soft cap on the local logits (Gemma 2), else the logits.")
      .def_property_readonly("final_logit_softcapping",
                             [](const CausalLMImpl& lm) { return lm.config.final_logit_softcapping; })
      .def_property_readonly("embedding_scale",
                             [](const CausalLMImpl& lm) {
                               return lm.config.scale_embeddings ? std::sqrt(static_cast<double>(lm.config.hidden_size))
                                                                 : 1.0;
                             })
      .def_property_readonly("local_vocab", [](const CausalLMImpl& lm) { return lm.lm_head->vocab_range().size(); })
      .def_property_readonly("rotary_dim", [](const CausalLMImpl& lm) { return lm.config.rotary_dim; })
      .def_property_readonly("head_dim", [](const CausalLMImpl& lm) { return lm.config.head_dim; })
      .def_property_readonly("dtype", [](const CausalLMImpl& lm) { return lm.dtype; })
      .def("make_cache", &CausalLMImpl::make_cache, py::arg("batch"), py::arg("capacity"))
      .def("gather_weights", &CausalLMImpl::gather_weights, Release())
      .def("split_plan", &CausalLMImpl::split_plan, Release())
      .def(
          "load_adapter",
          [](CausalLMImpl& m, const std::string& folder, const std::string& name) { load_adapter(m, folder, name); },
          py::arg("folder"), py::arg("name"), Release())
      .def(
          "add_adapter",
          [](CausalLMImpl& m, const std::string& name, int64_t r, double alpha, bool rslora,
             const std::vector<std::string>& targets, const std::string& regex,
             const std::vector<std::string>& parameters) {
            PeftLoRAConfig config;
            config.lora.rank(r).alpha(alpha).use_rslora(rslora);
            config.target_modules = targets;
            config.target_parameters = parameters;
            if (regex == "all-linear")
              config.all_linear = true;
            else
              config.target_regex = regex;
            add_adapter(m, name, config);
          },
          py::arg("name"), py::arg("r"), py::arg("lora_alpha"), py::arg("use_rslora"), py::arg("target_modules"),
          py::arg("target_regex"), py::arg("target_parameters"), Release())
      .def(
          "gather_adapter", [](const CausalLMImpl& m, const std::string& name) { return gather_adapter(m, name); },
          py::arg("name"), Release())
      .def(
          "save_adapter",
          [](const CausalLMImpl& m, const std::string& folder, const std::string& name) {
            save_adapter(m, folder, name);
          },
          py::arg("folder"), py::arg("name"), Release())
      .def(
          "merge_adapter", [](CausalLMImpl& m, const std::string& name) { merge_adapter(m, name); }, py::arg("name"),
          Release())
      .def(
          "unmerge_adapter", [](CausalLMImpl& m, const std::string& name) { unmerge_adapter(m, name); },
          py::arg("name"), Release())
      .def_property_readonly("adapter_names", [](const CausalLMImpl& m) { return adapter_names(m); })
      .def_property_readonly("adapter_selection",
                             [](const std::shared_ptr<CausalLMImpl>& m) { return m->adapter_selection; })
      .def("reduce_data_parallel_grads", &CausalLMImpl::reduce_data_parallel_grads, Release())
      .def_property_readonly("attention_data_parallel_size", [](const CausalLMImpl& m) { return m.dp.size; })
      .def_property_readonly("attention_group", [](const CausalLMImpl& m) { return m.dp.group; })
      .def("generate_greedy", &CausalLMImpl::generate_greedy, py::arg("prompt"), py::arg("new_tokens"), Release())
      .def(
          "generate",
          [](CausalLMImpl& lm, const at::Tensor& prompt, int64_t max_new_tokens, double temperature, int64_t top_k,
             double top_p, double min_p, double repetition_penalty, uint64_t seed, std::vector<int64_t> stop_token_ids,
             int64_t pad_token_id) {
            CausalLMImpl::GenerateOptions options;
            options.max_new_tokens = max_new_tokens;
            options.sampling.temperature = temperature;
            options.sampling.top_k = top_k;
            options.sampling.top_p = top_p;
            options.sampling.min_p = min_p;
            options.sampling.repetition_penalty = repetition_penalty;
            options.sampling.seed = seed;
            options.stop_token_ids = std::move(stop_token_ids);
            options.pad_token_id = pad_token_id;
            const auto out = lm.generate(prompt, options);
            return std::make_pair(out.tokens, out.lengths);
          },
          py::arg("prompt"), py::arg("max_new_tokens"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
          py::arg("min_p"), py::arg("repetition_penalty"), py::arg("seed"), py::arg("stop_token_ids"),
          py::arg("pad_token_id"), Release())
      .def(
          "named_parameters",
          [](const CausalLMImpl& model) {
            std::vector<std::pair<std::string, at::Tensor>> out;
            for (const auto& item : model.named_parameters(/*recurse=*/true))
              out.emplace_back(item.key(), item.value());
            return out;
          },
          "(name, tensor) for every parameter (C++ module paths), the tensors forward uses.")
      .def("__repr__", [](const CausalLMImpl& m) { return to_repr([&](std::ostream& o) { m.pretty_print(o); }); });
}

}  // namespace tp::python
