// Bindings: the four layers and their options.
//
// Each layer is bound over its Impl, held by std::shared_ptr (as torch::nn::ModuleHolder
// holds it). The tp package wraps each in a torch.nn.Module whose parameters ARE the
// tensors of this C++ module (same TensorImpl), so parameters(), state_dict(), .to()
// and optimizers see what the C++ forward uses. forward and load_weights release the GIL.

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "tp/comm/all_reduce_strategy.h"
#include "tp/comm/communicator.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/gate_up_parallel_linear.h"
#include "tp/layers/lora/lora.h"
#include "tp/layers/numerics/numerics.h"
#include "tp/layers/qkv_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"
#include "tp/loader/checkpoint.h"
#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
#include "tp/shard/split.h"

namespace py = pybind11;

namespace tp::python {
namespace {

using Release = py::call_guard<py::gil_scoped_release>;

/// A read-write property over a TORCH_ARG field.
#define TP_OPTION(cls, Options, field)                    \
  cls.def_property(                                       \
      #field, [](const Options& o) { return o.field(); }, \
      [](Options& o, std::decay_t<decltype(std::declval<const Options&>().field())> v) { o.field(std::move(v)); })

/// Options fields every layer has.
template <class Options>
py::class_<Options> bind_options(py::module_& m, const char* name, const char* doc) {
  py::class_<Options> cls(m, name, doc);
  TP_OPTION(cls, Options, bias);
  TP_OPTION(cls, Options, quant);
  TP_OPTION(cls, Options, split);
  TP_OPTION(cls, Options, dtype);
  TP_OPTION(cls, Options, device);
  TP_OPTION(cls, Options, sequence_parallel);
  TP_OPTION(cls, Options, sequence_dim);
  TP_OPTION(cls, Options, numerics);
  TP_OPTION(cls, Options, init_weights);
  return cls;
}

/// Members every layer has: construction, forward, loading, parameters, repr.
template <class Impl, class Options>
py::class_<Impl, std::shared_ptr<Impl>> bind_layer(py::module_& m, const char* name, const char* doc) {
  py::class_<Impl, std::shared_ptr<Impl>> cls(m, name, doc);
  // The layer holds a Communicator, hence maybe the last reference to its process
  // group: destroyed without the GIL (see release_gil_on_delete).
  // Construction is collective at world > 1 (a rank-local failure fails every rank):
  // without the GIL, so ranks that are threads of one process can all get there.
  cls.def(py::init([](Options options, const Communicator& comm) {
            Impl* impl = nullptr;
            {
              py::gil_scoped_release no_gil;
              impl = new Impl(std::move(options), comm);
            }
            return release_gil_on_delete(impl);
          }),
          py::arg("options"), py::arg("communicator"))
      .def(
          "forward", [](Impl& layer, const at::Tensor& x) { return layer.forward(x); }, py::arg("input"), Release(),
          "The layer's forward (GIL released, collectives included).")
      .def(
          "load_weights",
          [](Impl& layer, const Checkpoint& checkpoint, const std::string& prefix) {
            layer.load_weights(checkpoint, prefix);
          },
          py::arg("checkpoint"), py::arg("prefix"), Release(),
          "Loads this rank's slice of the checkpoint tensors under `prefix` (Hugging Face names).")
      .def("reset_parameters", &Impl::reset_parameters, "Fresh random weights (global fan-in).")
      .def_readonly("options", &Impl::options)
      .def_property_readonly("communicator",
                             [](const Impl& layer) { return release_gil_on_delete(new Communicator(layer.comm)); })
      .def_property_readonly("weight", [](const Impl& layer) { return layer.weight; })
      .def_property_readonly(
          "bias",
          [](const Impl& layer) { return layer.bias.defined() ? std::optional<at::Tensor>(layer.bias) : std::nullopt; })
      .def("named_parameters", &own_parameters<Impl>,
           "(name, tensor) for every parameter, in registration order: the tensors forward uses.")
      .def_property_readonly("lora", &lora_of<Impl>,
                             "The layer's LoRA adapters (tp/layers/lora/lora.h), cut by its own plan.")
      .def("__repr__", [](const Impl& layer) { return to_repr([&](std::ostream& o) { layer.pretty_print(o); }); });
  return cls;
}

// A LoRA factor getter as a binding: None for a segment the adapter leaves alone.
auto factor(at::Tensor (LoRAImpl::*get)(const std::string&, const std::string&) const) {
  return [get](const LoRAImpl& l, const std::string& name, const std::string& segment) -> std::optional<at::Tensor> {
    at::Tensor t = (l.*get)(name, segment);
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
  };
}

void bind_lora(py::module_& m) {
  py::class_<LoRASelection, std::shared_ptr<LoRASelection>>(
      m, "LoRASelection", "Which adapter each row of a batch takes (\"\" = none); the same on every rank.")
      .def("select", &LoRASelection::select, py::arg("name"))
      .def("select_rows", &LoRASelection::select_rows, py::arg("per_row"))
      .def("clear", &LoRASelection::clear)
      .def_property_readonly("whole", &LoRASelection::whole)
      .def_property_readonly("per_row", &LoRASelection::per_row)
      .def_property_readonly("names", &LoRASelection::names);
  py::class_<LoRAImpl, std::shared_ptr<LoRAImpl>>(m, "LoRA",
                                                  "A linear layer's LoRA adapters, cut by the layer's own plan.")
      .def("names", &LoRAImpl::names)
      .def("segment_names", &LoRAImpl::segment_names)
      .def(
          "rank", [](const LoRAImpl& l, const std::string& name) { return l.config(name).rank(); }, py::arg("name"))
      .def(
          "scaling", [](const LoRAImpl& l, const std::string& name) { return l.config(name).scaling(); },
          py::arg("name"))
      .def("lora_A", factor(&LoRAImpl::lora_A), py::arg("name"), py::arg("segment"),
           "This rank's A of the adapter's segment (None where the adapter leaves it alone).")
      .def("lora_B", factor(&LoRAImpl::lora_B), py::arg("name"), py::arg("segment"),
           "This rank's B of the adapter's segment (None where the adapter leaves it alone).")
      .def_property_readonly(
          "selection",
          [](const std::shared_ptr<LoRAImpl>& l) { return std::shared_ptr<LoRASelection>(l, &l->selection()); })
      .def("__repr__", [](const LoRAImpl& l) { return to_repr([&](std::ostream& o) { l.pretty_print(o); }); });
}

/// The column layers' pre-quantized input (the fused boundary's codes).
template <class Impl>
void bind_quantized_input(py::class_<Impl, std::shared_ptr<Impl>>& cls) {
  cls.def("input_quant", &Impl::input_quant, py::arg("input"),
          "The per-token quantization the layer's GEMM applies to an input like this (TokenQuant.none when "
          "forward_quantized takes no codes).")
      .def("forward_quantized", &Impl::forward_quantized, py::arg("codes"), py::arg("scales"), Release(),
           "forward of the input whose input_quant() quantization is codes [..., in] and scales [..., 1] "
           "(all_reduce_fusion's quant_out, scale_out): forward's bits, no backward.");
}

void bind_column(py::module_& m) {
  auto opts = bind_options<ColumnParallelLinearOptions>(m, "ColumnParallelLinearOptions",
                                                        "Options of ColumnParallelLinear; sizes are GLOBAL.");
  opts.def(py::init<int64_t, int64_t>(), py::arg("in_features"), py::arg("out_features"));
  TP_OPTION(opts, ColumnParallelLinearOptions, in_features);
  TP_OPTION(opts, ColumnParallelLinearOptions, out_features);
  TP_OPTION(opts, ColumnParallelLinearOptions, gather_output);

  auto cls = bind_layer<ColumnParallelLinearImpl, ColumnParallelLinearOptions>(
                 m, "ColumnParallelLinear",
                 "y = x W^T + b with W's rows sharded; y is this rank's slice (or all of it, gathered).")
                 .def("local_range", &ColumnParallelLinearImpl::local_range)
                 .def("ranges", &ColumnParallelLinearImpl::ranges)
                 .def("gather_weights", &ColumnParallelLinearImpl::gather_weights, py::arg("prefix"), Release(),
                      "The whole weight (and bias) under prefix + '.weight' / '.bias', on every rank (all-gathers).");
  bind_quantized_input(cls);
}

void bind_row(py::module_& m) {
  auto opts = bind_options<RowParallelLinearOptions>(m, "RowParallelLinearOptions",
                                                     "Options of RowParallelLinear; sizes are GLOBAL.");
  opts.def(py::init<int64_t, int64_t>(), py::arg("in_features"), py::arg("out_features"));
  TP_OPTION(opts, RowParallelLinearOptions, in_features);
  TP_OPTION(opts, RowParallelLinearOptions, out_features);
  TP_OPTION(opts, RowParallelLinearOptions, input_is_parallel);
  TP_OPTION(opts, RowParallelLinearOptions, reduce_output);
  TP_OPTION(opts, RowParallelLinearOptions, all_reduce);
  TP_OPTION(opts, RowParallelLinearOptions, wire);

  bind_layer<RowParallelLinearImpl, RowParallelLinearOptions>(
      m, "RowParallelLinear", "y = x W^T + b with W's columns sharded; partial sums reduced over ranks.")
      .def("local_range", &RowParallelLinearImpl::local_range)
      .def("ranges", &RowParallelLinearImpl::ranges)
      .def("gather_weights", &RowParallelLinearImpl::gather_weights, py::arg("prefix"), Release(),
           "The whole weight (and the mirrored bias) under prefix + '.weight' / '.bias', on every rank.");
}

void bind_qkv(py::module_& m) {
  auto opts = bind_options<QKVParallelLinearOptions>(m, "QKVParallelLinearOptions",
                                                     "Options of QKVParallelLinear; sizes are GLOBAL.");
  opts.def(py::init<int64_t, int64_t, int64_t, int64_t>(), py::arg("hidden_size"), py::arg("head_dim"),
           py::arg("num_heads"), py::arg("num_kv_heads"));
  TP_OPTION(opts, QKVParallelLinearOptions, hidden_size);
  TP_OPTION(opts, QKVParallelLinearOptions, head_dim);
  TP_OPTION(opts, QKVParallelLinearOptions, query_granularity);
  TP_OPTION(opts, QKVParallelLinearOptions, num_heads);
  TP_OPTION(opts, QKVParallelLinearOptions, num_kv_heads);
  TP_OPTION(opts, QKVParallelLinearOptions, gather_output);

  auto cls =
      bind_layer<QKVParallelLinearImpl, QKVParallelLinearOptions>(
          m, "QKVParallelLinear", "Fused [Q | K | V] projection, column-parallel by whole heads (GQA, KV replication).")
          .def("split", &QKVParallelLinearImpl::split, py::arg("output"), "(q, k, v) views of a forward output.")
          .def_property_readonly("head_plan", &QKVParallelLinearImpl::head_plan)
          .def_property_readonly("local_q_heads", &QKVParallelLinearImpl::local_q_heads)
          .def_property_readonly("local_kv_heads", &QKVParallelLinearImpl::local_kv_heads)
          .def("attention_output_split", &QKVParallelLinearImpl::attention_output_split,
               "The SplitPolicy that gives the O projection (RowParallelLinear) exactly this rank's query heads.")
          .def(
              "gather_weights",
              [](const QKVParallelLinearImpl& l, const std::string& prefix) { return l.gather_weights(prefix); },
              py::arg("prefix"), Release(),
              "The whole q_proj, k_proj, v_proj weights (and biases) under prefix, replicated KV heads once; every "
              "rank.");
  bind_quantized_input(cls);
}

void bind_gate_up(py::module_& m) {
  auto opts = bind_options<GateUpParallelLinearOptions>(m, "GateUpParallelLinearOptions",
                                                        "Options of GateUpParallelLinear; sizes are GLOBAL.");
  opts.def(py::init<int64_t, int64_t>(), py::arg("hidden_size"), py::arg("intermediate_size"));
  TP_OPTION(opts, GateUpParallelLinearOptions, hidden_size);
  TP_OPTION(opts, GateUpParallelLinearOptions, intermediate_size);
  TP_OPTION(opts, GateUpParallelLinearOptions, gather_output);

  auto cls =
      bind_layer<GateUpParallelLinearImpl, GateUpParallelLinearOptions>(
          m, "GateUpParallelLinear", "Fused [gate | up] projection of a gated MLP, column-parallel.")
          .def("split", &GateUpParallelLinearImpl::split, py::arg("output"), "(gate, up) views of a forward output.")
          .def("local_range", &GateUpParallelLinearImpl::local_range)
          .def(
              "gather_weights",
              [](const GateUpParallelLinearImpl& l, const std::string& prefix) { return l.gather_weights(prefix); },
              py::arg("prefix"), Release(),
              "The whole gate_proj and up_proj weights (and biases) under prefix; every rank.");
  bind_quantized_input(cls);
}

#undef TP_OPTION

}  // namespace

void init_layers(py::module_& m) {
  bind_lora(m);
  py::enum_<TokenQuant>(m, "TokenQuant",
                        "A per-token activation quantization a layer's GEMM applies first, which "
                        "forward_quantized takes done already (tp/quant/quant_method.h).")
      .value("none", TokenQuant::kNone)
      .value("fp8_e4m3", TokenQuant::kFp8E4m3)
      .value("int8", TokenQuant::kInt8);
  py::enum_<Numerics>(m, "Numerics",
                      "How a layer orders its sums (tp/layers/numerics/numerics.h): auto (TP_NUMERICS), default "
                      "(fastest), invariant (one canonical order: TP 1's bits at every TP size and batch).")
      .value("auto", Numerics::kAuto)
      .value("default", Numerics::kDefault)
      .value("invariant", Numerics::kInvariant);
  m.def(
      "parse_numerics", [](const std::string& name) { return parse_numerics(name); }, py::arg("name"),
      "\"auto\", \"default\" or \"invariant\" (case-insensitive) as a Numerics; a ValueError otherwise.");
  bind_column(m);
  bind_row(m);
  bind_qkv(m);
  bind_gate_up(m);
}

}  // namespace tp::python
