#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "client/client_runtime.h"
#include "common/config/config.h"
#include "common/history/records.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/peer_coordinator.h"
#include "python/src/bindings.h"
#include "sim/fleet_simulator.h"
#include "sim/peer_simulator.h"

namespace fedfleet::python {
namespace {

// A run (a simulation or a coordinator) on a thread of its own. Python starts it, waits for it
// in short slices with the GIL released (so that KeyboardInterrupt and other Python threads get
// through), stops it, and reads the rounds committed meanwhile.
class Job {
 public:
  // Each kind of job calls close() in its destructor (requestStop is its own).
  virtual ~Job() {
    if (thread_.joinable()) thread_.join();
  }

  void start() {
    if (thread_.joinable() || done_) throw StatusError(failedPrecondition("already started"));
    thread_ = std::thread([this] {
      Status status = body();
      std::lock_guard lock(mu_);
      status_ = std::move(status);
      done_ = true;
      cv_.notify_all();
    });
  }

  // True once the run has ended; waits at most timeout_s for that.
  bool wait(double timeout_s) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return done_; });
    if (done_ && thread_.joinable()) {
      lock.unlock();
      thread_.join();
    }
    return done_;
  }

  // Asks the run to stop soon; it ends as a signal would end the fedfleet command, with what was
  // committed in the history.
  void stop() { requestStop(); }

  std::vector<history::RoundRecord> takeRounds() {
    std::lock_guard lock(mu_);
    std::vector<history::RoundRecord> out(queue_.begin(), queue_.end());
    queue_.clear();
    return out;
  }

  // After the end (or before start): lets the run's objects go (the history closed), so that
  // another process may resume it while Python still holds this object.
  void close() {
    if (thread_.joinable()) {
      requestStop();
      thread_.join();
    }
    release();
  }

  // After the end: the run's status (throws its error).
  void checkEnded() {
    std::lock_guard lock(mu_);
    if (!done_) throw StatusError(failedPrecondition("the run has not ended; wait() for it"));
    check(status_);
  }

 protected:
  virtual Status body() = 0;
  virtual void requestStop() = 0;
  virtual void release() = 0;

  void pushRound(const history::RoundRecord& r) {
    std::lock_guard lock(mu_);
    queue_.push_back(r);
  }

 private:
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
  std::deque<history::RoundRecord> queue_;
};

py::object optionalFloat(const std::optional<double>& v) {
  return v ? py::object(py::float_(*v)) : py::object(py::none());
}

// The simulator of the config's policy: FleetSimulator, or PeerSimulator for a decentralised
// run. Created (data read, model built, history opened) in the constructor.
class Simulation : public Job {
 public:
  Simulation(const config::Config& config, sim::FleetSimulator::Extensions extensions)
      : config_(config) {
    if (config_.policy.mode == config::PolicyMode::kDecentralized) {
      if (extensions.custom_trainer) {
        throw StatusError(invalidArgument(
            "client_fn: a decentralised run's peers train with the built-in trainer"));
      }
      auto created = sim::PeerSimulator::create(config_);
      check(created.status());
      peer_ = std::move(*created);
      return;
    }
    auto created = sim::FleetSimulator::create(config_, std::move(extensions));
    check(created.status());
    fleet_ = std::move(*created);
    fleet_->setRoundObserver([this](const history::RoundRecord& r) { pushRound(r); });
  }
  ~Simulation() override { close(); }

  std::string alreadyFinished() const { return fleet_ ? fleet_->alreadyFinished() : std::string(); }
  int64_t runId() const {
    return fleet_ ? fleet_->runId() : peer_ ? peer_->runId() : closed_run_id_;
  }

  py::dict summary() {
    checkEnded();
    py::dict d;
    if (fleet_summary_) {
      const sim::SimSummary& s = *fleet_summary_;
      d["run_id"] = s.run_id;
      d["rounds"] = s.rounds;
      d["failed_rounds"] = s.failed_rounds;
      d["final_accuracy"] = optionalFloat(s.final_accuracy);
      d["best_accuracy"] = optionalFloat(s.best_accuracy);
      d["virtual_seconds"] = s.virtual_seconds;
      d["wall_seconds"] = s.wall_seconds;
      d["completed"] = s.completed;
      d["late"] = s.late;
      d["dropped"] = s.dropped;
      d["rejected"] = s.rejected;
      d["bytes_up"] = s.bytes_up;
      d["bytes_down"] = s.bytes_down;
      d["text"] = sim::formatSummary(s);
    } else if (peer_summary_) {
      const sim::PeerSimSummary& s = *peer_summary_;
      d["run_id"] = s.run_id;
      d["algorithm"] = s.algorithm;
      d["peers"] = s.peers;
      d["iterations"] = s.iterations;
      d["final_accuracy"] = optionalFloat(s.final_accuracy);
      d["best_accuracy"] = optionalFloat(s.best_accuracy);
      d["virtual_seconds"] = s.virtual_seconds;
      d["wall_seconds"] = s.wall_seconds;
      d["text"] = sim::formatPeerSummary(s);
    }
    return d;
  }

 protected:
  Status body() override {
    if (fleet_) {
      auto s = fleet_->run();
      if (!s.isOk()) return s.status();
      fleet_summary_ = std::move(*s);
    } else {
      auto s = peer_->run();
      if (!s.isOk()) return s.status();
      peer_summary_ = std::move(*s);
    }
    return Status::ok();
  }
  void requestStop() override {
    if (fleet_) fleet_->stop();
    if (peer_) peer_->stop();
  }
  void release() override {
    closed_run_id_ = runId();
    fleet_.reset();
    peer_.reset();
  }

 private:
  config::Config config_;
  std::unique_ptr<sim::FleetSimulator> fleet_;
  std::unique_ptr<sim::PeerSimulator> peer_;
  std::optional<sim::SimSummary> fleet_summary_;
  std::optional<sim::PeerSimSummary> peer_summary_;
  int64_t closed_run_id_ = 0;
};

// The coordinator service of the config (the peers' coordinator for a decentralised run),
// bound in the constructor; clients connect to bound_endpoint while it runs.
class Coordinator : public Job {
 public:
  Coordinator(const config::Config& config, engine::AggregatorFactory strategy) {
    if (config.policy.mode == config::PolicyMode::kDecentralized) {
      auto created = coordinator::PeerCoordinator::create(config);
      check(created.status());
      peer_ = std::move(*created);
    } else {
      auto created = coordinator::CoordinatorService::create(config, std::move(strategy));
      check(created.status());
      service_ = std::move(*created);
    }
  }
  ~Coordinator() override { close(); }
  std::string boundEndpoint() const {
    return service_ ? service_->boundEndpoint() : peer_ ? peer_->boundEndpoint() : "";
  }
  int64_t runId() const {
    return service_ ? service_->runId() : peer_ ? peer_->runId() : closed_run_id_;
  }

 protected:
  Status body() override { return service_ ? service_->run() : peer_->run(); }
  void requestStop() override {
    if (service_) service_->stop();
    if (peer_) peer_->stop();
  }
  void release() override {
    closed_run_id_ = runId();
    service_.reset();
    peer_.reset();
  }

 private:
  std::unique_ptr<coordinator::CoordinatorService> service_;
  std::unique_ptr<coordinator::PeerCoordinator> peer_;
  int64_t closed_run_id_ = 0;
};

// A client process's runtime (`fedfleet client`) whose training is a fedfleet.Client's fit().
class Client : public Job {
 public:
  Client(const config::Config& config, bool insecure,
         client::ClientRuntimeOptions::CustomTraining training) {
    auto options = cli::clientRuntimeOptions(config, insecure, /*read_data=*/false);
    check(options.status());
    options->custom_training = std::move(training);
    auto created = client::ClientRuntime::create(*options);
    check(created.status());
    runtime_ = std::move(*created);
  }
  ~Client() override { close(); }

 protected:
  Status body() override { return runtime_->run(); }
  void requestStop() override {
    if (runtime_) runtime_->stop();
  }
  void release() override { runtime_.reset(); }

 private:
  std::unique_ptr<client::ClientRuntime> runtime_;
};

}  // namespace

void bindJobs(py::module_& m) {
  // What Python is told of a committed round while the run goes on: the history's own record,
  // of which Python sees these fields.
  py::class_<history::RoundRecord>(m, "RoundProgress", "A round the run committed, as it happened.")
      .def_readonly("round", &history::RoundRecord::round)
      .def_readonly("status", &history::RoundRecord::status)
      .def_readonly("test_accuracy", &history::RoundRecord::test_accuracy)
      .def_readonly("test_loss", &history::RoundRecord::test_loss)
      .def_readonly("train_loss", &history::RoundRecord::train_loss)
      .def_readonly("end_time", &history::RoundRecord::end_time)
      .def_readonly("completed", &history::RoundRecord::completed)
      .def_readonly("late", &history::RoundRecord::late)
      .def_readonly("dropped", &history::RoundRecord::dropped)
      .def_readonly("rejected", &history::RoundRecord::rejected);

  const auto release = py::call_guard<py::gil_scoped_release>();
  py::class_<Job>(m, "Job", "A run on a thread of its own.")
      .def("start", &Job::start, "Starts the run.")
      .def("wait", &Job::wait, py::arg("timeout_s"), release,
           "Waits at most timeout_s seconds (the GIL released); True once the run has ended.")
      .def("stop", &Job::stop, "Asks the run to stop soon, as SIGINT stops the command.")
      .def("take_rounds", &Job::takeRounds, "The rounds committed since the last call.")
      .def("check", &Job::checkEnded, "After the end: raises the run's error, if it failed.")
      .def("close", &Job::close, release,
           "Stops the run if it still runs, then lets it go (its history closed).");

  py::class_<Simulation, Job>(m, "Simulation",
                              "A simulated fleet (or decentralised peers) of a configuration.")
      .def(py::init([](const config::Config& config, py::object strategy, py::object client_fn) {
             sim::FleetSimulator::Extensions extensions;
             extensions.custom_aggregator = strategyAggregator(std::move(strategy));
             if (!client_fn.is_none()) {
               extensions.custom_trainer = simClientTraining(std::move(client_fn));
             }
             py::gil_scoped_release unlocked;
             return std::make_unique<Simulation>(config, std::move(extensions));
           }),
           py::arg("config"), py::arg("strategy") = py::none(), py::arg("client_fn") = py::none(),
           "Reads the data, builds the model and opens the history; errors as fedfleet sim's. "
           "strategy: a fedfleet.Strategy for aggregation.method = \"custom\"; client_fn: "
           "k -> a fedfleet.Client that trains virtual client k.")
      .def_property_readonly("already_finished", &Simulation::alreadyFinished,
                             "A resumed run with nothing left to do: what to say instead.")
      .def_property_readonly("run_id", &Simulation::runId)
      .def("summary", &Simulation::summary, "After the end: the run's summary.");

  py::class_<Coordinator, Job>(m, "Coordinator",
                               "The coordinator service of a configuration, in this process.")
      .def(py::init([](const config::Config& config, py::object strategy) {
             auto aggregator = strategyAggregator(std::move(strategy));
             py::gil_scoped_release unlocked;
             return std::make_unique<Coordinator>(config, std::move(aggregator));
           }),
           py::arg("config"), py::arg("strategy") = py::none(),
           "Binds, loads the test data and opens the history; errors as fedfleet "
           "coordinator's. strategy: a fedfleet.Strategy for aggregation.method = \"custom\".")
      .def_property_readonly("bound_endpoint", &Coordinator::boundEndpoint,
                             "The address clients connect to (with the port chosen).")
      .def_property_readonly("run_id", &Coordinator::runId);

  py::class_<Client, Job>(m, "Client",
                          "A client process's runtime whose training is a fedfleet.Client's.")
      .def(py::init([](const config::Config& config, py::object client, bool insecure) {
             auto training = clientTraining(std::move(client));
             py::gil_scoped_release unlocked;
             return std::make_unique<Client>(config, insecure, std::move(training));
           }),
           py::arg("config"), py::arg("client"), py::arg("insecure") = false,
           "Reads the keys and connects (asynchronously); errors as fedfleet client's.");
}

}  // namespace fedfleet::python
