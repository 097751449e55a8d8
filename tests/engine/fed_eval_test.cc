// Federated evaluation in the round engine: which tasks ask for it, what the claims allow, the
// rows and the round's sample-weighted figures, and a coordinator without test data of its own.
#include <gtest/gtest.h>

#include "tests/engine/round_engine_fixture.h"

namespace fedfleet::engine::engine_test {
namespace {

EngineOptions fedEvalOptions() {
  EngineOptions o = baseOptions(3, 3, 1);
  o.rounds = 3;
  o.fed_eval_every = 2;  // the tasks of rounds 1 and 3 (the models after rounds 0 and 2)
  return o;
}

struct Report {
  uint64_t samples;
  double loss;
  double accuracy;
};

// Every client of the round uploads a zero delta; clients in `reports` add an evaluation.
CommitRound playRound(Fixture& f, const std::vector<SendTask>& tasks,
                      const std::map<std::string, Report>& reports, double now) {
  for (const auto& st : tasks) {
    auto it = reports.find(st.client);
    uploadWhole(*f.engine, st.client, st.task.task_token, {0, 0, 0}, now, [&](wire::Summary& s) {
      if (it == reports.end()) return;
      s.eval_samples = it->second.samples;
      s.eval_loss = it->second.loss;
      s.eval_accuracy = it->second.accuracy;
    });
  }
  auto commits = actionsOf<CommitRound>(f.take());
  EXPECT_EQ(commits.size(), 1u);
  return commits.empty() ? CommitRound{} : commits.back();
}

const history::UpdateRecord& rowOf(const CommitRound& c, const std::string& id) {
  for (const auto& u : c.updates) {
    if (u.client_id == id) return u;
  }
  ADD_FAILURE() << "no row of " << id;
  return c.updates.front();
}

TEST(FedEval, TheRoundsFiguresAreTheSampleWeightedMeansOfTheRows) {
  Fixture f(fedEvalOptions());
  f.engine->start(0);
  for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 3u);
  for (const auto& st : tasks) EXPECT_TRUE(st.task.fed_eval) << st.client;

  const std::map<std::string, Report> reports = {
      {"a", {10, 1.0, 0.5}}, {"b", {30, 0.5, 0.8}}, {"c", {60, 0.25, 0.9}}};
  CommitRound c = playRound(f, tasks, reports, 1);
  // By hand: samples 100; loss (10 x 1 + 30 x 0.5 + 60 x 0.25) / 100 = 0.4; accuracy
  // (10 x 0.5 + 30 x 0.8 + 60 x 0.9) / 100 = 0.83.
  EXPECT_EQ(c.round.round, 1u);
  EXPECT_EQ(c.round.fed_eval_clients, 3u);
  EXPECT_EQ(c.round.fed_eval_samples, 100u);
  ASSERT_TRUE(c.round.fed_eval_loss && c.round.fed_eval_accuracy);
  EXPECT_NEAR(*c.round.fed_eval_loss, 0.4, 1e-12);
  EXPECT_NEAR(*c.round.fed_eval_accuracy, 0.83, 1e-12);
  // And independently from the rows as the history stores them.
  double n = 0, correct = 0;
  for (const auto& u : c.updates) {
    EXPECT_EQ(u.eval_samples, reports.at(u.client_id).samples);
    ASSERT_TRUE(u.eval_accuracy);
    EXPECT_EQ(*u.eval_accuracy, reports.at(u.client_id).accuracy);
    n += static_cast<double>(u.eval_samples);
    correct += static_cast<double>(u.eval_samples) * *u.eval_accuracy;
  }
  EXPECT_NEAR(*c.round.fed_eval_accuracy, correct / n, 1e-12);

  // Round 2 does not ask: (2 - 1) % 2 != 0.
  std::vector<SendTask> round2;
  for (const auto& st : actionsOf<SendTask>(f.log)) {
    if (st.task.round == 2) round2.push_back(st);
  }
  ASSERT_EQ(round2.size(), 3u);
  for (const auto& st : round2) EXPECT_FALSE(st.task.fed_eval) << st.client;
  c = playRound(f, round2, {}, 2);
  EXPECT_EQ(c.round.fed_eval_clients, 0u);
  EXPECT_FALSE(c.round.fed_eval_accuracy.has_value());
  EXPECT_EQ(rowOf(c, "a").eval_samples, 0u);
  EXPECT_FALSE(rowOf(c, "a").eval_accuracy.has_value());
}

TEST(FedEval, FedEvalClientsLimitsTheTasksThatAsk) {
  EngineOptions o = fedEvalOptions();
  o.fed_eval_clients = 2;
  Fixture f(o);
  f.engine->start(0);
  for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 3u);
  int asked = 0;
  std::string not_asked;
  for (const auto& st : tasks) {
    if (st.task.fed_eval) {
      ++asked;
    } else {
      not_asked = st.client;
    }
  }
  EXPECT_EQ(asked, 2);
  // The client not asked that reports one anyway is rejected; the others count.
  std::map<std::string, Report> reports;
  for (const auto& st : tasks) reports[st.client] = {20, 0.5, 0.75};
  CommitRound c = playRound(f, tasks, reports, 1);
  EXPECT_EQ(rowOf(c, not_asked).status, "rejected");
  EXPECT_EQ(c.round.rejected, 1u);
  EXPECT_EQ(c.round.fed_eval_clients, 2u);
  EXPECT_EQ(c.round.fed_eval_samples, 40u);
  EXPECT_GE(eventsOf(f.log, "update_rejected"), 1);
}

TEST(FedEval, ClaimsOutOfRangeRejectTheUpdateAndCountForNothing) {
  EngineOptions o = fedEvalOptions();
  o.max_samples_per_update = 1000;
  Fixture f(o);
  f.engine->start(0);
  for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 3u);
  const std::map<std::string, Report> reports = {
      {"a", {1001, 0.5, 0.5}},                                      // more than the bound
      {"b", {10, 0.5, 1.5}},                                        // accuracy above 1
      {"c", {10, std::numeric_limits<double>::quiet_NaN(), 0.5}}};  // loss not finite
  CommitRound c = playRound(f, tasks, reports, 1);
  for (const char* id : {"a", "b", "c"}) EXPECT_EQ(rowOf(c, id).status, "rejected") << id;
  EXPECT_EQ(c.round.status, "failed");  // no update left for the quorum
  EXPECT_EQ(c.round.fed_eval_clients, 0u);
  EXPECT_FALSE(c.round.fed_eval_accuracy.has_value());
}

// A regression's clients report no accuracy and their mse, mae and own metrics: the round gets
// each metric's sample-weighted mean over the rows reporting it, and no accuracy.
TEST(FedEval, MetricsAreWeightedByHeldOutSamplesAndARegressionHasNoAccuracy) {
  EngineOptions o = fedEvalOptions();
  o.hparams.loss = wire::Loss::kMse;
  Fixture f(o);
  f.engine->start(0);
  for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 3u);
  const std::map<std::string, std::pair<uint64_t, history::Metrics>> reports = {
      {"a", {10, {{"mse", 2.0}, {"mae", 1.0}}}},
      {"b", {30, {{"mse", 1.0}, {"mae", 0.5}, {"r2", 0.9}}}},
      {"c", {60, {{"mse", 0.5}, {"mae", 0.25}}}}};
  for (const auto& st : tasks) {
    const auto& [samples, metrics] = reports.at(st.client);
    uploadWhole(*f.engine, st.client, st.task.task_token, {0, 0, 0}, 1, [&](wire::Summary& s) {
      s.eval_samples = samples;
      s.eval_loss = metrics[0].second;  // mse is the loss
      s.eval_has_accuracy = false;
      s.eval_metrics = metrics;
    });
  }
  auto commits = actionsOf<CommitRound>(f.take());
  ASSERT_EQ(commits.size(), 1u);
  const CommitRound& c = commits.back();
  EXPECT_EQ(c.round.fed_eval_clients, 3u);
  EXPECT_FALSE(c.round.fed_eval_accuracy.has_value());
  ASSERT_TRUE(c.round.fed_eval_loss);
  // By hand: mse (10 x 2 + 30 x 1 + 60 x 0.5) / 100 = 0.8; mae (10 + 15 + 15) / 100 = 0.4;
  // r2 reported by b alone: 0.9.
  EXPECT_NEAR(*c.round.fed_eval_loss, 0.8, 1e-12);
  ASSERT_EQ(c.round.fed_eval_metrics.size(), 3u);
  EXPECT_EQ(c.round.fed_eval_metrics[0].first, "mse");
  EXPECT_NEAR(c.round.fed_eval_metrics[0].second, 0.8, 1e-12);
  EXPECT_EQ(c.round.fed_eval_metrics[1].first, "mae");
  EXPECT_NEAR(c.round.fed_eval_metrics[1].second, 0.4, 1e-12);
  EXPECT_EQ(c.round.fed_eval_metrics[2].first, "r2");
  EXPECT_NEAR(c.round.fed_eval_metrics[2].second, 0.9, 1e-12);
  EXPECT_FALSE(rowOf(c, "a").eval_accuracy.has_value());
  EXPECT_EQ(rowOf(c, "b").eval_metrics, reports.at("b").second);
}

// A client of a cross-entropy run that claims its model has no accuracy, or sends a metric
// that is not finite, is rejected like any other bad claim.
TEST(FedEval, NoAccuracyUnderCrossEntropyAndNonFiniteMetricsAreRejected) {
  Fixture f(fedEvalOptions());
  f.engine->start(0);
  for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 3u);
  for (const auto& st : tasks) {
    uploadWhole(*f.engine, st.client, st.task.task_token, {0, 0, 0}, 1, [&](wire::Summary& s) {
      s.eval_samples = 10;
      s.eval_loss = 0.5;
      s.eval_accuracy = 0.5;
      if (st.client == "a") s.eval_has_accuracy = false, s.eval_accuracy = 0;
      if (st.client == "b") s.eval_metrics = {{"f1", std::numeric_limits<double>::infinity()}};
    });
  }
  auto commits = actionsOf<CommitRound>(f.take());
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(rowOf(commits.back(), "a").status, "rejected");
  EXPECT_EQ(rowOf(commits.back(), "b").status, "rejected");
  EXPECT_EQ(rowOf(commits.back(), "c").status, "completed");
  EXPECT_EQ(commits.back().round.fed_eval_clients, 1u);
}

TEST(FedEval, WithoutServerEvaluationNothingIsEvaluatedByTheCoordinator) {
  EngineOptions o = fedEvalOptions();
  o.server_eval = false;
  o.fed_eval_every = 1;
  ASSERT_TRUE(checkEngineOptions(o).isOk());
  RoundEngine engine(o, {0, 0, 0});
  engine.start(0);
  auto start = engine.takeActions();
  EXPECT_TRUE(actionsOf<Evaluate>(start).empty());
  auto initial = actionsOf<CommitRound>(start);
  ASSERT_EQ(initial.size(), 1u);
  EXPECT_EQ(initial[0].round.status, "initial");
  EXPECT_FALSE(initial[0].round.test_accuracy.has_value());
  for (const char* id : {"a", "b", "c"}) engine.onHello(id, hello(id), 0);
  auto tasks = actionsOf<SendTask>(engine.takeActions());
  for (uint32_t r = 1; r <= 3; ++r) {
    SCOPED_TRACE("round " + std::to_string(r));
    ASSERT_EQ(tasks.size(), 3u);
    for (const auto& st : tasks) {
      EXPECT_TRUE(st.task.fed_eval);
      uploadWhole(engine, st.client, st.task.task_token, {0, 0, 0}, r, [&](wire::Summary& s) {
        s.eval_samples = 50;
        s.eval_loss = 1.0 / r;
        s.eval_accuracy = 0.2 * r;
      });
    }
    auto actions = engine.takeActions();
    EXPECT_TRUE(actionsOf<Evaluate>(actions).empty());
    auto commits = actionsOf<CommitRound>(actions);
    ASSERT_EQ(commits.size(), 1u);
    EXPECT_EQ(commits[0].round.round, r);
    EXPECT_EQ(commits[0].round.status, "ok");
    EXPECT_FALSE(commits[0].round.test_accuracy.has_value());
    ASSERT_TRUE(commits[0].round.fed_eval_accuracy.has_value());
    EXPECT_NEAR(*commits[0].round.fed_eval_accuracy, 0.2 * r, 1e-12);
    EXPECT_NEAR(*commits[0].round.fed_eval_loss, 1.0 / r, 1e-12);
    tasks = actionsOf<SendTask>(actions);
  }
  EXPECT_TRUE(engine.finished());
}

TEST(FedEval, OptionsThatCannotWorkAreRefused) {
  EngineOptions o = fedEvalOptions();
  o.server_eval = false;
  o.fed_eval_every = 0;
  Status st = checkEngineOptions(o);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("fed_eval_every"), std::string::npos) << st.message();
  o.fed_eval_every = 1;
  o.target_accuracy = 0.9;
  st = checkEngineOptions(o);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("target_accuracy"), std::string::npos) << st.message();
}

TEST(FedEval, FederatedEvaluationOfRowsSkipsRowsThatDidNotComplete) {
  history::RoundRecord r;
  std::vector<history::UpdateRecord> rows(3);
  rows[0].status = "completed";
  rows[0].eval_samples = 4;
  rows[0].eval_loss = 2.0;
  rows[0].eval_accuracy = 0.25;
  rows[1].status = "rejected";  // its claims are not trusted
  rows[1].eval_samples = 1000;
  rows[1].eval_loss = 0.0;
  rows[1].eval_accuracy = 1.0;
  rows[2].status = "completed";
  rows[2].eval_samples = 12;
  rows[2].eval_loss = 1.0;
  rows[2].eval_accuracy = 0.75;
  // The states decide, not the rows' text: row 1 spells "completed" but its state is rejected.
  rows[1].status = "completed";
  federatedEvaluation(r, rows,
                      {UpdateState::kCompleted, UpdateState::kRejected, UpdateState::kCompleted});
  EXPECT_EQ(r.fed_eval_clients, 2u);
  EXPECT_EQ(r.fed_eval_samples, 16u);
  EXPECT_DOUBLE_EQ(*r.fed_eval_loss, (4 * 2.0 + 12 * 1.0) / 16);        // 1.25
  EXPECT_DOUBLE_EQ(*r.fed_eval_accuracy, (4 * 0.25 + 12 * 0.75) / 16);  // 0.625
}

}  // namespace
}  // namespace fedfleet::engine::engine_test
