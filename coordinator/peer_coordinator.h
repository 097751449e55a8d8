// PeerCoordinator: the coordinator of a decentralised run (policy.mode = "decentralized").
//
// Peers train and exchange among themselves over their own mesh (client/peer_runtime.h); the
// coordinator never aggregates. It keeps three jobs, on one event loop on the calling thread:
//   Rendezvous. Each peer registers with the endpoint its mesh listens on. Its index is the
//     one its authenticated key names (peer-<i>, common/wire/peer_control.h), never anything the
//     message says. Once all P peers registered, each gets the table of everyone (index,
//     endpoint, the public key it authenticated with) and the run starts. A peer that did not
//     register within coordinator.wait_clients_s fails the run (kTimeout naming the missing).
//   Prague's group generator (peer/group_generator.h), on real time since the start:
//     GroupRequests and Leaves relayed by the peers go in, GroupAssigns go back; a dead peer
//     leaves its groups.
//   The history. Every iteration a peer reports becomes a peer_iterations row (the peer index
//     from the connection's key). Every decentralized.eval_every_s, and once at the end, it asks
//     a seeded sample of at most kEvalSample live peers for their models, averages what arrives
//     within kEvalWaitS, evaluates the average on the test set and writes a peer_evals row. Peer
//     deaths and failures are events (peer_down, peer_failed).
// Liveness: a peer is dead once another peer reports it down (its mesh's heartbeats stopped),
// its connection to the coordinator closes, or it has been silent for coordinator.liveness_s
// (a peer's report is believed: authenticated peers are trusted to follow the protocol, as the
// peer engine trusts them; a lying peer can only drop others from groups and evaluations).
// The run ends (OK) when every live peer has finished (or decentralized.time_budget_s passed):
// the coordinator sends Stop to all. A peer that fails (its engine cannot go on, e.g. allreduce
// without a dead peer) ends the run: the others get Stop with the reason and run() returns
// kFailedPrecondition naming that peer and its reason. So does the death of every peer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/config/config.h"
#include "common/status.h"

namespace fedfleet::coordinator {

class PeerCoordinator {
 public:
  // Peers whose models are averaged for one evaluation, at most.
  static constexpr uint32_t kEvalSample = 4;
  // How long an evaluation waits for the models it asked for.
  static constexpr double kEvalWaitS = 5;

  // Loads the test set and the model (for evaluations), opens the history (a new run) and binds
  // the ROUTER (CURVE: coordinator key pair, allow-list of peer keys). Errors name the file or
  // key; kInvalidArgument for a config that is not decentralised or does not validate.
  static Result<std::unique_ptr<PeerCoordinator>> create(const config::Config& config);
  virtual ~PeerCoordinator() = default;

  // Runs the loop described above until the run ends. OK when it completed; kTimeout when
  // peers never registered; kFailedPrecondition when a peer failed or all died; kIoError when
  // the history cannot be written; kUnavailable after stop().
  virtual Status run() = 0;
  // Asks run() to return soon (peers get Stop). Safe from any thread and a signal handler.
  virtual void stop() = 0;

  virtual std::string boundEndpoint() const = 0;
  virtual int64_t runId() const = 0;
};

}  // namespace fedfleet::coordinator
