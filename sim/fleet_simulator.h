// FleetSimulator: a whole edge fleet on one host, driven by the coordinator's own RoundEngine.
//
// Only time is simulated. Training is real LibTorch work on real data; how long it would have
// taken comes from each virtual client's profile (sim/fleet.h):
//   download  = latency + model bytes / downlink
//   compute   = samples processed / (speed x the reference device's samples per second)
//   upload    = for each chunk: latency + bytes so far / uplink (the bytes the encoder produced),
//               counted from the upload's grant, at most sim.coordinator_ingress_mbps an upload
// Each virtual client runs the client's own protocol state machine (client/client_session.h):
// it checks its tasks, asks for upload credits (coordinator.max_concurrent_uploads) and waits
// for the grant, and keeps its served model and SCAFFOLD c_k as a client process does.
// The discrete-event loop feeds the engine exactly the events the ZeroMQ driver feeds it (chunks,
// summaries, goodbyes, hellos, ticks), in virtual-time order; deadlines fire in virtual time.
//
// Parallelism without losing determinism: the tasks of a round go to a WorkerPool at once (one
// LibTorch thread per worker), but their results are consumed in virtual-time order (ties broken
// by a sequence number), and every job's numbers depend only on its inputs, never on the worker
// that ran it. Evaluation is split into fixed 250-sample pieces summed in order. So the same
// config and seed give the same history at any worker count.
//
// Availability: a client that is offline (diurnal trace) is not sampled; a client whose online
// window closes during its task, or that drops out (per-round dropout probability), says goodbye
// at that moment, is recorded dropped, and rejoins sim.rejoin_s later (or when next online).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "client/client_session.h"
#include "common/config/config.h"
#include "common/history/history.h"
#include "common/status.h"
#include "engine/aggregator.h"
#include "sim/remote_workers.h"
#include "sim/sim_jobs.h"

namespace fedfleet::sim {

struct SimSummary {
  int64_t run_id = 0;
  uint32_t rounds = 0;  // committed training rounds (round 0 excluded)
  uint32_t failed_rounds = 0;
  std::optional<double> final_accuracy;
  std::optional<double> best_accuracy;
  // The latest round's metrics as history::roundMetricsText writes them (for runs without a
  // test accuracy: a regression's, federated ones), and that round.
  std::string last_metrics;
  uint32_t last_metrics_round = 0;
  double virtual_seconds = 0;  // the last recorded round's end_time (virtual seconds)
  double wall_seconds = 0;
  double median_round_virtual_s = 0;
  double median_round_wall_s = 0;
  uint64_t completed = 0, late = 0, dropped = 0, rejected = 0;
  uint64_t bytes_up = 0, bytes_down = 0;
  uint64_t registered_clients = 0;
  uint64_t distinct_participants = 0;
  std::string db_path;
};

class FleetSimulator {
 public:
  // Validates the config, loads or prepares the data, registers sim.clients virtual clients and
  // opens the history (config.history.db; ":memory:" keeps it in memory). Errors name the key or
  // file at fault. With `remote` (the MPI ranks of sim/mpi_workers.h), the virtual clients'
  // training and the server's evaluation run there, and this process's sim.workers threads only
  // encode the updates and wait; the history is the same as without it.
  // Code of the caller's own that the simulator runs (the Python package's), or the MPI ranks.
  struct Extensions {
    // The MPI ranks that train and evaluate (see above); null: this process's workers.
    std::shared_ptr<RemoteWorkers> remote;
    // Builds the aggregator of aggregation.method = "custom" (a Python strategy); without it
    // that method is refused.
    engine::AggregatorFactory custom_aggregator;
    // Every virtual client's training, in place of client::Trainer (a Python client's fit):
    // one job at a time on the sim.workers threads (sim.batch_clients does not apply), never
    // with `remote`. Virtual time is the fleet profile's, as for the built-in trainer.
    CustomTrainer custom_trainer;
  };
  static Result<std::unique_ptr<FleetSimulator>> create(const config::Config& config,
                                                        Extensions extensions = {});
  virtual ~FleetSimulator() = default;

  // Runs every round. Errors: a history write that fails (the run stops; what was committed
  // stays), a training job that fails in a way that is not the client's (kInternal), stop().
  virtual Result<SimSummary> run() = 0;
  // --resume of a run that has nothing left to do: what to say instead of running (run() then
  // returns kFailedPrecondition with it); "" otherwise.
  virtual const std::string& alreadyFinished() const = 0;
  // Asks run() to stop soon (safe from a signal handler).
  virtual void stop() = 0;
  virtual int64_t runId() const = 0;

  // For tests and tools, between runs: virtual client k's session (its c_k, its served model);
  // null when k was never sampled.
  virtual const client::ClientSession* clientSession(uint64_t k) const = 0;
  // For tests, before run(): alters every task as virtual client k receives it (a download
  // damaged on the way); its session checks what arrives as a real client's does.
  using ReceiveFilter = std::function<void(uint64_t k, client::ReceivedTask& task)>;
  virtual void setReceiveFilter(ReceiveFilter filter) = 0;
  // Before run(): called on run()'s thread after each round the engine commits, with the round
  // as the history holds it; for a progress display of the caller's own (the Python
  // package's). It must not block for long.
  using RoundObserver = std::function<void(const history::RoundRecord& round)>;
  virtual void setRoundObserver(RoundObserver observer) = 0;
};

// The summary as the few lines `fedfleet sim` prints at the end.
std::string formatSummary(const SimSummary& s);

}  // namespace fedfleet::sim
