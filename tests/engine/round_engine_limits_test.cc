// The RoundEngine does not believe a client's claims: sample counts, steps, losses and timings
// are bounded by what the coordinator knows; weights are capped and norms bounded against the
// round's median; a step or an evaluation that is not finite is refused and rolled back; event
// rows per client are capped; task tokens are unpredictable while the history stays
// deterministic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/participant_table.h"
#include "engine/round_engine.h"
#include "tests/engine/round_engine_fixture.h"

namespace fedfleet::engine {
namespace {

using namespace engine_test;

// The details of the RecordEvent actions of `kind` in `actions`.
std::vector<std::string> detailsOf(const std::vector<Action>& actions, const std::string& kind) {
  std::vector<std::string> out;
  for (const auto& e : actionsOf<RecordEvent>(actions)) {
    if (e.event.kind == kind) out.push_back(e.event.detail);
  }
  return out;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// One client "a" (partition 0) in a one-round run; returns its task.
SendTask soleTask(Fixture& f) {
  f.engine->start(0);
  f.engine->onHello("a", hello("a", 0), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  EXPECT_EQ(tasks.size(), 1u);
  return tasks.empty() ? SendTask{} : tasks[0];
}

// Sends one chunk of (1, 1, 1) with the given claims; returns the actions it caused.
std::vector<Action> claim(Fixture& f, uint64_t token, uint64_t n, uint64_t steps) {
  f.engine->onChunk("a", chunkOf(token, 0, {1, 1, 1}, true, n, steps), 100, 1);
  return f.take();
}

// The one rejection the actions hold: its SendError message, which the event repeats.
std::string rejection(const std::vector<Action>& actions) {
  auto errors = actionsOf<SendError>(actions);
  EXPECT_EQ(errors.size(), 1u);
  if (errors.empty()) return "";
  EXPECT_EQ(errors[0].error.code, wire::ErrorCode::kRejected);
  auto events = detailsOf(actions, "update_rejected");
  EXPECT_EQ(events.size(), 1u);
  if (!events.empty()) {
    EXPECT_TRUE(contains(events[0], errors[0].error.message)) << events[0];
  }
  return errors[0].error.message;
}

TEST(RoundEngineClaims, ATrillionSampleClaimIsRejectedAgainstTheBound) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 1;
  Fixture f(o);
  const uint64_t token = soleTask(f).task.task_token;
  auto actions = claim(f, token, 1000000000000ull, 3);
  EXPECT_EQ(rejection(actions),
            "claims 1000000000000 samples, more than coordinator.max_samples_per_update = "
            "1000000");
  auto commits = actionsOf<CommitRound>(actions);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.status, "failed");
  EXPECT_EQ(commits[0].updates[0].status, "rejected");
  EXPECT_EQ(commits[0].updates[0].weight, 0);
  EXPECT_EQ(f.engine->params(), (std::vector<float>{0, 0, 0}));
}

TEST(RoundEngineClaims, SamplesAreBoundedByThePartitionSizeAndZeroIsRejected) {
  for (uint64_t n : {101ull, 0ull}) {
    EngineOptions o = baseOptions(1, 1, 1);
    o.rounds = 1;
    o.partition_sizes = {100, 200, 300, 400};
    Fixture f(o);
    const uint64_t token = soleTask(f).task.task_token;
    auto actions = claim(f, token, n, 3);
    EXPECT_EQ(rejection(actions),
              n == 0 ? "chunk reports 0 samples" : "claims 101 samples, partition 0 holds 100");
  }
  // At the size: accepted.
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 1;
  o.partition_sizes = {100, 200, 300, 400};
  Fixture f(o);
  const uint64_t token = soleTask(f).task.task_token;
  f.upload("a", token, {1, 1, 1}, 100, 1);
  auto commits = actionsOf<CommitRound>(f.take());
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.status, "ok");
}

TEST(RoundEngineClaims, StepsMustBeAtLeastOneAndAtMostWhatTheTaskPlanned) {
  struct Case {
    uint32_t max_steps;  // the task's (0: epochs x batches)
    uint64_t steps;      // claimed
    std::string why;     // expected rejection ("": accepted)
  };
  // Partition 0 holds 100 samples; 2 epochs of batches of 32: 2 x ceil(100 / 32) = 8 steps.
  for (const Case& c :
       {Case{0, 0, "claims 0 local steps"},
        Case{0, 9, "claims 9 local steps, its task planned at most 8"}, Case{0, 8, ""},
        Case{5, 6, "claims 6 local steps, its task planned at most 5"}, Case{5, 5, ""}}) {
    SCOPED_TRACE(std::to_string(c.max_steps) + " " + std::to_string(c.steps));
    EngineOptions o = baseOptions(1, 1, 1);
    o.rounds = 1;
    o.partition_sizes = {100, 100, 100, 100};
    o.hparams.epochs = 2;
    o.hparams.batch_size = 32;
    o.hparams.max_steps = c.max_steps;
    Fixture f(o);
    const uint64_t token = soleTask(f).task.task_token;
    if (c.why.empty()) {
      f.upload("a", token, {1, 1, 1}, 100, 1, 3, c.steps);
      auto commits = actionsOf<CommitRound>(f.take());
      ASSERT_EQ(commits.size(), 1u);
      EXPECT_EQ(commits[0].round.status, "ok");
    } else {
      EXPECT_EQ(rejection(claim(f, token, 100, c.steps)), c.why);
    }
  }
  // Sizes unknown: the (bounded) sample claim stands in: 2 x ceil(40 / 32) = 4 steps.
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 1;
  o.hparams.epochs = 2;
  Fixture f(o);
  const uint64_t token = soleTask(f).task.task_token;
  EXPECT_EQ(rejection(claim(f, token, 40, 5)), "claims 5 local steps, its task planned at most 4");
}

TEST(RoundEngineClaims, SummaryLossesMustBeFiniteAndBoundedAndTimingsAreClamped) {
  struct Case {
    double mean_loss, sum_sq_loss;
    std::string why;
  };
  // n = 10, 3 steps of batches of 32, max_loss 100: at most max(10, 96) = 96 samples seen, so
  // the squares sum to at most 96 x 100^2 = 960000.
  for (const Case& c :
       {Case{-0.5, 1, "summary's mean loss -0.500000 is not in [0, 100.000000]"},
        Case{101, 1, "summary's mean loss 101.000000 is not in [0, 100.000000]"},
        Case{NAN, 1, "summary's mean loss nan is not in [0, 100.000000]"},
        Case{1, 960001,
             "summary's sum of squared losses 960001.000000 is not in [0, 960000.000000]"},
        Case{1, INFINITY, "summary's sum of squared losses inf is not in [0, 960000.000000]"}}) {
    SCOPED_TRACE(c.why);
    EngineOptions o = baseOptions(1, 1, 1);
    o.rounds = 1;
    o.max_loss = 100;
    Fixture f(o);
    const uint64_t token = soleTask(f).task.task_token;
    uploadWhole(*f.engine, "a", token, {1, 1, 1}, 1, [&](wire::Summary& s) {
      s.mean_loss = c.mean_loss;
      s.sum_sq_loss = c.sum_sq_loss;
    });
    EXPECT_EQ(rejection(f.take()), c.why);
  }
  // Timings: compute 1e9 s and upload -3 s, reported 2 s after the task was sent at 0.
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 1;
  Fixture f(o);
  const uint64_t token = soleTask(f).task.task_token;
  uploadWhole(*f.engine, "a", token, {1, 1, 1}, 2, [](wire::Summary& s) {
    s.compute_seconds = 1e9;
    s.upload_seconds = -3;
    s.encode_seconds = NAN;
  });
  auto commits = actionsOf<CommitRound>(f.take());
  ASSERT_EQ(commits.size(), 1u);
  ASSERT_EQ(commits[0].updates.size(), 1u);
  EXPECT_EQ(commits[0].updates[0].status, "completed");
  EXPECT_DOUBLE_EQ(commits[0].updates[0].compute_s, 2);
  EXPECT_DOUBLE_EQ(commits[0].updates[0].upload_s, 0);
  EXPECT_DOUBLE_EQ(commits[0].updates[0].encode_s, 0);
}

TEST(RoundEngineClaims, ChunkIndicesOutsideTheUpdateAreRejected) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 1;
  Fixture f(o);
  const uint64_t token = soleTask(f).task.task_token;
  f.engine->onChunk("a", chunkOf(token, 0, {1, 1}, false), 100, 1);
  EXPECT_TRUE(actionsOf<SendError>(f.take()).empty());
  // Offset 2 is next; 2 values from there end at 4, past the update's 3.
  EXPECT_EQ(rejection(claim(f, token, 10, 3)), "chunk at offset 0, expected 2");
  Fixture g(o);
  const uint64_t t2 = soleTask(g).task.task_token;
  g.engine->onChunk("a", chunkOf(t2, 0, {1, 1}, false), 100, 1);
  g.engine->onChunk("a", chunkOf(t2, 2, {1, 1}, true), 100, 1);
  EXPECT_EQ(rejection(g.take()), "chunk ends at 4, past the update's 3 values");
}

// Clients a, b, c with n = 10, 10, 1000 and deltas e1, e2, e3.
TEST(RoundEngineRobust, AWeightAboveTheCapIsCappedAtTenTimesTheMedian) {
  EngineOptions o = baseOptions(3, 3, 3);
  Fixture f(o, {0, 0, 0});
  auto c = oneRound(f, {"a", "b", "c"},
                    {{"a", {1, 0, 0}, 10}, {"b", {0, 1, 0}, 10}, {"c", {0, 0, 1}, 1000}});
  EXPECT_EQ(c.round.status, "ok");
  // Median 10, cap 100: x = (10 e1 + 10 e2 + 100 e3) / 120.
  EXPECT_FLOAT_EQ(f.engine->params()[0], 10.0f / 120);
  EXPECT_FLOAT_EQ(f.engine->params()[1], 10.0f / 120);
  EXPECT_FLOAT_EQ(f.engine->params()[2], 100.0f / 120);
  std::map<std::string, double> weight;
  for (const auto& u : c.updates) weight[u.client_id] = u.weight;
  EXPECT_DOUBLE_EQ(weight["a"], 10.0 / 120);
  EXPECT_DOUBLE_EQ(weight["c"], 100.0 / 120);
  auto capped = detailsOf(f.log, "weight_capped");
  ASSERT_EQ(capped.size(), 1u);
  EXPECT_EQ(capped[0],
            "round 1: 1000 samples weighed as 100.000000 (aggregation.weight_cap 10.000000 x "
            "the median 10.000000)");
  // Off: plain sample weights.
  o.weight_cap = 0;
  Fixture g(o, {0, 0, 0});
  oneRound(g, {"a", "b", "c"},
           {{"a", {1, 0, 0}, 10}, {"b", {0, 1, 0}, 10}, {"c", {0, 0, 1}, 1000}});
  EXPECT_FLOAT_EQ(g.engine->params()[2], 1000.0f / 1020);
}

// Honest a = (1, 0, 0) and b = (0, 2, 0); c sends 1e20 everywhere. Norms 1, 2, sqrt(3) 1e20:
// the lower median is 2, the bound 5 x 2 = 10.
const std::vector<Upload> kHostileRound = {
    {"a", {1, 0, 0}, 1}, {"b", {0, 2, 0}, 1}, {"c", {1e20f, 1e20f, 1e20f}, 1}};

TEST(RoundEngineRobust, AHugeUpdateIsClippedExactlyToTheNormBound) {
  EngineOptions o = baseOptions(3, 3, 3);
  Fixture f(o, {0, 0, 0});
  auto c = oneRound(f, {"a", "b", "c"}, kHostileRound);
  EXPECT_EQ(c.round.status, "ok");
  // c clipped to norm 10: 10 / sqrt(3) in each coordinate; x = (a + b + c') / 3.
  const double v = 10 / std::sqrt(3.0);
  EXPECT_FLOAT_EQ(f.engine->params()[0], static_cast<float>((1 + v) / 3));
  EXPECT_FLOAT_EQ(f.engine->params()[1], static_cast<float>((2 + v) / 3));
  EXPECT_FLOAT_EQ(f.engine->params()[2], static_cast<float>(v / 3));
  auto clipped = detailsOf(f.log, "update_clipped");
  ASSERT_EQ(clipped.size(), 1u);
  EXPECT_TRUE(contains(clipped[0],
                       "clipped to 10.000000 (aggregation.norm_bound 5.000000 x the "
                       "median norm 2.000000)"))
      << clipped[0];
  for (const auto& u : c.updates) EXPECT_EQ(u.status, "completed");
}

TEST(RoundEngineRobust, AHugeUpdateIsRejectedWhenTheActionIsReject) {
  EngineOptions o = baseOptions(3, 3, 2);
  o.norm_bound_action = NormBoundAction::kReject;
  Fixture f(o, {0, 0, 0});
  auto c = oneRound(f, {"a", "b", "c"}, kHostileRound);
  EXPECT_EQ(c.round.status, "ok");
  EXPECT_EQ(c.round.completed, 2u);
  EXPECT_EQ(c.round.rejected, 1u);
  EXPECT_EQ(f.engine->params(), (std::vector<float>{0.5f, 1, 0}));  // (a + b) / 2
  auto rejected = detailsOf(f.log, "update_rejected");
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_TRUE(contains(rejected[0],
                       "exceeds aggregation.norm_bound 5.000000 x the median norm "
                       "2.000000"))
      << rejected[0];
  for (const auto& u : c.updates) {
    EXPECT_EQ(u.status, u.client_id == "c" ? "rejected" : "completed");
    EXPECT_DOUBLE_EQ(u.weight, u.client_id == "c" ? 0 : 0.5);
  }
}

TEST(RoundEngineRobust, ClipNormIsExactEvenForAHugeUpdate) {
  EngineOptions o = baseOptions(2, 2, 2);
  o.norm_bound = 0;
  o.clip_norm = 1;
  Fixture f(o, {0, 0, 0});
  // (1e20, 0, 0) clipped to (1, 0, 0) before it enters the sum; (0, 0.5, 0) is within.
  oneRound(f, {"a", "b"}, {{"a", {1e20f, 0, 0}}, {"b", {0, 0.5f, 0}}});
  EXPECT_EQ(f.engine->params(), (std::vector<float>{0.5f, 0.25f, 0}));
}

TEST(RoundEngineRobust, ScaffoldRejectsRatherThanClips) {
  EngineOptions o = baseOptions(3, 3, 2);
  o.aggregator = AggregatorKind::kScaffold;
  o.hparams.scaffold = true;
  Fixture f(o, {0, 0, 0});
  // 2P values: delta, then control delta. Delta norms 1, 1, 100: median 1, bound 5.
  auto c =
      oneRound(f, {"a", "b", "c"},
               {{"a", {1, 0, 0, 0, 0, 0}}, {"b", {0, 1, 0, 0, 0, 0}}, {"c", {0, 0, 100, 0, 0, 0}}});
  EXPECT_EQ(c.round.completed, 2u);
  EXPECT_EQ(c.round.rejected, 1u);
  EXPECT_EQ(f.engine->params(), (std::vector<float>{0.5f, 0.5f, 0}));
}

TEST(RoundEngineRobust, FedBuffBoundsNormsAgainstTheLastUpdates) {
  EngineOptions o = asyncOptions();
  o.async_buffer = 3;
  o.rounds = 1;
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
  auto token = tokensOf(actionsOf<SendTask>(f.take()));
  // Norms 1, 2, then 300: the median of the three is 2, the bound 10.
  f.upload("a", token["a"], {1, 0, 0}, 1, 1);
  f.upload("b", token["b"], {0, 2, 0}, 1, 2);
  f.upload("c", token["c"], {0, 0, 300}, 1, 3);
  f.take();
  // x = (1/3)(a + b + (0, 0, 10)), staleness 0.
  EXPECT_FLOAT_EQ(f.engine->params()[0], 1.0f / 3);
  EXPECT_FLOAT_EQ(f.engine->params()[1], 2.0f / 3);
  EXPECT_FLOAT_EQ(f.engine->params()[2], 10.0f / 3);
  EXPECT_EQ(detailsOf(f.log, "update_clipped").size(), 1u);
}

TEST(RoundEngineRefusal, ANonFiniteStepIsRefusedAndTheModelKept) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 1;
  o.server.lr = 1e38;  // finite aggregate, but x + lr G overflows fp32
  Fixture f(o, {1, 2, 3});
  const uint64_t token = soleTask(f).task.task_token;
  f.upload("a", token, {10, 10, 10}, 1, 1);
  auto actions = f.take();
  auto commits = actionsOf<CommitRound>(actions);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.status, "failed");
  EXPECT_FALSE(commits[0].checkpoint.has_value());
  EXPECT_EQ(f.engine->params(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(f.engine->modelVersion(), 0u);
  auto refused = detailsOf(actions, "step_refused");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0],
            "round 1: the server step would make the model non-finite (fedavg, fedavg); the "
            "model is unchanged");
}

TEST(RoundEngineRefusal, ANonFiniteStepLeavesTheServerMomentumAsItWas) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 2;
  o.server.kind = ServerOptimizerKind::kFedAvgM;
  o.server.momentum = 0.5;
  o.server.lr = 1e30;
  // Round 2's update is 5e9 times round 1's, which the norm bound (judged against the rounds
  // before) would clip: off, so that the step is what refuses it.
  o.norm_bound = 0;
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  // Round 1: G = (2, 0, -2): m = G, x = 1e30 G. Round 2: G = (1e10, 0, 0) would make
  // x += 1e30 (m / 2 + G) overflow: refused.
  auto tasks = actionsOf<SendTask>(f.take());
  f.upload("a", tasks[0].task.task_token, {2, 0, -2}, 1, 1);
  const std::vector<float> after_round1 = f.engine->params();
  const std::string state = f.engine->saveState();
  tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 1u);
  f.upload("a", tasks[0].task.task_token, {1e10f, 0, 0}, 1, 2);
  auto actions = f.take();
  EXPECT_EQ(detailsOf(actions, "step_refused").size(), 1u);
  EXPECT_EQ(f.engine->params(), after_round1);
  // The optimiser's momentum (m = G of round 1) is part of the state: unchanged.
  EXPECT_EQ(f.engine->saveState(), state);
}

TEST(RoundEngineRefusal, ANonFiniteEvaluationRollsBackAndAbortsTheRoundInFlight) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 3;
  RoundEngine engine(o, {0, 0, 0});
  auto tasks = startWithClientA(engine);
  ASSERT_EQ(tasks.size(), 1u);
  uploadWhole(engine, "a", tasks[0].task.task_token, {1, 1, 1}, 1);
  auto actions = engine.takeActions();
  // Round 2 went out with round 1's model before its evaluation.
  tasks = actionsOf<SendTask>(actions);
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_EQ(tasks[0].task.round, 2u);
  const uint64_t t2 = tasks[0].task.task_token;
  EXPECT_EQ(engine.params(), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(engine.modelVersion(), 1u);

  engine.onEvaluated(1, EvalOutcome{NAN, 0.5}, 2);
  actions = engine.takeActions();
  EXPECT_EQ(engine.params(), (std::vector<float>{0, 0, 0}));  // the model before round 1
  EXPECT_EQ(engine.modelVersion(), 2u);  // a new version holding the old parameters
  auto commits = actionsOf<CommitRound>(actions);
  ASSERT_EQ(commits.size(), 2u);
  EXPECT_EQ(commits[0].round.round, 1u);
  EXPECT_EQ(commits[0].round.status, "failed");
  EXPECT_FALSE(commits[0].checkpoint.has_value());
  EXPECT_FALSE(commits[0].round.test_loss.has_value());
  EXPECT_EQ(commits[1].round.round, 2u);  // aborted: trained from the refused model
  EXPECT_EQ(commits[1].round.status, "failed");
  ASSERT_EQ(commits[1].updates.size(), 1u);
  EXPECT_EQ(commits[1].updates[0].status, "late");
  auto cancels = actionsOf<SendCancel>(actions);
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_EQ(cancels[0].cancel.task_token, t2);
  EXPECT_EQ(cancels[0].cancel.reason, "trained from round 1's refused model (rolled back)");
  auto refused = detailsOf(actions, "evaluation_refused");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0],
            "round 1: its evaluation is not finite (loss nan, accuracy 0.500000); the model is "
            "rolled back to the one before that round (now version 2)");
  EXPECT_EQ(detailsOf(actions, "round_failed").size(), 2u);
  // Round 3 goes out with the restored model.
  tasks = actionsOf<SendTask>(actions);
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_EQ(tasks[0].task.round, 3u);
  std::vector<float> sent(3);
  std::memcpy(sent.data(), tasks[0].model_bytes->data(), 12);
  EXPECT_EQ(sent, (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(tasks[0].task.model_version, 2u);
  // A late upload of the aborted task is stale.
  engine.onChunk("a", chunkOf(t2, 0, {1, 1, 1}, true), 100, 3);
  EXPECT_EQ(eventsOf(engine.takeActions(), "stale_update"), 1);
}

TEST(RoundEngineRefusal, AnInfiniteAccuracyIsRefusedToo) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 1;
  RoundEngine engine(o, {0, 0, 0});
  auto tasks = startWithClientA(engine);
  ASSERT_EQ(tasks.size(), 1u);
  uploadWhole(engine, "a", tasks[0].task.task_token, {1, 1, 1}, 1);
  engine.takeActions();
  engine.onEvaluated(1, EvalOutcome{0.3, INFINITY}, 2);
  auto actions = engine.takeActions();
  auto commits = actionsOf<CommitRound>(actions);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.status, "failed");
  EXPECT_EQ(engine.params(), (std::vector<float>{0, 0, 0}));
  EXPECT_TRUE(engine.finished());  // the last round: the run ends after its (failed) commit
}

TEST(RoundEngineRefusal, FedBuffRollsBackAndRestartsTheTasksInFlight) {
  EngineOptions o = asyncOptions();
  o.min_clients = 2;
  o.async_concurrency = 2;
  o.async_buffer = 1;
  o.rounds = 3;
  RoundEngine engine(o, {0, 0, 0});
  engine.start(0);
  engine.onEvaluated(0, EvalOutcome{1, 0.1}, 0);
  engine.onHello("a", hello("a"), 0);
  engine.onHello("b", hello("b"), 0);
  auto token = tokensOf(actionsOf<SendTask>(engine.takeActions()));
  ASSERT_EQ(token.size(), 2u);
  // a's update is one server step (buffer 1): x = (2, 2, 2), version 1; a gets a new task.
  uploadWhole(engine, "a", token["a"], {2, 2, 2}, 1);
  auto actions = engine.takeActions();
  ASSERT_EQ(actionsOf<Evaluate>(actions).size(), 1u);
  ASSERT_EQ(actionsOf<SendTask>(actions).size(), 1u);
  EXPECT_EQ(engine.params(), (std::vector<float>{2, 2, 2}));

  engine.onEvaluated(1, EvalOutcome{0.5, NAN}, 2);
  actions = engine.takeActions();
  EXPECT_EQ(engine.params(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(engine.modelVersion(), 2u);
  auto commits = actionsOf<CommitRound>(actions);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.round, 1u);
  EXPECT_EQ(commits[0].round.status, "failed");
  // Both tasks in flight (b's from version 0 and a's from the refused version 1) are cancelled
  // and sent again with the restored model.
  EXPECT_EQ(actionsOf<SendCancel>(actions).size(), 2u);
  auto again = actionsOf<SendTask>(actions);
  ASSERT_EQ(again.size(), 2u);
  for (const auto& t : again) EXPECT_EQ(t.task.model_version, 2u);
  // The run goes on from there: b's new update is the next step.
  for (const auto& t : again) {
    if (t.client == "b") uploadWhole(engine, t.client, t.task.task_token, {1, 0, 0}, 3);
  }
  EXPECT_EQ(engine.params(), (std::vector<float>{1, 0, 0}));
}

TEST(RoundEngineLimits, EventRowsPerClientAndRoundAreCappedWithOneLeftOutRow) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 1;
  o.events_per_client_round = 3;
  Fixture f(o);
  const uint64_t token = soleTask(f).task.task_token;
  // 10 chunks naming unknown tokens: one unknown_token event each.
  for (uint64_t t = 1; t <= 10; ++t) {
    f.engine->onChunk("a", chunkOf(token + t, 0, {1, 1, 1}, true), 100, 1);
  }
  f.upload("a", token, {1, 1, 1}, 10, 2);
  f.take();
  int rows = 0;
  std::vector<std::string> left_out;
  for (const auto& e : actionsOf<RecordEvent>(f.log)) {
    if (e.event.client_id != "a") continue;
    if (e.event.kind == "events_left_out") {
      left_out.push_back(e.event.detail);
    } else {
      ++rows;
    }
  }
  // client_joined and 10 unknown tokens: 11 events, 3 recorded, 8 left out.
  EXPECT_EQ(rows, 3);
  ASSERT_EQ(left_out.size(), 1u);
  EXPECT_EQ(left_out[0],
            "round 1: 8 more events of this client left out (limits.events_per_client_round = 3)");
  EXPECT_EQ(actionsOf<SendError>(f.log).size(), 10u);  // every client is still answered
}

// Rounds of 0.1 s for 100 s (virtual or not: the engine reads only the `now` it is given), and
// in each client "a" sends 25 chunks naming unknown tokens before its update. The per-round cap
// (20) alone let such a client write over 200 rows a second; with the budget in time (30 at
// once, then one every 10 s) its rows by time t, events_left_out included, never exceed
// 30 + t / 10: 39 by 99.9 s, its client_joined row among them. The run's end then writes the
// count still owed, so that every event is either written or counted in a row. Every one is
// still answered.
TEST(RoundEngineLimits, OneClientsEventRowsAreHeldToTheBudgetInTimeHoweverFastTheRounds) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 1000;
  Fixture f(o);
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  uint64_t bogus = 1;
  for (int r = 0; r < 1000; ++r) {
    const double t = r * 0.1;
    const auto tasks = actionsOf<SendTask>(f.take());
    ASSERT_EQ(tasks.size(), 1u) << "round " << r + 1;
    const uint64_t token = tasks[0].task.task_token;
    for (int i = 0; i < 25; ++i) {
      if (++bogus == token) ++bogus;
      f.engine->onChunk("a", chunkOf(bogus, 0, {1, 1, 1}, true), 100, t);
    }
    f.upload("a", token, {0.01f, 0.01f, 0.01f}, 10, t);
  }
  f.take();
  ASSERT_TRUE(f.engine->finished());
  std::vector<double> times;
  uint64_t left_out = 0, written = 0;
  for (const auto& e : actionsOf<RecordEvent>(f.log)) {
    if (e.event.client_id != "a") continue;
    times.push_back(e.event.time);
    if (e.event.kind == "events_left_out") {
      left_out += std::stoull(e.event.detail.substr(e.event.detail.find(": ") + 2));
    } else {
      ++written;
    }
  }
  ASSERT_EQ(times.size(), 40u);
  for (size_t i = 0; i + 1 < times.size(); ++i) {
    EXPECT_LE(static_cast<double>(i + 1), 30 + times[i] / 10) << "row " << i << " at " << times[i];
  }
  const auto rows = actionsOf<RecordEvent>(f.log);
  auto last = rows.rbegin();
  while (last != rows.rend() && last->event.client_id != "a") ++last;
  ASSERT_NE(last, rows.rend());
  EXPECT_EQ(last->event.kind, "events_left_out") << "the run's end writes the count still owed";
  // 1 + 25,000 events: each written, or counted in an events_left_out row.
  EXPECT_EQ(left_out + written, 25001u);
  EXPECT_EQ(actionsOf<SendError>(f.log).size(), 25000u);
}

TEST(RoundEngineTokens, TokensDifferBetweenEnginesWhileTheHistoryIsTheSame) {
  struct Run {
    std::vector<uint64_t> tokens;
    std::vector<CommitRound> commits;
    std::vector<std::string> event_kinds;
    std::vector<float> params;
  };
  auto run = [] {
    EngineOptions o = baseOptions(3, 3, 3);
    o.rounds = 2;
    Fixture f(o, {0, 0, 0});
    f.engine->start(0);
    for (const char* id : {"d", "b", "a", "c"}) f.engine->onHello(id, hello(id), 0);
    Run r;
    double t = 1;
    for (int round = 0; round < 2; ++round) {
      auto tasks = actionsOf<SendTask>(f.take());
      // Uploads in reverse dispatch order: the fold order must not follow arrival.
      for (auto it = tasks.rbegin(); it != tasks.rend(); ++it) {
        r.tokens.push_back(it->task.task_token);
        const float v = static_cast<float>(it->client[0] - 'a' + 1);
        f.upload(it->client, it->task.task_token, {v, 0.1f * v, -v}, 1 + round, t++);
      }
    }
    f.take();
    r.commits = actionsOf<CommitRound>(f.log);
    for (const auto& e : actionsOf<RecordEvent>(f.log)) r.event_kinds.push_back(e.event.kind);
    r.params = f.engine->params();
    return r;
  };
  Run a = run(), b = run();
  ASSERT_EQ(a.tokens.size(), 6u);
  ASSERT_EQ(b.tokens.size(), 6u);
  for (size_t i = 0; i < a.tokens.size(); ++i) EXPECT_NE(a.tokens[i], b.tokens[i]);
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(a.event_kinds, b.event_kinds);
  ASSERT_EQ(a.commits.size(), b.commits.size());
  for (size_t i = 0; i < a.commits.size(); ++i) {
    const auto &ra = a.commits[i].round, &rb = b.commits[i].round;
    EXPECT_EQ(ra.round, rb.round);
    EXPECT_EQ(ra.status, rb.status);
    EXPECT_EQ(ra.completed, rb.completed);
    EXPECT_EQ(ra.train_loss, rb.train_loss);
    EXPECT_EQ(ra.model_version, rb.model_version);
    ASSERT_EQ(a.commits[i].updates.size(), b.commits[i].updates.size());
    for (size_t j = 0; j < a.commits[i].updates.size(); ++j) {
      const auto &ua = a.commits[i].updates[j], &ub = b.commits[i].updates[j];
      EXPECT_EQ(ua.client_id, ub.client_id);
      EXPECT_EQ(ua.status, ub.status);
      EXPECT_EQ(ua.weight, ub.weight);
      EXPECT_EQ(ua.end_time, ub.end_time);
    }
    // Rows follow dispatch order (sampled clients sorted by id), not token order.
    for (size_t j = 1; j < a.commits[i].updates.size(); ++j) {
      EXPECT_LT(a.commits[i].updates[j - 1].client_id, a.commits[i].updates[j].client_id);
    }
    if (a.commits[i].checkpoint) {
      ASSERT_TRUE(b.commits[i].checkpoint.has_value());
      EXPECT_EQ(a.commits[i].checkpoint->blob, b.commits[i].checkpoint->blob);
    }
  }
}

TEST(ParticipantTable, IteratesInInsertionOrderWhateverTheTokens) {
  ParticipantTable<std::string> t;
  t.emplace(900, "first");
  t.emplace(5, "second");
  t.emplace(77, "third");
  t.erase(uint64_t{5});
  t.emplace(1, "fourth");
  std::vector<std::string> order;
  for (const auto& [token, v] : t) order.push_back(v);
  EXPECT_EQ(order, (std::vector<std::string>{"first", "third", "fourth"}));
  EXPECT_EQ(t.at(77), "third");
  EXPECT_EQ(t.count(5), 0u);
  EXPECT_EQ(t.find(5), t.end());
  EXPECT_EQ(t.size(), 3u);
}

TEST(EngineOptions, ANoSampleBoundNeedsPartitionSizes) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.max_samples_per_update = 0;
  Status st = checkEngineOptions(o);
  EXPECT_FALSE(st.isOk());
  EXPECT_TRUE(contains(st.message(), "max_samples_per_update")) << st.message();
  o.partition_sizes = {10, 10, 10, 10};
  EXPECT_TRUE(checkEngineOptions(o).isOk());
}

// A client with a valid key inventing task tokens is answered each time, but what the engine
// remembers of them stays bounded, and is forgotten when the round ends.
TEST(RoundEngineLimits, InventedTokensDoNotGrowWhatTheEngineRemembers) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 2;
  Fixture f(o);
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 1u);
  const uint64_t token = tasks[0].task.task_token;
  constexpr uint64_t kInvented = 10000;
  for (uint64_t t = 1; t <= kInvented; ++t) {
    f.engine->onChunk("a", chunkOf(token + t, 0, {1, 1, 1}, true), 100, 1);
  }
  auto actions = f.take();
  EXPECT_EQ(actionsOf<SendError>(actions).size(), kInvented);  // each one answered
  EXPECT_LE(f.engine->answeredTokens(), 4096u);
  EXPECT_GE(f.engine->answeredTokens(), 4000u);
  // One remembered token, sent again, is not answered twice.
  f.engine->onChunk("a", chunkOf(token + 1, 0, {1, 1, 1}, true), 100, 1);
  EXPECT_TRUE(actionsOf<SendError>(f.take()).empty());
  // The round ends: only its own (stale) task token is still remembered once answered.
  f.upload("a", token, {1, 1, 1}, 10, 2);
  f.take();
  EXPECT_LE(f.engine->answeredTokens(), 1u);
}

}  // namespace
}  // namespace fedfleet::engine
