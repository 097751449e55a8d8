#include "cli/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/peer_report.h"
#include "cli/report_text.h"
#include "cli/svg_chart.h"

namespace fedfleet::cli {
namespace {

using history::RoundRecord;
using history::RunRecord;
using history::UpdateRecord;

constexpr size_t kMaxTimelineRows = 200;

constexpr const char* kStyle = R"css(
body { font-family: sans-serif; margin: 24px; color: #222; background: #fff; max-width: 1600px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
p.meta, p.note { color: #555; font-size: 13px; margin: 4px 0; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f4f4f4; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 12px 24px; }
figure.chart { margin: 0; }
figure.chart svg { width: 100%; height: auto; display: block; }
.chart-title { font-weight: bold; font-size: 14px; margin: 6px 0 2px; }
.legend { font-size: 12px; color: #333; margin: 2px 0 0 72px; }
.legend .key { margin-right: 14px; white-space: nowrap; }
.legend .swatch { display: inline-block; width: 12px; height: 12px; margin-right: 4px;
                  vertical-align: -2px; border-radius: 2px; }
details { margin: 8px 0; }
summary { cursor: pointer; font-weight: bold; font-size: 14px; }
)css";

// One run's rows, loaded once.
struct RunData {
  RunRecord run;
  std::vector<RoundRecord> rounds;
  std::vector<UpdateRecord> updates;
  std::vector<history::BlockMetricRecord> blocks;
  double origin = 0;  // the run's first round start, on its clock
  // A decentralised run (peer_iterations or peer_evals rows): what the report draws of them.
  std::optional<PeerRunView> peer;
  // Drawn as a federated run: it has rounds, or no peer rows either.
  bool federated() const { return !peer || !rounds.empty(); }

  std::string label() const {
    return "run " + std::to_string(run.run_id) + " · " + run.name + " (" + run.clock + " clock)";
  }
  double elapsed(double t) const { return t - origin; }
};

std::string runsTable(const std::vector<RunData>& data) {
  std::string out =
      "<table class=\"runs\"><tr><th>run</th><th>name</th><th>clock</th><th>started</th>"
      "<th>rounds</th><th>failed</th><th>initial acc.</th><th>final acc.</th><th>best acc.</th>"
      "<th>last fed. acc.</th>"
      "<th>bytes up</th><th>bytes down</th><th>run time</th><th>wall time</th></tr>\n";
  for (const auto& d : data) {
    uint32_t trained = 0, failed = 0;
    uint64_t up = 0, down = 0;
    std::optional<double> initial, last, best, fed;
    double end = d.origin, wall_lo = std::numeric_limits<double>::infinity(), wall_hi = -wall_lo;
    for (const auto& r : d.rounds) {
      if (r.status != "initial") ++trained;
      if (r.status == "failed") ++failed;
      up += r.bytes_up;
      down += r.bytes_down;
      if (r.test_accuracy) {
        if (r.status == "initial") initial = r.test_accuracy;
        last = r.test_accuracy;
        best = best ? std::max(*best, *r.test_accuracy) : *r.test_accuracy;
      }
      if (r.fed_eval_accuracy) fed = r.fed_eval_accuracy;
      end = std::max(end, r.end_time);
      if (std::isfinite(r.wall_start)) wall_lo = std::min(wall_lo, r.wall_start);
      if (std::isfinite(r.wall_end)) wall_hi = std::max(wall_hi, r.wall_end);
    }
    out += "<tr data-run-id=\"" + std::to_string(d.run.run_id) + "\">" +
           td(std::to_string(d.run.run_id), true) + td(d.run.name) + td(d.run.clock) +
           td(utcTime(d.run.started_at)) + td(std::to_string(trained), true) +
           td(std::to_string(failed), true) + td(percent(initial), true) + td(percent(last), true) +
           td(percent(best), true) + td(percent(fed), true) + td(humanBytes(up), true) +
           td(humanBytes(down), true) +
           // A decentralised run has no rounds: its time is its peers' (cli/peer_report.h).
           td(humanSeconds(d.federated() ? d.elapsed(end) : d.peer->end_time), true) +
           td(wall_hi >= wall_lo ? humanSeconds(wall_hi - wall_lo) : "-", true) + "</tr>\n";
  }
  return out + "</table>\n";
}

// Accuracy and loss of every run against round and against time since its start.
std::string overlayCharts(const std::vector<RunData>& data) {
  double max_elapsed = 0;
  for (const auto& d : data) {
    for (const auto& r : d.rounds) max_elapsed = std::max(max_elapsed, d.elapsed(r.end_time));
  }
  const Unit tu = timeUnit(max_elapsed);
  std::vector<ChartSeries> acc_round, acc_time, loss_round, loss_time;
  for (size_t i = 0; i < data.size(); ++i) {
    const RunData& d = data[i];
    ChartSeries ar{d.label(), paletteColor(i), {}, {}}, at = ar, lr = ar, lt = ar;
    for (const auto& r : d.rounds) {
      if (r.test_accuracy) {
        ar.x.push_back(r.round);
        ar.y.push_back(*r.test_accuracy);
        at.x.push_back(d.elapsed(r.end_time));
        at.y.push_back(*r.test_accuracy);
      }
      if (r.test_loss) {
        lr.x.push_back(r.round);
        lr.y.push_back(*r.test_loss);
        lt.x.push_back(d.elapsed(r.end_time));
        lt.y.push_back(*r.test_loss);
      }
    }
    acc_round.push_back(std::move(ar));
    acc_time.push_back(std::move(at));
    loss_round.push_back(std::move(lr));
    loss_time.push_back(std::move(lt));
    // Federated evaluation, dashed beside the server's: round r's figures are of the model its
    // tasks carried, the one after round r - 1, which existed from round r's start.
    ChartSeries far{d.label() + " · federated", paletteColor(i), {}, {}, /*dashed=*/true};
    ChartSeries fat = far, flr = far, flt = far;
    for (const auto& r : d.rounds) {
      if (r.round == 0 || !r.fed_eval_accuracy || !r.fed_eval_loss) continue;
      far.x.push_back(r.round - 1);
      far.y.push_back(*r.fed_eval_accuracy);
      fat.x.push_back(d.elapsed(r.start_time));
      fat.y.push_back(*r.fed_eval_accuracy);
      flr.x.push_back(r.round - 1);
      flr.y.push_back(*r.fed_eval_loss);
      flt.x.push_back(d.elapsed(r.start_time));
      flt.y.push_back(*r.fed_eval_loss);
    }
    if (!far.x.empty()) {
      acc_round.push_back(std::move(far));
      acc_time.push_back(std::move(fat));
      loss_round.push_back(std::move(flr));
      loss_time.push_back(std::move(flt));
    }
  }
  ChartAxis round_axis{"round", 1, std::nullopt, std::nullopt, true};
  ChartAxis time_axis{"time since the run started (" + tu.name + "; each run on its own clock)",
                      tu.scale, 0.0, std::nullopt, false};
  ChartAxis acc_axis{"test accuracy (%)", 100, std::nullopt, std::nullopt, false};
  ChartAxis loss_axis{"test loss (the run's train.loss)", 1, std::nullopt, std::nullopt, false};
  // (Dashed: the clients' federated evaluation on their held-out data, where the run has one.)
  std::string out = "<div class=\"grid\">\n";
  out +=
      renderLineChart("accuracy-round", "Test accuracy by round", round_axis, acc_axis, acc_round);
  out += renderLineChart("accuracy-time", "Test accuracy over time", time_axis, acc_axis, acc_time);
  out += renderLineChart("loss-round", "Test loss by round", round_axis, loss_axis, loss_round);
  out += renderLineChart("loss-time", "Test loss over time", time_axis, loss_axis, loss_time);
  return out + "</div>\n";
}

// One chart by round for each metric beyond loss and accuracy (a regression's mse and mae, a
// model's own metrics()): a line per run, dashed for the federated figures (at round - 1, as
// above). Nothing when no run has any.
std::string metricCharts(const std::vector<RunData>& data) {
  std::vector<std::string> names;  // in the order they first appear
  const auto note = [&](const history::Metrics& m) {
    for (const auto& [name, v] : m) {
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  };
  for (const auto& d : data) {
    for (const auto& r : d.rounds) note(r.test_metrics), note(r.fed_eval_metrics);
  }
  if (names.empty()) return "";
  const auto valueOf = [](const history::Metrics& m,
                          const std::string& name) -> std::optional<double> {
    for (const auto& [n, v] : m) {
      if (n == name) return v;
    }
    return std::nullopt;
  };
  std::string out = "<h2>Metrics</h2>\n<div class=\"grid\">\n";
  for (size_t k = 0; k < names.size(); ++k) {
    const std::string& name = names[k];
    std::vector<ChartSeries> series;
    for (size_t i = 0; i < data.size(); ++i) {
      const RunData& d = data[i];
      ChartSeries server{d.label(), paletteColor(i), {}, {}};
      ChartSeries fed{d.label() + " · federated", paletteColor(i), {}, {}, /*dashed=*/true};
      for (const auto& r : d.rounds) {
        if (auto v = valueOf(r.test_metrics, name)) {
          server.x.push_back(r.round);
          server.y.push_back(*v);
        }
        if (auto v = valueOf(r.fed_eval_metrics, name); v && r.round > 0) {
          fed.x.push_back(r.round - 1);
          fed.y.push_back(*v);
        }
      }
      if (!server.x.empty()) series.push_back(std::move(server));
      if (!fed.x.empty()) series.push_back(std::move(fed));
    }
    out += renderLineChart("metric-" + std::to_string(k), name + " by round",
                           ChartAxis{"round", 1, std::nullopt, std::nullopt, true},
                           ChartAxis{name, 1, std::nullopt, std::nullopt, false}, series);
  }
  return out + "</div>\n";
}

// Differentially private runs (dp.mode = "central"): epsilon spent by round, and test accuracy
// against the epsilon spent (the privacy-utility trade-off), a line per run. Nothing when no
// run records an epsilon.
std::string privacyCharts(const std::vector<RunData>& data) {
  std::vector<ChartSeries> spent, utility;
  for (size_t i = 0; i < data.size(); ++i) {
    const RunData& d = data[i];
    ChartSeries e{d.label(), paletteColor(i), {}, {}}, u = e;
    for (const auto& r : d.rounds) {
      if (!r.dp_epsilon) continue;
      e.x.push_back(r.round);
      e.y.push_back(*r.dp_epsilon);
      if (r.test_accuracy) {
        u.x.push_back(*r.dp_epsilon);
        u.y.push_back(*r.test_accuracy);
      }
    }
    if (!e.x.empty()) spent.push_back(std::move(e));
    if (!u.x.empty()) utility.push_back(std::move(u));
  }
  if (spent.empty()) return "";
  const ChartAxis epsilon_axis{"epsilon spent (at the run's dp.delta)", 1, std::nullopt,
                               std::nullopt, false};
  std::string out = "<h2>Privacy</h2>\n<div class=\"grid\">\n";
  out +=
      renderLineChart("privacy-epsilon", "Epsilon spent by round",
                      ChartAxis{"round", 1, std::nullopt, std::nullopt, true}, epsilon_axis, spent);
  if (!utility.empty()) {
    out += renderLineChart("privacy-accuracy", "Test accuracy against epsilon spent", epsilon_axis,
                           ChartAxis{"test accuracy (%)", 100, std::nullopt, std::nullopt, false},
                           utility);
  }
  return out + "</div>\n";
}

std::string participantsChart(const RunData& d, const std::string& id) {
  std::vector<double> rounds;
  BarSeries completed{"completed", "#009E73", {}}, late{"late", "#E69F00", {}},
      dropped{"dropped", "#D55E00", {}}, rejected{"rejected", "#CC79A7", {}};
  for (const auto& r : d.rounds) {
    if (r.status == "initial") continue;
    rounds.push_back(r.round);
    completed.values.push_back(r.completed);
    late.values.push_back(r.late);
    dropped.values.push_back(r.dropped);
    rejected.values.push_back(r.rejected);
  }
  return renderBarChart(id, "Participants per round (selected clients by outcome)", rounds,
                        ChartAxis{"round", 1, std::nullopt, std::nullopt, true},
                        ChartAxis{"clients", 1, std::nullopt, std::nullopt, true},
                        {completed, late, dropped, rejected}, /*stacked=*/true);
}

std::string bytesChart(const RunData& d, const std::string& id) {
  std::vector<double> rounds;
  BarSeries up{"bytes up (clients to coordinator)", "#0072B2", {}},
      down{"bytes down (coordinator to clients)", "#56B4E9", {}};
  double max_bytes = 0;
  for (const auto& r : d.rounds) {
    if (r.status == "initial") continue;
    rounds.push_back(r.round);
    up.values.push_back(static_cast<double>(r.bytes_up));
    down.values.push_back(static_cast<double>(r.bytes_down));
    max_bytes =
        std::max({max_bytes, static_cast<double>(r.bytes_up), static_cast<double>(r.bytes_down)});
  }
  const Unit u = byteUnit(max_bytes);
  return renderBarChart(
      id, "Traffic per round", rounds, ChartAxis{"round", 1, std::nullopt, std::nullopt, true},
      ChartAxis{u.name + " per round", u.scale, std::nullopt, std::nullopt, false}, {up, down},
      /*stacked=*/false);
}

std::string timelineSection(const RunData& d, const std::optional<uint32_t>& asked,
                            const std::string& id) {
  const std::optional<uint32_t> round = asked ? asked : stragglerRound(d.updates);
  if (!round) return "<p class=\"note\">No client updates recorded: no timeline.</p>\n";
  const RoundRecord* rec = nullptr;
  for (const auto& r : d.rounds) {
    if (r.round == *round) rec = &r;
  }
  std::vector<const UpdateRecord*> updates;
  for (const auto& u : d.updates) {
    if (u.round == *round) updates.push_back(&u);
  }
  if (!rec || updates.empty()) {
    return "<p class=\"note\">Round " + std::to_string(*round) +
           " has no client updates in this run: no timeline.</p>\n";
  }
  const double start = rec->start_time;
  const double round_end = rec->end_time - start;
  // Completed first by finishing time, then the ones that never finished.
  std::stable_sort(updates.begin(), updates.end(), [](const auto* a, const auto* b) {
    const bool fa = a->status == "completed", fb = b->status == "completed";
    if (fa != fb) return fa;
    return a->end_time < b->end_time;
  });
  const size_t total = updates.size();
  if (updates.size() > kMaxTimelineRows) {
    updates.erase(updates.begin(), updates.end() - kMaxTimelineRows);  // keep the slowest
  }
  std::vector<TimelineRow> rows;
  double max_span = round_end;
  for (const UpdateRecord* u : updates) {
    TimelineRow row{u->client_id, u->status, {}};
    const double s = u->start_time - start, e = u->end_time - start;
    const double span = std::max(0.0, e - s);
    max_span = std::max(max_span, e);
    const double upload = std::clamp(u->upload_s, 0.0, span);
    const double compute = std::clamp(u->compute_s, 0.0, span - upload);
    if (u->status == "completed" || u->status == "rejected") {
      const double wait = span - upload - compute;
      if (wait > 0) row.segments.push_back({"download", s, s + wait});
      row.segments.push_back({"compute", s + wait, s + wait + compute});
      row.segments.push_back({"upload", s + wait + compute, e});
      if (round_end > e) row.segments.push_back({"idle", e, round_end});
    } else {
      // Cancelled at the deadline or lost: what it reported (often nothing), then unfinished.
      if (compute > 0) row.segments.push_back({"compute", s, s + compute});
      row.segments.push_back({"unfinished", s + compute, e});
    }
    rows.push_back(std::move(row));
  }
  const Unit tu = timeUnit(max_span);
  const std::vector<TimelineKind> kinds = {
      {"download", "download and wait for the task", "#BBBBBB"},
      {"compute", "compute", "#0072B2"},
      {"upload", "upload", "#E69F00"},
      {"idle", "idle until the round ended", "#DDEEDD"},
      {"unfinished", "unfinished (late or dropped)", "#CC79A7"},
  };
  std::string out = renderTimeline(
      id,
      "Per-client timeline of round " + std::to_string(*round) + " (" + std::to_string(total) +
          " clients)",
      rows, kinds,
      ChartAxis{"time since the round started (" + tu.name + ", " + d.run.clock + " clock)",
                tu.scale, std::nullopt, std::nullopt, false},
      round_end);
  if (total > rows.size()) {
    out += "<p class=\"note\">Showing the " + std::to_string(rows.size()) + " slowest of " +
           std::to_string(total) + " clients.</p>\n";
  }
  return out;
}

// Per-block accuracy of a block-cyclic run; empty when the database has no block_metrics table
// (history::HistoryStore::blockMetrics) or the run no rows in it.
std::string blockSection(const RunData& d, const std::string& id) {
  if (d.blocks.empty()) return "";
  std::map<std::string, ChartSeries> by_key;
  std::vector<std::string> order;
  for (const auto& b : d.blocks) {
    const std::string key = "block " + b.block + (b.model.empty() ? "" : " · " + b.model);
    auto [it, inserted] = by_key.try_emplace(key);
    if (inserted) {
      it->second.name = key;
      it->second.color = paletteColor(order.size());
      it->second.dashed = order.size() >= 8;
      order.push_back(key);
    }
    it->second.x.push_back(b.round);
    it->second.y.push_back(b.accuracy.value_or(std::numeric_limits<double>::quiet_NaN()));
  }
  std::vector<ChartSeries> series;
  for (const auto& key : order) series.push_back(by_key[key]);
  return "<h3>Per-block accuracy</h3>\n" +
         renderLineChart(id, "Test accuracy of each block's model by round",
                         ChartAxis{"round", 1, std::nullopt, std::nullopt, true},
                         ChartAxis{"test accuracy (%)", 100, std::nullopt, std::nullopt, false},
                         series);
}

void flatten(const nlohmann::json& j, const std::string& prefix,
             std::vector<std::pair<std::string, std::string>>& out) {
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      flatten(value, prefix.empty() ? key : prefix + "." + key, out);
    }
    return;
  }
  out.emplace_back(prefix, j.is_string()
                               ? j.get<std::string>()
                               : j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

std::string configTable(const RunData& d) {
  std::string out = "<details class=\"config\" open><summary>Configuration of run " +
                    std::to_string(d.run.run_id) + " (seed " + std::to_string(d.run.seed) +
                    ")</summary>\n";
  const auto j = nlohmann::json::parse(d.run.config_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return out + "<pre>" + htmlEscape(d.run.config_json) + "</pre></details>\n";
  }
  std::vector<std::pair<std::string, std::string>> rows;
  flatten(j, "", rows);
  out += "<table class=\"config\"><tr><th>key</th><th>value</th></tr>\n";
  for (const auto& [key, value] : rows) out += "<tr>" + td(key) + td(value) + "</tr>\n";
  return out + "</table></details>\n";
}

}  // namespace

std::optional<uint32_t> stragglerRound(const std::vector<UpdateRecord>& updates) {
  std::map<uint32_t, std::vector<double>> ends;  // per round: end - start of each update
  for (const auto& u : updates) ends[u.round].push_back(u.end_time - u.start_time);
  std::optional<uint32_t> best;
  double best_tail = -1;
  for (auto& [round, spans] : ends) {
    std::sort(spans.begin(), spans.end());
    const double tail = spans.back() - spans[spans.size() / 2];
    if (tail >= best_tail) {  // ties: the later round
      best_tail = tail;
      best = round;
    }
  }
  return best;
}

Result<std::string> renderReport(history::HistoryStore& store, const ReportOptions& options) {
  FEDFLEET_ASSIGN_OR_RETURN(auto runs, store.runs());
  if (runs.empty()) return failedPrecondition("the history holds no runs");
  std::vector<RunRecord> chosen;
  if (options.runs.empty()) {
    chosen = runs;
  } else {
    for (int64_t id : options.runs) {
      auto it = std::find_if(runs.begin(), runs.end(),
                             [id](const RunRecord& r) { return r.run_id == id; });
      if (it == runs.end()) {
        return notFound("no run " + std::to_string(id) + " (runs are " +
                        std::to_string(runs.front().run_id) + ".." +
                        std::to_string(runs.back().run_id) + ")");
      }
      chosen.push_back(*it);
    }
  }
  std::vector<RunData> data;
  for (const auto& run : chosen) {
    RunData d;
    d.run = run;
    FEDFLEET_ASSIGN_OR_RETURN(d.rounds, store.rounds(run.run_id));
    FEDFLEET_ASSIGN_OR_RETURN(d.updates, store.updates(run.run_id, std::nullopt));
    FEDFLEET_ASSIGN_OR_RETURN(d.blocks, store.blockMetrics(run.run_id));
    d.origin = d.rounds.empty() ? 0 : d.rounds.front().start_time;
    for (const auto& r : d.rounds) d.origin = std::min(d.origin, r.start_time);
    {
      // Reduced to what is drawn at once, so only one run's iteration rows are held at a time.
      FEDFLEET_ASSIGN_OR_RETURN(auto iterations, store.peerIterations(run.run_id));
      FEDFLEET_ASSIGN_OR_RETURN(auto evals, store.peerEvals(run.run_id));
      if (!iterations.empty() || !evals.empty()) {
        d.peer = buildPeerRunView(run, std::move(iterations), std::move(evals));
      }
    }
    data.push_back(std::move(d));
  }
  // The overlays of federated runs draw their run and rounds only: copy just those.
  std::vector<RunData> federated;
  std::vector<PeerRunView> decentralized;
  for (const auto& d : data) {
    if (d.federated()) {
      RunData f;
      f.run = d.run;
      f.rounds = d.rounds;
      f.origin = d.origin;
      federated.push_back(std::move(f));
    }
    if (d.peer) decentralized.push_back(*d.peer);
  }

  std::string html = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>" +
                     htmlEscape(options.title) + "</title>\n<style>" + kStyle +
                     "</style></head>\n<body>\n<h1>" + htmlEscape(options.title) + "</h1>\n";
  html += "<p class=\"meta\">" + std::to_string(data.size()) + " run" +
          (data.size() == 1 ? "" : "s") +
          " from the fedfleet history. Times on each run's own clock: <em>virtual</em> seconds "
          "for a simulation, <em>wall</em> seconds for a coordinator.</p>\n";
  html += "<h2>Runs</h2>\n" + runsTable(data);
  if (!federated.empty()) {
    html += "<h2>Accuracy and loss</h2>\n" + overlayCharts(federated);
    html += metricCharts(federated);
    html += privacyCharts(federated);
  }
  html += peerOverviewSection(decentralized);
  for (const auto& d : data) {
    const std::string id = std::to_string(d.run.run_id);
    html += "<section class=\"run\" data-run-id=\"" + id + "\">\n<h2>" +
            htmlEscape("Run " + id + ": " + d.run.name) + "</h2>\n";
    if (d.federated()) {
      html += "<div class=\"grid\">\n";
      html += participantsChart(d, "participants-" + id);
      html += bytesChart(d, "bytes-" + id);
      html += "</div>\n<h3>Stragglers</h3>\n";
      html += timelineSection(d, options.timeline_round, "timeline-" + id);
      html += blockSection(d, "blocks-" + id);
    }
    if (d.peer) html += peerRunSection(*d.peer, "peer-timeline-" + id);
    html += configTable(d);
    html += "</section>\n";
  }
  html += "</body></html>\n";
  return html;
}

}  // namespace fedfleet::cli
