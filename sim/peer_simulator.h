// PeerSimulator: decentralised training (peer/peer_engine.h) of decentralized.peers simulated
// peers on one host, in virtual time.
//
// Each peer is a PeerEngine fed by a discrete-event loop; Prague's group generator sits at a
// virtual coordinator. Training is real: a Compute action becomes client::Trainer steps on the
// peer's shard (sim/fleet_data.h, one shard per peer) on a WorkerPool; only time is simulated:
//   compute  = steps x batch / (speed x the reference device's samples per second), speed from
//              the peer's fleet profile (sim/fleet.h), divided by sim.slow_factor for the
//              slowest sim.slow_fraction of the peers (the highest ids) and by
//              sim.slowdown_factor during a transient slowdown (each compute starts one with
//              probability sim.slowdown_probability, seeded by run.seed, peer and iteration; it
//              lasts sim.slowdown_s)
//   transfer = latency + bytes / min(sender's uplink, receiver's downlink); a peer's sends
//              queue on its uplink one after another (receivers' downlinks are not queued).
//              decentralized.mbps and decentralized.latency_ms override every link's.
// The group generator answers at once and its messages cost latency only.
//
// Peers that leave: sim.peer_fail_at ("peer:seconds,...") or sim.peer_failures (that many
// seeded peers at seeded times, see planFailures in the .cc) make a peer leave for good at a
// virtual time. From then on it computes and sends nothing (a Compute in progress is lost), and
// nothing is delivered to it; a message whose last byte left its uplink before it left still
// arrives, one still queued or on the wire is lost. coordinator.liveness_s later (the real
// peers' heartbeat timeout, cli/commands.cc) every live peer, in id order, and then Prague's
// group generator get onPeerDown; what the leaver had in flight is dropped from then on, as a
// real mesh drops it. Algorithms that tolerate the loss carry on with the survivors; the others
// fail the run with the engine's error. Events: peer_left (when it left), peer_down (when it
// was declared down), peer_failed (an engine that cannot go on; the iteration rows so far are
// written first), all at virtual times.
//
// Every decentralized.eval_every_s of virtual time (and once at the end) the average of the
// live peers' models is evaluated on the test set, in 250-sample pieces summed in order. The
// run ends when every live peer finished its iterations, at decentralized.time_budget_s, when
// the mean accuracy of the last 3 evaluations reaches run.target_accuracy (> 0; one evaluation
// alone swings by points between neighbours and would credit a lucky one), or when a peer's
// engine fails (a dead peer the algorithm needs: the error says so).
//
// Determinism: a Compute's duration is known when it is asked for, so its training job goes to
// the pool at once and its result is consumed at its virtual finish time (ties broken by a
// sequence number); each job's numbers depend only on its inputs. The same config and seed give
// the same history at any sim.workers.
//
// History: the run (clock "virtual"), one PeerIterationRecord per peer iteration (t_start and
// t_end, compute_s, comm_s: the time its own sends held its uplink, wait_s: the rest), and one
// PeerEvalRecord per evaluation.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/config/config.h"
#include "common/history/history.h"
#include "common/status.h"
#include "peer/peer_engine.h"

namespace fedfleet::sim {

struct PeerSimSummary {
  int64_t run_id = 0;
  std::string algorithm;
  uint32_t peers = 0;
  double virtual_seconds = 0;
  double wall_seconds = 0;
  uint64_t iterations = 0;  // all peers', skipped ones included
  uint64_t bytes_sent = 0;
  uint32_t evaluations = 0;
  uint32_t peers_left = 0;  // peers that left before the run ended
  std::optional<double> final_accuracy, best_accuracy;
  // The virtual time of the first evaluation at which the mean of the last 3 reached
  // run.target_accuracy (> 0).
  std::optional<double> time_to_target;
  std::string db_path;
};

class PeerSimulator {
 public:
  // Validates the config (policy.mode must be "decentralized"; sim.peer_fail_at well formed),
  // loads the data, builds the initial model and opens the history. Errors name the key or file
  // at fault.
  static Result<std::unique_ptr<PeerSimulator>> create(const config::Config& config);
  virtual ~PeerSimulator() = default;
  // Runs to the end. Errors: a peer engine's Fail (its message names the dead peer and the
  // algorithms that tolerate one; the history keeps the iterations done and a peer_failed
  // event), a training job that fails, a history write that fails.
  virtual Result<PeerSimSummary> run() = 0;
  // Asks run() to stop soon (safe from a signal handler).
  virtual void stop() = 0;
  virtual int64_t runId() const = 0;
  // The history the run writes (for tests).
  virtual history::HistoryStore& history() = 0;
};

// The few lines `fedfleet sim` prints at the end of a decentralised run.
std::string formatPeerSummary(const PeerSimSummary& s);

}  // namespace fedfleet::sim
