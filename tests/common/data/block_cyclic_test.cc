#include "common/data/block_cyclic.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>

namespace fedfleet::data {
namespace {

// n samples of each of 10 classes, in class order.
std::vector<data::Label> balancedLabels(uint32_t per_class) {
  std::vector<data::Label> labels;
  for (uint32_t c = 0; c < 10; ++c) labels.insert(labels.end(), per_class, static_cast<uint8_t>(c));
  return labels;
}

TEST(BlockCyclic, ClassGroupsAreContiguousAndCoverTheClasses) {
  // 10 classes in 4 groups: 3, 3, 2, 2.
  const ClassGroup want[] = {{0, 3}, {3, 3}, {6, 2}, {8, 2}};
  for (uint32_t m = 0; m < 4; ++m) {
    EXPECT_EQ(classGroup(m, 4, 10).first, want[m].first);
    EXPECT_EQ(classGroup(m, 4, 10).size, want[m].size);
  }
  EXPECT_EQ(classGroup(9, 10, 10).first, 9u);
  EXPECT_EQ(classGroup(9, 10, 10).size, 1u);
}

TEST(BlockCyclic, ClassCountsFollowTheSkew) {
  // Block 2 of 4 (classes 6, 7), 100 samples at skew 0.8: 80 over {6, 7} = 40 each, then 20
  // over all 10 classes = 2 each.
  const auto c = blockClassCounts(2, 4, 10, 0.8, 100);
  const std::vector<uint32_t> want = {2, 2, 2, 2, 2, 2, 42, 42, 2, 2};
  EXPECT_EQ(c, want);
  // Remainders: 7 samples of block 0 (classes 0-2) at skew 0.5: round(3.5) = 4 over 3 classes
  // (2, 1, 1), the other 3 to classes offset, offset + 1, offset + 2.
  const auto r = blockClassCounts(0, 4, 10, 0.5, 7, 8);
  const std::vector<uint32_t> want_r = {3, 1, 1, 0, 0, 0, 0, 0, 1, 1};
  EXPECT_EQ(r, want_r);
}

TEST(BlockCyclic, PartitionsAreDisjointEqualAndSkewedToTheirBlock) {
  const auto labels = balancedLabels(600);  // 6000 samples
  BlockCyclicSpec spec;
  spec.blocks = 4;
  spec.skew = 0.8;
  spec.num_partitions = 40;
  spec.seed = 3;
  auto parts = partitionBlockCyclic(labels, 10, spec);
  ASSERT_TRUE(parts.isOk()) << parts.status().toString();
  ASSERT_EQ(parts->size(), 40u);
  // The 2-class groups bound the size: a class of groups 2 or 3 is asked 10 x (0.4 + 4 x 0.02)
  // = 4.8 samples per unit of S, so S = floor(600 / 4.8) = 125 (n / parts = 150 would not fit).
  std::set<uint32_t> all;
  for (uint32_t p = 0; p < 40; ++p) {
    const auto& shard = (*parts)[p];
    EXPECT_EQ(shard.size(), 125u) << "partition " << p;
    EXPECT_TRUE(std::is_sorted(shard.begin(), shard.end()));
    const ClassGroup g = classGroup(p % 4, 4, 10);
    uint32_t own = 0;
    for (uint32_t i : shard) {
      own += labels[i] >= g.first && labels[i] < g.first + g.size;
      all.insert(i);
    }
    // round(0.8 x 125) = 100 from the group, plus the group's share of the other 25.
    EXPECT_GE(own, 100u) << "partition " << p;
    EXPECT_LE(own, 100u + 25u * g.size / 10 + g.size) << "partition " << p;
  }
  EXPECT_EQ(all.size(), 40u * 125u);  // disjoint
  // Deterministic for a seed, another seed another split.
  EXPECT_EQ(*partitionBlockCyclic(labels, 10, spec), *parts);
  spec.seed = 4;
  EXPECT_NE(*partitionBlockCyclic(labels, 10, spec), *parts);
}

TEST(BlockCyclic, EvaluationSetsAreDisjointWithTheBlockMix) {
  const auto labels = balancedLabels(1000);
  auto sets = blockEvalIndices(labels, 10, 4, 0.8, 50, 100, 7);
  ASSERT_TRUE(sets.isOk()) << sets.status().toString();
  ASSERT_EQ(sets->size(), 4u);
  for (uint32_t m = 0; m < 4; ++m) {
    const auto& s = (*sets)[m];
    EXPECT_EQ(s.validation.size(), 50u);
    EXPECT_EQ(s.test.size(), 100u);
    std::vector<uint32_t> counts(10, 0);
    for (uint32_t i : s.test) ++counts[labels[i]];
    EXPECT_EQ(counts, blockClassCounts(m, 4, 10, 0.8, 100));
    std::set<uint32_t> v(s.validation.begin(), s.validation.end());
    for (uint32_t i : s.test) EXPECT_EQ(v.count(i), 0u) << "block " << m;
  }
}

TEST(BlockCyclic, BadSpecsAreRefused) {
  const auto labels = balancedLabels(10);
  BlockCyclicSpec spec;
  spec.num_partitions = 4;
  spec.blocks = 11;  // more blocks than classes
  EXPECT_EQ(partitionBlockCyclic(labels, 10, spec).status().code(), StatusCode::kInvalidArgument);
  spec.blocks = 2;
  spec.skew = 1.5;
  EXPECT_EQ(partitionBlockCyclic(labels, 10, spec).status().code(), StatusCode::kInvalidArgument);
  spec.skew = 0.5;
  spec.num_partitions = 0;
  EXPECT_EQ(partitionBlockCyclic(labels, 10, spec).status().code(), StatusCode::kInvalidArgument);
  // 10 samples a class cannot give a block's test set 60 of its classes.
  EXPECT_FALSE(blockEvalIndices(labels, 10, 2, 1.0, 0, 300, 1).isOk());
}

}  // namespace
}  // namespace fedfleet::data
