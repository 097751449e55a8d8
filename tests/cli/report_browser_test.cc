// The report of a small simulated run, opened in headless Chromium (Debian's `chromium`, which
// scripts/install-deps.sh installs): the DOM the browser built holds every chart with the
// database's numbers, the laid-out charts have a size and drawn lines, and a screenshot comes out.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "common/history/history.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

const std::string kBinary = FEDFLEET_BINARY;
const std::string kChromium = "/usr/bin/chromium";

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs headless Chromium with `args` (after the flags that keep it off the network and away
// from the user's profile), stdout to `out`; returns the exit code.
int chromium(const std::string& dir, const std::vector<std::string>& args, const std::string& out) {
  static int profile = 0;
  std::string command = kChromium +
                        " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
                        " --disable-background-networking --disable-component-update"
                        " --disable-sync --disable-dev-shm-usage --user-data-dir=" +
                        dir + "/chromium-profile-" + std::to_string(profile++);
  for (const auto& a : args) command += " '" + a + "'";
  command += " > '" + out + "' 2> '" + out + ".err'";
  testing::Process p({"/bin/sh", "-c", command}, dir + "/chromium.log");
  return p.waitFor(180).value_or(-1);
}

int pathPoints(const std::string& d) {
  return static_cast<int>(std::count(d.begin(), d.end(), 'M') +
                          std::count(d.begin(), d.end(), 'L'));
}

class ReportInBrowser : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kChromium)) return;
    dir_ = testing::freshDir("report-browser");
    db_ = dir_ + "/sim.db";
    testing::Process sim({kBinary,
                          "sim",
                          "--clients",
                          "20",
                          "--clients-per-round",
                          "5",
                          "--rounds",
                          "4",
                          "--model",
                          "logreg",
                          "--set",
                          "data.train_subset=2000",
                          "--set",
                          "data.test_subset=500",
                          "--set",
                          "coordinator.deadline_s=4",
                          "--fleet",
                          "mobile-mix",
                          "--db",
                          db_},
                         dir_ + "/sim.log");
    sim_rc_ = sim.waitFor(180).value_or(-1);
    sim_log_ = sim.log();
    testing::Process report({kBinary, "report", "--db", db_, "-o", dir_ + "/report.html"},
                            dir_ + "/report.log");
    report_rc_ = report.waitFor(60).value_or(-1);
    report_log_ = report.log();
  }

  void SetUp() override {
    if (!std::filesystem::exists(kChromium)) {
      GTEST_SKIP() << kChromium << " is missing; scripts/install-deps.sh installs it";
    }
    ASSERT_EQ(sim_rc_, 0) << sim_log_;
    ASSERT_EQ(report_rc_, 0) << report_log_;
  }

  static std::string dir_, db_, sim_log_, report_log_;
  static int sim_rc_, report_rc_;
};

std::string ReportInBrowser::dir_, ReportInBrowser::db_, ReportInBrowser::sim_log_,
    ReportInBrowser::report_log_;
int ReportInBrowser::sim_rc_ = -1, ReportInBrowser::report_rc_ = -1;

TEST_F(ReportInBrowser, DomHasEveryChartWithTheDatabasesPoints) {
  const std::string dom_file = dir_ + "/dom.html";
  ASSERT_EQ(chromium(dir_, {"--dump-dom", "file://" + dir_ + "/report.html"}, dom_file), 0)
      << readFile(dom_file + ".err");
  const std::string dom = readFile(dom_file);
  ASSERT_NE(dom.find("<svg"), std::string::npos) << dom.substr(0, 2000);

  auto store = history::openSqliteHistory(db_);
  ASSERT_TRUE(store.isOk());
  auto runs = (*store)->runs();
  ASSERT_TRUE(runs.isOk());
  ASSERT_EQ(runs->size(), 1u);
  const int64_t run = (*runs)[0].run_id;
  auto rounds = (*store)->rounds(run);
  ASSERT_TRUE(rounds.isOk());
  int evaluated = 0, training = 0;
  for (const auto& r : *rounds) {
    evaluated += r.test_accuracy.has_value();
    training += r.status != "initial";
  }
  ASSERT_EQ(training, 4);

  // Every chart's svg element is in the DOM the browser built.
  const std::string id = std::to_string(run);
  for (const std::string& chart :
       std::vector<std::string>{"accuracy-round", "accuracy-time", "loss-round", "loss-time",
                                "participants-" + id, "bytes-" + id, "timeline-" + id}) {
    EXPECT_NE(dom.find("data-chart=\"" + chart + "\""), std::string::npos) << chart;
  }
  // The accuracy path: as many points as evaluated rounds (the browser serialises attributes in
  // source order: class, data-series, data-points, d).
  std::smatch m;
  const std::regex path_re(
      R"re(<svg data-chart="accuracy-round"[\s\S]*?<path class="series" data-series="[^"]*" data-points="(\d+)" d="([^"]*)")re");
  ASSERT_TRUE(std::regex_search(dom, m, path_re)) << dom.substr(0, 4000);
  EXPECT_EQ(std::stoi(m[1]), evaluated);
  EXPECT_EQ(pathPoints(m[2]), evaluated);
  // The participants chart: a "completed" bar per round with completed updates.
  int completed_rounds = 0;
  for (const auto& r : *rounds) completed_rounds += r.completed > 0;
  const auto begin = dom.find("data-chart=\"participants-" + id + "\"");
  const std::string participants = dom.substr(begin, dom.find("</svg>", begin) - begin);
  int completed_bars = 0;
  for (size_t at = participants.find("data-series=\"completed\""); at != std::string::npos;
       at = participants.find("data-series=\"completed\"", at + 1)) {
    ++completed_bars;
  }
  EXPECT_EQ(completed_bars, completed_rounds);
}

TEST_F(ReportInBrowser, LaidOutChartsHaveASizeAndDrawnLines) {
  // A page that frames the report and measures it after layout, writing the figures into its
  // own DOM for --dump-dom (the report itself has no script).
  const std::string probe = dir_ + "/probe.html";
  std::ofstream(probe) << R"(<!DOCTYPE html><html><body><pre id="out">pending</pre>
<iframe id="f" src="report.html" width="1280" height="900"></iframe>
<script>
document.getElementById('f').addEventListener('load', () => {
  const doc = document.getElementById('f').contentDocument;
  const out = {};
  for (const svg of doc.querySelectorAll('svg[data-chart]')) {
    const box = svg.getBoundingClientRect();
    let length = 0;
    for (const p of svg.querySelectorAll('path.series')) length += p.getTotalLength();
    out[svg.dataset.chart] = {width: box.width, height: box.height, length: length,
                              bars: svg.querySelectorAll('rect.bar, rect.segment').length};
  }
  document.getElementById('out').textContent = JSON.stringify(out);
});
</script></body></html>)";
  const std::string dom_file = dir_ + "/probe-dom.html";
  ASSERT_EQ(chromium(dir_,
                     {"--allow-file-access-from-files", "--virtual-time-budget=10000", "--dump-dom",
                      "file://" + probe},
                     dom_file),
            0)
      << readFile(dom_file + ".err");
  const std::string dom = readFile(dom_file);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom, m, std::regex(R"re(<pre id="out">([^<]*)</pre>)re"))) << dom;
  ASSERT_NE(m[1].str(), "pending") << "the frame never loaded";
  auto figures = nlohmann::json::parse(m[1].str());
  ASSERT_GE(figures.size(), 7u) << figures.dump();
  for (const auto& [chart, f] : figures.items()) {
    EXPECT_GT(f["width"].get<double>(), 200) << chart;
    EXPECT_GT(f["height"].get<double>(), 100) << chart;
    if (chart.rfind("accuracy", 0) == 0 || chart.rfind("loss", 0) == 0) {
      EXPECT_GT(f["length"].get<double>(), 50) << chart << ": the line is not drawn";
    } else {
      EXPECT_GT(f["bars"].get<int>(), 0) << chart << ": no bars or segments";
    }
  }
}

TEST_F(ReportInBrowser, ScreenshotIsAPicture) {
  const std::string png = dir_ + "/report.png";
  ASSERT_EQ(chromium(dir_,
                     {"--screenshot=" + png, "--window-size=1280,1600", "--hide-scrollbars",
                      "file://" + dir_ + "/report.html"},
                     dir_ + "/screenshot.out"),
            0)
      << readFile(dir_ + "/screenshot.out.err");
  const std::string bytes = readFile(png);
  ASSERT_GT(bytes.size(), 20000u);  // a blank page of that size compresses to a few kB
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
}

}  // namespace
}  // namespace fedfleet
