// A regression in `fedfleet sim`: data.task = "regression" reads the CSV's target column as
// floats, train.loss = "mse" trains a one-output logreg (a linear model), and the history's
// test loss is the mean squared error of the checkpointed model on the test file, computed here
// from the file and the weights; there is no accuracy. A mismatched loss stops at start-up.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "common/history/history.h"
#include "tests/cli/blobs.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

const std::string kBinary = FEDFLEET_BINARY;

struct Row {
  double f0, f1, y;
};

// y = 1.5 f0 - 2 f1 + 0.3 + noise(0.1).
std::vector<Row> writeLine(const std::string& path, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> x(0, 1), noise(0, 0.1);
  std::vector<Row> rows;
  std::ofstream out(path);
  out << "id,f0,f1,y\n";
  for (int i = 0; i < n; ++i) {
    Row r{x(rng), x(rng), 0};
    r.y = 1.5 * r.f0 - 2 * r.f1 + 0.3 + noise(rng);
    out << "s" << i << "," << r.f0 << "," << r.f1 << "," << r.y << "\n";
    // As the reader stores them: the printed text, as floats.
    std::stringstream back;
    back << r.f0 << " " << r.f1 << " " << r.y;
    float a, b, c;
    back >> a >> b >> c;
    rows.push_back({a, b, c});
  }
  return rows;
}

std::vector<std::string> regressionSets(const std::string& dir) {
  return {"data.format=csv",
          "data.path=" + dir + "/train.csv",
          "data.test_path=" + dir + "/test.csv",
          "data.label_column=y",
          "data.feature_columns=[\"f0\",\"f1\"]",
          "data.task=regression",
          "data.partition=iid",
          "train.loss=mse",
          "model.name=logreg",
          "train.lr=0.05"};
}

TEST(SimRegression, TheTestLossIsTheCheckpointedModelsMeanSquaredError) {
  const std::string dir = testing::freshDir("sim-regression");
  writeLine(dir + "/train.csv", 600, 1);
  const std::vector<Row> test = writeLine(dir + "/test.csv", 200, 2);
  testing::Process p(testing::smallSimArgs(kBinary, dir + "/h.db", 5, regressionSets(dir)),
                     dir + "/sim.txt");
  ASSERT_EQ(p.waitFor(120).value_or(-1), 0) << p.log();

  auto store = history::openSqliteHistoryReadOnly(dir + "/h.db");
  ASSERT_TRUE(store.isOk()) << store.status().toString();
  const auto runs = (*store)->runs().value();
  ASSERT_EQ(runs.size(), 1u);
  const auto rounds = (*store)->rounds(runs[0].run_id).value();
  ASSERT_EQ(rounds.size(), 6u);  // round 0 and five rounds
  for (const auto& r : rounds) {
    EXPECT_FALSE(r.test_accuracy.has_value()) << "round " << r.round << ": a regression";
    ASSERT_TRUE(r.test_loss.has_value()) << r.round;
  }
  EXPECT_LT(*rounds.back().test_loss, 0.2 * *rounds.front().test_loss)
      << *rounds.front().test_loss << " -> " << *rounds.back().test_loss;

  auto cp = (*store)->latestCheckpoint(runs[0].run_id);
  ASSERT_TRUE(cp.isOk()) << cp.status().toString();
  ASSERT_EQ(cp->round, 5u);
  ASSERT_EQ(cp->blob.size(), 3 * sizeof(float));  // weight [1, 2], bias [1]
  float w[3];
  std::memcpy(w, cp->blob.data(), sizeof(w));
  double sq = 0;
  for (const Row& r : test) {
    const double e =
        static_cast<double>(w[0]) * r.f0 + static_cast<double>(w[1]) * r.f1 + w[2] - r.y;
    sq += e * e;
  }
  EXPECT_NEAR(*rounds.back().test_loss, sq / test.size(), 1e-4 * sq / test.size());
}

// A module written by Python with its own loss (Huber, per sample) and metrics (a count of
// outputs within 0.5 of the target): the history's figures are the checkpointed module's, as
// computed here from its weights and the test file.
const char* kWriteModule = R"py(
import sys, torch
from typing import Dict
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1)
    def forward(self, x):
        return self.lin(x)
    @torch.jit.export
    def loss(self, output, target):
        return nn.functional.huber_loss(output, target, reduction="none").mean(1)
    @torch.jit.export
    def metrics(self, output, target) -> Dict[str, torch.Tensor]:
        return {"within_0.5": ((output - target).abs() < 0.5).float().sum()}

torch.manual_seed(4)
torch.jit.script(Net()).save(sys.argv[1])
)py";

TEST(SimRegression, AModulesOwnLossAndMetricsAreTheHistorysFigures) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch (apt-get install python3-torch)";
  }
  const std::string dir = testing::freshDir("sim-regression-module");
  writeLine(dir + "/train.csv", 600, 1);
  const std::vector<Row> test = writeLine(dir + "/test.csv", 200, 2);
  { std::ofstream(dir + "/write.py") << kWriteModule; }
  testing::Process w({"/usr/bin/python3", dir + "/write.py", dir + "/net.pt"}, dir + "/w.txt");
  ASSERT_EQ(w.waitFor(120).value_or(-1), 0) << w.log();
  std::vector<std::string> sets = regressionSets(dir);
  sets.push_back("train.loss=module");
  sets.push_back("model.name=torchscript");
  sets.push_back("model.path=" + dir + "/net.pt");
  testing::Process p(testing::smallSimArgs(kBinary, dir + "/h.db", 4, sets), dir + "/sim.txt");
  ASSERT_EQ(p.waitFor(120).value_or(-1), 0) << p.log();

  auto store = history::openSqliteHistoryReadOnly(dir + "/h.db");
  ASSERT_TRUE(store.isOk()) << store.status().toString();
  const auto run = (*store)->runs().value().at(0).run_id;
  const auto rounds = (*store)->rounds(run).value();
  ASSERT_EQ(rounds.size(), 5u);
  const auto& last = rounds.back();
  ASSERT_EQ(last.test_metrics.size(), 3u);
  EXPECT_EQ(last.test_metrics[0].first, "mse");
  EXPECT_EQ(last.test_metrics[1].first, "mae");
  EXPECT_EQ(last.test_metrics[2].first, "within_0.5");

  auto cp = (*store)->latestCheckpoint(run);
  ASSERT_TRUE(cp.isOk()) << cp.status().toString();
  ASSERT_EQ(cp->blob.size(), 3 * sizeof(float));  // lin.weight [1, 2], lin.bias [1]
  float w3[3];
  std::memcpy(w3, cp->blob.data(), sizeof(w3));
  double huber = 0, sq = 0, abs = 0, within = 0;
  for (const Row& r : test) {
    const double e =
        static_cast<double>(w3[0]) * r.f0 + static_cast<double>(w3[1]) * r.f1 + w3[2] - r.y;
    huber += std::abs(e) < 1 ? 0.5 * e * e : std::abs(e) - 0.5;
    sq += e * e;
    abs += std::abs(e);
    within += std::abs(e) < 0.5;
  }
  const double n = static_cast<double>(test.size());
  ASSERT_TRUE(last.test_loss);
  EXPECT_NEAR(*last.test_loss, huber / n, 1e-4 * (huber / n) + 1e-7);
  EXPECT_NEAR(last.test_metrics[0].second, sq / n, 1e-4 * (sq / n));
  EXPECT_NEAR(last.test_metrics[1].second, abs / n, 1e-4 * (abs / n));
  EXPECT_NEAR(last.test_metrics[2].second, within / n, 1.5 / n) << "a boundary case may round";
  EXPECT_LT(*last.test_loss, *rounds.front().test_loss);
}

TEST(SimRegression, ALossThatDoesNotFitTheTargetsStopsAtStartUp) {
  const std::string dir = testing::freshDir("sim-regression-bad");
  writeLine(dir + "/train.csv", 60, 1);
  writeLine(dir + "/test.csv", 20, 2);
  std::vector<std::string> sets = regressionSets(dir);
  sets.push_back("train.loss=cross_entropy");
  testing::Process p(testing::smallSimArgs(kBinary, dir + "/h.db", 1, sets), dir + "/sim.txt");
  const int rc = p.waitFor(60).value_or(-1);
  EXPECT_NE(rc, 0);
  EXPECT_NE(p.log().find("\"cross_entropy\" needs class labels"), std::string::npos) << p.log();
}

}  // namespace
}  // namespace fedfleet
