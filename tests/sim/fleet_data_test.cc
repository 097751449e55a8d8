// The simulator's data against a real client's: with [blocks] on, virtual client k trains and
// evaluates its served model on exactly the samples a real client of partition k loads.
#include "sim/fleet_data.h"

#include <gtest/gtest.h>

#include "common/data/block_cyclic.h"
#include "common/data/dataset.h"
#include "common/wire/data_split.h"
#include "driver/run_setup.h"

namespace fedfleet::sim {
namespace {

TEST(FleetData, ABlockClientHoldsTheSamplesARealClientLoads) {
  config::Config c;
  c.run.seed = 5;
  c.data.train_subset = 3000;
  c.data.test_subset = 500;  // the server's test set; the clients' held-out data is all of it
  c.data.partitions = 12;    // a real job: 12 partitions, as the simulator's 12 clients
  c.coordinator.clients_per_round = 2;
  c.sim.clients = 12;
  c.blocks.count = 3;
  c.blocks.rounds_per_block = 1;
  c.blocks.skew = 0.7;
  c.blocks.validation_samples = 40;  // the server's per-block sets come from those 500
  c.blocks.test_samples = 80;
  ASSERT_TRUE(c.validate().isOk());
  auto train = data::loadFashionMnist(data::defaultFashionMnistDir(), true, c.data.train_subset);
  if (!train.isOk()) GTEST_SKIP() << "Fashion-MNIST not installed: " << train.status().toString();
  auto test = data::loadFashionMnist(data::defaultFashionMnistDir(), false, 0);
  ASSERT_TRUE(test.isOk());
  auto fd = FleetData::create(c, c.sim.clients);
  ASSERT_TRUE(fd.isOk()) << fd.status().toString();

  // What a real coordinator puts in every task, and what a real client makes of it.
  const engine::EngineOptions eo = driver::engineOptionsFromConfig(c, 1);
  wire::DataSpec spec = eo.data;
  spec.num_partitions = eo.num_partitions;
  EXPECT_EQ(spec.scheme, "block-cyclic");
  EXPECT_EQ(spec.blocks, 3u);
  EXPECT_DOUBLE_EQ(spec.skew, 0.7);
  auto parts = wire::splitBySpec(train->labels, 10, spec);
  ASSERT_TRUE(parts.isOk()) << parts.status().toString();
  auto held = wire::splitBySpec(test->labels, 10, spec);
  ASSERT_TRUE(held.isOk()) << held.status().toString();
  ASSERT_EQ(parts->size(), 12u);
  for (uint32_t k = 0; k < 12; ++k) {
    auto shard = (*fd)->shard(k);
    ASSERT_TRUE(shard.isOk());
    EXPECT_EQ(shard->indices, (*parts)[k]) << "client " << k;
    EXPECT_FALSE(shard->indices.empty());
    auto h = (*fd)->heldOut(k);
    ASSERT_TRUE(h.isOk()) << h.status().toString();
    EXPECT_EQ(h->data->size(), test->size());  // the whole test split
    EXPECT_EQ(h->indices, (*held)[k]) << "client " << k;
    // Block k mod 3 favours its own classes: most of the shard is from its group.
    const data::ClassGroup g = data::classGroup(k % 3, 3, 10);
    size_t own = 0;
    for (uint32_t i : shard->indices) {
      own += train->labels[i] >= g.first && train->labels[i] < g.first + g.size;
    }
    EXPECT_GT(own * 2, shard->indices.size()) << "client " << k;
  }
}

TEST(FleetData, WithoutBlocksThereIsNoHeldOutData) {
  config::Config c;
  c.data.train_subset = 1000;
  c.data.test_subset = 100;
  auto fd = FleetData::create(c, 4);
  if (!fd.isOk()) GTEST_SKIP() << fd.status().toString();
  auto h = (*fd)->heldOut(0);
  ASSERT_FALSE(h.isOk());
  EXPECT_EQ(h.status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace fedfleet::sim
