// Per-tier outcomes of a run's client updates: who straggles, read from the history alone
// (`fedfleet history tiers`).
//
// A client's tier is the device_name of its row in the clients table. The fleet simulator
// records the name of the client's fleet tier there ("flagship-phone", "embedded-board", a CSV
// fleet's `name` column; sim/fleet.h), so a simulated run groups by fleet tier. A real
// coordinator's run has no fleet tiers: its clients group by the device they reported in their
// hello ("cpu", or the GPU's name). A client with an empty device_name groups by its
// device_kind; one with no row in the clients table is in tier "-".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/history/history.h"

namespace fedfleet::history {

struct TierSummary {
  std::string tier;
  std::string device_kind;  // of the tier's clients ("cpu", "cuda"); "mixed" when they differ
  uint64_t clients = 0;     // distinct clients of this tier with an update in the run
  uint64_t updates = 0;     // every update row: completed + late + dropped + rejected
  uint64_t completed = 0, late = 0, dropped = 0, rejected = 0;
  // Mean of end_time - start_time over the completed updates (the run's clock), 0 when none
  // completed.
  double mean_completed_s = 0;
};

// One row per tier with at least one update in `updates`, ordered by tier name. `updates` is
// one run's (HistoryStore::updates); `clients` the clients table (HistoryStore::clients). An
// update whose status is none of the four is counted in `updates` only.
std::vector<TierSummary> summarizeTiers(const std::vector<UpdateRecord>& updates,
                                        const std::vector<ClientRecord>& clients);

}  // namespace fedfleet::history
