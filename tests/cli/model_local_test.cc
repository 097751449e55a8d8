// model.local in `fedfleet sim` (FedBN): a BatchNorm model whose running statistics are kept
// local leaves the global statistics at their initial values round after round while the
// shared weights train; federated, the same statistics move. `model info` marks them local.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "common/history/history.h"
#include "tests/cli/blobs.h"
#include "tests/integration/batchnorm_module.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

const std::string kBinary = FEDFLEET_BINARY;

struct Trained {
  int rc = -1;
  std::string log;
  std::vector<float> model;  // the last checkpoint
  double accuracy = 0;
};

// 3 rounds of the blobs (4 features, 3 classes) on the batch-norm model, with `sets` added.
Trained simulate(const std::string& dir, const std::vector<std::string>& sets) {
  testing::writeBlobs(dir + "/train.csv", 600, 1);
  testing::writeBlobs(dir + "/test.csv", 150, 2);
  const std::string module = testing::writeBatchNormModule(dir + "/bn.pt", 4, 3);
  std::vector<std::string> all = {"data.format=csv",
                                  "data.path=" + dir + "/train.csv",
                                  "data.test_path=" + dir + "/test.csv",
                                  "data.label_column=class",
                                  "data.feature_columns=[\"f0\",\"f1\",\"f2\",\"f3\"]",
                                  "data.partition=iid",
                                  "model.name=torchscript",
                                  "model.path=" + module,
                                  "train.lr=0.1"};
  all.insert(all.end(), sets.begin(), sets.end());
  testing::Process p(testing::smallSimArgs(kBinary, dir + "/h.db", 3, all), dir + "/sim.txt");
  Trained t;
  t.rc = p.waitFor(120).value_or(-1);
  t.log = p.log();
  auto store = history::openSqliteHistoryReadOnly(dir + "/h.db");
  if (!store.isOk()) return t;
  const auto runs = (*store)->runs().value();
  if (runs.empty()) return t;
  auto cp = (*store)->latestCheckpoint(runs[0].run_id);
  if (cp.isOk()) {
    t.model.resize(cp->blob.size() / sizeof(float));
    std::memcpy(t.model.data(), cp->blob.data(), cp->blob.size());
  }
  const auto rounds = (*store)->rounds(runs[0].run_id).value();
  if (!rounds.empty() && rounds.back().test_accuracy) t.accuracy = *rounds.back().test_accuracy;
  return t;
}

TEST(ModelLocal, LocalBatchNormStatisticsStayOutOfTheGlobalModel) {
  // Layout: w [4, 3] at 0, b [3] at 12, running_mean [4] at 15, running_var [4] at 19.
  const std::string shared_dir = testing::freshDir("model-local-shared");
  const Trained shared = simulate(shared_dir, {});
  ASSERT_EQ(shared.rc, 0) << shared.log;
  ASSERT_EQ(shared.model.size(), 23u);
  EXPECT_NE(shared.model[15], 0.0f) << "federated statistics move";
  EXPECT_NE(shared.model[19], 1.0f);

  const std::string dir = testing::freshDir("model-local-fedbn");
  const Trained local = simulate(dir, {"model.local=[\"running_*\"]"});
  ASSERT_EQ(local.rc, 0) << local.log;
  ASSERT_EQ(local.model.size(), 23u);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(local.model[15 + j], 0.0f) << "running_mean " << j;
    EXPECT_EQ(local.model[19 + j], 1.0f) << "running_var " << j;
  }
  EXPECT_NE(local.model[0], 0.1f) << "the shared weights train";
  EXPECT_GT(local.accuracy, 0.5);

  testing::Process info({kBinary, "model", "info", "--db", dir + "/h.db"}, dir + "/info.txt");
  ASSERT_EQ(info.waitFor(60).value_or(-1), 0) << info.log();
  EXPECT_THAT(info.log(), ::testing::ContainsRegex("running_mean +\\[4\\] .* buffer, local"));
  EXPECT_THAT(info.log(), ::testing::ContainsRegex("\nw +\\[4, 3\\] .* parameter\n"));
}

TEST(ModelLocal, APatternThatMatchesNoTensorStopsTheRunNamingIt) {
  const std::string dir = testing::freshDir("model-local-typo");
  const Trained t = simulate(dir, {"model.local=[\"bn.*\"]"});
  EXPECT_EQ(t.rc, 2) << t.log;
  EXPECT_THAT(t.log, ::testing::HasSubstr("model.local: pattern \"bn.*\" matches no tensor"));
}

}  // namespace
}  // namespace fedfleet
