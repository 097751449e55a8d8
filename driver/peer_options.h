// The peer engine's options from a run's configuration: what the decentralised drivers (the
// real peers of client/peer_runtime.h and the simulator's sim/peer_simulator.h) both start from.
#pragma once

#include "common/config/config.h"
#include "common/status.h"
#include "peer/peer_engine.h"

namespace fedfleet::driver {

// The engine options of [decentralized] (names parsed once here): algorithm, topology and
// codec from their names, the seed from run.seed, the rest as they are; validated
// (peer::validate). kInvalidArgument naming the key otherwise.
Result<peer::PeerOptions> peerOptionsFromConfig(const config::Config& config);

}  // namespace fedfleet::driver
