// Per-peer totals of a decentralised run, read from its peer_iterations rows (records.h): what
// `fedfleet history peers` prints and `fedfleet report` tabulates beside each run's timeline.
#pragma once

#include <cstdint>
#include <vector>

#include "common/history/records.h"

namespace fedfleet::history {

struct PeerSummary {
  uint32_t peer = 0;
  uint64_t iterations = 0;  // rows of this peer, skipped ones included
  uint64_t skipped = 0;     // of them, iterations Hop skipped
  uint64_t exchanges = 0;   // sum over its iterations
  uint64_t bytes_sent = 0;  // sums, saturating at UINT64_MAX
  uint64_t bytes_received = 0;
  double compute_s = 0;  // sums of the durations
  double comm_s = 0;
  double wait_s = 0;
  double mean_staleness = 0;  // over all its iterations
  uint32_t max_staleness = 0;
  double first_start = 0;  // smallest t_start
  double last_end = 0;     // largest t_end
};

// One summary per peer with at least one row in `rows` (one run's, any order), ordered by peer.
std::vector<PeerSummary> summarizePeers(const std::vector<PeerIterationRecord>& rows);

}  // namespace fedfleet::history
