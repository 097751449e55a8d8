// The HTML report (cli/report.h) and `fedfleet report`: the charts carry exactly the numbers of
// the database (points of the accuracy paths, bars per outcome, the straggler timeline), the
// per-block section appears only with block_metrics rows, the page fetches nothing, and bad
// input is a clear error.
#include "cli/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "common/history/history.h"
#include "tests/integration/process.h"

namespace fedfleet::cli {
namespace {

const std::string kBinary = FEDFLEET_BINARY;

// The value of attribute `name` in each element of `html` that has data-chart=`chart` as an
// ancestor svg and matches `tag_prefix` (for example `<path class="series"`).
struct Element {
  std::map<std::string, std::string> attrs;
};

// The elements starting with `tag_prefix` inside <svg data-chart="CHART">...</svg>.
std::vector<Element> elementsIn(const std::string& html, const std::string& chart,
                                const std::string& tag_prefix) {
  std::vector<Element> out;
  const auto begin = html.find("<svg data-chart=\"" + chart + "\"");
  if (begin == std::string::npos) return out;
  const auto end = html.find("</svg>", begin);
  const std::string svg = html.substr(begin, end - begin);
  static const std::regex kAttr(R"re(([a-z-]+)="([^"]*)")re");
  for (size_t at = svg.find(tag_prefix); at != std::string::npos;
       at = svg.find(tag_prefix, at + 1)) {
    const std::string tag = svg.substr(at, svg.find('>', at) - at);
    Element e;
    for (std::sregex_iterator it(tag.begin(), tag.end(), kAttr), stop; it != stop; ++it) {
      e.attrs[(*it)[1]] = (*it)[2];
    }
    out.push_back(std::move(e));
  }
  return out;
}

// Points in an SVG path: one M or L command each.
int pathPoints(const std::string& d) {
  return static_cast<int>(std::count(d.begin(), d.end(), 'M') +
                          std::count(d.begin(), d.end(), 'L'));
}

class Report : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::freshDir("report");
    db_ = dir_ + "/h.db";
    auto opened = history::openSqliteHistory(db_);
    ASSERT_TRUE(opened.isOk()) << opened.status().toString();
    store_ = std::move(opened).value();
    // Run 1: virtual clock, 5 training rounds, round 3 not evaluated, round 4 with a straggler
    // 9 s behind the others, round 2 with a late and a dropped client.
    sim_run_ =
        addRun("sim", "virtual", R"({"run":{"name":"sim","rounds":5},"model":{"name":"mlp"}})");
    for (uint32_t r = 0; r <= 5; ++r) {
      history::RoundRecord row = roundRow(sim_run_, r, 100.0 * r);
      if (r == 3) row.test_accuracy.reset(), row.test_loss.reset();
      std::vector<history::UpdateRecord> ups;
      if (r > 0) {
        for (int c = 0; c < 4; ++c) {
          const double span = (r == 4 && c == 3) ? 12 : 3 + 0.1 * c;
          std::string status = "completed";
          if (r == 2 && c == 2) status = "late";
          if (r == 2 && c == 3) status = "dropped";
          ups.push_back(
              updateRow(sim_run_, r, "c" + std::to_string(c), status, row.start_time, span));
        }
        row.selected = 4;
        row.completed = r == 2 ? 2 : 4;
        row.late = r == 2 ? 1 : 0;
        row.dropped = r == 2 ? 1 : 0;
        row.end_time = row.start_time + (r == 4 ? 12.5 : 10);
      }
      ASSERT_TRUE(store_->commitRound(row, ups, std::nullopt).isOk());
    }
    // Run 2: wall clock, 2 training rounds, all evaluated.
    wall_run_ = addRun("real", "wall", "{}");
    for (uint32_t r = 0; r <= 2; ++r) {
      history::RoundRecord row = roundRow(wall_run_, r, 1.7e9 + 30.0 * r);
      ASSERT_TRUE(store_->commitRound(row, {}, std::nullopt).isOk());
    }
  }

  int64_t addRun(const std::string& name, const std::string& clock, const std::string& config) {
    history::RunRecord run;
    run.name = name;
    run.clock = clock;
    run.config_json = config;
    run.started_at = 1.7e9;
    auto id = store_->beginRun(run);
    EXPECT_TRUE(id.isOk());
    return *id;
  }

  static history::RoundRecord roundRow(int64_t run, uint32_t r, double start) {
    history::RoundRecord row;
    row.run_id = run;
    row.round = r;
    row.status = r == 0 ? "initial" : "ok";
    row.start_time = start;
    row.end_time = start + 10;
    row.wall_start = row.start_time;
    row.wall_end = row.end_time;
    row.test_accuracy = 0.1 + 0.1 * r;
    row.test_loss = 2.0 - 0.2 * r;
    row.bytes_up = 1000000 * r;
    row.bytes_down = 500000 * r;
    row.model_version = r;
    return row;
  }

  static history::UpdateRecord updateRow(int64_t run, uint32_t r, const std::string& client,
                                         const std::string& status, double start, double span) {
    history::UpdateRecord u;
    u.run_id = run;
    u.round = r;
    u.client_id = client;
    u.status = status;
    u.start_time = start + 0.5;
    u.end_time = start + 0.5 + span;
    u.compute_s = status == "completed" ? span - 1.5 : 0;
    u.upload_s = status == "completed" ? 1 : 0;
    u.n_samples = 10;
    return u;
  }

  std::string render(const ReportOptions& options = {}) {
    auto html = renderReport(*store_, options);
    EXPECT_TRUE(html.isOk()) << html.status().toString();
    return html.isOk() ? *html : "";
  }

  // Runs `fedfleet report` with `args`; returns (exit code, output).
  std::pair<int, std::string> runReport(std::vector<std::string> args) {
    args.insert(args.begin(), {kBinary, "report"});
    testing::Process p(args, dir_ + "/out.txt");
    auto rc = p.waitFor(60);
    return {rc.value_or(-1), p.log()};
  }

  std::string dir_, db_;
  std::unique_ptr<history::HistoryStore> store_;
  int64_t sim_run_ = 0, wall_run_ = 0;
};

TEST_F(Report, AccuracyAndLossPathsHaveOnePointPerEvaluatedRound) {
  const std::string html = render();
  for (const std::string chart : {"accuracy-round", "accuracy-time", "loss-round", "loss-time"}) {
    auto paths = elementsIn(html, chart, "<path class=\"series\"");
    ASSERT_EQ(paths.size(), 2u) << chart;  // both runs overlaid
    for (auto& p : paths) {
      const int64_t run = p.attrs["data-series"].find("run " + std::to_string(sim_run_)) == 0
                              ? sim_run_
                              : wall_run_;
      auto rounds = store_->rounds(run);
      ASSERT_TRUE(rounds.isOk());
      int evaluated = 0;
      for (const auto& r : *rounds) evaluated += r.test_accuracy.has_value();
      EXPECT_EQ(std::stoi(p.attrs["data-points"]), evaluated) << chart << " run " << run;
      EXPECT_EQ(pathPoints(p.attrs["d"]), evaluated) << chart << " run " << run;
    }
  }
  // The sim run has 6 rounds, one not evaluated: 5 points; the wall run 3.
  auto paths = elementsIn(html, "accuracy-round", "<path class=\"series\"");
  EXPECT_EQ(paths[0].attrs["data-points"], "5");
  EXPECT_EQ(paths[1].attrs["data-points"], "3");
  EXPECT_NE(paths[0].attrs["data-series"].find("virtual clock"), std::string::npos);
  EXPECT_NE(paths[1].attrs["data-series"].find("wall clock"), std::string::npos);
}

// A run evaluated by its clients alone: the server's series is empty, the federated one (dashed)
// has a point per round that reported, at the round of the model evaluated (the one before).
TEST_F(Report, FederatedEvaluationIsDrawnDashedAtTheRoundOfTheModelEvaluated) {
  const int64_t run = addRun("fed", "virtual", "{}");
  for (uint32_t r = 0; r <= 3; ++r) {
    history::RoundRecord row = roundRow(run, r, 50.0 * r);
    row.test_accuracy.reset();
    row.test_loss.reset();
    if (r > 0) {
      row.fed_eval_clients = 2;
      row.fed_eval_samples = 40;
      row.fed_eval_accuracy = 0.25 * r;
      row.fed_eval_loss = 1.0 / r;
    }
    ASSERT_TRUE(store_->commitRound(row, {}, std::nullopt).isOk());
  }
  ReportOptions options;
  options.runs = {run};
  const std::string html = render(options);
  for (const std::string chart : {"accuracy-round", "accuracy-time", "loss-round", "loss-time"}) {
    auto paths = elementsIn(html, chart, "<path class=\"series\"");
    ASSERT_EQ(paths.size(), 2u) << chart;
    EXPECT_EQ(paths[0].attrs["data-points"], "0") << chart << ": no server evaluation";
    EXPECT_NE(paths[1].attrs["data-series"].find("federated"), std::string::npos) << chart;
    EXPECT_EQ(paths[1].attrs["data-points"], "3") << chart;
  }
  // The last federated accuracy in the runs table: round 3's, 75%.
  EXPECT_NE(html.find("75.00%"), std::string::npos);
}

// A regression with a model's own metric: one chart per metric by round, the server's figures
// solid and the clients' dashed, each point one round's value as the history holds it.
TEST_F(Report, EachMetricGetsAChartByRound) {
  const int64_t run = addRun("regression", "virtual", "{}");
  for (uint32_t r = 0; r <= 3; ++r) {
    history::RoundRecord row = roundRow(run, r, 50.0 * r);
    row.test_accuracy.reset();
    row.test_metrics = {{"mse", 1.0 / (r + 1)}, {"mae", 0.5 / (r + 1)}};
    if (r > 0) {
      row.fed_eval_clients = 2;
      row.fed_eval_samples = 40;
      row.fed_eval_loss = 1.0 / r;
      row.fed_eval_metrics = {{"mse", 1.0 / r}, {"r2", 0.2 * r}};
    }
    ASSERT_TRUE(store_->commitRound(row, {}, std::nullopt).isOk());
  }
  ReportOptions options;
  options.runs = {run};
  const std::string html = render(options);
  ASSERT_NE(html.find("<h2>Metrics</h2>"), std::string::npos);
  auto mse = elementsIn(html, "metric-0", "<path class=\"series\"");
  ASSERT_EQ(mse.size(), 2u);
  EXPECT_EQ(mse[0].attrs["data-points"], "4") << "the server's, rounds 0..3";
  EXPECT_NE(mse[1].attrs["data-series"].find("federated"), std::string::npos);
  EXPECT_EQ(mse[1].attrs["data-points"], "3");
  auto mae = elementsIn(html, "metric-1", "<path class=\"series\"");
  ASSERT_EQ(mae.size(), 1u) << "mae: the server's alone";
  auto r2 = elementsIn(html, "metric-2", "<path class=\"series\"");
  ASSERT_EQ(r2.size(), 1u) << "r2: the clients' alone";
  EXPECT_NE(html.find("r2 by round"), std::string::npos);
  // Runs without metrics draw no such section.
  ReportOptions plain;
  plain.runs = {sim_run_};
  EXPECT_EQ(render(plain).find("<h2>Metrics</h2>"), std::string::npos);
}

// A differentially private run: epsilon by round (each recorded round a point) and accuracy
// against epsilon (the rounds with both); runs without an epsilon draw no such section.
TEST_F(Report, APrivateRunGetsItsEpsilonByRoundAndAccuracyAgainstEpsilon) {
  const int64_t run = addRun("private", "virtual", "{}");
  for (uint32_t r = 0; r <= 4; ++r) {
    history::RoundRecord row = roundRow(run, r, 50.0 * r);
    if (r > 0) {
      row.dp_epsilon = 0.5 * r;
      row.dp_clip = 1;
    }
    if (r == 2) row.test_accuracy.reset();  // not evaluated
    ASSERT_TRUE(store_->commitRound(row, {}, std::nullopt).isOk());
  }
  ReportOptions options;
  options.runs = {run};
  const std::string html = render(options);
  ASSERT_NE(html.find("<h2>Privacy</h2>"), std::string::npos);
  auto spent = elementsIn(html, "privacy-epsilon", "<path class=\"series\"");
  ASSERT_EQ(spent.size(), 1u);
  EXPECT_EQ(spent[0].attrs["data-points"], "4") << "rounds 1..4";
  auto utility = elementsIn(html, "privacy-accuracy", "<path class=\"series\"");
  ASSERT_EQ(utility.size(), 1u);
  EXPECT_EQ(utility[0].attrs["data-points"], "3") << "rounds 1, 3 and 4";
  ReportOptions plain;
  plain.runs = {sim_run_};
  EXPECT_EQ(render(plain).find("<h2>Privacy</h2>"), std::string::npos);
}

TEST_F(Report, ParticipantAndTrafficBarsAddUpToTheRounds) {
  const std::string html = render();
  auto rounds = store_->rounds(sim_run_);
  ASSERT_TRUE(rounds.isOk());
  std::map<std::string, double> expected;
  double up = 0;
  for (const auto& r : *rounds) {
    if (r.status == "initial") continue;
    expected["completed"] += r.completed;
    expected["late"] += r.late;
    expected["dropped"] += r.dropped;
    up += static_cast<double>(r.bytes_up);
  }
  std::map<std::string, double> got;
  for (auto& bar : elementsIn(html, "participants-" + std::to_string(sim_run_), "<rect class")) {
    got[bar.attrs["data-series"]] += std::stod(bar.attrs["data-value"]);
  }
  EXPECT_EQ(got["completed"], expected["completed"]);
  EXPECT_EQ(got["late"], 1);
  EXPECT_EQ(got["dropped"], 1);
  double got_up = 0;
  int up_bars = 0;
  for (auto& bar : elementsIn(html, "bytes-" + std::to_string(sim_run_), "<rect class")) {
    if (bar.attrs["data-series"].find("bytes up") == 0) {
      got_up += std::stod(bar.attrs["data-value"]);
      ++up_bars;
    }
  }
  EXPECT_EQ(up_bars, 5);  // one per training round
  EXPECT_DOUBLE_EQ(got_up, up);
  // Axis labels with units.
  EXPECT_NE(html.find("MB per round"), std::string::npos);
  EXPECT_NE(html.find("test accuracy (%)"), std::string::npos);
}

TEST_F(Report, TimelineShowsTheRoundWithTheWorstStraggler) {
  auto updates = store_->updates(sim_run_, std::nullopt);
  ASSERT_TRUE(updates.isOk());
  EXPECT_EQ(stragglerRound(*updates), 4u);
  const std::string html = render();
  const std::string chart = "timeline-" + std::to_string(sim_run_);
  auto rows = elementsIn(html, chart, "<g class=\"timeline-row\"");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows.back().attrs["data-client"], "c3");  // the slowest last
  EXPECT_NE(html.find("Per-client timeline of round 4"), std::string::npos);
  // The straggler's upload ends where its update ended: 0.5 + 12 s after the round started.
  double straggler_end = 0;
  for (auto& seg : elementsIn(html, chart, "<rect class=\"segment\"")) {
    if (seg.attrs["data-kind"] == "upload") {
      straggler_end = std::max(straggler_end, std::stod(seg.attrs["data-to"]));
    }
  }
  EXPECT_DOUBLE_EQ(straggler_end, 12.5);

  // A chosen round: late and dropped clients are marked.
  ReportOptions options;
  options.timeline_round = 2;
  const std::string html2 = render(options);
  auto rows2 = elementsIn(html2, chart, "<g class=\"timeline-row\"");
  ASSERT_EQ(rows2.size(), 4u);
  std::map<std::string, std::string> status;
  for (auto& r : rows2) status[r.attrs["data-client"]] = r.attrs["data-status"];
  EXPECT_EQ(status["c2"], "late");
  EXPECT_EQ(status["c3"], "dropped");
  EXPECT_EQ(elementsIn(html2, chart, "<rect class=\"segment\" data-kind=\"unfinished\"").size(),
            2u);
}

TEST_F(Report, PerBlockSectionOnlyWithBlockMetricRows) {
  std::string html = render();
  EXPECT_EQ(html.find("Per-block accuracy"), std::string::npos);
  EXPECT_EQ(html.find("data-chart=\"blocks-"), std::string::npos);

  // A block-cyclic run's rows (as the round engine's RecordBlockMetrics writes them).
  auto row = [&](uint32_t round, const char* block, std::optional<double> acc,
                 std::optional<double> loss) {
    history::BlockMetricRecord b;
    b.run_id = sim_run_;
    b.round = round;
    b.block = block;
    b.model = "m";
    b.accuracy = acc;
    b.loss = loss;
    return b;
  };
  ASSERT_TRUE(
      store_
          ->recordBlockMetrics({row(1, "0", 0.5, 1.0), row(2, "0", 0.6, 0.9), row(3, "0", 0.7, 0.8),
                                row(1, "1", 0.3, 1.2), row(2, "1", std::nullopt, std::nullopt)})
          .isOk());
  auto blocks = store_->blockMetrics(sim_run_);
  ASSERT_TRUE(blocks.isOk()) << blocks.status().toString();
  ASSERT_EQ(blocks->size(), 5u);
  // Ordered by round, then block: (1,0) (1,1) (2,0) (2,1) (3,0).
  EXPECT_EQ((*blocks)[0].block, "0");
  EXPECT_EQ((*blocks)[1].block, "1");
  EXPECT_EQ((*blocks)[1].model, "m");
  EXPECT_DOUBLE_EQ((*blocks)[1].accuracy.value_or(-1), 0.3);
  EXPECT_FALSE((*blocks)[3].accuracy.has_value());
  EXPECT_EQ((*blocks)[4].round, 3u);

  html = render();
  EXPECT_NE(html.find("Per-block accuracy"), std::string::npos);
  auto paths = elementsIn(html, "blocks-" + std::to_string(sim_run_), "<path class=\"series\"");
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(paths[0].attrs["data-series"], "block 0 · m");
  EXPECT_EQ(paths[0].attrs["data-points"], "3");
  EXPECT_EQ(paths[1].attrs["data-points"], "1");  // the NULL accuracy is no point
  // The wall run has no block rows: no section in its part.
  EXPECT_EQ(html.find("data-chart=\"blocks-" + std::to_string(wall_run_)), std::string::npos);
}

TEST_F(Report, PageIsSelfContainedAndShowsTheConfig) {
  const std::string html = render();
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  EXPECT_EQ(html.find("url(http"), std::string::npos);
  // The only URL is the SVG namespace, which is a name, never fetched.
  std::string stripped = std::regex_replace(html, std::regex("http://www.w3.org/2000/svg"), "");
  EXPECT_EQ(stripped.find("http"), std::string::npos);
  // Config of run 1 as key/value rows.
  EXPECT_NE(html.find("<td>model.name</td><td>mlp</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>run.rounds</td><td>5</td>"), std::string::npos);
}

TEST_F(Report, OnlyTheAskedRunsAndUnknownRunsAreErrors) {
  ReportOptions options;
  options.runs = {wall_run_};
  const std::string html = render(options);
  EXPECT_EQ(elementsIn(html, "accuracy-round", "<path class=\"series\"").size(), 1u);
  EXPECT_EQ(html.find("data-run-id=\"" + std::to_string(sim_run_) + "\""), std::string::npos);
  options.runs = {99};
  auto bad = renderReport(*store_, options);
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("99"), std::string::npos);
}

TEST_F(Report, CommandWritesTheFileAndRejectsBadInput) {
  store_.reset();
  const std::string out = dir_ + "/r.html";
  auto [rc, log] = runReport({"--db", db_, "-o", out});
  ASSERT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("report: " + out), std::string::npos) << log;
  std::ifstream in(out);
  std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(html.find("data-chart=\"accuracy-round\""), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));

  auto [rc1, log1] = runReport({"--db", dir_ + "/missing.db", "-o", out});
  EXPECT_EQ(rc1, 2);
  EXPECT_NE(log1.find("missing.db: no such file"), std::string::npos) << log1;
  auto [rc2, log2] = runReport({"--db", db_, "--run", "42", "-o", out});
  EXPECT_EQ(rc2, 2);
  EXPECT_NE(log2.find("no run 42"), std::string::npos) << log2;
  const std::string text = dir_ + "/notes.txt";
  std::ofstream(text) << "plain text, not a database, long enough to have a header's length\n";
  auto [rc3, log3] = runReport({"--db", text, "-o", out});
  EXPECT_EQ(rc3, 1);
  EXPECT_NE(log3.find("notes.txt"), std::string::npos) << log3;
  auto [rc4, log4] = runReport({"--db", db_, "-o", dir_ + "/no/such/dir/r.html"});
  EXPECT_EQ(rc4, 1);
  EXPECT_NE(log4.find("cannot write"), std::string::npos) << log4;
}

TEST_F(Report, UnwritableOutputSaysWhyAndLeavesNothing) {
  store_.reset();
  const std::string nodir = dir_ + "/nodir";
  auto [rc, log] = runReport({"--db", db_, "-o", nodir + "/r.html"});
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find("cannot write " + nodir + "/r.html: directory " + nodir + " does not exist"),
            std::string::npos)
      << log;
  EXPECT_FALSE(std::filesystem::exists(nodir));
  // A file where the directory should be.
  const std::string file = dir_ + "/plain";
  std::ofstream(file) << "x";
  auto [rc2, log2] = runReport({"--db", db_, "-o", file + "/r.html"});
  EXPECT_EQ(rc2, 1) << log2;
  EXPECT_NE(log2.find(file + " is not a directory"), std::string::npos) << log2;
  // A directory this user may not write (root may: then the report is written there).
  const std::string ro = dir_ + "/ro";
  std::filesystem::create_directories(ro);
  std::filesystem::permissions(ro, std::filesystem::perms(0555));
  auto [rc3, log3] = runReport({"--db", db_, "-o", ro + "/r.html"});
  if (::geteuid() != 0) {
    EXPECT_EQ(rc3, 1) << log3;
    EXPECT_NE(log3.find("directory " + ro + " is not writable"), std::string::npos) << log3;
    EXPECT_TRUE(std::filesystem::is_empty(ro));
  } else {
    EXPECT_EQ(rc3, 0) << log3;
  }
  EXPECT_FALSE(std::filesystem::exists(ro + "/r.html.tmp"));
  std::filesystem::permissions(ro, std::filesystem::perms(0755));
}

}  // namespace
}  // namespace fedfleet::cli
