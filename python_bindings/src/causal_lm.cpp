// Bindings: CausalLM (a whole decoder from a Hugging Face folder) and its KV cache.
// The tp package wraps the model in a torch.nn.Module (tp.CausalLM) whose parameters
// are the C++ module's own tensors.

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "tp/comm/communicator.h"
#include "tp/models/causal_lm.h"
#include "tp/models/kv_cache.h"

namespace py = pybind11;

namespace tp::python {

void init_causal_lm(py::module_& m) {
  using Release = py::call_guard<py::gil_scoped_release>;
  py::class_<KVCache>(m, "KVCache", "Keys and values per layer (this rank's KV heads) for incremental decoding.")
      .def_readwrite("length", &KVCache::length, "Positions filled so far (the next token's position).")
      .def_property_readonly("capacity", &KVCache::capacity);

  py::class_<CausalLMImpl, std::shared_ptr<CausalLMImpl>>(
      m, "CausalLM", "A Llama / Qwen2 / Qwen3 decoder, tensor-parallel; logits split over the vocabulary.")
      .def_static(
          "from_pretrained",
          [](const std::string& folder, const Communicator& comm, std::optional<at::ScalarType> dtype,
             int64_t pad_vocab_to_multiple_of, int64_t num_layers) {
            auto options = CausalLMOptions()
                               .dtype(dtype.value_or(at::ScalarType::Undefined))
                               .pad_vocab_to_multiple_of(pad_vocab_to_multiple_of)
                               .num_layers(num_layers);
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
          py::arg("pad_vocab_to_multiple_of") = 1, py::arg("num_layers") = 0)
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
      .def("make_cache", &CausalLMImpl::make_cache, py::arg("batch"), py::arg("capacity"))
      .def("gather_weights", &CausalLMImpl::gather_weights, Release())
      .def("generate_greedy", &CausalLMImpl::generate_greedy, py::arg("prompt"), py::arg("new_tokens"), Release())
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
