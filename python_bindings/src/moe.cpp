// Bindings: MoEParallelMLP (a mixture-of-experts MLP), its options, its router's options
// and its checkpoint layout. The tp package wraps the layer in tp.MoEParallelMLP (a
// torch.nn.Module whose parameters are this module's tensors), built from global sizes
// by a user or over a tp.CausalLM's child.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "tp/comm/communicator.h"
#include "tp/layers/moe/checkpoint_layout.h"
#include "tp/layers/moe/moe_parallel_mlp.h"
#include "tp/layers/moe/router.h"
#include "tp/loader/checkpoint.h"
#include "tp/quant/quant_config.h"

namespace py = pybind11;

namespace tp::python {
namespace {

using Release = py::call_guard<py::gil_scoped_release>;

/// A read-write property over a TORCH_ARG field.
#define TP_OPTION(cls, Options, field)                    \
  cls.def_property(                                       \
      #field, [](const Options& o) { return o.field(); }, \
      [](Options& o, std::decay_t<decltype(std::declval<const Options&>().field())> v) { o.field(std::move(v)); })

void bind_router(py::module_& m) {
  py::enum_<MoEScoring>(m, "MoEScoring",
                        "How a MoE router turns its logits into expert scores (tp/layers/moe/router.h).")
      .value("softmax", MoEScoring::kSoftmax)
      .value("softmax_of_top_k", MoEScoring::kSoftmaxOfTopK)
      .value("sigmoid", MoEScoring::kSigmoid);
  py::class_<MoERouterOptions> router(m, "MoERouterOptions",
                                      "The router of MoEParallelMLP: its scoring and the options each family sets.");
  router.def(py::init<>());
  TP_OPTION(router, MoERouterOptions, scoring);
  TP_OPTION(router, MoERouterOptions, normalize_top_k);
  TP_OPTION(router, MoERouterOptions, weights_in_input_dtype);
  TP_OPTION(router, MoERouterOptions, logits_in_float32);
  TP_OPTION(router, MoERouterOptions, bias);
  TP_OPTION(router, MoERouterOptions, score_correction_bias);
  TP_OPTION(router, MoERouterOptions, num_groups);
  TP_OPTION(router, MoERouterOptions, top_k_groups);
  TP_OPTION(router, MoERouterOptions, scaling_factor);
  router.def("__repr__", [](const MoERouterOptions& o) {
    return to_repr([&](std::ostream& out) {
      out << "tp.MoERouterOptions(scoring=" << to_string(o.scoring()) << ", normalize_top_k=" << o.normalize_top_k()
          << ", bias=" << o.bias() << ", score_correction_bias=" << o.score_correction_bias()
          << ", num_groups=" << o.num_groups() << ", top_k_groups=" << o.top_k_groups()
          << ", scaling_factor=" << o.scaling_factor() << ")";
    });
  });
}

void bind_layout(py::module_& m) {
  py::enum_<ExpertLayout>(m, "ExpertLayout", "How a checkpoint stores a block's experts: per_expert or fused (3-D).")
      .value("per_expert", ExpertLayout::kPerExpert)
      .value("fused", ExpertLayout::kFused);
  py::class_<MoECheckpointLayout> layout(m, "MoECheckpointLayout",
                                         "How a MoE checkpoint names its tensors under the block's prefix.");
  layout.def(py::init<>());
  TP_OPTION(layout, MoECheckpointLayout, router_name);
  TP_OPTION(layout, MoECheckpointLayout, experts);
  TP_OPTION(layout, MoECheckpointLayout, gate_name);
  TP_OPTION(layout, MoECheckpointLayout, up_name);
  TP_OPTION(layout, MoECheckpointLayout, down_name);
  TP_OPTION(layout, MoECheckpointLayout, gate_up_name);
  TP_OPTION(layout, MoECheckpointLayout, interleaved_gate_up);
  TP_OPTION(layout, MoECheckpointLayout, transposed);
  TP_OPTION(layout, MoECheckpointLayout, shared_expert_name);
  TP_OPTION(layout, MoECheckpointLayout, shared_expert_gate_name);
}

void bind_options(py::module_& m) {
  py::class_<MoEParallelMLPOptions> opts(
      m, "MoEParallelMLPOptions", "Options of MoEParallelMLP; sizes are GLOBAL (intermediate_size: one expert's).");
  opts.def(py::init<int64_t, int64_t, int64_t, int64_t>(), py::arg("hidden_size"), py::arg("intermediate_size"),
           py::arg("num_experts"), py::arg("top_k"));
  TP_OPTION(opts, MoEParallelMLPOptions, hidden_size);
  TP_OPTION(opts, MoEParallelMLPOptions, intermediate_size);
  TP_OPTION(opts, MoEParallelMLPOptions, num_experts);
  TP_OPTION(opts, MoEParallelMLPOptions, top_k);
  TP_OPTION(opts, MoEParallelMLPOptions, router);
  TP_OPTION(opts, MoEParallelMLPOptions, expert_parallel_size);
  TP_OPTION(opts, MoEParallelMLPOptions, split_weights);
  TP_OPTION(opts, MoEParallelMLPOptions, split_rotation);
  TP_OPTION(opts, MoEParallelMLPOptions, quant);
  TP_OPTION(opts, MoEParallelMLPOptions, expert_bias);
  TP_OPTION(opts, MoEParallelMLPOptions, activation);
  TP_OPTION(opts, MoEParallelMLPOptions, swiglu_alpha);
  TP_OPTION(opts, MoEParallelMLPOptions, swiglu_limit);
  TP_OPTION(opts, MoEParallelMLPOptions, shared_expert_intermediate_size);
  TP_OPTION(opts, MoEParallelMLPOptions, shared_expert_gate);
  TP_OPTION(opts, MoEParallelMLPOptions, shared_expert_quant);
  TP_OPTION(opts, MoEParallelMLPOptions, dtype);
  TP_OPTION(opts, MoEParallelMLPOptions, device);
}

#undef TP_OPTION

void bind_layer(py::module_& m) {
  py::class_<MoEParallelMLPImpl, std::shared_ptr<MoEParallelMLPImpl>>(
      m, "MoEParallelMLP",
      "A mixture-of-experts MLP, experts split by expert tensor and expert parallelism (tp::MoEParallelMLP).")
      // Construction is collective at world > 1: without the GIL, so ranks that are
      // threads of one process can all get there (as the linear layers).
      .def(py::init([](MoEParallelMLPOptions options, const Communicator& comm) {
             MoEParallelMLPImpl* impl = nullptr;
             {
               py::gil_scoped_release no_gil;
               impl = new MoEParallelMLPImpl(std::move(options), comm);
             }
             return release_gil_on_delete(impl);
           }),
           py::arg("options"), py::arg("communicator"))
      .def_readonly("options", &MoEParallelMLPImpl::options)
      .def_property_readonly(
          "communicator",
          [](const MoEParallelMLPImpl& moe) { return release_gil_on_delete(new Communicator(moe.comm)); })
      .def(
          "load_weights",
          [](MoEParallelMLPImpl& moe, const Checkpoint& checkpoint, const std::string& prefix,
             const MoECheckpointLayout& layout) { moe.load_weights(checkpoint, prefix, layout); },
          py::arg("checkpoint"), py::arg("prefix"), py::arg("layout") = MoECheckpointLayout(), Release(),
          "Loads the router, this rank's experts' slices and the shared expert's slice from `layout`'s names "
          "under `prefix` (strict and collective).")
      .def("reset_parameters", &MoEParallelMLPImpl::reset_parameters, Release(),
           "Fresh random weights (global fan-in).")
      .def(
          "forward", [](MoEParallelMLPImpl& moe, const at::Tensor& x) { return moe.forward(x); }, py::arg("input"),
          Release())
      .def(
          "route",
          [](const MoEParallelMLPImpl& moe, const at::Tensor& x) {
            auto [weights, experts] = moe.route(x);
            return py::make_tuple(weights, experts);
          },
          py::arg("input"), "(weights [tokens, top_k], expert ids [tokens, top_k]) of tokens [tokens, hidden].")
      .def_property_readonly("local_experts",
                             [](const MoEParallelMLPImpl& moe) {
                               return py::make_tuple(moe.local_experts().begin, moe.local_experts().end);
                             })
      .def_property_readonly(
          "local_range",
          [](const MoEParallelMLPImpl& moe) { return py::make_tuple(moe.local_range().begin, moe.local_range().end); })
      .def_property_readonly("shared_expert_range",
                             [](const MoEParallelMLPImpl& moe) {
                               return py::make_tuple(moe.shared_expert_range().begin, moe.shared_expert_range().end);
                             })
      .def_property_readonly("expert_parallel_size", &MoEParallelMLPImpl::expert_parallel_size)
      .def_property_readonly("intermediate_size",
                             [](const MoEParallelMLPImpl& moe) { return moe.options.intermediate_size(); })
      .def_property_readonly(
          "shared_expert_intermediate_size",
          [](const MoEParallelMLPImpl& moe) { return moe.options.shared_expert_intermediate_size(); })
      .def_property_readonly("quant", &MoEParallelMLPImpl::quant_name)
      .def_property_readonly("quant_config", [](const MoEParallelMLPImpl& moe) { return moe.options.quant(); })
      .def_property_readonly("shared_expert_quant_config",
                             [](const MoEParallelMLPImpl& moe) { return moe.options.shared_expert_quant(); })
      .def(
          "gather_weights",
          [](const MoEParallelMLPImpl& moe, const std::string& prefix, const MoECheckpointLayout& layout) {
            return moe.gather_weights(prefix, layout);
          },
          py::arg("prefix"), py::arg("layout") = MoECheckpointLayout(), Release(),
          "Every tensor whole under the per-expert names load_weights reads (collective).")
      .def(
          "named_parameters",
          [](const MoEParallelMLPImpl& moe) {
            std::vector<std::pair<std::string, at::Tensor>> out;
            for (const auto& item : moe.named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
            return out;
          },
          "Every parameter, the experts' in their child modules (experts.<e>.gate_up.weight, ...).")
      .def("named_buffers",
           [](const MoEParallelMLPImpl& moe) {
             std::vector<std::pair<std::string, at::Tensor>> out;
             for (const auto& item : moe.named_buffers(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
             return out;
           })
      .def("__repr__",
           [](const MoEParallelMLPImpl& moe) { return to_repr([&](std::ostream& o) { moe.pretty_print(o); }); });
}

}  // namespace

void init_moe(py::module_& m) {
  bind_router(m);
  bind_layout(m);
  bind_options(m);
  bind_layer(m);
}

}  // namespace tp::python
