// SCAFFOLD with momentum 0.9 and weight decay in a simulated non-IID federation (each client two
// of the blobs' three classes, 20 local steps a round): every round is ok and the model learns,
// as in NIID-Bench's setting. (The form that added c - c_k to the gradient before momentum
// diverged after its first round there, every later update non-finite.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/history/history.h"
#include "tests/cli/blobs.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

const std::string kBinary = FEDFLEET_BINARY;

TEST(SimScaffoldMomentum, NonIidRunsConvergeWithMomentumAndWeightDecay) {
  const std::string dir = testing::freshDir("sim-scaffold-momentum");
  testing::writeBlobs(dir + "/train.csv", 600, 1);
  testing::writeBlobs(dir + "/test.csv", 150, 2);
  std::vector<std::string> sets = testing::blobsSimSets(dir);
  for (const char* s :
       {"data.partition=labels", "data.labels_per_client=2", "aggregation.method=scaffold",
        "train.momentum=0.9", "train.weight_decay=1e-5", "train.lr=0.05", "train.steps=20",
        "train.batch=16", "coordinator.quorum=6", "model.name=mlp"}) {
    sets.push_back(s);
  }
  std::vector<std::string> args = testing::smallSimArgs(kBinary, dir + "/h.db", 8, sets);
  args[5] = "6";  // all six clients every round
  testing::Process p(args, dir + "/sim.txt");
  ASSERT_EQ(p.waitFor(300).value_or(-1), 0) << p.log();
  auto store = history::openSqliteHistoryReadOnly(dir + "/h.db");
  ASSERT_TRUE(store.isOk()) << store.status().toString();
  const auto runs = (*store)->runs().value();
  ASSERT_EQ(runs.size(), 1u);
  const auto rounds = (*store)->rounds(runs[0].run_id).value();
  ASSERT_EQ(rounds.size(), 9u);
  for (size_t r = 1; r < rounds.size(); ++r) {
    EXPECT_EQ(rounds[r].status, "ok") << "round " << r;
    EXPECT_EQ(rounds[r].rejected, 0u) << "round " << r;
  }
  ASSERT_TRUE(rounds.back().test_accuracy.has_value());
  EXPECT_GT(*rounds.back().test_accuracy, 0.9) << p.log();
}

}  // namespace
}  // namespace fedfleet
