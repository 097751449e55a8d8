// The decentralised part of the HTML report (cli/report.h): what `fedfleet report` draws for a
// run that has peer_iterations or peer_evals rows (history::PeerIterationRecord).
//
//   - an overview of every such run: a table (algorithm, peers, iterations, final and best
//     accuracy of the averaged model, run time, traffic, share of time spent waiting) and the
//     averaged model's test accuracy and loss against time and against iterations, one line
//     per run, labelled by its algorithm (decentralized.algorithm of the run's configuration);
//   - per run: a timeline with one row per peer (compute, communication and waiting spans) and
//     a per-peer table (iterations, exchanges, bytes, waiting, staleness).
//
// A run's iteration rows can be many (peers times iterations); buildPeerRunView reduces them to
// what is drawn (at most kMaxPeerTimelineSegments rectangles), so the report holds one run's
// rows at a time and its SVG stays small.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cli/svg_chart.h"
#include "common/history/peer_summary.h"
#include "common/history/records.h"

namespace fedfleet::cli {

// The most rectangles a run's peer timeline draws, and the most peers it has a row for (the
// table lists every peer).
inline constexpr size_t kMaxPeerTimelineSegments = 2000;
inline constexpr size_t kMaxPeerTimelineRows = 200;

// What the report keeps of one decentralised run.
struct PeerRunView {
  history::RunRecord run;
  std::string algorithm;  // peerAlgorithmLabel(run)
  std::vector<history::PeerEvalRecord> evals;
  std::vector<history::PeerSummary> peers;
  // One row per peer, up to kMaxPeerTimelineRows (the lowest peer indices), data-client "peer N".
  std::vector<TimelineRow> timeline;
  // Iterations merged into one span of the timeline (the largest group; 1: none merged).
  uint64_t iterations_per_span = 1;
  double end_time = 0;  // the latest t_end, or the latest evaluation when later
};

// The label of a decentralised run's algorithm from its configuration (config_json's
// decentralized section): the algorithm and the option that tells its variants apart
// ("allreduce (pipeline 2)", "dpsgd (ring)", "prague (groups of 4)", "local (H=8)"); "" when the
// configuration names none.
std::string peerAlgorithmLabel(const history::RunRecord& run);

// Builds the view of `run` from its rows (HistoryStore::peerIterations and peerEvals; iterations
// in another order are sorted by peer and iteration first).
// Each peer's iterations are drawn as compute, then communication, then waiting, in that
// order from t_start (the order within an iteration is not recorded); phases that add up to
// more than the iteration's span are scaled down to fit it, and a shortfall stays blank. When
// a peer has more iterations than its share of kMaxPeerTimelineSegments allows, runs of
// consecutive iterations are merged into one span from the first's t_start to the last's
// t_end, drawn the same way with their summed phases. A skipped iteration not merged with
// others is drawn as one "skipped" span.
PeerRunView buildPeerRunView(const history::RunRecord& run,
                             std::vector<history::PeerIterationRecord> iterations,
                             std::vector<history::PeerEvalRecord> evals);

// The overview of every decentralised run (<h2>Decentralised training</h2>, the table and the
// charts "peer-accuracy-time", "peer-loss-time", "peer-accuracy-iterations"); "" for none.
std::string peerOverviewSection(const std::vector<PeerRunView>& runs);

// The per-run part: the timeline chart `id` ("peer-timeline-RUN") and the per-peer table.
std::string peerRunSection(const PeerRunView& view, const std::string& id);

}  // namespace fedfleet::cli
