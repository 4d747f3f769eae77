// Bindings: QuantFormat, GptqFormat, BlockScaleName, QuantConfig, Range, SplitPolicy,
// HeadPlan (plain values).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "tp/quant/quant_config.h"
#include "tp/quant/stored_tensors.h"
#include "tp/shard/heads.h"
#include "tp/shard/range.h"
#include "tp/shard/split.h"

namespace py = pybind11;

namespace tp::python {

void init_config(py::module_& m) {
  // The values come from the library's format table, so a new format needs no binding.
  py::enum_<QuantFormat> formats(m, "QuantFormat", "Weight formats (none: the layer's dtype, GEMM by at::linear).");
  for (QuantFormat f : all_quant_formats()) formats.value(to_string(f), f);

  py::enum_<GptqFormat>(m, "GptqFormat",
                        "How a GPTQ checkpoint stores zero points: v1 ('gptq', zero - 1) or v2 ('gptq_v2').")
      .value("v1", GptqFormat::kV1)
      .value("v2", GptqFormat::kV2);
  py::enum_<BlockScaleName>(m, "BlockScaleName",
                            "The tensor name of an FP8 block scale: weight_scale_inv (HF / DeepSeek) or "
                            "weight_scale (compressed-tensors).")
      .value("weight_scale_inv", BlockScaleName::kWeightScaleInv)
      .value("weight_scale", BlockScaleName::kWeightScale);
  py::enum_<Nvfp4Dialect>(m, "Nvfp4Dialect",
                          "Who wrote an NVFP4 checkpoint: compressed_tensors (weight_global_scale divides) or "
                          "modelopt (weight_scale_2 multiplies).")
      .value("compressed_tensors", Nvfp4Dialect::kCompressedTensors)
      .value("modelopt", Nvfp4Dialect::kModelOpt);

  py::class_<QuantConfig>(m, "QuantConfig",
                          "Selects a layer's weight format (INT4: group_size and symmetric; int4_gptq: "
                          "gptq_format; fp8_block: block_scale_name; nvfp4: nvfp4_dialect).")
      .def(py::init([](QuantFormat format, int64_t group_size, bool symmetric, GptqFormat gptq_format,
                       BlockScaleName block_scale_name, Nvfp4Dialect nvfp4_dialect) {
             QuantConfig c{format, group_size, symmetric};
             c.gptq_format = gptq_format;
             c.block_scale_name = block_scale_name;
             c.nvfp4_dialect = nvfp4_dialect;
             return c;
           }),
           py::arg("format") = QuantFormat::kNone, py::arg("group_size") = 128, py::arg("symmetric") = true,
           py::arg("gptq_format") = GptqFormat::kV1, py::arg("block_scale_name") = BlockScaleName::kWeightScaleInv,
           py::arg("nvfp4_dialect") = Nvfp4Dialect::kCompressedTensors)
      .def_static("parse", &parse_quant_config, py::arg("text"),
                  "From a name like 'int4_gptq:g64:asym:v2', 'fp8_block:weight_scale' or 'int4_pack_quantized'.")
      .def_readwrite("format", &QuantConfig::format)
      .def_readwrite("group_size", &QuantConfig::group_size)
      .def_readwrite("symmetric", &QuantConfig::symmetric)
      .def_readwrite("gptq_format", &QuantConfig::gptq_format)
      .def_readwrite("block_scale_name", &QuantConfig::block_scale_name)
      .def_readwrite("nvfp4_dialect", &QuantConfig::nvfp4_dialect)
      .def(py::self == py::self)
      .def(py::self != py::self)
      .def("__hash__", [](const QuantConfig& q) { return std::hash<std::string>()(to_string(q)); })
      .def("__str__", [](const QuantConfig& q) { return to_string(q); })
      .def("__repr__", [](const QuantConfig& q) { return "tp.QuantConfig.parse('" + to_string(q) + "')"; });

  // The format table's declaration of each format's stored tensors (tp/quant/stored_tensors.h):
  // what tp.dcp splits, tensor by tensor.
  m.def(
      "stored_tensors",
      [](const QuantConfig& config) {
        auto dim = [](int64_t d) { return d < 0 ? py::object(py::none()) : py::object(py::int_(d)); };
        py::list out;
        for (const auto& t : stored_tensors(config))
          out.append(py::make_tuple(t.name, dim(t.out_dim), t.out_per_index, dim(t.in_dim), t.in_per_index));
        return out;
      },
      py::arg("config"),
      "[(name, out_dim, out_per_index, in_dim, in_per_index)] of every tensor `config`'s format registers on a "
      "layer: the dimension carrying the output features (None: none) and the features one index covers, the "
      "same for the input features.");
  m.def("quantized_tensor_names", &quantized_tensor_names,
        "Checkpoint tensor names (after a layer's prefix) that only quantized formats store (strict loading's list).");

  py::class_<Range>(m, "Range", "A half-open interval [begin, end) of elements along one dimension.")
      .def(py::init([](int64_t begin, int64_t end) {
             return Range{begin, end};
           }),
           py::arg("begin"), py::arg("end"))
      .def_readonly("begin", &Range::begin)
      .def_readonly("end", &Range::end)
      .def("size", &Range::size)
      .def("__len__", &Range::size)
      .def("__iter__", [](const Range& r) { return py::iter(py::make_tuple(r.begin, r.end)); })
      .def(py::self == py::self)
      .def(py::self != py::self)
      .def("__repr__", [](const Range& r) { return to_repr([&](std::ostream& o) { o << "tp.Range" << r; }); });

  py::class_<SplitPolicy>(m, "SplitPolicy",
                          "How one dimension is split: granularity (every boundary a multiple of it), "
                          "per-rank weights (empty: even), rotation (which rank takes the remainder first).")
      .def(py::init([](int64_t granularity, std::vector<double> weights, int64_t rotation) {
             SplitPolicy p;
             p.granularity = granularity;
             p.weights = std::move(weights);
             p.rotation = rotation;
             return p;
           }),
           py::arg("granularity") = 1, py::arg("weights") = std::vector<double>{}, py::arg("rotation") = 0)
      .def_readwrite("granularity", &SplitPolicy::granularity)
      .def_readwrite("weights", &SplitPolicy::weights)
      .def_readwrite("rotation", &SplitPolicy::rotation)
      .def("__repr__", [](const SplitPolicy& p) {
        return to_repr([&](std::ostream& o) {
          o << "tp.SplitPolicy(granularity=" << p.granularity << ", weights=[";
          for (size_t i = 0; i < p.weights.size(); ++i) o << (i ? ", " : "") << p.weights[i];
          o << "], rotation=" << p.rotation << ")";
        });
      });

  m.def("split", &split, py::arg("total"), py::arg("world"), py::arg("policy") = SplitPolicy{},
        py::arg("what") = "dimension",
        "Splits [0, total) into `world` ranges, in rank order (ValueError if it cannot).");

  py::class_<HeadPlan>(m, "HeadPlan", "Which attention heads one rank owns.")
      .def_readonly("num_heads", &HeadPlan::num_heads)
      .def_readonly("num_kv_heads", &HeadPlan::num_kv_heads)
      .def_readonly("head_dim", &HeadPlan::head_dim)
      .def_readonly("world", &HeadPlan::world)
      .def_readonly("rank", &HeadPlan::rank)
      .def_readonly("q_heads", &HeadPlan::q_heads)
      .def_readonly("kv_heads", &HeadPlan::kv_heads)
      .def_readonly("kv_replicas", &HeadPlan::kv_replicas)
      .def("__repr__", [](const HeadPlan& h) {
        return to_repr([&](std::ostream& o) {
          o << "tp.HeadPlan(q_heads=" << h.q_heads << ", kv_heads=" << h.kv_heads << ", kv_replicas=" << h.kv_replicas
            << ", rank=" << h.rank << "/" << h.world << ")";
        });
      });
}

}  // namespace tp::python
