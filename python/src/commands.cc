#include "cli/commands.h"

#include <pybind11/stl.h>
#include <spdlog/spdlog.h>

#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/model/blas_core.h"
#include "python/src/bindings.h"

namespace fedfleet::python {
namespace {

// Sends std::cout and std::cerr to strings for its lifetime (the commands print there).
class CapturedOutput {
 public:
  CapturedOutput()
      : out_(std::cout.rdbuf(stdout_.rdbuf())), err_(std::cerr.rdbuf(stderr_.rdbuf())) {}
  ~CapturedOutput() {
    std::cout.rdbuf(out_);
    std::cerr.rdbuf(err_);
  }
  std::string out() const { return stdout_.str(); }
  std::string err() const { return stderr_.str(); }

 private:
  std::ostringstream stdout_, stderr_;
  std::streambuf* out_;
  std::streambuf* err_;
};

// `fedfleet ARGS...` for the commands that read or write files and return: the exit status
// and what it printed on stdout and stderr. The long-running ones (sim, coordinator, client,
// peer) install signal handlers and are refused here: Simulation and Coordinator run those.
py::tuple command(const std::vector<std::string>& args) {
  static const std::set<std::string> kAllowed = {"history", "report", "model", "keygen"};
  if (args.empty() || !kAllowed.count(args.front())) {
    throw StatusError(
        invalidArgument("fedfleet._core.command runs history, report, model and keygen; got " +
                        (args.empty() ? std::string("nothing") : args.front())));
  }
  std::vector<std::string> storage;
  storage.reserve(args.size() + 1);
  storage.push_back("fedfleet");
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  int rc = 0;
  std::string out, err;
  {
    py::gil_scoped_release release;
    CapturedOutput captured;
    rc = cli::main(static_cast<int>(storage.size()), argv.data());
    out = captured.out();
    err = captured.err();
  }
  return py::make_tuple(rc, py::bytes(out), err);
}

// The engine's log: on stderr as the command writes it, at this level.
void setLogLevel(const std::string& level) {
  const auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    throw StatusError(
        invalidArgument("log level " + level + ": give trace, debug, info, warn, error or off"));
  }
  cli::setupLogging(level);
}

// (the OpenBLAS core loaded, the better one) where OpenBLAS took this CPU for one without AVX2
// and OPENBLAS_CORETYPE is not set (model::betterBlasCore); None otherwise. This process loaded
// OpenBLAS before fedfleet: only a new Python started with the variable set can change it.
py::object blasCoreAdvice() {
  const auto better = model::blasCoreToAsk();
  if (!better) return py::none();
  return py::make_tuple(model::openblasCoreName(), *better);
}

}  // namespace

void bindCommands(py::module_& m) {
  m.def("set_log_level", &setLogLevel, py::arg("level"),
        "The level of fedfleet's own log lines on stderr: trace, debug, info, warn, error, off.");
  m.def("blas_core_advice", &blasCoreAdvice,
        "(OpenBLAS's core, a better one) where OpenBLAS took this CPU for one without AVX2 "
        "and OPENBLAS_CORETYPE is not set; None otherwise.");
  m.def("command", &command, py::arg("args"),
        "Runs `fedfleet ARGS...` (history, report, model or keygen) in this process: "
        "(exit status, stdout as bytes, stderr as text).");
}

}  // namespace fedfleet::python
