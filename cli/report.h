// The HTML report of a history database (`fedfleet report`): one self-contained file (inline
// CSS, SVG drawn here, no script, no font or image fetched) that opens from disk.
//
// Sections:
//   - the runs: id, name, clock, rounds, first/final/best accuracy, bytes, duration;
//   - test accuracy and test loss against round and against time since the run started (each
//     run on its own clock: virtual seconds for the simulator, wall seconds for a coordinator),
//     every selected run overlaid;
//   - per run: participants per round (completed, late, dropped, rejected stacked), bytes up
//     and down per round, the per-client timeline of one round (download and waiting, compute,
//     upload, idle until the round ended; late and dropped clients marked), per-block accuracy
//     when the database has a block_metrics table (block-cyclic runs; the section is left out
//     otherwise, see history::BlockMetricRecord), and the run's configuration as a table;
//   - decentralised runs (peer_iterations or peer_evals rows; cli/peer_report.h): the averaged
//     model's accuracy and loss against time and iterations, a line per run labelled by its
//     algorithm, and per run a per-peer timeline and table in place of the per-round charts (a
//     run with no rounds is left out of the charts above).
// Everything shown comes from the HistoryStore's queries; the report writes nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/history/history.h"
#include "common/status.h"

namespace fedfleet::cli {

struct ReportOptions {
  std::string title = "fedfleet report";  // page title and heading (for example the file name)
  std::vector<int64_t> runs;              // runs to show, in this order; empty: every run
  // Round of the per-client timeline, for every run shown. Default: the training round whose
  // slowest participant finished furthest behind the median one (the worst stragglers).
  std::optional<uint32_t> timeline_round;
};

// The round `renderReport` picks for the timeline of `updates` (one run's updates) when none is
// asked for; nullopt when no round has an update.
std::optional<uint32_t> stragglerRound(const std::vector<history::UpdateRecord>& updates);

// Renders the report. kNotFound naming the run for an id the store does not hold;
// kFailedPrecondition when the store holds no run; the store's own errors as they come. A
// timeline_round a run has no update in gives a note in place of that run's timeline.
Result<std::string> renderReport(history::HistoryStore& store, const ReportOptions& options);

}  // namespace fedfleet::cli
