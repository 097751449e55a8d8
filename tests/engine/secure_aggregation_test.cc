// The round engine under secure aggregation (engine/secure_aggregation.h), driven by clients
// that run the SecAgg+ client state machine themselves: the step is FedAvg's to within the
// quantisation; a client that never advertises is left out after the stage's timeout and the
// round completes without it, as does one that leaves after part of its upload was summed;
// clients lost during unmasking beyond the threshold fail the round, and the model is
// unchanged; under central DP the clients clip and the coordinator's noise on the unmasked sum
// has the promised scale; start-up refuses what cannot be summed under masks, saying which
// setting and why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "common/privacy/rdp_accountant.h"
#include "common/secagg/quantizer.h"
#include "common/secagg/secagg_client.h"
#include "engine/round_engine.h"
#include "tests/engine/round_engine_fixture.h"

namespace fedfleet::engine {
namespace {

using engine_test::actionsOf;
using engine_test::eventsOf;
using engine_test::Fixture;
using engine_test::hello;

EngineOptions secureOptions() {
  EngineOptions o = engine_test::baseOptions(4, 4, 2);
  o.rounds = 1;
  o.partition_sizes = {10, 20, 30, 40};
  o.norm_bound = 0;
  o.liveness_s = 100;  // the stages' timeouts are the subject here
  o.secagg.enabled = true;
  o.secagg.stage_timeout_s = 5;
  return o;
}

struct Peer {
  uint64_t token = 0;
  wire::Task task;
  std::unique_ptr<secagg::SecAggClient> sa;
};

// Drives one round of a model of `n` values: `silent` never advertise, `no_reveal` do not
// answer the unmasking, `cut_short` send the first value of their masked update and leave.
struct SecureRound {
  explicit SecureRound(EngineOptions o = secureOptions(), size_t n = 3)
      : f(o, std::vector<float>(n, 0.0f)), n(n) {}
  Fixture f;
  size_t n;
  std::set<std::string> cut_short;
  std::map<std::string, Peer> peers;
  std::map<std::string, std::vector<float>> deltas = {{"a", {0.5f, -1.0f, 2.0f}},
                                                      {"b", {1.5f, 0.0f, -0.5f}},
                                                      {"c", {-0.25f, 0.75f, 1.0f}},
                                                      {"d", {0.0f, 2.0f, 0.5f}}};
  std::map<std::string, uint64_t> samples = {{"a", 10}, {"b", 20}, {"c", 30}, {"d", 40}};
  std::map<std::string, uint64_t> local_steps = {{"a", 3}, {"b", 3}, {"c", 3}, {"d", 3}};
  // Under FedNova, each client's a(tau_k, rho), hand-computed by the test.
  std::map<std::string, double> normaliser;

  std::vector<SendSecAgg> steps() { return actionsOf<SendSecAgg>(f.take()); }

  void run(const std::set<std::string>& silent, const std::set<std::string>& no_reveal) {
    f.engine->start(0);
    for (const char* id : {"a", "b", "c", "d"}) {
      f.engine->onHello(id, hello(id, static_cast<int32_t>(id[0] - 'a')), 0);
    }
    for (const auto& st : actionsOf<SendTask>(f.take())) {
      ASSERT_TRUE(st.task.secagg.on());
      Peer& p = peers[st.client];
      p.token = st.task.task_token;
      p.task = st.task;
      secagg::RoundParams rp;
      rp.round = st.task.round;
      rp.clients = st.task.secagg.clients;
      rp.neighbours = st.task.secagg.neighbours;
      rp.threshold = st.task.secagg.threshold;
      rp.length = n;
      rp.graph_seed = st.task.secagg.graph_seed;
      p.sa = std::make_unique<secagg::SecAggClient>(
          rp, st.task.secagg.index, crypto::streamKeyFromSeed("engine secagg test", p.token),
          crypto::streamKeyFromSeed("engine secagg test noise", p.token));
    }
    ASSERT_EQ(peers.size(), 4u);
    for (auto& [id, p] : peers) {
      if (silent.count(id)) continue;
      wire::SecAgg m{p.token, wire::SecAggStep::kAdvert, {p.sa->advertise()}, {}, {}, {}};
      f.engine->onSecAgg(id, m, 100, 1);
    }
    std::vector<SendSecAgg> keys = steps();
    double t = 2;  // each stage's messages a second after the last
    if (!silent.empty()) {
      EXPECT_TRUE(keys.empty()) << "the stage waits for the silent client";
      f.engine->onTick(6);  // past its timeout
      keys = steps();
      t = 7;
    }
    ASSERT_EQ(keys.size(), 4 - silent.size());
    for (const auto& k : keys) {
      ASSERT_EQ(k.message.step, wire::SecAggStep::kKeys);
      Peer& p = peers[k.client];
      auto shares = p.sa->shareKeys(k.message.adverts);
      ASSERT_TRUE(shares.isOk()) << shares.status().toString();
      wire::SecAgg m{p.token, wire::SecAggStep::kShares, {}, *shares, {}, {}};
      f.engine->onSecAgg(k.client, m, 100, t);
    }
    for (const auto& fw : steps()) {
      ASSERT_EQ(fw.message.step, wire::SecAggStep::kForwarded);
      Peer& p = peers[fw.client];
      Status received = p.sa->receiveShares(fw.message.shares);
      ASSERT_TRUE(received.isOk()) << received.toString();
      // Weighted (under DP: clipped to the task's clip at weight 1, and no noise unless the
      // task asks for it), quantised and masked, as client/masked_upload.cc does.
      const auto& sat = p.task.secagg;
      const std::vector<float>& delta = deltas.at(fw.client);
      ASSERT_EQ(delta.size(), n);
      double w = std::min(1.0, samples[fw.client] / sat.weight_scale);
      if (sat.fednova) w /= normaliser.at(fw.client);
      if (sat.dp_clip > 0) {
        double sq = 0;
        for (float v : delta) sq += static_cast<double>(v) * v;
        w = std::min(1.0, sat.dp_clip / std::sqrt(sq));
      }
      ASSERT_EQ(sat.dp_noise_stddev, 0.0) << "this test's clients add no noise";
      std::vector<float> weighted;
      for (float v : delta) weighted.push_back(static_cast<float>(w * v));
      std::vector<uint32_t> q(n);
      crypto::KeyedStream rounding(crypto::streamKeyFromSeed("rounding", p.token), 0, 0);
      secagg::quantize({sat.clip_range, sat.quant_range}, weighted.data(), n, rounding, q.data());
      p.sa->mask(0, q.data(), n);
      wire::Chunk c;
      c.task_token = p.token;
      c.elements = cut_short.count(fw.client) ? 1 : n;
      c.payload.resize(c.elements * 4);
      std::memcpy(c.payload.data(), q.data(), c.payload.size());
      c.last = c.elements == n;
      c.n_samples = samples[fw.client];
      c.steps = local_steps[fw.client];
      f.engine->onChunk(fw.client, c, 100, t + 1);
      if (!c.last) {  // its first value is in the masked sum now
        f.engine->onBye(fw.client, t + 1);
        continue;
      }
      wire::Summary s;
      s.task_token = p.token;
      s.n_samples = samples[fw.client];
      s.steps = local_steps[fw.client];
      s.mean_loss = 1;
      f.engine->onSummary(fw.client, s, 50, t + 1);
    }
    for (const auto& un : steps()) {
      ASSERT_EQ(un.message.step, wire::SecAggStep::kUnmask);
      if (no_reveal.count(un.client)) continue;
      Peer& p = peers[un.client];
      auto revealed = p.sa->unmask(un.message.request);
      ASSERT_TRUE(revealed.isOk()) << revealed.status().toString();
      wire::SecAgg m{p.token, wire::SecAggStep::kReveal, {}, {}, {}, *revealed};
      f.engine->onSecAgg(un.client, m, 100, t + 2);
    }
    if (!no_reveal.empty()) f.engine->onTick(t + 1 + 6);  // past the unmasking timeout
    f.take();
  }

  // Round 1's commit (round 0 is the initial model's).
  CommitRound commit() const {
    for (const auto& c : actionsOf<CommitRound>(f.log)) {
      if (c.round.round == 1) return c;
    }
    ADD_FAILURE() << "round 1 was not committed";
    return CommitRound{};
  }
};

TEST(SecureAggregation, TheStepIsFedAvgsToWithinTheQuantisation) {
  SecureRound r;
  r.run({}, {});
  const CommitRound c = r.commit();
  EXPECT_EQ(c.round.status, "ok");
  EXPECT_EQ(c.round.completed, 4u);
  // x = 0 + sum_k n_k D_k / sum_k n_k, n = 10, 20, 30, 40.
  const std::vector<float>& x = r.f.engine->params();
  const std::vector<double> want = {(10 * 0.5 + 20 * 1.5 + 30 * -0.25 + 40 * 0.0) / 100,
                                    (10 * -1.0 + 20 * 0.0 + 30 * 0.75 + 40 * 2.0) / 100,
                                    (10 * 2.0 + 20 * -0.5 + 30 * 1.0 + 40 * 0.5) / 100};
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(x[i], want[i], 1e-5) << i;
  for (const auto& u : c.updates) EXPECT_EQ(u.codec, "secagg");
}

// FedNova (Wang et al., NeurIPS 2020) under masks: the task tells each client its momentum,
// the client divides its weight by a(tau_k, rho), the engine adds n_k and a_k to FedNova's
// totals from the declared steps. With rho = 0.5 and steps 2, 3, 2, 3 the normalisers are
// a(2) = 1 + 1.5 = 2.5 and a(3) = 2.5 + 1.75 = 4.25; tau_eff = sum n_k a_k / N = 355 / 100, and
// x = tau_eff / N * sum_k n_k D_k / a_k (server learning rate 1).
TEST(SecureAggregation, FedNovaWeightsAreAppliedByTheClientsAndCountedByTheEngine) {
  EngineOptions o = secureOptions();
  o.aggregator = AggregatorKind::kFedNova;
  o.hparams.momentum = 0.5f;
  ASSERT_TRUE(checkEngineOptions(o).isOk()) << checkEngineOptions(o).toString();
  SecureRound r(o);
  r.local_steps = {{"a", 2}, {"b", 3}, {"c", 2}, {"d", 3}};
  r.normaliser = {{"a", 2.5}, {"b", 4.25}, {"c", 2.5}, {"d", 4.25}};
  r.run({}, {});
  for (const auto& [id, p] : r.peers) {
    EXPECT_TRUE(p.task.secagg.fednova) << id;
    EXPECT_EQ(p.task.secagg.fednova_momentum, 0.5) << id;
  }
  const CommitRound c = r.commit();
  EXPECT_EQ(c.round.status, "ok");
  EXPECT_EQ(c.round.completed, 4u);
  const double tau_eff = (10 * 2.5 + 20 * 4.25 + 30 * 2.5 + 40 * 4.25) / 100;
  ASSERT_DOUBLE_EQ(tau_eff, 3.55);
  const std::vector<double> want = {
      tau_eff / 100 * (10 * 0.5 / 2.5 + 20 * 1.5 / 4.25 + 30 * -0.25 / 2.5 + 40 * 0.0 / 4.25),
      tau_eff / 100 * (10 * -1.0 / 2.5 + 20 * 0.0 / 4.25 + 30 * 0.75 / 2.5 + 40 * 2.0 / 4.25),
      tau_eff / 100 * (10 * 2.0 / 2.5 + 20 * -0.5 / 4.25 + 30 * 1.0 / 2.5 + 40 * 0.5 / 4.25)};
  const std::vector<float>& x = r.f.engine->params();
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(x[i], want[i], 1e-5) << i;
  // FedAvg's step differs from it by far more than the tolerance: the weights were applied.
  EXPECT_GT(std::fabs(x[1] - 0.925), 0.05);
}

TEST(SecureAggregation, AClientThatNeverAdvertisesIsLeftOutAndTheRestSum) {
  SecureRound r;
  r.run({"b"}, {});
  const CommitRound c = r.commit();
  EXPECT_EQ(c.round.status, "ok");
  EXPECT_EQ(c.round.completed, 3u);
  EXPECT_EQ(c.round.rejected, 1u);
  const std::vector<float>& x = r.f.engine->params();
  const std::vector<double> want = {(10 * 0.5 + 30 * -0.25) / 80, (10 * -1.0 + 30 * 0.75 + 80) / 80,
                                    (20 + 30 * 1.0 + 20) / 80.0};
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(x[i], want[i], 1e-5) << i;
}

// b sends the first value of its masked update, which goes into the masked sum, and leaves: the
// server takes it back out when the uploads end, and the round is FedAvg's of a, c and d (as
// when b never advertised).
TEST(SecureAggregation, AnUploadCutShortIsTakenBackOutOfTheSum) {
  SecureRound r;
  r.cut_short = {"b"};
  r.run({}, {});
  const CommitRound c = r.commit();
  EXPECT_EQ(c.round.status, "ok");
  EXPECT_EQ(c.round.completed, 3u);
  EXPECT_EQ(c.round.dropped + c.round.rejected, 1u);
  const std::vector<float>& x = r.f.engine->params();
  const std::vector<double> want = {(10 * 0.5 + 30 * -0.25) / 80, (10 * -1.0 + 30 * 0.75 + 80) / 80,
                                    (20 + 30 * 1.0 + 20) / 80.0};
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(x[i], want[i], 1e-5) << i;
}

// Central DP (DP-FedAvg) under secure aggregation, clip C = 1 and negligible noise: every task
// tells its client to clip to C at weight 1 and to add no noise; a's update of norm 5 enters the
// masked sum clipped to norm 1, c's of norm 2 too, b's (norm 0.5) as it is; the step divides by
// K = 4 (d contributes zeros), not by the samples.
EngineOptions centralDpOptions(double z) {
  EngineOptions o = secureOptions();
  o.dp.central = true;
  o.dp.noise_multiplier = z;
  o.dp.clip_norm = 1;
  o.dp.noise_key = crypto::streamKeyFromSeed("fedfleet dp noise", 5);
  return o;
}

TEST(SecureAggregation, CentralDpClientsClipBeforeMaskingAndTheSumIsAveragedOverK) {
  const EngineOptions o = centralDpOptions(1e-6);
  ASSERT_TRUE(checkEngineOptions(o).isOk()) << checkEngineOptions(o).toString();
  SecureRound r(o);
  r.deltas = {{"a", {3, 4, 0}}, {"b", {0.3f, 0.4f, 0}}, {"c", {0, 0, 2}}, {"d", {0, 0, 0}}};
  r.run({}, {});
  for (const auto& [id, p] : r.peers) {
    EXPECT_EQ(p.task.secagg.dp_clip, 1.0) << id;
    EXPECT_EQ(p.task.secagg.dp_noise_stddev, 0.0) << id;  // the coordinator adds the noise
    EXPECT_EQ(p.task.secagg.weight_scale, 1.0) << id;
  }
  const CommitRound c = r.commit();
  EXPECT_EQ(c.round.status, "ok");
  EXPECT_EQ(c.round.completed, 4u);
  // ((0.6, 0.8, 0) + (0.3, 0.4, 0) + (0, 0, 1) + 0) / 4. Unclipped, FedAvg by samples would be
  // (0.09, 0.12, 0.6).
  const std::vector<float>& x = r.f.engine->params();
  const std::vector<double> want = {0.9 / 4, 1.2 / 4, 1.0 / 4};
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(x[i], want[i], 1e-5) << i;
  ASSERT_TRUE(c.round.dp_clip.has_value());
  EXPECT_EQ(*c.round.dp_clip, 1.0);
  for (const auto& u : c.updates) EXPECT_DOUBLE_EQ(u.weight, 0.25) << u.client_id;
}

// Every client uploads zeros: the step is the coordinator's noise over K alone, N(0, (z C / K)^2)
// in every coordinate, z = 3, C = 1, K = 4: 0.75, checked to five standard errors (3.5%) over
// 20,000 values. The round spends what central DP's does: q = K / N = 1, z = 3, one step.
TEST(SecureAggregation, CentralDpNoiseOnTheUnmaskedSumHasStandardDeviationZTimesClipOverK) {
  constexpr size_t kP = 20000;
  SecureRound r(centralDpOptions(3.0), kP);
  for (auto& [id, delta] : r.deltas) delta.assign(kP, 0.0f);
  r.run({}, {});
  const CommitRound c = r.commit();
  ASSERT_EQ(c.round.status, "ok");
  EXPECT_EQ(c.round.completed, 4u);
  double sum = 0, sq = 0;
  for (float v : r.f.engine->params()) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double mean = sum / kP;
  const double sd = std::sqrt(sq / kP - mean * mean);
  EXPECT_NEAR(mean, 0, 5 * 0.75 / std::sqrt(kP));
  EXPECT_NEAR(sd, 0.75, 0.75 * 5 / std::sqrt(2.0 * kP));
  ASSERT_TRUE(c.round.dp_epsilon.has_value());
  EXPECT_DOUBLE_EQ(*c.round.dp_epsilon, privacy::epsilonOf(1.0, 3.0, 1, 1e-5)->epsilon);
}

TEST(SecureAggregation, TooFewSharesAtUnmaskingFailTheRoundAndKeepTheModel) {
  SecureRound r;
  // Complete graph of 4 (k = 3, t = 3): with two silent at unmasking, each survivor's seed has
  // its own share and one neighbour's, fewer than 3.
  r.run({}, {"c", "d"});
  const CommitRound c = r.commit();
  EXPECT_EQ(c.round.status, "failed");
  EXPECT_EQ(eventsOf(r.f.log, "secagg_failed"), 1);
  for (float v : r.f.engine->params()) EXPECT_EQ(v, 0.0f);
}

TEST(SecureAggregation, StartUpRefusesWhatCannotBeSummedUnderMasks) {
  EngineOptions o = secureOptions();
  EXPECT_TRUE(checkEngineOptions(o).isOk());
  o.aggregator = AggregatorKind::kMedian;
  EXPECT_NE(checkEngineOptions(o).message().find("not median"), std::string::npos);
  o = secureOptions();
  o.codec = "topk:0.01";
  EXPECT_NE(checkEngineOptions(o).message().find("codec"), std::string::npos);
  o = secureOptions();
  o.aggregator = AggregatorKind::kTrimmedMean;
  const std::string trimmed = checkEngineOptions(o).message();
  EXPECT_NE(trimmed.find("not trimmed_mean"), std::string::npos) << trimmed;
  EXPECT_NE(trimmed.find("need every update in the clear"), std::string::npos) << trimmed;
  o = secureOptions();
  o.aggregator = AggregatorKind::kScaffold;
  const std::string scaffold = checkEngineOptions(o).message();
  EXPECT_NE(scaffold.find("not scaffold"), std::string::npos) << scaffold;
  EXPECT_NE(scaffold.find("SCAFFOLD's control variates are not in the masked sum"),
            std::string::npos)
      << scaffold;
  o = secureOptions();
  o.async = true;
  EXPECT_NE(checkEngineOptions(o).message().find("synchronous"), std::string::npos);
  o = secureOptions();
  o.min_clients = 1;  // a round of one would show its update
  EXPECT_NE(checkEngineOptions(o).message().find("min_clients"), std::string::npos);
  o = secureOptions();
  o.secagg.threshold = 1;  // at most half the holders
  EXPECT_NE(checkEngineOptions(o).message().find("threshold"), std::string::npos);
  // Central DP runs under masks (the clients clip), with a fixed clip only: adaptive clipping
  // needs the count of updates within the clip, and no update's norm is seen.
  o = centralDpOptions(1.0);
  EXPECT_TRUE(checkEngineOptions(o).isOk()) << checkEngineOptions(o).toString();
  o.dp.adaptive_clip = true;
  o.dp.count_stddev = 1;
  const std::string adaptive = checkEngineOptions(o).message();
  EXPECT_NE(adaptive.find("dp.adaptive_clip"), std::string::npos) << adaptive;
  EXPECT_NE(adaptive.find("under secure aggregation"), std::string::npos) << adaptive;
  o.secagg.enabled = false;  // in the clear the coordinator counts the norms itself
  EXPECT_TRUE(checkEngineOptions(o).isOk()) << checkEngineOptions(o).toString();
}

}  // namespace
}  // namespace fedfleet::engine
