#include "engine/block_models.h"

#include <gtest/gtest.h>

namespace fedfleet::engine {
namespace {

TEST(BlockSchedule, ByRoundsCyclesThroughTheBlocks) {
  BlockScheduleOptions o;
  o.count = 3;
  o.rounds_per_block = 2;
  BlockSchedule s(o);
  // Rounds 1,2 -> block 0; 3,4 -> 1; 5,6 -> 2; 7 -> 0 again.
  const uint32_t want[] = {0, 0, 1, 1, 2, 2, 0, 0};
  for (uint32_t r = 1; r <= 8; ++r) EXPECT_EQ(s.blockAt(r, 1e9), want[r - 1]) << "round " << r;
  const int64_t visits[] = {0, 0, 1, 1, 2, 2, 3, 3};
  for (uint32_t r = 1; r <= 8; ++r) EXPECT_EQ(s.visitAt(r, 1e9), visits[r - 1]) << "round " << r;
  EXPECT_FALSE(s.endsAfter(1, 0, 0));
  EXPECT_TRUE(s.endsAfter(2, 0, 0));
  EXPECT_FALSE(s.endsAfter(5, 2, 0));
  EXPECT_TRUE(s.endsAfter(6, 2, 0));
  EXPECT_FALSE(s.nextBoundary(5).has_value());
}

TEST(BlockSchedule, ByClockUsesTheAnchor) {
  BlockScheduleOptions o;
  o.count = 4;
  o.block_s = 10;
  o.anchor_s = 100;
  BlockSchedule s(o);
  EXPECT_EQ(s.blockAt(1, 100), 0u);
  EXPECT_EQ(s.blockAt(1, 109.9), 0u);
  EXPECT_EQ(s.blockAt(1, 110), 1u);
  EXPECT_EQ(s.blockAt(1, 135), 3u);
  EXPECT_EQ(s.blockAt(1, 140), 0u);
  EXPECT_EQ(s.blockAt(1, 95), 3u);  // before the anchor: the cycle runs backwards too
  EXPECT_EQ(s.visitAt(7, 115), 1);
  EXPECT_EQ(s.visitAt(7, 95), -1);
  EXPECT_FALSE(s.endsAfter(7, 1, 119));
  EXPECT_TRUE(s.endsAfter(7, 1, 120.5));
  EXPECT_DOUBLE_EQ(*s.nextBoundary(113), 120);
  EXPECT_DOUBLE_EQ(*s.nextBoundary(120), 130);
}

TEST(BlockSchedule, OneBlockOnAClockIsAlwaysBlockZero) {
  BlockScheduleOptions o;
  o.count = 1;
  o.block_s = 10;
  o.anchor_s = 3;
  BlockSchedule s(o);
  for (double t : {-1e6, -7.5, 0.0, 3.0, 12.999, 13.0, 1234.5, 1.7e9}) {
    EXPECT_EQ(s.blockAt(1, t), 0u) << "t = " << t;
    EXPECT_EQ(s.blockAt(1000, t), 0u) << "t = " << t;
  }
  // The visits still change every block_s after the anchor, and every partition is in it.
  EXPECT_EQ(s.visitAt(1, 12.999), 0);
  EXPECT_EQ(s.visitAt(1, 13.0), 1);
  EXPECT_FALSE(s.endsAfter(4, 0, 12.5));
  EXPECT_TRUE(s.endsAfter(4, 0, 13.5));
  EXPECT_DOUBLE_EQ(*s.nextBoundary(3), 13);
  EXPECT_DOUBLE_EQ(*s.nextBoundary(14), 23);
  for (uint32_t p = 0; p < 5; ++p) EXPECT_TRUE(s.available(p, 0)) << "partition " << p;
}

TEST(BlockSchedule, AvailabilityFollowsThePartitionAndOverlap) {
  BlockScheduleOptions o;
  o.count = 4;
  o.rounds_per_block = 1;
  BlockSchedule none(o);
  for (uint32_t p = 0; p < 40; ++p) {
    for (uint32_t m = 0; m < 4; ++m) EXPECT_EQ(none.available(p, m), p % 4 == m);
  }
  o.overlap = 0.5;
  o.seed = 9;
  BlockSchedule half(o);
  int also_next = 0;
  const int n = 4000;
  for (uint32_t p = 0; p < static_cast<uint32_t>(n); ++p) {
    EXPECT_TRUE(half.available(p, p % 4));
    EXPECT_FALSE(half.available(p, (p + 2) % 4));  // never two blocks ahead
    also_next += half.available(p, (p + 1) % 4);
  }
  EXPECT_NEAR(also_next / static_cast<double>(n), 0.5, 0.03);
  o.overlap = 1;
  BlockSchedule all(o);
  EXPECT_TRUE(all.available(5, 2));
}

TEST(BlockModels, RunningAverageIsTheMeanOfTheEndOfBlockIterates) {
  BlockModels b(BlockMode::kPluralistic, 2);
  EXPECT_TRUE(b.average(0).empty());
  const std::vector<std::vector<float>> x = {
      {1, -2, 0.5f}, {4, 0, 1.5f}, {-2, 8, 0.25f}, {5, 2, 0.75f}};
  // After r visits z_0 = mean of the first r: (1,-2,.5); (2.5,-1,1); (1,2,.75); (2,2,.75).
  const std::vector<std::vector<float>> want = {
      {1, -2, 0.5f}, {2.5f, -1, 1}, {1, 2, 0.75f}, {2, 2, 0.75f}};
  for (size_t r = 0; r < x.size(); ++r) {
    b.endVisit(0, x[r]);
    EXPECT_EQ(b.visits(0), r + 1);
    ASSERT_EQ(b.average(0).size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(b.average(0)[i], want[r][i]) << r << "," << i;
  }
  EXPECT_EQ(b.visits(1), 0u);  // the other block is untouched
  EXPECT_TRUE(b.average(1).empty());
  // Served: z_0 for the visited block, x for the other.
  const std::vector<float> shared = {9, 9, 9};
  EXPECT_EQ(b.served(0), BlockModels::Served::kPluralistic);
  EXPECT_EQ(b.servedParams(0, shared), want[3]);
  EXPECT_EQ(b.served(1), BlockModels::Served::kShared);
  EXPECT_EQ(b.servedParams(1, shared), shared);
}

TEST(BlockModels, SingleModeKeepsNoAverages) {
  BlockModels b(BlockMode::kSingle, 2);
  b.endVisit(0, {1, 2});
  EXPECT_EQ(b.visits(0), 0u);
  EXPECT_EQ(b.served(0), BlockModels::Served::kShared);
}

TEST(BlockModels, MultichainServesTheLowerValidationLoss) {
  BlockModels b(BlockMode::kMultichain, 2);
  b.endVisit(0, {1, 1});
  std::vector<float>& y = b.chain(0, {1, 1});
  y = {5, 5};
  EXPECT_EQ(b.chain(0, {7, 7}), (std::vector<float>{5, 5}));  // started once, then kept
  EXPECT_EQ(b.served(0), BlockModels::Served::kPluralistic);  // no choice yet
  EXPECT_EQ(b.choose(0, 0.9, 0.4), BlockModels::Served::kChain);
  EXPECT_EQ(b.servedParams(0, {0, 0}), (std::vector<float>{5, 5}));
  EXPECT_EQ(b.choose(0, 0.3, 0.4), BlockModels::Served::kPluralistic);
  EXPECT_EQ(b.servedParams(0, {0, 0}), (std::vector<float>{1, 1}));
  EXPECT_EQ(b.choose(0, 0.5, 0.5), BlockModels::Served::kPluralistic);  // a tie: the average
  EXPECT_EQ(b.choose(0, std::nullopt, 0.7), BlockModels::Served::kChain);
  EXPECT_EQ(b.choose(0, std::nullopt, std::nullopt), BlockModels::Served::kChain);  // kept
  // Block 1 has neither model: x whatever the losses say.
  EXPECT_EQ(b.choose(1, 0.1, 0.2), BlockModels::Served::kShared);
}

TEST(BlockModels, SaveAndLoadRoundTrip) {
  BlockModels a(BlockMode::kMultichain, 3);
  a.endVisit(0, {1, 2});
  a.endVisit(0, {3, 4});
  a.chain(2, {7, 8})[1] = 9;
  a.choose(2, std::nullopt, 0.5);
  const std::string blob = a.save();

  BlockModels b(BlockMode::kMultichain, 3);
  ASSERT_TRUE(b.load(blob, 2).isOk());
  EXPECT_EQ(b.visits(0), 2u);
  EXPECT_EQ(b.average(0), (std::vector<float>{2, 3}));
  EXPECT_EQ(b.chain(2), (std::vector<float>{7, 9}));
  EXPECT_EQ(b.served(2), BlockModels::Served::kChain);
  EXPECT_EQ(b.save(), blob);

  // Another mode, another block count, another model size, a truncated blob: refused, unchanged.
  BlockModels other_mode(BlockMode::kPluralistic, 3);
  EXPECT_FALSE(other_mode.load(blob, 2).isOk());
  BlockModels other_count(BlockMode::kMultichain, 4);
  EXPECT_FALSE(other_count.load(blob, 2).isOk());
  EXPECT_FALSE(b.load(blob, 3).isOk());
  EXPECT_FALSE(b.load(blob.substr(0, blob.size() - 1), 2).isOk());
  EXPECT_EQ(b.save(), blob);
}

TEST(BlockModes, ParseNames) {
  EXPECT_EQ(*parseBlockMode("pluralistic"), BlockMode::kPluralistic);
  EXPECT_EQ(std::string(blockModeName(BlockMode::kMultichain)), "multichain");
  EXPECT_FALSE(parseBlockMode("plural").isOk());
}

}  // namespace
}  // namespace fedfleet::engine
