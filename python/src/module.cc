// The fedfleet._core extension module; see bindings.h for what each file binds.
#include "python/src/bindings.h"

PYBIND11_MODULE(_core, m) {
  m.doc() =
      "fedfleet's native half: the C++ configuration, simulators, coordinator and history "
      "commands. Use the fedfleet package, not this module.";
  fedfleet::python::bindErrors(m);
  fedfleet::python::bindConfig(m);
  fedfleet::python::bindJobs(m);
  fedfleet::python::bindClient(m);
  fedfleet::python::bindCommands(m);
}
