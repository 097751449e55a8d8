#include "peer/peer_engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "peer/topology.h"
#include "tests/peer/peer_harness.h"

namespace fedfleet::peer {
namespace {

using testing::PeerHarness;

PeerOptions options(Algorithm a, uint32_t peers, uint64_t iterations) {
  PeerOptions o;
  o.algorithm = a;
  o.peers = peers;
  o.iterations = iterations;
  o.seed = 42;
  return o;
}

std::vector<std::vector<float>> same(uint32_t peers, std::vector<float> x) {
  return std::vector<std::vector<float>>(peers, x);
}

// Peer i's delta is (i + 1) * c for every iteration: small integers, exact in float.
PeerHarness::DeltaFn constantDelta(std::vector<float> c) {
  return [c](uint32_t peer, uint64_t, const std::vector<float>&) {
    std::vector<float> d = c;
    for (float& v : d) v *= static_cast<float>(peer + 1);
    return d;
  };
}

PeerHarness::DeltaFn zeroDelta(size_t n) {
  return [n](uint32_t, uint64_t, const std::vector<float>&) { return std::vector<float>(n, 0.0f); };
}

TEST(PeerEngineTest, OptionsAreValidated) {
  PeerOptions o = options(Algorithm::kAllReduce, 1, 1);
  EXPECT_FALSE(validate(o).isOk());
  o.peers = 4;
  EXPECT_TRUE(validate(o).isOk());
  o.pipeline = 3;
  EXPECT_FALSE(validate(o).isOk());
  o = options(Algorithm::kHop, 4, 1);  // ring: two neighbours each
  o.hop_backup = 2;
  Status s = validate(o);
  EXPECT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("hop_backup"), std::string::npos) << s.message();
  o = options(Algorithm::kDpsgd, 5, 1);
  o.topology = Topology::kRandom;
  o.degree = 3;  // 5 * 3 odd
  EXPECT_FALSE(validate(o).isOk());
  EXPECT_TRUE(parseAlgorithm("prague").isOk());
  EXPECT_FALSE(parseAlgorithm("gossip").isOk());
}

TEST(PeerEngineTest, AllReduceAppliesTheExactMean) {
  // 4 peers, deltas (i + 1) * [1, 2, 3, 4, 5]: the mean is 2.5 * c.
  PeerHarness h(options(Algorithm::kAllReduce, 4, 3), same(4, {1, 1, 1, 1, 1}),
                constantDelta({1, 2, 3, 4, 5}));
  h.run();
  ASSERT_TRUE(h.fails.empty()) << h.fails[0].message();
  EXPECT_EQ(h.finished.size(), 4u);
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(h.engines[i]->model(), (std::vector<float>{8.5f, 16, 23.5f, 31, 38.5f})) << i;
    ASSERT_EQ(h.done[i].size(), 3u);
    EXPECT_EQ(h.done[i][1].exchanges, 6u);  // 2 (P - 1) chunks received
    EXPECT_EQ(h.done[i][1].staleness, 0u);
  }
  // Iteration 1 computes on the model after iteration 0's mean: 1 + 2.5.
  for (const auto& c : h.computes) {
    if (c.iteration == 1) {
      EXPECT_EQ(c.params[0], 3.5f);
    }
  }
}

TEST(PeerEngineTest, PipelinedAllReduceIsOneStepStale) {
  PeerOptions o = options(Algorithm::kAllReduce, 2, 4);
  o.pipeline = 2;
  // Delta = 1 + the first parameter, so that what each compute saw shows in the result.
  PeerHarness h(o, same(2, {0, 0}), [](uint32_t, uint64_t, const std::vector<float>& x) {
    return std::vector<float>{1 + x[0], 1 + x[0]};
  });
  h.setLatency(0.5);  // a slow network: the all-reduce overlaps the next compute
  h.run();
  ASSERT_TRUE(h.fails.empty()) << h.fails[0].message();
  // Iterations 0 and 1 both compute on x0 = 0 (1 lacks mean(u_0)): u_0 = u_1 = 1.
  // Iteration 2 computes on x0 + mean(u_0) = 1: u_2 = 2; iteration 3 on 1 + 1 = 2: u_3 = 3.
  std::map<uint64_t, float> seen;
  for (const auto& c : h.computes) {
    if (c.peer == 0) seen[c.iteration] = c.params[0];
  }
  EXPECT_EQ(seen, (std::map<uint64_t, float>{{0, 0}, {1, 0}, {2, 1}, {3, 2}}));
  EXPECT_EQ(h.engines[0]->model()[0], 7.0f);  // 1 + 1 + 2 + 3
  EXPECT_EQ(h.engines[1]->model(), h.engines[0]->model());
  ASSERT_EQ(h.done[0].size(), 4u);
  EXPECT_EQ(h.done[0][0].staleness, 0u);
  for (int t = 1; t < 4; ++t) EXPECT_EQ(h.done[0][t].staleness, 1u) << t;
  // Pipelining overlaps: with one compute second and 6 message hops of 0.5 s per all-reduce,
  // 4 iterations take less than the unpipelined 4 x (1 + 1) seconds.
  PeerHarness plain(options(Algorithm::kAllReduce, 2, 4), same(2, {0, 0}),
                    [](uint32_t, uint64_t, const std::vector<float>& x) {
                      return std::vector<float>{1 + x[0], 1 + x[0]};
                    });
  plain.setLatency(0.5);
  plain.run();
  EXPECT_LT(h.now(), plain.now() - 1.5);
}

TEST(PeerEngineTest, CompressedAllReduceWithErrorFeedbackTracksTheMean) {
  PeerOptions o = options(Algorithm::kAllReduce, 4, 40);
  auto spec = compress::parseCodecSpec("qsgd8");
  ASSERT_TRUE(spec.isOk());
  o.codec = spec.value();
  std::vector<float> c(64);
  for (size_t i = 0; i < c.size(); ++i) c[i] = 0.01f * static_cast<float>((i * 37) % 17) - 0.05f;
  PeerHarness h(o, same(4, std::vector<float>(64, 0.0f)), constantDelta(c));
  h.run();
  ASSERT_TRUE(h.fails.empty()) << h.fails[0].message();
  // Exact: 40 iterations of mean (i + 1) = 2.5 times c.
  double worst = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    worst = std::max(worst, std::abs(h.engines[0]->model()[i] - 40 * 2.5 * c[i]));
  }
  EXPECT_LT(worst, 0.02);  // the per-step quantisation error does not accumulate
  for (uint32_t i = 1; i < 4; ++i) EXPECT_EQ(h.engines[i]->model(), h.engines[0]->model());
}

TEST(PeerEngineTest, DpsgdMixesWithMetropolisWeights) {
  // Ring of 4: W = 1/3 for self and both neighbours. x_i^0 = [i], u_i = [i + 1].
  // x_0^1 = (0 + 1 + 3) / 3 + 1 = 7/3; x_1^1 = (0 + 1 + 2) / 3 + 2 = 3.
  PeerHarness h(options(Algorithm::kDpsgd, 4, 1), {{0}, {1}, {2}, {3}}, constantDelta({1}));
  h.run();
  ASSERT_TRUE(h.fails.empty()) << h.fails[0].message();
  EXPECT_NEAR(h.engines[0]->model()[0], 7.0 / 3, 1e-6);
  EXPECT_NEAR(h.engines[1]->model()[0], 3.0, 1e-6);
  EXPECT_NEAR(h.engines[2]->model()[0], 2.0 + 3.0, 1e-6);        // (1 + 2 + 3) / 3 + 3
  EXPECT_NEAR(h.engines[3]->model()[0], 2.0 / 3 + 1 + 4, 1e-6);  // (2 + 3 + 0) / 3 + 4
  EXPECT_EQ(h.done[0][0].exchanges, 2u);
}

TEST(PeerEngineTest, DpsgdOnRandomGraphConservesTheMeanAndContracts) {
  PeerOptions o = options(Algorithm::kDpsgd, 8, 30);
  o.topology = Topology::kRandom;
  o.degree = 3;
  std::vector<std::vector<float>> init;
  for (uint32_t i = 0; i < 8; ++i) init.push_back({static_cast<float>(i)});
  PeerHarness h(o, init, zeroDelta(1));
  h.run();
  ASSERT_TRUE(h.fails.empty());
  double sum = 0, spread = 0;
  for (auto& e : h.engines) sum += e->model()[0];
  for (auto& e : h.engines) spread = std::max(spread, std::abs(e->model()[0] - 3.5));
  EXPECT_NEAR(sum, 28.0, 1e-4);  // doubly stochastic W keeps the average
  EXPECT_LT(spread, 0.05);       // and mixes towards it
}

TEST(PeerEngineTest, AdpsgdPairsActivesWithPassivesAndConservesTheSum) {
  // Zero deltas: every averaging (x_i + x_j) / 2 for both keeps the sum of the models.
  std::vector<std::vector<float>> init;
  for (uint32_t i = 0; i < 6; ++i) init.push_back({static_cast<float>(i * i)});
  PeerHarness h(options(Algorithm::kAdpsgd, 6, 20), init, zeroDelta(1));
  h.setComputeSeconds(3, 2.5);  // a slow passive: no deadlock, others need not wait for it
  h.run();
  ASSERT_TRUE(h.fails.empty()) << h.fails[0].message();
  EXPECT_EQ(h.finished.size(), 6u);
  double sum = 0;
  for (auto& e : h.engines) sum += e->model()[0];
  EXPECT_NEAR(sum, 55.0, 1e-3);
  size_t requests = 0;
  for (const auto& m : h.sent) {
    if (m.kind == PeerMessageKind::kAverageRequest) {
      ++requests;
      EXPECT_TRUE(isActive(m.from));
      EXPECT_FALSE(isActive(m.to));
      // Ring of 6: an active's partners are its two (odd) neighbours.
      EXPECT_TRUE(m.to == (m.from + 1) % 6 || m.to == (m.from + 5) % 6);
    }
    if (m.kind == PeerMessageKind::kAverageReply) {
      EXPECT_FALSE(isActive(m.from));
    }
  }
  EXPECT_EQ(requests, 3u * 20);  // one per active iteration
  // The slow passive was averaged into while computing: its deltas are stale.
  uint32_t stale = 0;
  for (const auto& d : h.done[3]) stale = std::max(stale, d.staleness);
  EXPECT_GT(stale, 0u);
}

TEST(PeerEngineTest, AdpsgdNeighbourChoiceIsSeeded) {
  auto run = [](uint64_t seed) {
    PeerOptions o = options(Algorithm::kAdpsgd, 8, 10);
    o.seed = seed;
    PeerHarness h(o, same(8, {0}), zeroDelta(1));
    h.run();
    std::vector<uint32_t> partners;
    for (const auto& m : h.sent) {
      if (m.kind == PeerMessageKind::kAverageRequest) partners.push_back(m.to);
    }
    return partners;
  };
  EXPECT_EQ(run(1), run(1));
  EXPECT_NE(run(1), run(2));
}

TEST(PeerEngineTest, PragueGroupsAverageAndConserveTheSum) {
  PeerOptions o = options(Algorithm::kPrague, 8, 15);
  o.group_size = 4;
  o.group_buffer = 2;
  std::vector<std::vector<float>> init;
  for (uint32_t i = 0; i < 8; ++i) init.push_back({static_cast<float>(i), 1.0f});
  PeerHarness h(o, init, zeroDelta(2));
  h.setComputeSeconds(7, 5.0);
  h.run();
  ASSERT_TRUE(h.fails.empty()) << h.fails[0].message();
  EXPECT_EQ(h.finished.size(), 8u);
  double sum = 0;
  for (auto& e : h.engines) sum += e->model()[0];
  EXPECT_NEAR(sum, 28.0, 1e-3);
  for (auto& e : h.engines) EXPECT_NEAR(e->model()[1], 1.0, 1e-6);
  size_t grouped = 0;
  for (const auto& m : h.sent) {
    if (m.kind == PeerMessageKind::kGroupAssign && m.members.size() >= 2) ++grouped;
  }
  EXPECT_GT(grouped, 30u);
  // The fast peers were not held to the slow one's pace: they finished in far less time than
  // 15 of its 5-second iterations.
  EXPECT_LT(h.done[0].size(), 16u);
}

TEST(PeerEngineTest, HopBackupWorkersLetFastPeersGoAheadWithinTheBound) {
  // Ring of 4, one backup worker: each peer mixes the first of its two neighbours. Peer 2 is
  // 4x slower. The fast peers may not run more than `bound` iterations ahead of it, and it
  // skips iterations to catch up.
  PeerOptions o = options(Algorithm::kHop, 4, 20);
  o.hop_backup = 1;
  o.hop_bound = 2;
  PeerHarness h(o, same(4, {0}), constantDelta({1}));
  h.setComputeSeconds(2, 4.0);
  h.run();
  ASSERT_TRUE(h.fails.empty()) << h.fails[0].message();
  EXPECT_EQ(h.finished.size(), 4u);
  uint32_t skipped = 0;
  for (const auto& d : h.done[2]) skipped += d.skipped;
  EXPECT_GT(skipped, 0u);
  for (const auto& d : h.done[0]) EXPECT_FALSE(d.skipped);
  for (const auto& d : h.done[0]) EXPECT_EQ(d.exchanges, 1u);
  // The bound: no model message from a neighbour of peer 2 ever ran more than bound + 1
  // iterations ahead of peer 2's last model before it.
  int64_t newest2 = -1;
  for (const auto& m : h.sent) {
    if (m.kind != PeerMessageKind::kModel) continue;
    if (m.from == 2) newest2 = std::max<int64_t>(newest2, m.iteration);
    if (m.from == 1 || m.from == 3) {
      EXPECT_LE(static_cast<int64_t>(m.iteration), newest2 + 1 + 2 + 1) << m.from;
    }
  }
}

TEST(PeerEngineTest, LocalSgdTakesTheOuterNesterovStep) {
  // H = 3 local steps, deltas (i + 1) c: mean pseudo-gradient d = -2.5 c (2 peers: -1.5 c).
  PeerOptions o = options(Algorithm::kLocal, 2, 2);
  o.local_steps = 3;
  PeerHarness h(o, same(2, {0}), constantDelta({1}));
  h.run();
  ASSERT_TRUE(h.fails.empty());
  // d = -1.5. Step 1: v = -1.5, x = 0 - 0.7 (-1.5 - 1.35) = 1.995.
  // Step 2: v = -1.35 - 1.5 = -2.85, x = 1.995 - 0.7 (-1.5 - 2.565) = 4.8405.
  EXPECT_NEAR(h.engines[0]->model()[0], 4.8405, 1e-5);
  EXPECT_EQ(h.engines[1]->model(), h.engines[0]->model());
  // FedAvg's periodic averaging: lr 1, momentum 0 gives the average of the peers' models.
  o.outer_lr = 1;
  o.outer_momentum = 0;
  PeerHarness avg(o, same(2, {0}), constantDelta({1}));
  avg.run();
  EXPECT_NEAR(avg.engines[0]->model()[0], 3.0, 1e-6);  // 2 x 1.5
}

TEST(PeerEngineTest, DeadPeerEndsTheAlgorithmsThatNeedIt) {
  for (Algorithm a :
       {Algorithm::kAllReduce, Algorithm::kDpsgd, Algorithm::kLocal, Algorithm::kHop}) {
    PeerHarness h(options(a, 4, 50), same(4, {0}), zeroDelta(1));
    h.killAt(2, 3.5);
    h.run();
    ASSERT_FALSE(h.fails.empty()) << algorithmName(a);
    const std::string& msg = h.fails[0].message();
    EXPECT_NE(msg.find("peer 2 is down"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string(algorithmName(a)) + " cannot continue"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("adpsgd, prague and hop with hop_backup >= 1"), std::string::npos) << msg;
    EXPECT_TRUE(h.finished.empty()) << algorithmName(a);
  }
}

TEST(PeerEngineTest, DeadPeerIsToleratedByAdpsgdPragueAndHopWithBackups) {
  for (Algorithm a : {Algorithm::kAdpsgd, Algorithm::kPrague, Algorithm::kHop}) {
    PeerOptions o = options(a, 6, 30);
    o.hop_backup = 1;
    o.group_size = 3;
    PeerHarness h(o, same(6, {0}), constantDelta({1}));
    h.killAt(3, 4.5);
    h.run();
    EXPECT_TRUE(h.fails.empty()) << algorithmName(a) << ": " << h.fails[0].message();
    EXPECT_EQ(h.finished.size(), 5u) << algorithmName(a);
    for (uint32_t i = 0; i < 6; ++i) {
      if (i != 3) {
        EXPECT_EQ(h.engines[i]->iteration(), 30u) << algorithmName(a) << " " << i;
      }
    }
  }
}

TEST(PeerEngineTest, RefusesMessagesOutsideTheProtocol) {
  PeerEngine e(options(Algorithm::kDpsgd, 4, 5), 0, {0, 0});
  (void)e.start();
  PeerMessage m;
  m.kind = PeerMessageKind::kModel;
  m.from = 2;  // not a neighbour of 0 on a ring of 4
  m.to = 0;
  m.values = {1, 1};
  auto out = e.onMessage(m);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<Fail>(out[0]));
  EXPECT_NE(std::get<Fail>(out[0]).status.message().find("not a neighbour"), std::string::npos);
  EXPECT_TRUE(e.failed());
  EXPECT_TRUE(e.onMessage(m).empty());  // nothing after a failure

  PeerEngine f(options(Algorithm::kDpsgd, 4, 5), 0, {0, 0});
  (void)f.start();
  m.from = 1;
  m.values = {1, 1, 1};  // wrong size
  out = f.onMessage(m);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<Fail>(out[0]));
}

}  // namespace
}  // namespace fedfleet::peer
