// The SecAgg+ neighbour graph: k-regular, symmetric, without self-loops, fixed by its seed,
// complete when k >= n - 1; the default degree grows as log n and the threshold keeps the
// coordinator from collecting both kinds of share of a client.
#include "common/secagg/neighbour_graph.h"

#include <gtest/gtest.h>

#include "common/secagg/round_params.h"

namespace fedfleet::secagg {
namespace {

TEST(NeighbourGraph, IsRegularSymmetricAndSeeded) {
  for (uint32_t n : {5u, 16u, 101u, 1000u}) {
    const uint32_t k = defaultNeighbours(n);
    auto g = NeighbourGraph::build(n, k, 42);
    ASSERT_TRUE(g.isOk()) << g.status().toString();
    for (uint32_t i = 0; i < n; ++i) {
      ASSERT_EQ(g->neighbours(i).size(), k) << "n " << n << " client " << i;
      for (uint32_t j : g->neighbours(i)) {
        EXPECT_NE(i, j);
        EXPECT_TRUE(g->adjacent(j, i));
      }
    }
    auto again = NeighbourGraph::build(n, k, 42);
    auto other = NeighbourGraph::build(n, k, 43);
    bool same = true, differs = false;
    for (uint32_t i = 0; i < n; ++i) {
      same = same && again->neighbours(i) == g->neighbours(i);
      differs = differs || other->neighbours(i) != g->neighbours(i);
    }
    EXPECT_TRUE(same);
    if (k < n - 1) {
      EXPECT_TRUE(differs) << "n " << n;
    }
  }
}

TEST(NeighbourGraph, DefaultsGrowAsLogN) {
  EXPECT_EQ(defaultNeighbours(1), 0u);
  EXPECT_EQ(defaultNeighbours(8), 6u);      // 2 ceil(log2 8)
  EXPECT_EQ(defaultNeighbours(5), 4u);      // 2 ceil(2.32) = 6, capped at n - 1
  EXPECT_EQ(defaultNeighbours(100), 14u);   // 2 ceil(6.64)
  EXPECT_EQ(defaultNeighbours(1000), 20u);  // 2 ceil(9.97)
  EXPECT_EQ(defaultThreshold(14), 8u);      // 2t > k + 1 = 15
  EXPECT_EQ(defaultThreshold(7), 5u);       // 2t > 8
}

TEST(NeighbourGraph, CompleteWhenDegreeCoversEveryone) {
  auto g = NeighbourGraph::build(6, 9, 1);
  ASSERT_TRUE(g.isOk());
  for (uint32_t i = 0; i < 6; ++i) EXPECT_EQ(g->neighbours(i).size(), 5u);
}

TEST(NeighbourGraph, RefusesOddSparseDegrees) {
  EXPECT_EQ(NeighbourGraph::build(20, 5, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NeighbourGraph::build(20, 0, 1).status().code(), StatusCode::kInvalidArgument);
}

TEST(RoundParams, ThresholdMustExceedHalfTheHolders) {
  RoundParams p;
  p.clients = 20;
  p.neighbours = 10;
  p.length = 4;
  p.threshold = 6;  // 2 x 6 > 11
  EXPECT_TRUE(validateRoundParams(p).isOk());
  p.threshold = 5;  // 2 x 5 <= 11: both kinds of one client's shares could be collected
  EXPECT_EQ(validateRoundParams(p).code(), StatusCode::kInvalidArgument);
  p.threshold = 12;  // more than the 11 holders
  EXPECT_EQ(validateRoundParams(p).code(), StatusCode::kInvalidArgument);
  p.threshold = 6;
  p.neighbours = 7;  // odd and sparse
  EXPECT_EQ(validateRoundParams(p).code(), StatusCode::kInvalidArgument);
  p.neighbours = 10;
  p.clients = 1;
  EXPECT_EQ(validateRoundParams(p).code(), StatusCode::kInvalidArgument);
  // Every pair of 70,000 clients: more neighbours than a message may list.
  p.clients = 70000;
  p.neighbours = 69999;
  p.threshold = 35001;
  EXPECT_EQ(validateRoundParams(p).code(), StatusCode::kInvalidArgument);
  p.neighbours = kMaxNeighbours - 1;  // even, sparse: allowed
  p.threshold = kMaxNeighbours / 2 + 1;
  EXPECT_TRUE(validateRoundParams(p).isOk()) << validateRoundParams(p).toString();
}

}  // namespace
}  // namespace fedfleet::secagg
