// Bindings: AllReduceStrategy, CommunicatorOptions, Communicator (its fused boundary:
// AllReduceFusionNorm / Quant / Result).
//
// A torch.distributed process group crosses by NAME (group.group_name), resolved
// here with c10d::resolve_process_group: no pybind11 holder of torch's crosses into
// this module. Collectives release the GIL.

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "tp/comm/all_reduce_fusion.h"
#include "tp/comm/all_reduce_strategy.h"
#include "tp/comm/communicator.h"

namespace py = pybind11;

namespace tp::python {
namespace {

using Release = py::call_guard<py::gil_scoped_release>;

std::shared_ptr<Communicator> from_group_name(const std::string& name, const CommunicatorOptions& options) {
  TORCH_CHECK_VALUE(!name.empty(),
                    "tp.Communicator: the process group name is empty; pass "
                    "group.group_name of a torch.distributed ProcessGroup");
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  try {
    group = c10d::resolve_process_group(name);
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false,
                      "tp.Communicator: no torch.distributed process group is registered "
                      "under the name '",
                      name,
                      "' (did this process call "
                      "torch.distributed.init_process_group?): ",
                      e.what_without_backtrace());
  }
  return release_gil_on_delete(new Communicator(group, options));
}

std::map<std::string, int64_t> counts_by_name(const Communicator& c) {
  std::map<std::string, int64_t> out;
  for (const auto& [strategy, n] : c.all_reduce_counts()) out[to_string(strategy)] = n;
  return out;
}

}  // namespace

void init_comm(py::module_& m) {
  py::enum_<AllReduceStrategy>(m, "AllReduceStrategy", "AllReduce algorithms (auto: chosen per call).")
      .value("auto", AllReduceStrategy::kAuto)
      .value("process_group", AllReduceStrategy::kProcessGroup)
      .value("shm_one_shot", AllReduceStrategy::kSharedMemoryOneShot)
      .value("shm_two_shot", AllReduceStrategy::kSharedMemoryTwoShot)
      .value("nccl", AllReduceStrategy::kNccl)
      .value("nccl_bf16_wire", AllReduceStrategy::kNcclBf16Wire)
      .value("recursive_doubling", AllReduceStrategy::kRecursiveDoubling);
  m.def("parse_all_reduce_strategy", &parse_all_reduce_strategy, py::arg("name"),
        "The strategy named `name` ('auto', 'process_group', 'shm_one_shot', 'shm_two_shot', "
        "'recursive_doubling'; case-insensitive); ValueError otherwise.");
  py::enum_<WirePrecision>(m, "WirePrecision",
                           "Precision an all_reduce's data travels in (default: the communicator's; "
                           "bf16 halves float32 bytes, relative error <= 2^-8 per rounding).")
      .value("default", WirePrecision::kDefault)
      .value("native", WirePrecision::kNative)
      .value("bf16", WirePrecision::kBFloat16);
  m.def("parse_wire_precision", &parse_wire_precision, py::arg("name"),
        "The wire precision named `name` ('default', 'native', 'bf16'; case-insensitive); ValueError otherwise.");

  py::enum_<AllReduceFusionNorm>(m, "AllReduceFusionNorm",
                                 "The norm all_reduce_fusion applies after the residual add (tp::Norm's kinds).")
      .value("none", AllReduceFusionNorm::kNone)
      .value("rms", AllReduceFusionNorm::kRMS)
      .value("rms_unit_offset", AllReduceFusionNorm::kRMSUnitOffset)
      .value("rms_scale_first", AllReduceFusionNorm::kRMSScaleFirst)
      .value("layer_norm", AllReduceFusionNorm::kLayerNorm);
  py::enum_<AllReduceFusionQuant>(m, "AllReduceFusionQuant",
                                  "The per-token quantization of norm_out all_reduce_fusion adds (quant_out, "
                                  "scale_out): the next GEMM's activation format.")
      .value("none", AllReduceFusionQuant::kNone)
      .value("fp8_per_token", AllReduceFusionQuant::kFp8PerToken)
      .value("int8_per_token", AllReduceFusionQuant::kInt8PerToken);
  const auto or_none = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
  py::class_<AllReduceFusionResult>(m, "AllReduceFusionResult",
                                    "all_reduce_fusion's outputs; None where not asked for.")
      .def_property_readonly("residual_out", [=](const AllReduceFusionResult& r) { return or_none(r.residual_out); })
      .def_property_readonly("norm_out", [=](const AllReduceFusionResult& r) { return or_none(r.norm_out); })
      .def_property_readonly("quant_out", [=](const AllReduceFusionResult& r) { return or_none(r.quant_out); })
      .def_property_readonly("scale_out", [=](const AllReduceFusionResult& r) { return or_none(r.scale_out); });

  py::class_<CommunicatorOptions>(m, "CommunicatorOptions", "Settings shared by every collective of a communicator.")
      .def(py::init([](std::optional<double> timeout_s, AllReduceStrategy all_reduce, std::optional<bool> verify_calls,
                       WirePrecision wire, std::optional<std::string> all_reduce_table,
                       std::optional<std::string> host_id) {
             CommunicatorOptions o;
             if (timeout_s) {
               TORCH_CHECK_VALUE(*timeout_s > 0, "tp.CommunicatorOptions: timeout_s=", *timeout_s,
                                 "; expected a positive number of seconds");
               o.timeout = std::chrono::milliseconds(static_cast<int64_t>(*timeout_s * 1000.0 + 0.5));
             }
             o.all_reduce = all_reduce;
             if (verify_calls) o.verify_calls = *verify_calls;
             TORCH_CHECK_VALUE(wire != WirePrecision::kDefault, "tp.CommunicatorOptions: wire must be native or bf16");
             o.wire = wire;
             if (all_reduce_table) o.all_reduce_table = *all_reduce_table;
             if (host_id) o.host_id = *host_id;
             return o;
           }),
           py::arg("timeout_s") = py::none(), py::arg("all_reduce") = AllReduceStrategy::kAuto,
           py::arg("verify_calls") = py::none(), py::arg("wire") = WirePrecision::kNative,
           py::arg("all_reduce_table") = py::none(), py::arg("host_id") = py::none(),
           "timeout_s: a collective not done by then raises RuntimeError (default TP_COMM_TIMEOUT_MS or 300 s); "
           "all_reduce: the default strategy; verify_calls: ranks check that they agree on each collective "
           "(default TP_COMM_VERIFY or on); wire: native or bf16 (TP_ALLREDUCE_WIRE overrides); "
           "all_reduce_table: a tuning table written by tp-allreduce-bench --tune (default TP_ALLREDUCE_TABLE, "
           "else built-in); host_id: this rank's host identity (default TP_COMM_HOST_ID, else hostname+boot id).")
      .def_property_readonly("timeout_s", [](const CommunicatorOptions& o) { return o.timeout.count() / 1000.0; })
      .def_readonly("all_reduce", &CommunicatorOptions::all_reduce)
      .def_readonly("verify_calls", &CommunicatorOptions::verify_calls)
      .def_readonly("wire", &CommunicatorOptions::wire)
      .def_readonly("all_reduce_table", &CommunicatorOptions::all_reduce_table)
      .def_readonly("host_id", &CommunicatorOptions::host_id);

  // Held by a shared_ptr that releases the GIL on destruction (see release_gil_on_delete).
  py::class_<Communicator, std::shared_ptr<Communicator>>(
      m, "Communicator",
      "A rank's view of its tensor-parallel group; Communicator() is world size 1 "
      "(collectives are no-ops).")
      .def(py::init([] { return release_gil_on_delete(new Communicator()); }))
      .def_static("from_group_name", &from_group_name, py::arg("group_name"),
                  py::arg("options") = CommunicatorOptions{},
                  "Wraps the torch.distributed process group registered as `group_name` (group.group_name).")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("world_size", &Communicator::world_size)
      .def_property_readonly("options", &Communicator::options)
      .def(
          "all_reduce",
          [](const Communicator& c, at::Tensor t, AllReduceStrategy strategy, WirePrecision wire) {
            return c.all_reduce(t, strategy, wire);
          },
          py::arg("tensor"), py::arg("strategy") = AllReduceStrategy::kAuto, py::arg("wire") = WirePrecision::kDefault,
          Release(), "Sums `tensor` over all ranks in place (accumulating in at least fp32) and returns it.")
      .def(
          "all_reduce_fusion",
          [](const Communicator& c, const at::Tensor& allreduce_in, std::optional<at::Tensor> bias,
             std::optional<at::Tensor> residual_in, AllReduceFusionNorm norm, std::optional<at::Tensor> norm_weight,
             std::optional<at::Tensor> norm_bias, double eps, AllReduceFusionQuant quant_out,
             AllReduceStrategy strategy, WirePrecision wire) {
            AllReduceFusionParams p;
            p.bias = bias.value_or(at::Tensor());
            p.residual_in = residual_in.value_or(at::Tensor());
            p.norm = norm;
            p.norm_weight = norm_weight.value_or(at::Tensor());
            p.norm_bias = norm_bias.value_or(at::Tensor());
            p.eps = eps;
            p.quant_out = quant_out;
            p.strategy = strategy;
            p.wire = wire;
            return c.all_reduce_fusion(allreduce_in, p);
          },
          py::arg("allreduce_in"), py::kw_only(), py::arg("bias") = py::none(), py::arg("residual_in") = py::none(),
          py::arg("norm") = AllReduceFusionNorm::kNone, py::arg("norm_weight") = py::none(),
          py::arg("norm_bias") = py::none(), py::arg("eps") = 1e-6, py::arg("quant_out") = AllReduceFusionQuant::kNone,
          py::arg("strategy") = AllReduceStrategy::kAuto, py::arg("wire") = WirePrecision::kDefault, Release(),
          "The layer boundary as one collective (FlashInfer's allreduce_fusion): sums allreduce_in over ranks, "
          "adds bias once, then residual_in (residual_out), the norm (norm_out) and its per-token quantization "
          "(quant_out, scale_out). Not differentiable. Returns an AllReduceFusionResult.")
      .def("all_gather", &Communicator::all_gather, py::arg("tensor"), py::arg("dim"), py::arg("sizes"), Release(),
           "Concatenates every rank's tensor along `dim`; sizes[r] is rank r's extent.")
      .def("reduce_scatter", &Communicator::reduce_scatter, py::arg("tensor"), py::arg("dim"), py::arg("sizes"),
           Release(), "Sums over ranks and returns this rank's slice along `dim` (sizes[r]: rank r's extent).")
      .def(
          "broadcast", [](const Communicator& c, at::Tensor t, int64_t root) { c.broadcast(t, root); },
          py::arg("tensor"), py::arg("root"), Release(), "Copies root's tensor into every rank's, in place.")
      .def("barrier", &Communicator::barrier, Release(), "Returns once every rank has called it.")
      .def("all_reduce_counts", &counts_by_name,
           "How many all_reduce calls took each strategy (after resolving auto), by name.")
      .def("resolve_all_reduce", &Communicator::resolve_all_reduce, py::arg("tensor"),
           py::arg("strategy") = AllReduceStrategy::kAuto,
           "The strategy all_reduce(tensor, strategy) would take (never auto), without communicating.")
      .def_property_readonly("ranks_on_one_host", &Communicator::ranks_on_one_host)
      .def(
          "all_reduce_wire_counts",
          [](const Communicator& c) {
            std::map<std::string, int64_t> out;
            for (const auto& [w, n] : c.all_reduce_wire_counts()) out[to_string(w)] = n;
            return out;
          },
          "How many all_reduce calls used each wire precision ('native', 'bf16').")
      .def("__repr__", [](const Communicator& c) {
        return "tp.Communicator(rank=" + std::to_string(c.rank()) + ", world_size=" + std::to_string(c.world_size()) +
               ")";
      });
}

}  // namespace tp::python
