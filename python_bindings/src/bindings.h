#pragma once
// Private to the extension: one init function per area, called from module.cpp.

#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <Python.h>
#include <pybind11/pybind11.h>

#include "tp/layers/lora/lora.h"

namespace tp::python {

/// AllReduceStrategy, CommunicatorOptions, Communicator (from a process group name).
void init_comm(pybind11::module_& m);
/// QuantFormat, GptqFormat, BlockScaleName, QuantConfig, Range, SplitPolicy, HeadPlan.
void init_config(pybind11::module_& m);
/// Checkpoint (name -> tensor sources), LoadSession.
void init_loader(pybind11::module_& m);
/// Numerics, the four layers and their options.
void init_layers(pybind11::module_& m);
/// VocabParallelEmbedding, ParallelLMHead, VocabPartition, the vocab-parallel loss and argmax.
void init_vocab(pybind11::module_& m);
/// MoEParallelMLP, its options, MoERouterOptions and MoECheckpointLayout (after init_loader and init_config).
void init_moe(pybind11::module_& m);
/// ModelConfig, its quantization and DecoderLayerOptions (after init_layers: it returns layer options).
void init_models(pybind11::module_& m);
/// CausalLM (after init_vocab and init_models) and KVCache.
void init_causal_lm(pybind11::module_& m);
/// The differentiable collectives and the sequence-parallel token rule.
void init_differentiable(pybind11::module_& m);
/// op_module / op_communicator: the handles of the torch.ops.tp operators (ops.cpp).
void init_ops(pybind11::module_& m);

/// `p` owned by a shared_ptr whose deleter releases the GIL while `*p` is destroyed.
///
/// Anything that may hold the last reference to a process group needs it: the
/// group's destructor joins Gloo's worker thread, which may itself be dropping the
/// last reference to a tensor that has a Python object (a forward's output), and
/// that needs the GIL. Destroyed with the GIL held, the two wait on each other
/// forever (torch binds its ProcessGroup with the same kind of holder,
/// IntrusivePtrNoGilDestructor, for the same reason).
template <class T>
std::shared_ptr<T> release_gil_on_delete(T* p) {
  return std::shared_ptr<T>(p, [](T* q) {
    if (PyGILState_Check()) {
      pybind11::gil_scoped_release no_gil;
      delete q;
    } else {
      delete q;
    }
  });
}

/// A layer's `lora` property: its LoRA adapters (tp/layers/lora/lora.h), kept alive by the
/// layer; the first call registers them as the layer's child "lora".
template <class Impl>
std::shared_ptr<LoRAImpl> lora_of(const std::shared_ptr<Impl>& layer) {
  LoRAImpl& lora = layer->lora();
  return std::shared_ptr<LoRAImpl>(layer, &lora);
}

/// (name, tensor) of a torch::nn::Module's own parameters (not its children's), in
/// registration order: what the tp package registers as the Python module's parameters.
template <class Impl>
std::vector<std::pair<std::string, at::Tensor>> own_parameters(const Impl& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module.named_parameters(/*recurse=*/false)) out.emplace_back(item.key(), item.value());
  return out;
}

/// What `print(stream)` writes, as a string (for __repr__).
template <class F>
std::string to_repr(F&& print) {
  std::ostringstream out;
  print(out);
  return out.str();
}

}  // namespace tp::python
