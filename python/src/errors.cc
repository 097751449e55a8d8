#include "python/src/bindings.h"

namespace fedfleet::python {
namespace {

PyObject* g_error = nullptr;         // fedfleet.Error (a RuntimeError)
PyObject* g_config_error = nullptr;  // fedfleet.ConfigError (a fedfleet.Error and a ValueError)

}  // namespace

void bindErrors(py::module_& m) {
  g_error = PyErr_NewExceptionWithDoc(
      "fedfleet.Error",
      "A run, a history or a file that fedfleet could not handle; the message is the C++ one, "
      "as the fedfleet command prints it.",
      PyExc_RuntimeError, nullptr);
  py::tuple bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError));
  g_config_error = PyErr_NewExceptionWithDoc(
      "fedfleet.ConfigError",
      "A configuration that fedfleet refuses (an unknown key, a wrong type, a value out of "
      "range, a file it names that is not there), with the message of fedfleet's own parser.",
      bases.ptr(), nullptr);
  if (g_error == nullptr || g_config_error == nullptr) throw py::error_already_set();
  m.add_object("Error", py::handle(g_error));
  m.add_object("ConfigError", py::handle(g_config_error));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const bool config =
          e.code() == StatusCode::kInvalidArgument || e.code() == StatusCode::kNotFound;
      PyErr_SetString(config ? g_config_error : g_error, e.what());
    }
  });
}

}  // namespace fedfleet::python
