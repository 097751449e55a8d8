#include "common/config/config.h"

#include <pybind11/stl.h>

#include <nlohmann/json.hpp>

#include "python/src/bindings.h"

namespace fedfleet::python {

void bindConfig(py::module_& m) {
  using config::Config;
  py::class_<Config>(m, "Config",
                     "A fedfleet configuration: every key of the TOML file, read and checked by "
                     "the C++ parser (fedfleet.Config is the Python face of it).")
      .def(py::init<>(), "Every key at its default value.")
      .def(
          "copy", [](const Config& c) { return Config(c); }, "An independent copy.")
      .def(
          "load_file", [](Config& c, const std::string& path) { check(c.loadFile(path)); },
          py::arg("path"), "Reads a TOML file over the current values.")
      .def(
          "load_string",
          [](Config& c, const std::string& text, const std::string& origin) {
            check(c.loadString(text, origin));
          },
          py::arg("text"), py::arg("origin") = "<string>",
          "Reads TOML text over the current values (`origin` names it in messages).")
      .def(
          "load_json",
          [](Config& c, const std::string& text, const std::string& origin) {
            auto json = nlohmann::json::parse(text, nullptr, false);
            if (json.is_discarded() || !json.is_object()) {
              throw StatusError(invalidArgument(origin + ": not a JSON object"));
            }
            check(c.loadJson(json, origin));
          },
          py::arg("text"), py::arg("origin") = "<json>",
          "Reads a configuration as to_json() writes it (a stored run's) over the current "
          "values.")
      .def(
          "set", [](Config& c, const std::string& assignment) { check(c.set(assignment)); },
          py::arg("assignment"),
          "Applies one override \"section.key=value\" (the value is TOML), as --set does.")
      .def(
          "validate", [](const Config& c) { check(c.validate()); },
          "Checks ranges and cross-field rules, as a run does before it starts.")
      .def(
          "to_json", [](const Config& c) { return c.toJson().dump(); },
          "Every key as a JSON object of sections (the form a history stores).")
      .def("to_toml", &Config::toToml, "Every key as a TOML file.")
      .def_static("keys", &Config::keys, "Every \"section.key\", in order.");
}

}  // namespace fedfleet::python
