// The README's worked example (examples/own_data/run.sh) runs end to end, and the TorchScript
// model with BatchNorm it exports gives in PyTorch the test accuracy the history recorded for
// that checkpoint (to 0.01 points): trained parameters and federated running statistics came
// out together.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>

#include "common/history/history.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

TEST(OwnDataExample, RunsAndTheExportedModelScoresInPyTorchAsInTheHistory) {
  if (std::system("/usr/bin/python3 -c 'import torch, numpy, PIL' > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 lacks torch, numpy or PIL (python3-torch, python3-pil)";
  }
  const std::string dir = testing::freshDir("own-data-example");
  setenv("FEDFLEET", FEDFLEET_BINARY, 1);
  testing::Process run(
      {"/bin/bash", std::string(FEDFLEET_SOURCE_DIR) + "/examples/own_data/run.sh", dir + "/out"},
      dir + "/run.txt");
  ASSERT_EQ(run.waitFor(600).value_or(-1), 0) << run.log();
  const std::string log = run.log();
  EXPECT_THAT(log, ::testing::ContainsRegex("bn.running_mean +\\[32\\] .* buffer, local"));

  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("accuracy ([0-9.]+) samples 400"))) << log;
  const double python = std::stod(m[1]);

  auto store = history::openSqliteHistoryReadOnly(dir + "/out/csv.db");
  ASSERT_TRUE(store.isOk()) << store.status().toString();
  const auto runs = (*store)->runs().value();
  ASSERT_EQ(runs.size(), 1u);
  double best = -1;
  const auto rounds = (*store)->rounds(runs[0].run_id).value();  // a copy, not into a temporary
  for (const auto& r : rounds) {
    if (r.round > 0 && r.test_accuracy) best = std::max(best, *r.test_accuracy);
    EXPECT_EQ(r.rejected, 0u) << "round " << r.round << ": a BatchNorm client failed";
  }
  EXPECT_NEAR(python, best, 1e-4) << "PyTorch " << python << ", history " << best;
  EXPECT_GT(best, 0.8) << "the clusters are separable";

  for (const char* db : {"/out/fedbn.db", "/out/images.db"}) {
    auto s = history::openSqliteHistoryReadOnly(dir + db);
    ASSERT_TRUE(s.isOk()) << db;
    const auto rounds = (*s)->rounds((*s)->runs().value().at(0).run_id).value();
    ASSERT_EQ(rounds.size(), 9u) << db;
    ASSERT_TRUE(rounds.back().test_accuracy.has_value()) << db;
    EXPECT_GT(*rounds.back().test_accuracy, 0.6) << db;
  }
}

}  // namespace
}  // namespace fedfleet
