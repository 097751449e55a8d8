#include "cli/peer_report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>
#include <utility>

#include "cli/report_text.h"

namespace fedfleet::cli {
namespace {

using history::PeerEvalRecord;
using history::PeerIterationRecord;
using history::PeerSummary;

// The timeline's kinds, in drawing order within an iteration.
const std::vector<TimelineKind>& peerKinds() {
  static const std::vector<TimelineKind> kKinds = {
      {"compute", "compute", "#0072B2"},
      {"comm", "communication (sending, receiving)", "#E69F00"},
      {"wait", "waiting for peers", "#D55E00"},
      {"skipped", "skipped to catch up (Hop)", "#999999"},
  };
  return kKinds;
}

// The integer at `key` of `section`, if it holds one.
std::optional<int64_t> integerAt(const nlohmann::json& section, const char* key) {
  auto it = section.find(key);
  if (it == section.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

std::optional<std::string> stringAt(const nlohmann::json& section, const char* key) {
  auto it = section.find(key);
  if (it == section.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

// Appends the span [from, to) of `count` iterations with these summed phases to `row`: compute,
// then communication, then waiting, scaled down together when they add up to more than the span.
void addSpan(TimelineRow& row, double from, double to, double compute, double comm, double wait) {
  const double span = std::max(0.0, to - from);
  const double total = compute + comm + wait;
  const double fit = total > span && total > 0 ? span / total : 1;
  double at = from;
  for (const auto& [kind, seconds] :
       {std::pair{"compute", compute * fit}, std::pair{"comm", comm * fit},
        std::pair{"wait", wait * fit}}) {
    if (seconds <= 0) continue;
    row.segments.push_back({kind, at, at + seconds});
    at += seconds;
  }
}

// The runs' evaluations as one line each against `x_of(eval)` and `y_of(eval)`.
template <typename X, typename Y>
std::vector<ChartSeries> evalSeries(const std::vector<PeerRunView>& runs, X x_of, Y y_of) {
  std::vector<ChartSeries> out;
  for (size_t i = 0; i < runs.size(); ++i) {
    const PeerRunView& v = runs[i];
    ChartSeries s{"run " + std::to_string(v.run.run_id) + " · " +
                      (v.algorithm.empty() ? v.run.name : v.algorithm),
                  paletteColor(i),
                  {},
                  {},
                  /*dashed=*/i >= 8};  // the palette has 8 colours: tell reused ones apart
    for (const PeerEvalRecord& e : v.evals) {
      s.x.push_back(x_of(e));
      s.y.push_back(y_of(e));
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string overviewTable(const std::vector<PeerRunView>& runs) {
  std::string out =
      "<table class=\"peer-runs\"><tr><th>run</th><th>name</th><th>algorithm</th><th>clock</th>"
      "<th>peers</th><th>iterations</th><th>skipped</th><th>final acc.</th><th>best acc.</th>"
      "<th>run time</th><th>bytes sent</th><th>waiting</th></tr>\n";
  for (const PeerRunView& v : runs) {
    uint64_t iterations = 0, skipped = 0;
    double sent = 0, wait = 0, busy = 0;
    for (const PeerSummary& p : v.peers) {
      iterations += p.iterations;
      skipped += p.skipped;
      sent += static_cast<double>(p.bytes_sent);
      wait += p.wait_s;
      busy += p.compute_s + p.comm_s + p.wait_s;
    }
    std::optional<double> final_acc, best_acc;
    for (const PeerEvalRecord& e : v.evals) {
      if (!std::isfinite(e.accuracy)) continue;
      final_acc = e.accuracy;
      best_acc = std::max(best_acc.value_or(e.accuracy), e.accuracy);
    }
    // Waiting as a share of the time the peers accounted for (compute + communication + wait).
    const std::string waiting = busy > 0 ? fixed(100 * wait / busy, 1) + "%" : "-";
    out += "<tr data-run-id=\"" + std::to_string(v.run.run_id) + "\">" +
           td(std::to_string(v.run.run_id), true) + td(v.run.name) +
           td(v.algorithm.empty() ? "-" : v.algorithm) + td(v.run.clock) +
           td(std::to_string(v.peers.size()), true) + td(std::to_string(iterations), true) +
           td(std::to_string(skipped), true) + td(percent(final_acc), true) +
           td(percent(best_acc), true) + td(humanSeconds(v.end_time), true) +
           td(humanBytes(sent), true) + td(waiting, true) + "</tr>\n";
  }
  return out + "</table>\n";
}

}  // namespace

std::string peerAlgorithmLabel(const history::RunRecord& run) {
  const auto j = nlohmann::json::parse(run.config_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return "";
  auto section = j.find("decentralized");
  if (section == j.end() || !section->is_object()) return "";
  const std::optional<std::string> algorithm = stringAt(*section, "algorithm");
  if (!algorithm || algorithm->empty()) return "";
  std::string detail;
  if (*algorithm == "allreduce") {
    if (auto pipeline = integerAt(*section, "pipeline"); pipeline && *pipeline > 1) {
      detail = "pipeline " + std::to_string(*pipeline);
    }
    if (auto codec = stringAt(*section, "codec"); codec && *codec != "none" && !codec->empty()) {
      detail += (detail.empty() ? "" : ", ") + *codec;
    }
  } else if (*algorithm == "dpsgd" || *algorithm == "adpsgd" || *algorithm == "hop") {
    if (auto topology = stringAt(*section, "topology")) detail = *topology;
  } else if (*algorithm == "prague") {
    if (auto g = integerAt(*section, "group_size")) detail = "groups of " + std::to_string(*g);
  } else if (*algorithm == "local") {
    if (auto h = integerAt(*section, "local_steps")) detail = "H=" + std::to_string(*h);
  }
  return detail.empty() ? *algorithm : *algorithm + " (" + detail + ")";
}

PeerRunView buildPeerRunView(const history::RunRecord& run,
                             std::vector<PeerIterationRecord> iterations,
                             std::vector<PeerEvalRecord> evals) {
  const auto by_peer_iteration = [](const PeerIterationRecord& a, const PeerIterationRecord& b) {
    return std::tie(a.peer, a.iteration) < std::tie(b.peer, b.iteration);
  };
  if (!std::is_sorted(iterations.begin(), iterations.end(), by_peer_iteration)) {
    std::sort(iterations.begin(), iterations.end(), by_peer_iteration);
  }
  PeerRunView view;
  view.run = run;
  view.algorithm = peerAlgorithmLabel(run);
  view.evals = std::move(evals);
  view.peers = history::summarizePeers(iterations);
  for (const PeerSummary& p : view.peers) view.end_time = std::max(view.end_time, p.last_end);
  for (const PeerEvalRecord& e : view.evals) view.end_time = std::max(view.end_time, e.time_s);

  const size_t rows = std::min(view.peers.size(), kMaxPeerTimelineRows);
  if (rows == 0) return view;
  // Spans per peer: each draws up to three rectangles.
  const uint64_t spans_per_peer = std::max<uint64_t>(1, kMaxPeerTimelineSegments / rows / 3);
  // The rows come ordered by (peer, iteration): each peer's iterations are one stretch.
  size_t at = 0;
  for (size_t p = 0; p < rows; ++p) {
    const PeerSummary& peer = view.peers[p];
    while (at < iterations.size() && iterations[at].peer != peer.peer) ++at;
    const uint64_t n = peer.iterations;
    const uint64_t group = (n + spans_per_peer - 1) / spans_per_peer;
    view.iterations_per_span = std::max(view.iterations_per_span, group);
    TimelineRow row{"peer " + std::to_string(peer.peer), "", {}};
    for (uint64_t first = 0; first < n; first += group) {
      const uint64_t count = std::min(group, n - first);
      const PeerIterationRecord& head = iterations[at + first];
      if (count == 1 && head.skipped) {
        row.segments.push_back({"skipped", head.t_start, head.t_end});
        continue;
      }
      double from = std::numeric_limits<double>::infinity(), to = 0;
      double compute = 0, comm = 0, wait = 0;
      for (uint64_t k = 0; k < count; ++k) {
        const PeerIterationRecord& r = iterations[at + first + k];
        from = std::min(from, r.t_start);
        to = std::max(to, r.t_end);
        compute += r.compute_s;
        comm += r.comm_s;
        wait += r.wait_s;
      }
      addSpan(row, from, to, compute, comm, wait);
    }
    at += n;
    view.timeline.push_back(std::move(row));
  }
  return view;
}

std::string peerOverviewSection(const std::vector<PeerRunView>& runs) {
  if (runs.empty()) return "";
  double max_time = 0;
  for (const PeerRunView& v : runs) max_time = std::max(max_time, v.end_time);
  const Unit tu = timeUnit(max_time);
  const ChartAxis time_axis{
      "time since the run started (" + tu.name + "; each run on its own clock)", tu.scale, 0.0,
      std::nullopt, false};
  const ChartAxis iteration_axis{"iterations of all peers", 1, 0.0, std::nullopt, true};
  const ChartAxis acc_axis{"test accuracy of the peers' average model (%)", 100, std::nullopt,
                           std::nullopt, false};
  const ChartAxis loss_axis{"test loss of the peers' average model", 1, std::nullopt, std::nullopt,
                            false};
  const auto time_of = [](const PeerEvalRecord& e) { return e.time_s; };
  const auto iterations_of = [](const PeerEvalRecord& e) {
    return static_cast<double>(e.iterations);
  };
  const auto accuracy_of = [](const PeerEvalRecord& e) { return e.accuracy; };
  const auto loss_of = [](const PeerEvalRecord& e) { return e.loss; };
  std::string out = "<h2>Decentralised training</h2>\n";
  out +=
      "<p class=\"note\">Runs whose peers train and exchange with each other, without a "
      "central model. Accuracy and loss are of the average of the peers' models, evaluated "
      "on the test set now and then.</p>\n";
  out += overviewTable(runs);
  out += "<div class=\"grid\">\n";
  out += renderLineChart("peer-accuracy-time", "Test accuracy over time (decentralised runs)",
                         time_axis, acc_axis, evalSeries(runs, time_of, accuracy_of));
  out += renderLineChart("peer-loss-time", "Test loss over time (decentralised runs)", time_axis,
                         loss_axis, evalSeries(runs, time_of, loss_of));
  out += renderLineChart("peer-accuracy-iterations",
                         "Test accuracy by iterations (decentralised runs)", iteration_axis,
                         acc_axis, evalSeries(runs, iterations_of, accuracy_of));
  return out + "</div>\n";
}

std::string peerRunSection(const PeerRunView& view, const std::string& id) {
  std::string out = "<h3>Peers</h3>\n";
  if (view.peers.empty()) {
    return out + "<p class=\"note\">No peer iterations recorded: no timeline.</p>\n";
  }
  const Unit tu = timeUnit(view.end_time);
  out += renderTimeline(
      id,
      "Per-peer timeline (" + std::to_string(view.peers.size()) + " peers" +
          (view.algorithm.empty() ? "" : ", " + view.algorithm) + ")",
      view.timeline, peerKinds(),
      ChartAxis{"time since the run started (" + tu.name + ", " + view.run.clock + " clock)",
                tu.scale, std::nullopt, std::nullopt, false},
      std::nullopt);
  out +=
      "<p class=\"note\">Each iteration, from its start to the end of its exchange, is drawn as "
      "its compute time, then its communication, then its waiting: the order within an "
      "iteration is not recorded, phases that overlapped are scaled down to fit, and time no "
      "phase accounts for is left blank.";
  if (view.iterations_per_span > 1) {
    out += " To keep the chart small, up to " + std::to_string(view.iterations_per_span) +
           " consecutive iterations of a peer are drawn as one span with their summed phases.";
  }
  if (view.timeline.size() < view.peers.size()) {
    out += " The timeline shows the first " + std::to_string(view.timeline.size()) + " of " +
           std::to_string(view.peers.size()) + " peers; the table lists all.";
  }
  out += "</p>\n";
  out += "<table class=\"peers\" data-run-id=\"" + std::to_string(view.run.run_id) +
         "\"><tr><th>peer</th><th>iterations</th><th>skipped</th><th>exchanges</th>"
         "<th>bytes sent</th><th>bytes received</th><th>compute</th><th>communication</th>"
         "<th>waiting</th><th>mean staleness</th><th>max staleness</th></tr>\n";
  for (const PeerSummary& p : view.peers) {
    out += "<tr data-peer=\"" + std::to_string(p.peer) + "\">" + td(std::to_string(p.peer), true) +
           td(std::to_string(p.iterations), true) + td(std::to_string(p.skipped), true) +
           td(std::to_string(p.exchanges), true) +
           td(humanBytes(static_cast<double>(p.bytes_sent)), true) +
           td(humanBytes(static_cast<double>(p.bytes_received)), true) +
           td(humanSeconds(p.compute_s), true) + td(humanSeconds(p.comm_s), true) +
           td(humanSeconds(p.wait_s), true) + td(fixed(p.mean_staleness, 2), true) +
           td(std::to_string(p.max_staleness), true) + "</tr>\n";
  }
  return out + "</table>\n";
}

}  // namespace fedfleet::cli
