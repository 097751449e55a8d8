#include "sim/peer_simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

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
  std::vector<history::EventRecord> events;
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
  r.events = (*sim)->history().events((*sim)->runId()).value();
  return r;
}

// The two runs' iteration rows, evaluations and virtual end agree exactly.
void expectSameRun(const SimRun& one, const SimRun& two, const std::string& algorithm) {
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
    EXPECT_EQ(one.evals[i].peers_averaged, two.evals[i].peers_averaged);
    EXPECT_EQ(one.evals[i].accuracy, two.evals[i].accuracy) << algorithm << " eval " << i;
    EXPECT_EQ(one.evals[i].loss, two.evals[i].loss);
  }
  EXPECT_EQ(one.summary.virtual_seconds, two.summary.virtual_seconds);
}

TEST(PeerSimulatorTest, SameSeedSameHistoryAtOneAndTwoWorkers) {
  for (const std::string algorithm : {"allreduce", "prague", "adpsgd"}) {
    SimRun one = simulate(smallPeers(algorithm, 1));
    SimRun two = simulate(smallPeers(algorithm, 2));
    ASSERT_FALSE(one.evals.empty()) << algorithm;
    expectSameRun(one, two, algorithm);
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

// ---- peers that leave -------------------------------------------------------------------------

// 4 peers (peer 3 computes 5x slower) and 10 iterations each: a run of about a second.
config::Config fewPeers(const std::string& algorithm, uint32_t workers) {
  config::Config c = smallPeers(algorithm, workers);
  c.decentralized.peers = 4;
  c.decentralized.iterations = 10;
  c.decentralized.group_size = 2;
  c.decentralized.degree = 2;  // the default 4 needs more peers (unused on a ring)
  return c;
}

struct FailedRun {
  Status status;
  std::vector<history::PeerIterationRecord> iterations;
  std::vector<history::EventRecord> events;
};

// A run that is expected to fail: its error and what its history kept.
FailedRun simulateFailing(const config::Config& c) {
  auto sim = PeerSimulator::create(c);
  EXPECT_TRUE(sim.isOk()) << sim.status().toString();
  if (!sim.isOk()) return {};
  auto summary = (*sim)->run();
  EXPECT_FALSE(summary.isOk());
  FailedRun r;
  r.status = summary.status();
  r.iterations = (*sim)->history().peerIterations((*sim)->runId()).value();
  r.events = (*sim)->history().events((*sim)->runId()).value();
  return r;
}

// Peer `peer`'s rows of a history.
std::vector<history::PeerIterationRecord> rowsOf(const SimRun& r, uint32_t peer) {
  std::vector<history::PeerIterationRecord> out;
  for (const auto& it : r.iterations) {
    if (it.peer == peer) out.push_back(it);
  }
  return out;
}

// Peer 1 (a fast one) leaves halfway between the ends of its 5th and 6th iterations of the same run
// without failures (until it leaves, the two runs are the same events in the same order). The
// others reach all their iterations; its rows are the first 5 of the undisturbed run's; evaluations
// from its leaving on average 3 models; the events say when it left and when it was declared
// down (coordinator.liveness_s later).
class PeerLeavesTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PeerLeavesTest, SurvivorsFinishAndTheLeaverStops) {
  const std::string algorithm = GetParam();
  config::Config c = fewPeers(algorithm, 2);
  const SimRun whole = simulate(c);
  const auto leaver = rowsOf(whole, 1);
  ASSERT_EQ(leaver.size(), 10u) << algorithm;
  const double t_fail = (leaver[4].t_end + leaver[5].t_end) / 2;
  ASSERT_LT(leaver[4].t_end, leaver[5].t_end);

  std::ostringstream fail_at;
  fail_at.precision(17);
  fail_at << "1:" << t_fail;
  c.sim.peer_fail_at = fail_at.str();
  // Declared down while the other fast peers still train (they finish near 2 t_fail).
  c.coordinator.liveness_s = 0.5 * t_fail;
  // Evaluations change no model: more of them leave the training as it was.
  c.decentralized.eval_every_s = 0.4 * t_fail;
  auto sim = PeerSimulator::create(c);
  ASSERT_TRUE(sim.isOk()) << sim.status().toString();
  auto summary = (*sim)->run();
  ASSERT_TRUE(summary.isOk()) << algorithm << ": " << summary.status().toString();
  const int64_t run = (*sim)->runId();
  SimRun cut;
  cut.iterations = (*sim)->history().peerIterations(run).value();
  cut.evals = (*sim)->history().peerEvals(run).value();
  EXPECT_EQ(summary->peers_left, 1u);

  for (uint32_t p : {0u, 2u, 3u}) {
    const auto rows = rowsOf(cut, p);
    ASSERT_EQ(rows.size(), 10u) << algorithm << " peer " << p;
    EXPECT_EQ(rows.back().iteration, 9u);
  }
  const auto stopped = rowsOf(cut, 1);
  ASSERT_EQ(stopped.size(), 5u) << algorithm;
  for (size_t i = 0; i < stopped.size(); ++i) {
    EXPECT_EQ(stopped[i].iteration, leaver[i].iteration);
    EXPECT_EQ(stopped[i].t_end, leaver[i].t_end);
    EXPECT_EQ(stopped[i].bytes_sent, leaver[i].bytes_sent);
    EXPECT_LT(stopped[i].t_end, t_fail);
  }
  ASSERT_FALSE(cut.evals.empty());
  bool before = false, after = false;
  for (const auto& e : cut.evals) {
    EXPECT_EQ(e.peers_averaged, e.time_s < t_fail ? 4u : 3u) << algorithm << " at " << e.time_s;
    (e.time_s < t_fail ? before : after) = true;
  }
  EXPECT_TRUE(before && after) << algorithm << ": " << cut.evals.size() << " evaluations, t_fail "
                               << t_fail << " of " << whole.summary.virtual_seconds << " s";
  EXPECT_EQ(cut.evals.back().peers_averaged, 3u);

  const auto events = (*sim)->history().events(run).value();
  ASSERT_EQ(events.size(), 2u) << algorithm;
  EXPECT_EQ(events[0].kind, "peer_left");
  EXPECT_EQ(events[0].client_id, "peer-1");
  EXPECT_EQ(events[0].time, t_fail);
  EXPECT_EQ(events[1].kind, "peer_down");
  EXPECT_EQ(events[1].client_id, "peer-1");
  EXPECT_EQ(events[1].time, t_fail + c.coordinator.liveness_s);
  // The survivors carried on after they learned it: some iteration ends after that.
  double last = 0;
  for (const auto& it : cut.iterations) last = std::max(last, it.t_end);
  EXPECT_GT(last, events[1].time) << algorithm;
}

INSTANTIATE_TEST_SUITE_P(Tolerant, PeerLeavesTest, ::testing::Values("adpsgd", "prague"));

// All-reduce needs every peer: once peer 2 is declared down the run fails, naming it and the
// algorithms that would have carried on; the iterations done before stay in the history.
TEST(PeerSimulatorTest, AllReduceFailsNamingTheLeaver) {
  config::Config c = fewPeers("allreduce", 1);
  const SimRun whole = simulate(c);
  const auto peer2 = rowsOf(whole, 2);
  ASSERT_EQ(peer2.size(), 10u);
  const double t_fail = (peer2[2].t_end + peer2[3].t_end) / 2;
  std::ostringstream fail_at;
  fail_at.precision(17);
  fail_at << "2:" << t_fail;
  c.sim.peer_fail_at = fail_at.str();
  c.coordinator.liveness_s = 0.5;
  const FailedRun r = simulateFailing(c);
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.toString();
  const std::string& m = r.status.message();
  EXPECT_NE(m.find("peer 2 is down"), std::string::npos) << m;
  EXPECT_NE(m.find("allreduce cannot continue"), std::string::npos) << m;
  EXPECT_NE(m.find("adpsgd, prague"), std::string::npos) << m;
  // Every peer finished iterations 0-2 (the all-reduce keeps them in step) and none more: the
  // others wait for peer 2's chunks until it is declared down.
  ASSERT_EQ(r.iterations.size(), 12u);
  for (const auto& it : r.iterations) EXPECT_LE(it.iteration, 2u);
  ASSERT_EQ(r.events.size(), 3u);
  EXPECT_EQ(r.events[0].kind, "peer_left");
  EXPECT_EQ(r.events[1].kind, "peer_down");
  EXPECT_EQ(r.events[1].time, t_fail + 0.5);
  EXPECT_EQ(r.events[2].kind, "peer_failed");
  EXPECT_EQ(r.events[2].client_id, "peer-0");  // the first live peer told
  EXPECT_NE(r.events[2].detail.find("peer 2 is down"), std::string::npos);
}

// sim.peer_failures draws its leavers and their times from run.seed: the same at 1 and 2
// workers, two distinct peers, both mid-run.
TEST(PeerSimulatorTest, DrawnFailuresSameHistoryAtOneAndTwoWorkers) {
  for (const std::string algorithm : {"prague", "adpsgd"}) {
    config::Config c1 = smallPeers(algorithm, 1), c2 = smallPeers(algorithm, 2);
    c1.sim.peer_failures = c2.sim.peer_failures = 2;
    c1.coordinator.liveness_s = c2.coordinator.liveness_s = 0.2;
    SimRun one = simulate(c1), two = simulate(c2);
    const auto &ev1 = one.events, &ev2 = two.events;
    ASSERT_FALSE(one.evals.empty()) << algorithm;
    EXPECT_EQ(one.summary.peers_left, 2u);
    ASSERT_EQ(ev1.size(), 4u) << algorithm;  // two peer_left, two peer_down
    std::set<std::string> left;
    for (const auto& e : ev1) {
      if (e.kind == "peer_left") {
        left.insert(e.client_id);
        EXPECT_LT(e.time, one.summary.virtual_seconds);
      }
    }
    EXPECT_EQ(left.size(), 2u);
    ASSERT_EQ(ev1.size(), ev2.size());
    for (size_t i = 0; i < ev1.size(); ++i) {
      EXPECT_EQ(ev1[i].kind, ev2[i].kind);
      EXPECT_EQ(ev1[i].client_id, ev2[i].client_id);
      EXPECT_EQ(ev1[i].time, ev2[i].time);
    }
    EXPECT_LT(one.iterations.size(), 96u);  // the leavers did not finish
    expectSameRun(one, two, algorithm);
    EXPECT_EQ(one.evals.back().peers_averaged, 6u);
  }
}

TEST(PeerSimulatorTest, FailureKeysAreChecked) {
  for (const std::string bad : {"8:1", "1:-2", "1", "x:3", "1:2,1:3", "1:2s", "0:1,1:1,2:1,3:1"}) {
    config::Config c = fewPeers("adpsgd", 1);
    c.sim.peer_fail_at = bad;
    auto sim = PeerSimulator::create(c);
    ASSERT_FALSE(sim.isOk()) << bad;
    EXPECT_EQ(sim.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(sim.status().message().find("sim.peer_fail_at"), std::string::npos)
        << sim.status().message();
  }
  config::Config c = fewPeers("adpsgd", 1);
  c.sim.peer_failures = 4;  // of 4 peers
  auto sim = PeerSimulator::create(c);
  ASSERT_FALSE(sim.isOk());
  EXPECT_NE(sim.status().message().find("sim.peer_failures"), std::string::npos);
}

}  // namespace
}  // namespace fedfleet::sim
