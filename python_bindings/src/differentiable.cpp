// Bindings: the differentiable collectives (tp/comm/differentiable.h) and the
// sequence-parallel token rule (tp/layers/sequence_parallel.h).
//
// The returned tensors carry the C++ autograd nodes, so loss.backward() in Python runs
// the C++ backward (and its collectives), with the GIL released by torch's engine.
// The forwards release the GIL too.

#include <cstdint>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "tp/comm/all_reduce_strategy.h"
#include "tp/comm/communicator.h"
#include "tp/comm/differentiable.h"
#include "tp/layers/sequence_parallel.h"

namespace py = pybind11;

namespace tp::python {

void init_differentiable(py::module_& m) {
  using Release = py::call_guard<py::gil_scoped_release>;
  m.def("copy_to_parallel", &copy_to_parallel, py::arg("input"), py::arg("communicator"), Release(),
        "Identity forward; the backward all-reduces the gradient (Megatron's f).");
  m.def("reduce_from_parallel", &reduce_from_parallel, py::arg("input"), py::arg("communicator"),
        py::arg("strategy") = AllReduceStrategy::kAuto, py::arg("wire") = WirePrecision::kDefault, Release(),
        "All-reduce forward (a new tensor); identity backward (Megatron's g).");
  m.def("gather_from_parallel", &gather_from_parallel, py::arg("input"), py::arg("communicator"), py::arg("dim"),
        py::arg("sizes") = std::vector<int64_t>{}, Release(),
        "All-gather along dim (sizes[r]: rank r's extent; empty: exchanged); backward: this rank's piece.");
  m.def("scatter_to_parallel", &scatter_to_parallel, py::arg("input"), py::arg("communicator"), py::arg("dim"),
        py::arg("sizes"), Release(), "This rank's piece along dim (sizes[r] per rank); backward all-gathers.");
  m.def("gather_from_sequence_parallel", &gather_from_sequence_parallel, py::arg("input"), py::arg("communicator"),
        py::arg("dim"), py::arg("sizes") = std::vector<int64_t>{}, Release(),
        "All-gather the token pieces along dim (empty sizes: exchanged); backward reduce-scatters.");
  m.def("reduce_scatter_to_sequence_parallel", &reduce_scatter_to_sequence_parallel, py::arg("input"),
        py::arg("communicator"), py::arg("dim"), py::arg("sizes"), Release(),
        "Sum over ranks, this rank's tokens along dim (sizes[r] per rank); backward all-gathers.");
  m.def("exchange_sizes", &exchange_sizes, py::arg("input"), py::arg("communicator"), py::arg("dim"), Release(),
        "Every rank's extent of input along dim (one small all-gather).");
  m.def("sequence_ranges", &sequence_ranges, py::arg("tokens"), py::arg("world_size"),
        "Every rank's tokens [begin, end) of a sequence-parallel split of `tokens` (even: the first "
        "tokens % world_size ranks get one more).");
  m.def("sequence_sizes", &sequence_sizes, py::arg("tokens"), py::arg("world_size"),
        "The sizes of sequence_ranges(tokens, world_size).");
}

}  // namespace tp::python
