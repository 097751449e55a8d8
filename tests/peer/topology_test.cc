#include "peer/topology.h"

#include <gtest/gtest.h>

#include <map>

namespace fedfleet::peer {
namespace {

using Neighbours = std::vector<uint32_t>;

TEST(TopologyTest, RingAndTorusNeighbours) {
  Graph ring = makeGraph(Topology::kRing, 5, 0, 1);
  EXPECT_EQ(ring.neighbours[0], (Neighbours{1, 4}));
  EXPECT_EQ(ring.neighbours[2], (Neighbours{1, 3}));
  EXPECT_EQ(makeGraph(Topology::kRing, 2, 0, 1).neighbours[0], (Neighbours{1}));

  // 9 = 3 x 3: peer 4 is the middle of the grid, peer 0 wraps around both ways.
  Graph torus = makeGraph(Topology::kTorus, 9, 0, 1);
  EXPECT_EQ(torus.neighbours[4], (Neighbours{1, 3, 5, 7}));
  EXPECT_EQ(torus.neighbours[0], (Neighbours{1, 2, 3, 6}));
  // 16 = 4 x 4.
  EXPECT_EQ(makeGraph(Topology::kTorus, 16, 0, 1).neighbours[5], (Neighbours{1, 4, 6, 9}));
}

TEST(TopologyTest, RandomRegularIsRegularSimpleAndSeeded) {
  for (uint32_t d : {3u, 4u}) {
    Graph g = makeGraph(Topology::kRandom, 16, d, 7);
    for (uint32_t i = 0; i < 16; ++i) {
      ASSERT_EQ(g.neighbours[i].size(), d) << "peer " << i;
      for (uint32_t j : g.neighbours[i]) {
        EXPECT_NE(i, j);
        EXPECT_TRUE(std::binary_search(g.neighbours[j].begin(), g.neighbours[j].end(), i));
      }
    }
    EXPECT_EQ(g.neighbours, makeGraph(Topology::kRandom, 16, d, 7).neighbours);
    EXPECT_NE(g.neighbours, makeGraph(Topology::kRandom, 16, d, 8).neighbours);
  }
}

TEST(TopologyTest, MetropolisWeightsByHand) {
  // A star 0-1, 0-2, 0-3: d_0 = 3, d_1..3 = 1. W_0j = 1/(1+3) = 1/4, W_00 = 1/4, W_jj = 3/4.
  Graph star;
  star.neighbours = {{1, 2, 3}, {0}, {0}, {0}};
  auto w0 = metropolisWeights(star, 0);
  ASSERT_EQ(w0.size(), 4u);
  for (auto [j, w] : w0) EXPECT_DOUBLE_EQ(w, 0.25) << j;
  auto w1 = metropolisWeights(star, 1);
  ASSERT_EQ(w1.size(), 2u);
  EXPECT_EQ(w1[0].first, 0u);
  EXPECT_DOUBLE_EQ(w1[0].second, 0.25);
  EXPECT_EQ(w1[1].first, 1u);
  EXPECT_DOUBLE_EQ(w1[1].second, 0.75);
  // Ring of 4: every weight 1/3.
  for (auto [j, w] : metropolisWeights(makeGraph(Topology::kRing, 4, 0, 1), 2)) {
    EXPECT_DOUBLE_EQ(w, 1.0 / 3) << j;
  }
}

TEST(TopologyTest, MetropolisIsSymmetricDoublyStochastic) {
  for (Topology t : {Topology::kRing, Topology::kTorus, Topology::kRandom}) {
    Graph g = makeGraph(t, 16, 3, 11);
    std::map<std::pair<uint32_t, uint32_t>, double> w;
    for (uint32_t i = 0; i < 16; ++i) {
      double row = 0;
      for (auto [j, x] : metropolisWeights(g, i)) {
        w[{i, j}] = x;
        row += x;
        EXPECT_GT(x, 0);
      }
      EXPECT_NEAR(row, 1.0, 1e-12);
    }
    for (auto [ij, x] : w) EXPECT_DOUBLE_EQ(x, (w[{ij.second, ij.first}])) << topologyName(t);
    for (uint32_t j = 0; j < 16; ++j) {
      double col = 0;
      for (uint32_t i = 0; i < 16; ++i) {
        auto it = w.find({i, j});
        if (it != w.end()) col += it->second;
      }
      EXPECT_NEAR(col, 1.0, 1e-12);
    }
  }
}

TEST(TopologyTest, BipartiteRolesPairActivesWithPassivesOnly) {
  Graph ring6 = makeGraph(Topology::kRing, 6, 0, 1);
  EXPECT_EQ(averagingPartners(ring6, 0), (Neighbours{1, 5}));
  EXPECT_EQ(averagingPartners(ring6, 3), (Neighbours{2, 4}));
  // Odd ring: peer 4 (active) has neighbours 3 and 0; only 3 is passive.
  EXPECT_EQ(averagingPartners(makeGraph(Topology::kRing, 5, 0, 1), 4), (Neighbours{3}));
  // A peer whose neighbours all share its role pairs with every peer of the other role.
  Graph same;
  same.neighbours = {{2}, {3}, {0}, {1}};
  EXPECT_EQ(averagingPartners(same, 0), (Neighbours{1, 3}));
  EXPECT_EQ(averagingPartners(same, 1), (Neighbours{0, 2}));
  for (Topology t : {Topology::kRing, Topology::kTorus, Topology::kRandom}) {
    Graph g = makeGraph(t, 16, 4, 3);
    for (uint32_t i = 0; i < 16; ++i) {
      for (uint32_t j : averagingPartners(g, i)) EXPECT_NE(isActive(i), isActive(j));
    }
  }
}

}  // namespace
}  // namespace fedfleet::peer
