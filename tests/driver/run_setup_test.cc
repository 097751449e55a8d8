#include "driver/run_setup.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/crypto/keyed_stream.h"
#include "common/data/dataset.h"
#include "tests/engine/round_engine_fixture.h"

namespace fedfleet::driver {
namespace {

using engine::EngineOptions;
using engine::engine_test::baseOptions;

TEST(RunSetup, PartitionSizesFollowTheClientsSplit) {
  // 40 samples, labels 0..3 cycling; 4 IID partitions of 10 (sizes differ by at most 1).
  data::Dataset train;
  train.num_classes = 4;
  for (int i = 0; i < 40; ++i) train.labels.push_back(static_cast<uint8_t>(i % 4));
  engine::EngineOptions o = baseOptions(1, 1, 1);
  o.num_partitions = 4;
  o.data.scheme = "iid";
  auto sizes = partitionSizes(o, train);
  ASSERT_TRUE(sizes.isOk()) << sizes.status().toString();
  EXPECT_EQ(*sizes, (std::vector<uint64_t>{10, 10, 10, 10}));
  o.data.scheme = "labels";
  o.data.labels_per_client = 1;  // partition i holds label i: 10 samples each
  sizes = partitionSizes(o, train);
  ASSERT_TRUE(sizes.isOk());
  EXPECT_EQ(*sizes, (std::vector<uint64_t>{10, 10, 10, 10}));
  o.data.scheme = "nonsense";
  EXPECT_FALSE(partitionSizes(o, train).isOk());
}

}  // namespace
}  // namespace fedfleet::driver

namespace fedfleet::driver {
namespace {

// The [dp] section becomes the engine's DP options, with a noise key derived from the seed
// (the simulator's; a coordinator replaces it with a random one), and the engine's check
// refuses what cannot work with the key named.
TEST(RunSetup, TheDpSectionBecomesTheEnginesPrivacyOptions) {
  config::Config c;
  ASSERT_TRUE(c.loadString("[run]\nseed = 9\n[coordinator]\nclients_per_round = 2\nmin_clients = "
                           "2\nquorum = 2\n[dp]\nmode = \"central\"\nnoise_multiplier = 1.5\n"
                           "clip_norm = 0.25\nadaptive_clip = true\ntarget_quantile = 0.7\n"
                           "clip_lr = 0.1\ncount_stddev = 2\ndelta = 1e-6\ntarget_epsilon = "
                           "30\npopulation = 1000\n",
                           "dp.toml")
                  .isOk());
  ASSERT_TRUE(c.validate().isOk()) << c.validate().toString();
  EngineOptions o = engineOptionsFromConfig(c, 1);
  EXPECT_TRUE(o.dp.central);
  EXPECT_EQ(o.dp.noise_multiplier, 1.5);
  EXPECT_EQ(o.dp.clip_norm, 0.25);
  EXPECT_TRUE(o.dp.adaptive_clip);
  EXPECT_EQ(o.dp.target_quantile, 0.7);
  EXPECT_EQ(o.dp.clip_lr, 0.1);
  EXPECT_EQ(o.dp.count_stddev, 2);
  EXPECT_EQ(o.dp.delta, 1e-6);
  EXPECT_EQ(o.dp.target_epsilon, 30);
  EXPECT_EQ(o.dp.population, 1000u);
  EXPECT_EQ(o.dp.noise_key, crypto::streamKeyFromSeed("fedfleet dp noise", 9));
  EXPECT_TRUE(engine::validateDpOptions(o).isOk());

  ASSERT_TRUE(c.set("dp.population=1").isOk());  // fewer than the 2 sampled a round
  Status st = engine::checkEngineOptions(engineOptionsFromConfig(c, 1));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("config [dp]"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("dp.population"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace fedfleet::driver

namespace fedfleet::driver {
namespace {

TEST(RunSetup, ANewRunRecordsItsConfigClockAndModel) {
  config::Config c;
  c.run.name = "r";
  c.run.seed = 41;
  config::Config recorded = c;
  recorded.data.mean = {0.25};
  history::RunRecord run = newRunRecord(c, "virtual", "{\"m\":1}", &recorded);
  EXPECT_EQ(run.name, "r");
  EXPECT_EQ(run.seed, 41u);
  EXPECT_EQ(run.clock, "virtual");
  EXPECT_EQ(run.model_json, "{\"m\":1}");
  EXPECT_EQ(run.config_json, recorded.toJson().dump());
  EXPECT_NE(run.config_json, c.toJson().dump());
  EXPECT_GT(run.started_at, 1.7e9);  // unix seconds
  EXPECT_EQ(newRunRecord(c, "wall", "").config_json, c.toJson().dump());

  // ":memory:" is a memory history for a simulation, and a SQLite database otherwise; both
  // record the run.
  for (bool in_memory_ok : {true, false}) {
    auto store = openRunHistory(":memory:", in_memory_ok);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    auto id = (*store)->beginRun(run);
    ASSERT_TRUE(id.isOk());
    auto runs = (*store)->runs();
    ASSERT_TRUE(runs.isOk());
    ASSERT_EQ(runs->size(), 1u);
    EXPECT_EQ(runs->front().clock, "virtual");
  }
}

}  // namespace
}  // namespace fedfleet::driver
