// tp's operations as PyTorch custom operators (torch.ops.tp.*), so that torch.compile,
// torch.export and AOTAutograd see a tp layer as one node of known shape instead of a
// pybind11 call they cannot trace.
//
//   tp::column_parallel_linear(int module, Tensor input, Tensor[] params) -> Tensor
//   ... one op per layer kind (row, QKV, gate/up, vocab embedding, LM head, a model's
//   norm, a mixture-of-experts MLP), alike
//   tp::decoder_attention(int module, Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin,
//                         Tensor[] params) -> Tensor            a CausalLM layer's attention
//   tp::rotary_cos_sin(int module, Tensor positions) -> Tensor     a CausalLM's RoPE tables
//   tp::vocab_parallel_cross_entropy(int module, Tensor local_logits, Tensor target, int ignore_index)
//   tp::module_backward(int module, str method, Tensor[] inputs, int[] ints, Tensor[] params,
//                       Tensor grad_output, bool[] needs) -> Tensor[]
//   tp::copy_to_parallel(int comm, Tensor input) -> Tensor, and the other collectives
//
// A layer enters an op as an integer handle (op_module below), not as a script object:
// Dynamo and export take an int attribute of a module as a constant, and the handle
// keeps no reference (a destroyed layer's handle is an error naming it, not a crash).
// `params` are the layer's parameters, passed so that the graph has the data dependency
// (an optimizer step between two calls is seen) and autograd has the leaves; the C++
// forward reads the module's own tensors, so where the op gets other tensors (a graph
// replayed on copies) they stand in for the module's during the call (UseParams): the
// op computes with its arguments, never silently with the old weights.
//
// The fake (meta) kernels and the autograd formulas are registered from Python
// (tp/ops.py), next to the modules that know their output shapes; the modules call the
// ops under the compiler only (eagerly the C++ autograd runs). The ops' backward is
// module_backward: it reruns the C++ forward with autograd on and differentiates it
// (the same autograd nodes, hence the same bits, as an eager backward; the cost is one
// more forward, collectives included, per layer: RESULTS.md "2026-12-03 (night)"). The
// collectives' backward is the paired collective op, with no recompute.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros_like.h>
#include <Python.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <pybind11/stl.h>
#include <torch/autograd.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include "bindings.h"
#include "tp/comm/all_reduce_strategy.h"
#include "tp/comm/communicator.h"
#include "tp/comm/differentiable.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/gate_up_parallel_linear.h"
#include "tp/layers/moe/moe_parallel_mlp.h"
#include "tp/layers/qkv_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"
#include "tp/layers/vocab/parallel_lm_head.h"
#include "tp/layers/vocab/vocab_parallel_embedding.h"
#include "tp/models/causal_lm.h"
#include "tp/models/decoder_layer.h"
#include "tp/models/norm.h"

namespace py = pybind11;

namespace tp::python {
namespace {

/// One method of a registered module: (non-parameter tensors, integer arguments) -> output.
/// `params` gives the tensors it reads besides its inputs, the ones the op passes (in
/// that order); none where it is empty.
struct Method {
  std::function<at::Tensor(const std::vector<at::Tensor>&, c10::ArrayRef<int64_t>)> run;
  std::function<std::vector<at::Tensor>()> params;
};

/// A module the ops can call by handle.
struct OpModule {
  std::string what;                 // the C++ type, for messages
  std::weak_ptr<const void> alive;  // expired once the module is destroyed
  std::map<std::string, Method> methods;
};

/// Handles -> modules and communicators. Never holds a reference: the Python module
/// (or communicator) owns the object; a handle outliving it is a clear error.
class Registry {
 public:
  static Registry& get() {
    static Registry* registry = new Registry();  // never destroyed: ops may run at exit
    return *registry;
  }

  int64_t add(std::shared_ptr<const OpModule> module) {
    std::lock_guard<std::mutex> lock(mutex_);
    sweep();
    modules_[next_] = std::move(module);
    return next_++;
  }

  int64_t add(const std::shared_ptr<Communicator>& comm) {
    std::lock_guard<std::mutex> lock(mutex_);
    sweep();
    comms_[next_] = comm;
    return next_++;
  }

  std::shared_ptr<const OpModule> module(int64_t handle) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = modules_.find(handle);
    TORCH_CHECK_VALUE(it != modules_.end(), "tp op: no tp module has handle ", handle,
                      " (handles belong to one process; an exported program runs where it was exported)");
    TORCH_CHECK_VALUE(!it->second->alive.expired(), "tp op: the ", it->second->what, " of handle ", handle,
                      " was destroyed; a compiled or exported graph must not outlive its modules");
    return it->second;
  }

  std::shared_ptr<Communicator> comm(int64_t handle) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = comms_.find(handle);
    TORCH_CHECK_VALUE(it != comms_.end(), "tp op: no tp.Communicator has handle ", handle);
    auto comm = it->second.lock();
    TORCH_CHECK_VALUE(comm != nullptr, "tp op: the tp.Communicator of handle ", handle, " was destroyed");
    return comm;
  }

 private:
  void sweep() {
    for (auto it = modules_.begin(); it != modules_.end();)
      it = it->second->alive.expired() ? modules_.erase(it) : std::next(it);
    for (auto it = comms_.begin(); it != comms_.end();) it = it->second.expired() ? comms_.erase(it) : std::next(it);
  }

  mutable std::mutex mutex_;
  int64_t next_ = 1;
  std::map<int64_t, std::shared_ptr<const OpModule>> modules_;
  std::map<int64_t, std::weak_ptr<Communicator>> comms_;
};

/// A layer's LoRA factors (its child "lora", once registered: tp/layers/lora/lora.h), in
/// registration order: op parameters, so a traced graph's gradients reach them.
void append_lora(const torch::nn::Module& impl, std::vector<at::Tensor>& out) {
  const auto children = impl.named_children();
  if (const auto* lora = children.find("lora"))
    for (const auto& p : (*lora)->parameters()) out.push_back(p);
}

template <class Impl>
std::function<std::vector<at::Tensor>()> own_params(const std::weak_ptr<Impl>& weak, bool recurse = false) {
  return [weak, recurse] {
    std::vector<at::Tensor> out;
    if (auto impl = weak.lock()) {
      for (const auto& item : impl->named_parameters(recurse)) out.push_back(item.value());
      if (!recurse) append_lora(*impl, out);
    }
    return out;
  };
}

/// A new OpModule for `impl` (which must exist), named `what` in messages.
template <class Impl>
std::shared_ptr<OpModule> new_module(const std::shared_ptr<Impl>& impl, std::string what) {
  TORCH_CHECK_VALUE(impl != nullptr, "tp.op_module: expected a ", what);
  auto module = std::make_shared<OpModule>();
  module->what = std::move(what);
  module->alive = impl;
  return module;
}

/// The handle of a module whose one method is forward(x); its parameters are its own
/// (`recurse`: with its children's).
template <class Impl>
int64_t forward_module(const std::shared_ptr<Impl>& impl, const char* what, bool recurse = false) {
  auto module = new_module(impl, what);
  std::weak_ptr<Impl> weak = impl;
  module->methods["forward"] = {
      [weak](const std::vector<at::Tensor>& in, c10::ArrayRef<int64_t>) { return weak.lock()->forward(in.at(0)); },
      own_params(weak, recurse)};
  return Registry::get().add(std::move(module));
}

int64_t head_module(const std::shared_ptr<ParallelLMHeadImpl>& impl) {
  auto module = new_module(impl, "ParallelLMHead");
  std::weak_ptr<ParallelLMHeadImpl> weak = impl;
  module->methods["forward"] = {
      [weak](const std::vector<at::Tensor>& in, c10::ArrayRef<int64_t>) { return weak.lock()->forward(in.at(0)); },
      // Its one parameter, also when tied (the embedding's, registered there), and its adapters'.
      [weak] {
        auto head = weak.lock();
        std::vector<at::Tensor> out{head->weight};
        append_lora(*head, out);
        return out;
      }};
  module->methods["cross_entropy"] = {[weak](const std::vector<at::Tensor>& in, c10::ArrayRef<int64_t> ints) {
                                        return weak.lock()->cross_entropy(in.at(0), in.at(1), ints.at(0));
                                      },
                                      {}};  // its parameter: forward's
  return Registry::get().add(std::move(module));
}

/// A decoder layer's attention (DecoderLayerImpl::attention): q, k, v, cos, sin; its
/// parameters are the q/k norm weights (Qwen3, Gemma 3) and the sinks (GPT-OSS).
int64_t attention_module(const std::shared_ptr<DecoderLayerImpl>& impl) {
  auto module = new_module(impl, impl ? "DecoderLayer " + std::to_string(impl->index) : "DecoderLayer");
  std::weak_ptr<DecoderLayerImpl> weak = impl;
  module->methods["attention"] = {[weak](const std::vector<at::Tensor>& in, c10::ArrayRef<int64_t>) {
                                    return weak.lock()->attention(in.at(0), in.at(1), in.at(2), in.at(3), in.at(4));
                                  },
                                  [weak] {
                                    auto layer = weak.lock();
                                    auto params = layer->qk_norm() ? std::vector<at::Tensor>{layer->q_norm->weight,
                                                                                             layer->k_norm->weight}
                                                                   : std::vector<at::Tensor>{};
                                    if (layer->sinks.defined()) params.push_back(layer->sinks);
                                    return params;
                                  }};
  return Registry::get().add(std::move(module));
}

/// A model's rotary tables: positions [batch, seq] -> stack(cos, sin, local cos, local sin)
/// [4, batch, seq, rotary_dim] (CausalLMImpl::rotary_tables).
int64_t model_module(const std::shared_ptr<CausalLMImpl>& impl) {
  auto module = new_module(impl, "CausalLM");
  std::weak_ptr<CausalLMImpl> weak = impl;
  module->methods["rotary"] = {
      [weak](const std::vector<at::Tensor>& in, c10::ArrayRef<int64_t>) {
        auto model = weak.lock();
        const auto tables = model->rotary_tables(in.at(0));
        return at::stack({tables.at(0).first, tables.at(0).second, tables.at(1).first, tables.at(1).second});
      },
      {}};  // no parameters
  return Registry::get().add(std::move(module));
}

/// For the duration of a call, the module's own tensors hold the data of the ones passed
/// to the op, where those are not the module's tensors already: the op then computes
/// with its arguments, as an operator must (a traced graph replayed on cloned or new
/// weights, opcheck's copies). In the compiled and eager paths they are the module's
/// own tensors and nothing is swapped. Kernel-side copies (prepacked weights) follow,
/// since their stamps name the storage (cpu/tensor_stamp.h). Not for concurrent calls
/// of one module with different weights.
class UseParams {
 public:
  UseParams(const OpModule& module, const Method& method, int64_t handle, at::TensorList passed)
      : own_(method.params ? method.params() : std::vector<at::Tensor>{}) {
    TORCH_CHECK_VALUE(passed.size() == own_.size(), "tp op: ", module.what, " (handle ", handle, ") takes ",
                      own_.size(), " parameters here; the op got ", passed.size());
    for (size_t i = 0; i < own_.size(); ++i) {
      const at::Tensor& p = passed[i];
      const at::Tensor& o = own_[i];
      TORCH_CHECK_VALUE(
          p.defined() && p.sizes() == o.sizes() && p.scalar_type() == o.scalar_type() && p.device() == o.device(),
          "tp op: parameter ", i, " passed to ", module.what, " (handle ", handle, ") is ",
          p.defined() ? p.toString() : std::string("undefined"), " ", p.defined() ? p.sizes() : c10::IntArrayRef{},
          "; the module's is ", o.toString(), " ", o.sizes());
      if (p.data_ptr() == o.data_ptr() && p.strides() == o.strides()) continue;
      saved_.emplace_back(i, o.detach());  // shares the storage and version counter
      own_[i].set_data(p);
    }
  }
  ~UseParams() {
    for (auto& [i, data] : saved_) own_[i].set_data(data);
  }
  UseParams(const UseParams&) = delete;
  UseParams& operator=(const UseParams&) = delete;

  const std::vector<at::Tensor>& own() const { return own_; }

 private:
  std::vector<at::Tensor> own_;
  std::vector<std::pair<size_t, at::Tensor>> saved_;
};

/// Releases the GIL for a kernel's duration where the calling thread holds it (a call
/// from Python; the autograd engine's threads do not): the collectives wait for the
/// other ranks, which may be threads of this process.
class WithoutGil {
 public:
  WithoutGil() {
    if (PyGILState_Check()) release_.emplace();
  }

 private:
  std::optional<py::gil_scoped_release> release_;
};

/// `out` unless it shares storage with one of `inputs` (an op's output must be fresh).
at::Tensor fresh(at::Tensor out, at::TensorList inputs) {
  for (const auto& t : inputs)
    if (t.defined() && out.is_alias_of(t)) return out.clone();
  return out;
}

at::Tensor call(int64_t handle, const std::string& method, std::vector<at::Tensor> inputs, c10::ArrayRef<int64_t> ints,
                at::TensorList params) {
  const auto module = Registry::get().module(handle);
  auto it = module->methods.find(method);
  TORCH_CHECK_VALUE(it != module->methods.end(), "tp op: ", module->what, " has no method ", method);
  const UseParams use(*module, it->second, handle, params);
  const WithoutGil no_gil;
  at::NoGradGuard no_grad;  // the op's own autograd formula (tp/ops.py) is the graph
  at::Tensor out = it->second.run(inputs, ints);
  out = fresh(out, inputs);
  return fresh(out, params);
}

at::Tensor module_forward(int64_t handle, const at::Tensor& input, at::TensorList params) {
  return call(handle, "forward", {input}, {}, params);
}

at::Tensor attention_op(int64_t handle, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& cos, const at::Tensor& sin, at::TensorList params) {
  return call(handle, "attention", {q, k, v, cos, sin}, {}, params);
}

at::Tensor rotary_op(int64_t handle, const at::Tensor& positions) {
  return call(handle, "rotary", {positions}, {}, {});
}

at::Tensor cross_entropy_op(int64_t handle, const at::Tensor& local_logits, const at::Tensor& target,
                            int64_t ignore_index) {
  return call(handle, "cross_entropy", {local_logits, target}, {ignore_index}, {});
}

/// The gradients of `method` at `inputs` (then the module's parameters), for those with
/// needs[i], in that order: the C++ forward rerun with autograd on, differentiated.
std::vector<at::Tensor> module_backward(int64_t handle, const std::string& method, at::TensorList inputs,
                                        c10::ArrayRef<int64_t> ints, at::TensorList params,
                                        const at::Tensor& grad_output, const c10::List<bool>& needs) {
  const auto module = Registry::get().module(handle);
  auto it = module->methods.find(method);
  TORCH_CHECK_VALUE(it != module->methods.end(), "tp op: ", module->what, " has no method ", method);
  const UseParams use(*module, it->second, handle, params);
  TORCH_CHECK_VALUE(needs.size() == inputs.size() + params.size(), "tp::module_backward: ", needs.size(), " needs for ",
                    inputs.size(), " inputs and ", params.size(), " parameters");
  // This kernel runs below the autograd keys; the rerun must record a graph.
  const auto tls = c10::impl::tls_local_dispatch_key_set();
  c10::impl::ForceDispatchKeyGuard keys(tls.included_,
                                        tls.excluded_ - c10::autograd_dispatch_keyset_with_ADInplaceOrView);
  at::AutoGradMode grad_mode(true);
  std::vector<at::Tensor> fresh_inputs, leaves;
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor x = inputs[i].detach();
    if (needs.get(i)) {
      x.requires_grad_(true);
      leaves.push_back(x);
    }
    fresh_inputs.push_back(x);
  }
  const std::vector<at::Tensor>& own = use.own();
  for (size_t j = 0; j < own.size(); ++j) {
    if (!needs.get(inputs.size() + j)) continue;
    TORCH_CHECK_VALUE(own[j].requires_grad(), "tp::module_backward: a gradient was asked for parameter ", j, " of ",
                      module->what, ", which does not require grad");
    leaves.push_back(own[j]);
  }
  if (leaves.empty()) return {};
  const WithoutGil no_gil;
  const at::Tensor out = it->second.run(fresh_inputs, ints);
  std::vector<at::Tensor> grads;
  if (out.requires_grad())
    grads = torch::autograd::grad({out}, leaves, {grad_output}, /*retain_graph=*/false, /*create_graph=*/false,
                                  /*allow_unused=*/true);
  else
    grads.resize(leaves.size());
  for (size_t i = 0; i < grads.size(); ++i)
    if (!grads[i].defined()) grads[i] = at::zeros_like(leaves[i]);
  return grads;
}

/// The collectives run without their C++ autograd nodes: the ops' formulas pair them.
template <class F>
at::Tensor collective(const at::Tensor& input, F&& f) {
  const WithoutGil no_gil;
  at::NoGradGuard no_grad;
  return fresh(f(), {input});
}

at::Tensor copy_op(int64_t comm, const at::Tensor& input) {
  Registry::get().comm(comm);  // the handle is checked even where nothing is sent
  return input.clone();
}

at::Tensor reduce_op(int64_t comm, const at::Tensor& input, int64_t strategy, int64_t wire) {
  auto c = Registry::get().comm(comm);
  return collective(input, [&] {
    return reduce_from_parallel(input, *c, static_cast<AllReduceStrategy>(strategy), static_cast<WirePrecision>(wire));
  });
}

/// A collective over `sizes[r]` entries per rank along `dim` (gathers, scatters,
/// reduce-scatters alike).
template <at::Tensor (*F)(const at::Tensor&, const Communicator&, int64_t, const std::vector<int64_t>&)>
at::Tensor sized_op(int64_t comm, const at::Tensor& input, int64_t dim, c10::ArrayRef<int64_t> sizes) {
  auto c = Registry::get().comm(comm);
  return collective(input, [&] { return F(input, *c, dim, sizes.vec()); });
}

}  // namespace

void init_ops(py::module_& m) {
  // The handle torch.ops.tp.* take for a module (no reference is kept), one overload per type.
  m.def("op_module",
        [](const std::shared_ptr<ColumnParallelLinearImpl>& l) { return forward_module(l, "ColumnParallelLinear"); });
  m.def("op_module",
        [](const std::shared_ptr<RowParallelLinearImpl>& l) { return forward_module(l, "RowParallelLinear"); });
  m.def("op_module",
        [](const std::shared_ptr<QKVParallelLinearImpl>& l) { return forward_module(l, "QKVParallelLinear"); });
  m.def("op_module",
        [](const std::shared_ptr<GateUpParallelLinearImpl>& l) { return forward_module(l, "GateUpParallelLinear"); });
  m.def("op_module", [](const std::shared_ptr<VocabParallelEmbeddingImpl>& l) {
    return forward_module(l, "VocabParallelEmbedding");
  });
  m.def("op_module", &head_module);
  m.def("op_module", [](const std::shared_ptr<NormImpl>& l) { return forward_module(l, "Norm"); });
  m.def("op_module", [](const std::shared_ptr<MoEParallelMLPImpl>& l) {
    return forward_module(l, "MoEParallelMLP", /*recurse=*/true);  // the experts' tensors live in child modules
  });
  m.def("op_module", &attention_module);
  m.def("op_module", &model_module);
  m.def(
      "op_communicator", [](const std::shared_ptr<Communicator>& c) { return Registry::get().add(c); },
      py::arg("communicator"), "The handle the collective ops take for this communicator (no reference is kept).");
}

}  // namespace tp::python

TORCH_LIBRARY(tp, m) {
  for (const char* layer :
       {"column_parallel_linear", "row_parallel_linear", "qkv_parallel_linear", "gate_up_parallel_linear",
        "vocab_parallel_embedding", "parallel_lm_head", "norm", "moe_parallel_mlp"})
    m.def((std::string(layer) + "(int module, Tensor input, Tensor[] params) -> Tensor").c_str());
  m.def(
      "decoder_attention(int module, Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin, Tensor[] params) -> "
      "Tensor");
  m.def("rotary_cos_sin(int module, Tensor positions) -> Tensor");
  m.def("vocab_parallel_cross_entropy(int module, Tensor local_logits, Tensor target, int ignore_index) -> Tensor");
  m.def(
      "module_backward(int module, str method, Tensor[] inputs, int[] ints, Tensor[] params, Tensor grad_output, "
      "bool[] needs) -> Tensor[]");
  m.def("copy_to_parallel(int comm, Tensor input) -> Tensor");
  m.def("reduce_from_parallel(int comm, Tensor input, int strategy, int wire) -> Tensor");
  m.def("gather_from_parallel(int comm, Tensor input, int dim, int[] sizes) -> Tensor");
  m.def("scatter_to_parallel(int comm, Tensor input, int dim, int[] sizes) -> Tensor");
  m.def("gather_from_sequence_parallel(int comm, Tensor input, int dim, int[] sizes) -> Tensor");
  m.def("reduce_scatter_to_sequence_parallel(int comm, Tensor input, int dim, int[] sizes) -> Tensor");
}

// CompositeExplicitAutograd: one kernel for every device (the C++ layers dispatch on
// their own); the Autograd and Meta/Fake entries come from tp/ops.py.
TORCH_LIBRARY_IMPL(tp, CompositeExplicitAutograd, m) {
  using namespace tp::python;
  for (const char* layer :
       {"column_parallel_linear", "row_parallel_linear", "qkv_parallel_linear", "gate_up_parallel_linear",
        "vocab_parallel_embedding", "parallel_lm_head", "norm", "moe_parallel_mlp"})
    m.impl(layer, TORCH_FN(module_forward));
  m.impl("decoder_attention", TORCH_FN(attention_op));
  m.impl("rotary_cos_sin", TORCH_FN(rotary_op));
  m.impl("vocab_parallel_cross_entropy", TORCH_FN(cross_entropy_op));
  m.impl("module_backward", TORCH_FN(module_backward));
  m.impl("copy_to_parallel", TORCH_FN(copy_op));
  m.impl("reduce_from_parallel", TORCH_FN(reduce_op));
  m.impl("gather_from_parallel", TORCH_FN(sized_op<&tp::gather_from_parallel>));
  m.impl("scatter_to_parallel", TORCH_FN(sized_op<&tp::scatter_to_parallel>));
  m.impl("gather_from_sequence_parallel", TORCH_FN(sized_op<&tp::gather_from_sequence_parallel>));
  m.impl("reduce_scatter_to_sequence_parallel", TORCH_FN(sized_op<&tp::reduce_scatter_to_sequence_parallel>));
}
