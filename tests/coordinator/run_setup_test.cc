#include "coordinator/run_setup.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/data/dataset.h"
#include "tests/engine/round_engine_fixture.h"

namespace fedfleet::coordinator {
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
}  // namespace fedfleet::coordinator
