// The decentralised part of the HTML report (cli/peer_report.h): a history with two
// decentralised runs (and a federated one) draws both runs' accuracy lines labelled by their
// algorithm, each run's per-peer timeline with its compute, communication and waiting spans at
// the recorded times, and the per-peer table with the recorded totals; a long run's timeline
// is merged into a bounded number of rectangles that keep the phases' totals; and a history of
// federated runs alone has no decentralised section. `fedfleet history peers` and `peer-evals`
// print the same figures as text.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "cli/peer_report.h"
#include "cli/report.h"
#include "common/history/history.h"
#include "tests/integration/process.h"

namespace fedfleet::cli {
namespace {

const std::string kBinary = FEDFLEET_BINARY;

using Attrs = std::map<std::string, std::string>;

// The attributes of each tag starting with `tag_prefix` inside <svg data-chart="CHART">.
std::vector<Attrs> elementsIn(const std::string& html, const std::string& chart,
                              const std::string& tag_prefix) {
  std::vector<Attrs> out;
  const auto begin = html.find("<svg data-chart=\"" + chart + "\"");
  if (begin == std::string::npos) return out;
  const std::string svg = html.substr(begin, html.find("</svg>", begin) - begin);
  static const std::regex kAttr(R"re(([a-z-]+)="([^"]*)")re");
  for (size_t at = svg.find(tag_prefix); at != std::string::npos;
       at = svg.find(tag_prefix, at + 1)) {
    const std::string tag = svg.substr(at, svg.find('>', at) - at);
    Attrs attrs;
    for (std::sregex_iterator it(tag.begin(), tag.end(), kAttr), stop; it != stop; ++it) {
      attrs[(*it)[1]] = (*it)[2];
    }
    out.push_back(std::move(attrs));
  }
  return out;
}

// The segments of the timeline row of `client` in chart `chart`, as (kind, from, to).
struct Segment {
  std::string kind;
  double from, to;
};
std::vector<Segment> rowSegments(const std::string& html, const std::string& chart,
                                 const std::string& client) {
  const auto svg_at = html.find("<svg data-chart=\"" + chart + "\"");
  if (svg_at == std::string::npos) return {};
  const auto row_at = html.find("data-client=\"" + client + "\"", svg_at);
  if (row_at == std::string::npos) return {};
  const std::string row = html.substr(row_at, html.find("</g>", row_at) - row_at);
  std::vector<Segment> out;
  static const std::regex kSegment(
      R"re(<rect class="segment" data-kind="([a-z]+)" data-from="([^"]*)" data-to="([^"]*)")re");
  for (std::sregex_iterator it(row.begin(), row.end(), kSegment), stop; it != stop; ++it) {
    out.push_back({(*it)[1], std::stod((*it)[2]), std::stod((*it)[3])});
  }
  return out;
}

// The cells of the table row `<tr data-peer="PEER">` after `table_at`.
std::vector<std::string> peerRow(const std::string& html, size_t table_at, uint32_t peer) {
  const auto at = html.find("<tr data-peer=\"" + std::to_string(peer) + "\">", table_at);
  if (at == std::string::npos) return {};
  const std::string row = html.substr(at, html.find("</tr>", at) - at);
  std::vector<std::string> cells;
  static const std::regex kCell(R"re(<td[^>]*>([^<]*)</td>)re");
  for (std::sregex_iterator it(row.begin(), row.end(), kCell), stop; it != stop; ++it) {
    cells.push_back((*it)[1]);
  }
  return cells;
}

history::PeerIterationRecord iteration(int64_t run, uint32_t peer, uint64_t i, double t_start,
                                       double t_end, double compute, double comm, double wait) {
  history::PeerIterationRecord r;
  r.run_id = run;
  r.peer = peer;
  r.iteration = i;
  r.t_start = t_start;
  r.t_end = t_end;
  r.compute_s = compute;
  r.comm_s = comm;
  r.wait_s = wait;
  return r;
}

class PeerReport : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::freshDir("report_peer");
    db_ = dir_ + "/h.db";
    auto opened = history::openSqliteHistory(db_);
    ASSERT_TRUE(opened.isOk()) << opened.status().toString();
    store_ = std::move(opened).value();
  }

  int64_t addRun(const std::string& name, const std::string& config) {
    history::RunRecord run;
    run.name = name;
    run.clock = "virtual";
    run.config_json = config;
    auto id = store_->beginRun(run);
    EXPECT_TRUE(id.isOk());
    return *id;
  }

  // A federated run with two evaluated rounds, then two decentralised runs:
  //  dpsgd (ring), 3 peers of 3 iterations; peer 1's iteration 1 was skipped, peer 2's
  //  iteration 2 reports more time than its span (its phases are scaled to fit); 3 evaluations.
  //  allreduce with Pipe-SGD's pipeline, 2 peers of 2 iterations; 4 evaluations.
  void addRuns() {
    fed_run_ = addRun("fedavg", R"({"policy":{"mode":"sync"}})");
    for (uint32_t r = 0; r <= 1; ++r) {
      history::RoundRecord row;
      row.run_id = fed_run_;
      row.round = r;
      row.status = r == 0 ? "initial" : "ok";
      row.start_time = 10.0 * r;
      row.end_time = row.start_time + 10;
      row.test_accuracy = 0.2 + 0.3 * r;
      ASSERT_TRUE(store_->commitRound(row, {}, std::nullopt).isOk());
    }
    dpsgd_run_ = addRun(
        "gossip",
        R"({"policy":{"mode":"decentralized"},"decentralized":{"algorithm":"dpsgd","topology":"ring","pipeline":1}})");
    std::vector<history::PeerIterationRecord> rows;
    for (uint32_t p = 0; p < 3; ++p) {
      for (uint64_t i = 0; i < 3; ++i) {
        const double start = 2.0 * i;
        auto r = iteration(dpsgd_run_, p, i, start, start + 2.0, 1.0, 0.5, 0.25 * p);
        r.bytes_sent = 1000 * (p + 1);
        r.bytes_received = 500;
        r.exchanges = 2;
        r.staleness = static_cast<uint32_t>(i % 2) * p;
        if (p == 1 && i == 1) {
          r.skipped = true;
          r.t_end = r.t_start + 0.5;
          r.compute_s = 0;
          r.comm_s = 0;
          r.wait_s = 0.5;
        }
        if (p == 2 && i == 2) {  // 4 s of phases in a 2 s span
          r.compute_s = 2.0;
          r.comm_s = 1.0;
          r.wait_s = 1.0;
        }
        rows.push_back(r);
      }
    }
    ASSERT_TRUE(store_->recordPeerIterations(rows).isOk());
    for (const auto& [t, acc] : {std::pair{0.0, 0.1}, std::pair{3.0, 0.45}, std::pair{6.0, 0.6}}) {
      ASSERT_TRUE(
          store_->recordPeerEval({dpsgd_run_, t, static_cast<uint64_t>(t * 1.5), 3, acc, 2.0 - acc})
              .isOk());
    }
    allreduce_run_ = addRun(
        "ring",
        R"({"policy":{"mode":"decentralized"},"decentralized":{"algorithm":"allreduce","pipeline":2,"codec":"none"}})");
    rows.clear();
    for (uint32_t p = 0; p < 2; ++p) {
      for (uint64_t i = 0; i < 2; ++i) {
        rows.push_back(iteration(allreduce_run_, p, i, 1.5 * i, 1.5 * i + 1.5, 1.0, 0.5, 0));
      }
    }
    ASSERT_TRUE(store_->recordPeerIterations(rows).isOk());
    for (const auto& [t, acc] :
         {std::pair{0.0, 0.1}, std::pair{1.5, 0.3}, std::pair{3.0, 0.5}, std::pair{4.5, 0.7}}) {
      ASSERT_TRUE(store_->recordPeerEval({allreduce_run_, t, 2, 2, acc, 1.0}).isOk());
    }
  }

  std::string render() {
    auto html = renderReport(*store_, {});
    EXPECT_TRUE(html.isOk()) << html.status().toString();
    return html.isOk() ? *html : "";
  }

  std::string dir_, db_;
  std::unique_ptr<history::HistoryStore> store_;
  int64_t fed_run_ = 0, dpsgd_run_ = 0, allreduce_run_ = 0;
};

TEST_F(PeerReport, AccuracyOverTimeHasOneLinePerDecentralisedRunLabelledByAlgorithm) {
  addRuns();
  const std::string html = render();
  ASSERT_NE(html.find("<h2>Decentralised training</h2>"), std::string::npos);
  for (const std::string chart :
       {"peer-accuracy-time", "peer-loss-time", "peer-accuracy-iterations"}) {
    auto paths = elementsIn(html, chart, "<path class=\"series\"");
    ASSERT_EQ(paths.size(), 2u) << chart;  // the federated run is not among them
    EXPECT_EQ(paths[0]["data-series"], "run " + std::to_string(dpsgd_run_) + " · dpsgd (ring)");
    EXPECT_EQ(paths[0]["data-points"], "3") << chart;
    EXPECT_EQ(paths[1]["data-series"],
              "run " + std::to_string(allreduce_run_) + " · allreduce (pipeline 2)");
    EXPECT_EQ(paths[1]["data-points"], "4") << chart;
  }
  // Both runs' lines share one time axis (virtual seconds 0..6): the allreduce run's last point
  // (4.5 s) lies left of the dpsgd run's (6 s), and 70% is above 60% (SVG y grows downwards).
  auto paths = elementsIn(html, "peer-accuracy-time", "<path class=\"series\"");
  auto lastPoint = [](const std::string& d) {
    const auto l = d.rfind(' ', d.rfind(' ') - 1);
    const std::string tail = d.substr(l + 1);  // "Lx y" -> "x y" after the 'L'
    double x = 0, y = 0;
    std::sscanf(tail.c_str(), "L%lf %lf", &x, &y);
    return std::pair{x, y};
  };
  const auto [dx, dy] = lastPoint(paths[0]["d"]);
  const auto [ax, ay] = lastPoint(paths[1]["d"]);
  EXPECT_LT(ax, dx);
  EXPECT_LT(ay, dy);
  // The runs table gives a decentralised run its peers' time (the last iteration ended at 6 s).
  const auto runs_at = html.find("<table class=\"runs\">");
  ASSERT_NE(runs_at, std::string::npos);
  const auto dpsgd_in_runs =
      html.find("<tr data-run-id=\"" + std::to_string(dpsgd_run_) + "\">", runs_at);
  ASSERT_NE(dpsgd_in_runs, std::string::npos);
  EXPECT_NE(html.substr(dpsgd_in_runs, html.find("</tr>", dpsgd_in_runs) - dpsgd_in_runs)
                .find("<td class=\"num\">6.0 s</td>"),
            std::string::npos);
  // The federated run keeps its own charts, alone.
  EXPECT_EQ(elementsIn(html, "accuracy-time", "<path class=\"series\"").size(), 1u);
  // The overview table: final and best accuracy of the averaged model, peers and iterations.
  const auto row_at = html.find("<table class=\"peer-runs\">");
  ASSERT_NE(row_at, std::string::npos);
  const auto dpsgd_row =
      html.find("<tr data-run-id=\"" + std::to_string(dpsgd_run_) + "\">", row_at);
  ASSERT_NE(dpsgd_row, std::string::npos);
  const std::string row = html.substr(dpsgd_row, html.find("</tr>", dpsgd_row) - dpsgd_row);
  EXPECT_NE(row.find("<td>dpsgd (ring)</td>"), std::string::npos) << row;
  EXPECT_NE(row.find("<td class=\"num\">3</td><td class=\"num\">9</td><td class=\"num\">1</td>"
                     "<td class=\"num\">60.00%</td><td class=\"num\">60.00%</td>"),
            std::string::npos)
      << row;
}

TEST_F(PeerReport, TimelineDrawsEachPeersPhasesAtTheRecordedTimes) {
  addRuns();
  const std::string html = render();
  const std::string chart = "peer-timeline-" + std::to_string(dpsgd_run_);
  auto rows = elementsIn(html, chart, "<g class=\"timeline-row\"");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0]["data-client"], "peer 0");
  EXPECT_EQ(rows[2]["data-client"], "peer 2");
  // Peer 0: three iterations of 2 s: compute 1 s, then communication 0.5 s, no waiting (0).
  auto p0 = rowSegments(html, chart, "peer 0");
  ASSERT_EQ(p0.size(), 6u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p0[2 * i].kind, "compute");
    EXPECT_DOUBLE_EQ(p0[2 * i].from, 2.0 * i);
    EXPECT_DOUBLE_EQ(p0[2 * i].to, 2.0 * i + 1);
    EXPECT_EQ(p0[2 * i + 1].kind, "comm");
    EXPECT_DOUBLE_EQ(p0[2 * i + 1].to, 2.0 * i + 1.5);
  }
  // Peer 1: iteration 1 skipped (one span 2..2.5), the others with 0.25 s of waiting.
  auto p1 = rowSegments(html, chart, "peer 1");
  ASSERT_EQ(p1.size(), 7u);
  EXPECT_EQ(p1[2].kind, "wait");
  EXPECT_DOUBLE_EQ(p1[2].from, 1.5);
  EXPECT_DOUBLE_EQ(p1[2].to, 1.75);
  EXPECT_EQ(p1[3].kind, "skipped");
  EXPECT_DOUBLE_EQ(p1[3].from, 2.0);
  EXPECT_DOUBLE_EQ(p1[3].to, 2.5);
  // Peer 2's last iteration reported 2 + 1 + 1 s in a 2 s span: halved to fit, 4..5..5.5..6.
  auto p2 = rowSegments(html, chart, "peer 2");
  ASSERT_EQ(p2.size(), 9u);
  EXPECT_EQ(p2[6].kind, "compute");
  EXPECT_DOUBLE_EQ(p2[6].from, 4.0);
  EXPECT_DOUBLE_EQ(p2[6].to, 5.0);
  EXPECT_DOUBLE_EQ(p2[7].to, 5.5);
  EXPECT_EQ(p2[8].kind, "wait");
  EXPECT_DOUBLE_EQ(p2[8].to, 6.0);
  // The legend says how the spans are drawn.
  EXPECT_NE(html.find("waiting for peers"), std::string::npos);
  EXPECT_NE(html.find("the order within an iteration is not recorded"), std::string::npos);
  // Each decentralised run has its timeline; the federated run has its straggler section.
  EXPECT_EQ(elementsIn(html, "peer-timeline-" + std::to_string(allreduce_run_),
                       "<g class=\"timeline-row\"")
                .size(),
            2u);
  EXPECT_NE(html.find("data-chart=\"participants-" + std::to_string(fed_run_) + "\""),
            std::string::npos);
  EXPECT_EQ(html.find("data-chart=\"participants-" + std::to_string(dpsgd_run_) + "\""),
            std::string::npos);
}

TEST_F(PeerReport, PeerTableHasTheRecordedTotals) {
  addRuns();
  const std::string html = render();
  const auto table_at =
      html.find("<table class=\"peers\" data-run-id=\"" + std::to_string(dpsgd_run_) + "\">");
  ASSERT_NE(table_at, std::string::npos);
  // peer, iterations, skipped, exchanges, sent, received, compute, comm, waiting, staleness.
  // Peer 1: 3 iterations (one skipped: no compute, 0.5 s waiting), 2000 B sent each time,
  // staleness 0, 1, 0.
  EXPECT_EQ(peerRow(html, table_at, 1),
            (std::vector<std::string>{"1", "3", "1", "6", "6.0 kB", "1.5 kB", "2.0 s", "1.0 s",
                                      "1.0 s", "0.33", "1"}));
  // Peer 2: compute 1 + 1 + 2, comm 0.5 + 0.5 + 1, wait 0.5 + 0.5 + 1; staleness 0, 2, 0.
  EXPECT_EQ(peerRow(html, table_at, 2),
            (std::vector<std::string>{"2", "3", "0", "6", "9.0 kB", "1.5 kB", "4.0 s", "2.0 s",
                                      "2.0 s", "0.67", "2"}));
}

// 5000 iterations of one peer: merged into spans of 8 (at most 2000 rectangles), whose compute,
// communication and waiting add up to the recorded totals.
TEST_F(PeerReport, ALongRunsTimelineIsMergedKeepingThePhaseTotals) {
  const int64_t run = addRun("long", R"({"decentralized":{"algorithm":"local","local_steps":8}})");
  std::vector<history::PeerIterationRecord> rows;
  for (uint64_t i = 0; i < 5000; ++i) {
    rows.push_back(iteration(run, 0, i, 1.0 * i, 1.0 * i + 1.0, 0.5, 0.25, 0.125));
  }
  ASSERT_TRUE(store_->recordPeerIterations(rows).isOk());
  const std::string html = render();
  const std::string chart = "peer-timeline-" + std::to_string(run);
  const auto segments = rowSegments(html, chart, "peer 0");
  EXPECT_LE(segments.size(), kMaxPeerTimelineSegments);
  EXPECT_EQ(segments.size(), 3u * 625);  // ceil(5000 / 8) spans of 3 phases
  std::map<std::string, double> total;
  for (const Segment& s : segments) total[s.kind] += s.to - s.from;
  // Within the 6 significant digits the attributes carry.
  EXPECT_NEAR(total["compute"], 2500, 1);
  EXPECT_NEAR(total["comm"], 1250, 1);
  EXPECT_NEAR(total["wait"], 625, 1);
  EXPECT_NE(html.find("up to 8 consecutive iterations"), std::string::npos);
  EXPECT_LT(html.size(), 1'000'000u);
  // No evaluation: the overview lists the run, its lines are empty.
  EXPECT_NE(html.find("<td>local (H=8)</td>"), std::string::npos);
  auto paths = elementsIn(html, "peer-accuracy-time", "<path class=\"series\"");
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(paths[0]["data-points"], "0");
  // Only a decentralised run: no federated charts.
  EXPECT_EQ(html.find("<h2>Accuracy and loss</h2>"), std::string::npos);
}

TEST_F(PeerReport, FederatedRunsAloneHaveNoDecentralisedSection) {
  const int64_t run = addRun("fedavg", "{}");
  history::RoundRecord row;
  row.run_id = run;
  row.status = "initial";
  row.test_accuracy = 0.5;
  ASSERT_TRUE(store_->commitRound(row, {}, std::nullopt).isOk());
  const std::string html = render();
  EXPECT_NE(html.find("<h2>Accuracy and loss</h2>"), std::string::npos);
  EXPECT_EQ(html.find("Decentralised"), std::string::npos);
  EXPECT_EQ(html.find("peer-"), std::string::npos);
}

TEST_F(PeerReport, CommandDrawsTheDecentralisedRuns) {
  addRuns();
  store_.reset();
  const std::string out = dir_ + "/r.html";
  testing::Process p({kBinary, "report", "--db", db_, "-o", out}, dir_ + "/out.txt");
  ASSERT_EQ(p.waitFor(60).value_or(-1), 0) << p.log();
  std::ifstream in(out);
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(elementsIn(html, "peer-accuracy-time", "<path class=\"series\"").size(), 2u);
  EXPECT_EQ(
      elementsIn(html, "peer-timeline-" + std::to_string(dpsgd_run_), "<g class=\"timeline-row\"")
          .size(),
      3u);
}

// `fedfleet history peers` and `peer-evals` print what the report tabulates.
TEST_F(PeerReport, HistoryViewsPrintPeersAndEvaluations) {
  addRuns();
  store_.reset();
  auto history = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {kBinary, "history", "--db", db_});
    testing::Process p(args, dir_ + "/history.txt");
    EXPECT_EQ(p.waitFor(60).value_or(-1), 0) << p.log();
    return p.log();
  };
  const std::string run = std::to_string(dpsgd_run_);
  const std::string peers = history({"peers", "--run", run, "--format", "csv"});
  EXPECT_NE(peers.find("run_id,peer,iterations,skipped,exchanges,bytes_sent,bytes_received,"
                       "compute_s,comm_s,wait_s,mean_staleness,max_staleness,first_start,"
                       "last_end\r\n" +
                       run + ",0,3,0,6,3000,1500,3,1.5,0,0,0,0,6\r\n" + run +
                       ",1,3,1,6,6000,1500,2,1,1,0.3333333333333333,1,0,6\r\n" + run +
                       ",2,3,0,6,9000,1500,4,2,2,0.6666666666666666,2,0,6\r\n"),
            std::string::npos)
      << peers;
  // The latest run by default: the allreduce run's four evaluations, in time order.
  const std::string evals = history({"peer-evals"});
  EXPECT_NE(evals.find("time  iterations  peers_averaged  accuracy    loss\n"
                       "0.00           2               2    10.00%  1.0000\n"),
            std::string::npos)
      << evals;
  EXPECT_NE(evals.find("4.50           2               2    70.00%  1.0000\n"), std::string::npos)
      << evals;
}

}  // namespace
}  // namespace fedfleet::cli
