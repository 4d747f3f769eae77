// Bindings: Checkpoint, the name -> tensor map the layers load from.

#include <memory>
#include <string>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "tp/loader/checkpoint.h"
#include "tp/loader/safetensors_writer.h"

namespace py = pybind11;

namespace tp::python {

void init_loader(py::module_& m) {
  py::class_<Checkpoint, std::shared_ptr<Checkpoint>>(
      m, "Checkpoint", "Hugging Face tensor names -> tensors. A layer's load_weights reads only its rank's slice.")
      .def(py::init<>())
      .def(py::init([](const py::dict& tensors) {
             auto ckpt = std::make_shared<Checkpoint>();
             for (const auto& [name, tensor] : tensors) ckpt->add(name.cast<std::string>(), tensor.cast<at::Tensor>());
             return ckpt;
           }),
           py::arg("tensors"), "From a dict of name -> tensor (a state_dict, say).")
      .def(
          "add", [](Checkpoint& c, const std::string& name, const at::Tensor& t) { c.add(name, t); }, py::arg("name"),
          py::arg("tensor"), "Adds `tensor` under `name` (ValueError if the name is taken).")
      .def("names", &Checkpoint::names)
      .def("__contains__", &Checkpoint::contains)
      .def("__len__", &Checkpoint::size)
      .def("__repr__", [](const Checkpoint& c) { return "tp.Checkpoint(" + std::to_string(c.size()) + " tensors)"; });

  m.def(
      "open_checkpoint", [](const std::string& path) { return std::make_shared<Checkpoint>(open_checkpoint(path)); },
      py::arg("path"), py::call_guard<py::gil_scoped_release>(),
      "Opens a .safetensors file, or a folder with model.safetensors.index.json or model.safetensors, lazily:\n"
      "each rank's load_weights then reads only its own slices from the mapped files.");
  m.def("save_safetensors", &save_safetensors, py::arg("path"), py::arg("tensors"),
        py::arg("metadata") = std::map<std::string, std::string>{}, py::call_guard<py::gil_scoped_release>(),
        "Writes name -> tensor (and optional string metadata) as one .safetensors file.");
  m.def("save_sharded_safetensors", &save_sharded_safetensors, py::arg("dir"), py::arg("tensors"),
        py::arg("max_file_bytes"), py::call_guard<py::gil_scoped_release>(),
        "Writes name -> tensor as a Hugging Face sharded checkpoint folder (model-0000i-of-0000N.safetensors "
        "of at most max_file_bytes of data each, and model.safetensors.index.json); returns the number of files.");
}

}  // namespace tp::python
