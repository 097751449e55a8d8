// The fedfleet._core extension module (the Python package's native half), one file per area:
//   errors.cc    fedfleet.Error and fedfleet.ConfigError, and C++ Status -> Python exception
//   config.cc    _core.Config: the C++ config::Config, parsed and checked by its own code
//   jobs.cc      _core.Simulation and _core.Coordinator: a run on a thread of its own, which
//                Python waits for with the GIL released, stops on KeyboardInterrupt and reads
//                round by round
//   client.cc    a fedfleet.Client's fit() as the client runtime's training loop, and as the
//                simulator's for each virtual client; the trainer's batch order
//   strategy.cc  a fedfleet.Strategy as the engine's aggregator (aggregation.method = "custom")
//   commands.cc  _core.command: the CLI's read and write commands (history, report, model,
//                keygen) run in-process, their output returned as text
// The pure-Python layer over them is python/fedfleet/.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>

#include "client/client_runtime.h"
#include "common/status.h"
#include "engine/aggregator.h"
#include "sim/sim_jobs.h"

namespace fedfleet::python {

namespace py = pybind11;

// A failed Status on its way to Python: fedfleet.ConfigError for a bad configuration or a
// missing file it names (kInvalidArgument, kNotFound; a ValueError too), fedfleet.Error for
// the rest. The message is the C++ one, whole.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(const Status& status)
      : std::runtime_error(status.message()), code_(status.code()) {}
  StatusCode code() const { return code_; }

 private:
  StatusCode code_;
};

// A Python object that C++ code keeps and may let go of on any thread: released with the GIL
// held.
struct HeldObject {
  explicit HeldObject(py::object o) : object(std::move(o)) {}
  ~HeldObject() {
    py::gil_scoped_acquire gil;
    object = py::object();
  }
  HeldObject(const HeldObject&) = delete;
  HeldObject& operator=(const HeldObject&) = delete;
  py::object object;
};

// A float32 array owning a copy of values[0..n) (client.cc).
py::array_t<float> arrayOf(const float* values, size_t n);

// Throws StatusError unless `status` is ok.
inline void check(const Status& status) {
  if (!status.isOk()) throw StatusError(status);
}

// The engine's aggregator for a fedfleet.Strategy (fedfleet/strategy.py), or none for None.
// Call with the GIL held; the aggregator takes the GIL for each call into Python.
engine::AggregatorFactory strategyAggregator(py::object strategy);

// The client runtime's training loop for a fedfleet.Client (fedfleet/client.py). Call with the
// GIL held; the loop takes the GIL for each fit().
client::ClientRuntimeOptions::CustomTraining clientTraining(py::object client);

// The simulator's training of each virtual client by a fedfleet.Client that client_fn(k)
// returns (fedfleet.simulate(client_fn=...)). Call with the GIL held; each job takes the GIL
// for its fit().
sim::CustomTrainer simClientTraining(py::object client_fn);

void bindErrors(py::module_& m);
void bindConfig(py::module_& m);
void bindJobs(py::module_& m);
void bindClient(py::module_& m);
void bindCommands(py::module_& m);

}  // namespace fedfleet::python
