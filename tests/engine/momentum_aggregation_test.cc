// The server side of the algorithms when clients train with momentum, through the round engine
// and against values worked out by hand: FedNova's normaliser uses the clients' momentum rho
// (train.momentum, sent in every task), and FedAvgM and FedAdam step on the round's
// pseudo-gradient whatever the clients' optimiser was.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/round_engine.h"
#include "tests/engine/round_engine_fixture.h"

namespace fedfleet::engine {
namespace {

using namespace engine_test;

// FedNova with rho = 0.5: n = (1, 3), tau = (1, 3), D_a = (1, 2, 3), D_b = (3, 0, -6).
// a = (1, (3 - 0.5 (1 - 0.125) / 0.5) / 0.5) = (1, 4.25); p = (0.25, 0.75);
// sum p D / a = (0.25 + 0.75 x 3 / 4.25, 0.5, 0.75 - 0.75 x 6 / 4.25);
// tau_eff = 0.25 x 1 + 0.75 x 4.25 = 3.4375; x = 3.4375 x that from x = 0.
TEST(MomentumAggregation, FedNovaNormalisesByTheClientsMomentum) {
  EngineOptions o = baseOptions(2, 2, 2);
  o.aggregator = AggregatorKind::kFedNova;
  o.hparams.momentum = 0.5f;
  Fixture f(o, {0, 0, 0});
  const CommitRound c = oneRound(f, {"a", "b"}, {{"a", {1, 2, 3}, 1, 1}, {"b", {3, 0, -6}, 3, 3}});
  EXPECT_EQ(c.round.status, "ok");
  const double tau_eff = 3.4375;
  EXPECT_NEAR(f.engine->params()[0], tau_eff * (0.25 + 0.75 * 3 / 4.25), 1e-5);
  EXPECT_NEAR(f.engine->params()[1], tau_eff * 0.5, 1e-5);
  EXPECT_NEAR(f.engine->params()[2], tau_eff * (0.75 - 0.75 * 6 / 4.25), 1e-5);
  // The task told the clients the momentum their steps are normalised with.
  const auto tasks = actionsOf<SendTask>(f.log);
  ASSERT_FALSE(tasks.empty());
  EXPECT_FLOAT_EQ(tasks[0].task.hparams.momentum, 0.5f);
}

// FedAvgM (beta 0.9, eta_g 1) over two rounds of FedAvg pseudo-gradients:
// round 1: G1 = mean(D) = (2, 1, -1.5); m = G1; x = (2, 1, -1.5)
// round 2: G2 = (1, 1, 1); m = 0.9 m + G2 = (2.8, 1.9, -0.35); x = (4.8, 2.9, -1.85)
TEST(MomentumAggregation, FedAvgMAccumulatesThePseudoGradients) {
  EngineOptions o = baseOptions(2, 2, 2);
  o.server.kind = ServerOptimizerKind::kFedAvgM;
  o.server.momentum = 0.9;
  o.rounds = 2;
  Fixture f(o, {0, 0, 0});
  oneRound(f, {"a", "b"}, {{"a", {1, 2, -3}, 1}, {"b", {3, 0, 0}, 1}});
  EXPECT_NEAR(f.engine->params()[0], 2, 1e-6);
  EXPECT_NEAR(f.engine->params()[2], -1.5, 1e-6);
  f.take();
  const auto sent = actionsOf<SendTask>(f.log);  // round 2's tasks went out with round 1's end
  ASSERT_EQ(sent.size(), 4u);
  auto token = tokensOf({sent[2], sent[3]});
  ASSERT_EQ(sent[2].task.round, 2u);
  f.upload("a", token.at("a"), {1, 1, 1}, 1, 10);
  f.upload("b", token.at("b"), {1, 1, 1}, 1, 11);
  f.take();
  EXPECT_NEAR(f.engine->params()[0], 4.8, 1e-5);
  EXPECT_NEAR(f.engine->params()[1], 2.9, 1e-5);
  EXPECT_NEAR(f.engine->params()[2], -1.85, 1e-5);
}

// FedAdam (beta1 0.9, beta2 0.99, tau 1e-3, eta_g 0.1), one round, G = (2, 1, -1.5), from
// m = v = 0: m = 0.1 G, v = 0.01 G^2, x += 0.1 m / (sqrt(v) + tau) = 0.01 G / (0.1 |G| + 1e-3).
TEST(MomentumAggregation, FedAdamStepsOnThePseudoGradient) {
  EngineOptions o = baseOptions(2, 2, 2);
  o.server.kind = ServerOptimizerKind::kFedAdam;
  o.server.lr = 0.1;
  o.server.beta1 = 0.9;
  o.server.beta2 = 0.99;
  o.server.tau = 1e-3;
  Fixture f(o, {0, 0, 0});
  oneRound(f, {"a", "b"}, {{"a", {1, 2, -3}, 1}, {"b", {3, 0, 0}, 1}});
  const double g[3] = {2, 1, -1.5};
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(f.engine->params()[i], 0.01 * g[i] / (0.1 * std::abs(g[i]) + 1e-3), 1e-6) << i;
  }
}

}  // namespace
}  // namespace fedfleet::engine
