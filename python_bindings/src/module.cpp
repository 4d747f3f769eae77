// tp._C: the extension module. Errors thrown by the C++ side cross as Python
// exceptions carrying the C++ message (without the C++ backtrace):
//   c10::ValueError -> ValueError, c10::TypeError -> TypeError,
//   c10::IndexError -> IndexError, c10::NotImplementedError -> NotImplementedError,
//   any other c10::Error -> RuntimeError.
// Everything else falls through to pybind11's own translation (std::invalid_argument
// -> ValueError, std::exception -> RuntimeError).

#include <exception>

#include <Python.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>

#include "bindings.h"

namespace py = pybind11;

namespace {

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::IndexError& e) {
    PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
  } catch (const c10::NotImplementedError& e) {
    PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "tp: Megatron-style tensor-parallel linear layers (C++ core). Use the tp package.";
  // Tensors cross through torch's casters, which need torch's Python module loaded.
  py::module_::import("torch");
  py::register_local_exception_translator(&translate);
  tp::python::init_comm(m);
  tp::python::init_config(m);
  tp::python::init_loader(m);
  tp::python::init_layers(m);
  tp::python::init_vocab(m);
  tp::python::init_moe(m);
  tp::python::init_models(m);
  tp::python::init_causal_lm(m);
  tp::python::init_differentiable(m);
  tp::python::init_ops(m);
}
