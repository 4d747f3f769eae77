// Bindings: Checkpoint, the name -> tensor map the layers load from, and LoadSession.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "tp/comm/communicator.h"
#include "tp/layers/loading/load_session.h"
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
      .def(
          "__getitem__",
          [](const Checkpoint& c, const std::string& name) {
            if (!c.contains(name)) throw py::key_error("checkpoint has no tensor '" + name + "'");
            py::gil_scoped_release no_gil;
            return c.get(name).read_all();
          },
          py::arg("name"), "The whole tensor `name` (recorded as read when this is a LoadSession's checkpoint).")
      .def("names", &Checkpoint::names)
      .def("__contains__", &Checkpoint::contains)
      .def("__len__", &Checkpoint::size)
      .def("__repr__", [](const Checkpoint& c) { return "tp.Checkpoint(" + std::to_string(c.size()) + " tensors)"; });

  py::class_<LoadSession, std::shared_ptr<LoadSession>>(
      m, "LoadSession", "One rank's strict load of a module tree (tp.LoadSession wraps it).")
      .def(py::init([](const Checkpoint& checkpoint, const Communicator& comm,
                       const std::optional<std::vector<std::string>>& allow_unread) {
             LoadSessionOptions options;
             if (allow_unread) options.allow_unread(*allow_unread);
             // It holds a Communicator: maybe the last reference to a process group.
             return release_gil_on_delete(new LoadSession(checkpoint, comm, options));
           }),
           py::arg("checkpoint"), py::arg("communicator"), py::arg("allow_unread") = std::nullopt)
      .def_property_readonly(
          "checkpoint", [](const LoadSession& s) { return std::make_shared<Checkpoint>(s.checkpoint()); },
          "The checkpoint to load from; every tensor read through it is recorded in this session.")
      .def("read", &LoadSession::read)
      .def("unread", &LoadSession::unread)
      .def("expect_filled",
           py::overload_cast<const std::vector<std::pair<std::string, at::Tensor>>&>(&LoadSession::expect_filled),
           py::arg("tensors"))
      .def("unfilled", &LoadSession::unfilled)
      .def("finish", &LoadSession::finish, py::call_guard<py::gil_scoped_release>(),
           "ValueError on every rank if a tensor is unread on any rank (a collective).");
  m.attr("default_allow_unread") = LoadSessionOptions::default_allow_unread();

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
