#include "sim/peer_simulator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace fedfleet::sim {
namespace {

// 8 peers on 2000 Fashion-MNIST samples (the MLP), 1000 test samples; history in memory.
config::Config smallPeers(const std::string& algorithm, uint32_t workers) {
  config::Config c;
  c.run.seed = 5;
  c.policy.mode = "decentralized";
  c.model.name = "mlp";
  c.data.train_subset = 2000;
  c.data.test_subset = 1000;
  c.train.batch = 16;
  c.train.lr = 0.05;
  c.sim.workers = workers;
  c.sim.progress = "off";
  c.sim.slow_fraction = 0.25;
  c.sim.slow_factor = 5;
  c.decentralized.algorithm = algorithm;
  c.decentralized.peers = 8;
  c.decentralized.iterations = 12;
  c.decentralized.eval_every_s = 0.5;
  c.decentralized.mbps = 100;
  c.decentralized.latency_ms = 5;
  c.history.db = ":memory:";
  return c;
}

struct SimRun {
  PeerSimSummary summary;
  std::vector<history::PeerIterationRecord> iterations;
  std::vector<history::PeerEvalRecord> evals;
};

SimRun simulate(const config::Config& c) {
  auto sim = PeerSimulator::create(c);
  EXPECT_TRUE(sim.isOk()) << sim.status().toString();
  if (!sim.isOk()) return {};
  auto summary = (*sim)->run();
  EXPECT_TRUE(summary.isOk()) << summary.status().toString();
  if (!summary.isOk()) return {};
  SimRun r;
  r.summary = *summary;
  r.iterations = (*sim)->history().peerIterations((*sim)->runId()).value();
  r.evals = (*sim)->history().peerEvals((*sim)->runId()).value();
  return r;
}

TEST(PeerSimulatorTest, SameSeedSameHistoryAtOneAndTwoWorkers) {
  for (const std::string algorithm : {"allreduce", "prague", "adpsgd"}) {
    SimRun one = simulate(smallPeers(algorithm, 1));
    SimRun two = simulate(smallPeers(algorithm, 2));
    ASSERT_FALSE(one.evals.empty()) << algorithm;
    ASSERT_EQ(one.iterations.size(), two.iterations.size()) << algorithm;
    for (size_t i = 0; i < one.iterations.size(); ++i) {
      const auto &a = one.iterations[i], &b = two.iterations[i];
      EXPECT_EQ(a.peer, b.peer);
      EXPECT_EQ(a.iteration, b.iteration);
      EXPECT_EQ(a.t_end, b.t_end);
      EXPECT_EQ(a.bytes_sent, b.bytes_sent);
      EXPECT_EQ(a.exchanges, b.exchanges);
    }
    ASSERT_EQ(one.evals.size(), two.evals.size()) << algorithm;
    for (size_t i = 0; i < one.evals.size(); ++i) {
      EXPECT_EQ(one.evals[i].time_s, two.evals[i].time_s);
      EXPECT_EQ(one.evals[i].accuracy, two.evals[i].accuracy) << algorithm << " eval " << i;
      EXPECT_EQ(one.evals[i].loss, two.evals[i].loss);
    }
    EXPECT_EQ(one.summary.virtual_seconds, two.summary.virtual_seconds);
  }
}

TEST(PeerSimulatorTest, TrainsAndRecordsEveryIteration) {
  SimRun r = simulate(smallPeers("allreduce", 2));
  // 8 peers x 12 iterations, each an all-reduce of 2 (P - 1) chunks.
  ASSERT_EQ(r.iterations.size(), 96u);
  for (const auto& it : r.iterations) {
    EXPECT_EQ(it.exchanges, 14u);
    EXPECT_GE(it.t_end, it.t_start);
    EXPECT_GT(it.compute_s, 0);
    EXPECT_GT(it.bytes_sent, 0u);
  }
  // Peers 6 and 7 compute 5x slower (sim.slow_factor): exactly 5x the seconds of a uniform
  // fleet's speed-1 peer. The all-reduce makes the fast peers wait for them: each fast
  // iteration waits at least the difference.
  std::map<uint32_t, double> compute, wait;
  for (const auto& it : r.iterations) {
    compute[it.peer] += it.compute_s;
    wait[it.peer] += it.wait_s;
  }
  EXPECT_NEAR(compute[7], 5 * compute[0], 1e-9 * compute[7]);
  EXPECT_NEAR(compute[6], compute[7], 1e-9 * compute[7]);
  EXPECT_GT(wait[0], wait[7] + 0.9 * (compute[7] - compute[0]));
  ASSERT_TRUE(r.summary.final_accuracy.has_value());
  // 12 steps of SGD on the MLP: clearly better than chance (0.1).
  EXPECT_GT(*r.summary.final_accuracy, 0.3);
  EXPECT_EQ(r.evals.back().iterations, 96u);
}

TEST(PeerSimulatorTest, TransientSlowdownsStretchComputes) {
  // Every compute starts a slowdown (probability 1) of factor 3 that outlasts the run: each
  // iteration computes exactly 3x as long as without.
  config::Config c = smallPeers("allreduce", 1);
  c.decentralized.iterations = 3;
  c.sim.slow_fraction = 0;
  SimRun plain = simulate(c);
  c.sim.slowdown_probability = 1;
  c.sim.slowdown_factor = 3;
  c.sim.slowdown_s = 1e6;
  SimRun slowed = simulate(c);
  ASSERT_EQ(plain.iterations.size(), slowed.iterations.size());
  for (size_t i = 0; i < plain.iterations.size(); ++i) {
    EXPECT_NEAR(slowed.iterations[i].compute_s, 3 * plain.iterations[i].compute_s,
                1e-12 + 1e-9 * plain.iterations[i].compute_s);
  }
  EXPECT_GT(slowed.summary.virtual_seconds, plain.summary.virtual_seconds);
}

TEST(PeerSimulatorTest, PragueOutpacesAllReduceWithSlowPeers) {
  config::Config c = smallPeers("prague", 2);
  c.decentralized.group_size = 3;
  SimRun prague = simulate(c);
  SimRun allreduce = simulate(smallPeers("allreduce", 2));
  // The same 12 iterations a peer: Prague's fast peers do not wait for the slow ones.
  ASSERT_GT(prague.summary.virtual_seconds, 0);
  EXPECT_LT(prague.summary.virtual_seconds, 0.6 * allreduce.summary.virtual_seconds);
}

TEST(PeerSimulatorTest, ConfigErrorsNameTheKey) {
  config::Config c = smallPeers("hop", 1);
  c.decentralized.hop_backup = 2;  // a ring gives two neighbours
  auto sim = PeerSimulator::create(c);
  ASSERT_FALSE(sim.isOk());
  EXPECT_NE(sim.status().message().find("hop_backup"), std::string::npos) << sim.status().message();
  c = smallPeers("gossip", 1);
  sim = PeerSimulator::create(c);
  ASSERT_FALSE(sim.isOk());
  EXPECT_NE(sim.status().message().find("decentralized.algorithm"), std::string::npos);
}

}  // namespace
}  // namespace fedfleet::sim
