// PeerRuntime: one peer process of a decentralised run (policy.mode = "decentralized").
//
// It drives a peer::PeerEngine over the network: the engine decides, the runtime carries out.
//   1. Start-up: load this peer's shard (partition `index` of data.partitions = P, cut as a
//      client cuts it, or the peer's own files), build the model from the run's seed (every peer
//      starts from the same weights), bind the PeerMesh and dial the coordinator.
//   2. Rendezvous: send Register (the mesh's endpoint) every second until the coordinator
//      answers with the table of all peers; give up after register_timeout_s.
//   3. Run: dial the peers of the table, start the engine, and loop on one thread: take the
//      mesh's messages and peer-down events and the coordinator's messages, feed them to the
//      engine, and carry out its actions in order (Compute: train on a worker thread with
//      client::Trainer while the loop keeps polling and beating; Send: over the mesh, or to the
//      coordinator for Prague's group generator; IterationDone: report the iteration's row;
//      Finished: tell the coordinator and keep answering; Fail: tell the coordinator and
//      return the engine's Status). A peer the mesh declares down is fed to the engine and
//      reported to the coordinator. The coordinator's model requests are answered with the
//      engine's current model.
//   4. End: the coordinator's Stop. An empty reason is the normal end (OK); otherwise the run
//      was aborted (kFailedPrecondition with the coordinator's reason).
//
// Identity: the mesh and the coordinator know this peer by its key (peer-<index>); a message
// from the mesh is checked against the sender's authenticated index (a PeerMessage whose
// `from` is another peer is a protocol violation: the run fails naming the sender).
//
// Threads: the calling thread owns both sockets and the engine; one worker thread at a time
// trains (it owns the LibTorch model while it runs; the engine's model is a copy).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "common/config/config.h"
#include "common/status.h"
#include "common/transport/peer_mesh.h"
#include "common/transport/transport.h"
#include "peer/peer_engine.h"

namespace fedfleet::client {

struct PeerRuntimeOptions {
  uint32_t index = 0;     // this peer, 0 .. decentralized.peers - 1 (its key is peer-<index>)
  config::Config config;  // the run's configuration (the same file as the coordinator's)
  transport::ClientOptions coordinator;  // endpoint, this peer's keys, the coordinator's key
  transport::PeerMeshOptions mesh;       // listen endpoint, keys, peer allow-list, heartbeats
  std::string device = "cpu";
  uint32_t threads = 1;               // LibTorch intra-op threads
  double register_timeout_s = 120;    // no table by then: kTimeout
  double coordinator_silence_s = 30;  // nothing from the coordinator this long: kUnavailable
};

class PeerRuntime {
 public:
  // Loads data and model and binds the mesh. kInvalidArgument for an index >= P, a config
  // whose policy.mode is not "decentralized", or synthetic data; data, model and transport
  // errors as they come (naming the file or key).
  static Result<std::unique_ptr<PeerRuntime>> create(const PeerRuntimeOptions& options);
  virtual ~PeerRuntime() = default;

  // Runs steps 2-4 above. OK at the coordinator's normal Stop; the engine's Fail status; a
  // coordinator that never answered (kTimeout) or went silent (kUnavailable); stop()
  // (kUnavailable: "stopped"); a Stop with a reason (kFailedPrecondition).
  virtual Status run() = 0;
  // Asks run() to return soon. Safe from any thread and from a signal handler.
  virtual void stop() = 0;
};

}  // namespace fedfleet::client
