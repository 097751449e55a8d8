// Differentially private FedAvg in the round engine (engine/central_dp.h): clipping to the DP
// clip with the fixed denominator K, the noise's scale (statistically), the epsilon each round
// records, the privacy budget ending the run, adaptive clipping tracking a quantile, the
// engine state, and the combinations refused at start-up.
#include "engine/central_dp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/crypto/keyed_stream.h"
#include "common/privacy/rdp_accountant.h"
#include "engine/engine_state.h"
#include "tests/engine/round_engine_fixture.h"

namespace fedfleet::engine::engine_test {
namespace {

// K clients a round out of 4 partitions, quorum 2, central DP with clip 1.
EngineOptions dpOptions(uint32_t k, double z, uint64_t seed = 1) {
  EngineOptions o = baseOptions(k, k, 2);
  o.dp.central = true;
  o.dp.noise_multiplier = z;
  o.dp.clip_norm = 1;
  o.dp.noise_key = crypto::streamKeyFromSeed("fedfleet dp noise", seed);
  return o;
}

double epsilonAfter(double q, double z, uint64_t steps, double delta = 1e-5) {
  auto spent = privacy::epsilonOf(q, z, steps, delta);
  EXPECT_TRUE(spent.isOk());
  return spent.isOk() ? spent->epsilon : 0;
}

// Starts the run with clients c0..c{n-1}; returns the first round's tasks.
std::vector<SendTask> startWith(Fixture& f, int n) {
  f.engine->start(0);
  for (int i = 0; i < n; ++i) {
    const std::string id = "c" + std::to_string(i);
    f.engine->onHello(id, hello(id), 0);
  }
  return actionsOf<SendTask>(f.take());
}

// Every task's client uploads `delta`; returns the round's commit and the next round's tasks.
std::pair<CommitRound, std::vector<SendTask>> everyoneUploads(Fixture& f,
                                                              const std::vector<SendTask>& tasks,
                                                              const std::vector<float>& delta,
                                                              double now) {
  for (const auto& st : tasks) uploadWhole(*f.engine, st.client, st.task.task_token, delta, now);
  auto actions = f.take();
  auto commits = actionsOf<CommitRound>(actions);
  EXPECT_EQ(commits.size(), 1u);
  return {commits.empty() ? CommitRound{} : commits.back(), actionsOf<SendTask>(actions)};
}

TEST(CentralDp, UpdatesAreClippedToTheDpClipAndAveragedOverTheFixedK) {
  // K = 3; a's delta has norm 5, b's 0.5, c never uploads. Noise 1e-6 x clip: negligible.
  Fixture f(dpOptions(3, 1e-6));
  auto tasks = startWith(f, 3);
  ASSERT_EQ(tasks.size(), 3u);
  std::map<std::string, std::vector<float>> deltas = {{"c0", {3, 4, 0}}, {"c1", {0.3f, 0.4f, 0}}};
  for (const auto& st : tasks) {
    auto it = deltas.find(st.client);
    if (it != deltas.end()) uploadWhole(*f.engine, st.client, st.task.task_token, it->second, 1);
  }
  f.engine->onTick(11);  // past the deadline: c2 is late
  auto commits = actionsOf<CommitRound>(f.take());
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.status, "ok");
  EXPECT_EQ(commits[0].round.completed, 2u);
  EXPECT_EQ(commits[0].round.late + commits[0].round.dropped, 1u);  // c2 (silent: dropped)
  // By hand: (3, 4, 0) clipped to (0.6, 0.8, 0); (0.3, 0.4, 0) unchanged; their sum over K = 3,
  // not over the 2 that came: (0.3, 0.4, 0). (Without DP the norm bound, 5 x the lower median
  // 0.5, would have scaled a's to norm 2.5 and the mean of the two would be (0.9, 1.2, 0).)
  const auto& x = f.engine->params();
  EXPECT_NEAR(x[0], 0.3, 1e-4);
  EXPECT_NEAR(x[1], 0.4, 1e-4);
  EXPECT_NEAR(x[2], 0.0, 1e-4);
  ASSERT_TRUE(commits[0].round.dp_clip.has_value());
  EXPECT_EQ(*commits[0].round.dp_clip, 1.0);
  for (const auto& u : commits[0].updates) {
    if (u.status == "completed") EXPECT_DOUBLE_EQ(u.weight, 1.0 / 3) << u.client_id;
  }
}

TEST(CentralDp, TheNoiseOnTheAverageHasStandardDeviationZTimesClipOverK) {
  // Two clients upload zeros: the model after a round is the noise over K alone, N(0, (z C /
  // K)^2) in every coordinate: z = 3, C = 1, K = 2 gives 1.5.
  constexpr size_t kP = 20000;
  EngineOptions o = dpOptions(2, 3.0);
  Fixture f(o, std::vector<float>(kP, 0.0f));
  auto tasks = startWith(f, 2);
  ASSERT_EQ(tasks.size(), 2u);
  auto [first, next] = everyoneUploads(f, tasks, std::vector<float>(kP, 0.0f), 1);
  const std::vector<float> after1 = f.engine->params();
  double sum = 0, sq = 0;
  for (float v : after1) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double mean = sum / kP;
  const double sd = std::sqrt(sq / kP - mean * mean);
  EXPECT_NEAR(mean, 0, 5 * 1.5 / std::sqrt(kP));
  EXPECT_NEAR(sd, 1.5, 1.5 * 5 / std::sqrt(2.0 * kP));  // five standard errors (3.5%)

  // Round 2: fresh noise, uncorrelated with round 1's.
  ASSERT_EQ(next.size(), 2u);
  auto [second, unused] = everyoneUploads(f, next, std::vector<float>(kP, 0.0f), 2);
  double cross = 0, sq2 = 0;
  for (size_t i = 0; i < kP; ++i) {
    const double d = f.engine->params()[i] - after1[i];
    cross += d * after1[i];
    sq2 += d * d;
  }
  EXPECT_NEAR(cross / std::sqrt(sq * sq2), 0, 5 / std::sqrt(kP));
  EXPECT_NEAR(std::sqrt(sq2 / kP), 1.5, 1.5 * 5 / std::sqrt(2.0 * kP));

  // Each round records the epsilon spent so far: q = K / N = 2 / 4, z = 3.
  ASSERT_TRUE(first.round.dp_epsilon && second.round.dp_epsilon);
  EXPECT_DOUBLE_EQ(*first.round.dp_epsilon, epsilonAfter(0.5, 3.0, 1));
  EXPECT_DOUBLE_EQ(*second.round.dp_epsilon, epsilonAfter(0.5, 3.0, 2));
  EXPECT_GT(*second.round.dp_epsilon, *first.round.dp_epsilon);

  // The same key gives the same noise; another key other noise.
  Fixture again(o, std::vector<float>(kP, 0.0f));
  everyoneUploads(again, startWith(again, 2), std::vector<float>(kP, 0.0f), 1);
  EXPECT_EQ(again.engine->params(), after1);
  Fixture other(dpOptions(2, 3.0, 2), std::vector<float>(kP, 0.0f));
  everyoneUploads(other, startWith(other, 2), std::vector<float>(kP, 0.0f), 1);
  EXPECT_NE(other.engine->params(), after1);
}

TEST(CentralDp, AFailedRoundSpendsNothing) {
  Fixture f(dpOptions(2, 1.0));
  auto tasks = startWith(f, 2);
  uploadWhole(*f.engine, tasks[0].client, tasks[0].task.task_token, {1, 0, 0}, 1);
  f.engine->onTick(11);  // one update, quorum 2: failed
  auto commits = actionsOf<CommitRound>(f.take());
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.status, "failed");
  ASSERT_TRUE(commits[0].round.dp_epsilon.has_value());
  EXPECT_EQ(*commits[0].round.dp_epsilon, 0.0);
  EXPECT_EQ(f.engine->params(), (std::vector<float>{0, 0, 0}));
}

TEST(CentralDp, TheBudgetEndsTheRunBeforeEpsilonExceedsIt) {
  // q = 2 / 4, z = 1: the target lies between epsilon after 3 and after 4 rounds.
  EngineOptions o = dpOptions(2, 1.0);
  o.rounds = 10;
  const double e3 = epsilonAfter(0.5, 1.0, 3), e4 = epsilonAfter(0.5, 1.0, 4);
  ASSERT_LT(e3, e4);
  o.dp.target_epsilon = (e3 + e4) / 2;
  ASSERT_TRUE(checkEngineOptions(o).isOk());
  Fixture f(o);
  auto tasks = startWith(f, 2);
  EXPECT_EQ(eventsOf(f.log, "privacy_budget"), 1);
  std::vector<CommitRound> rounds;
  for (int r = 1; r <= 10 && !tasks.empty(); ++r) {
    auto [commit, next] = everyoneUploads(f, tasks, {0.1f, 0, 0}, r);
    rounds.push_back(commit);
    tasks = next;
  }
  ASSERT_EQ(rounds.size(), 3u);
  EXPECT_DOUBLE_EQ(*rounds.back().round.dp_epsilon, e3);
  EXPECT_LE(*rounds.back().round.dp_epsilon, o.dp.target_epsilon);
  auto finished = actionsOf<RunFinished>(f.log);
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_TRUE(finished[0].ok);
}

TEST(CentralDp, AdaptiveClippingTracksTheTargetQuantileOfTheNorms) {
  // Norms uniform on [0, 10]: the gamma quantile is 10 gamma. K = 100 a round, z = 1, sigma_b
  // = K / 20 = 5, eta = 0.2, from C = 1.
  for (double gamma : {0.5, 0.9}) {
    EngineOptions o = dpOptions(100, 1.0);
    o.num_partitions = 100000;
    o.dp.delta = 1e-6;
    o.dp.adaptive_clip = true;
    o.dp.target_quantile = gamma;
    ASSERT_TRUE(validateDpOptions(o).isOk());
    CentralDp dp(o);
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<double> norm(0, 10);
    double late_sum = 0;
    for (uint32_t round = 1; round <= 400; ++round) {
      for (int k = 0; k < 100; ++k) dp.observe(norm(rng));
      dp.stepTaken(round);
      if (round > 300) late_sum += dp.clip();
    }
    EXPECT_NEAR(late_sum / 100, 10 * gamma, 0.1 * 10 * gamma) << "gamma " << gamma;
    EXPECT_EQ(dp.steps(), 400u);
  }
}

TEST(CentralDp, OneAdaptiveStepFollowsTheGeometricRuleAndTheNoiseSplitsTheBudget) {
  EngineOptions o = dpOptions(10, 1e-9);
  o.dp.adaptive_clip = true;
  o.dp.count_stddev = 1e-6;  // a negligible count noise
  o.dp.target_quantile = 0.5;
  o.dp.clip_lr = 0.2;
  CentralDp dp(o);
  for (double n : {0.1, 0.2, 0.5, 0.9, 1.0, 0.3, 0.7, 1.5, 2.0, 3.0}) dp.observe(n);  // 7 <= 1
  dp.stepTaken(1);
  EXPECT_NEAR(dp.clip(), std::exp(-0.2 * (0.7 - 0.5)), 1e-7);

  // z = 1, sigma_b = 1: z_D = (1 - 1/4)^(-1/2).
  EngineOptions split = dpOptions(10, 1.0);
  split.dp.adaptive_clip = true;
  split.dp.count_stddev = 1;
  EXPECT_NEAR(CentralDp(split).updateNoiseMultiplier(), 1 / std::sqrt(0.75), 1e-12);
  EXPECT_EQ(CentralDp(dpOptions(10, 1.0)).updateNoiseMultiplier(), 1.0);
}

TEST(CentralDp, TheStateKeepsClipAndStepsAcrossARestart) {
  EngineOptions o = dpOptions(2, 1.0);
  o.dp.adaptive_clip = true;
  o.dp.count_stddev = 1;
  Fixture f(o);
  auto [commit, next] = everyoneUploads(f, startWith(f, 2), {5, 0, 0}, 1);
  const std::string state = f.engine->saveState();
  ASSERT_TRUE(commit.round.dp_clip.has_value());

  EngineOptions resumed = o;
  resumed.first_round = 2;
  Fixture g(resumed);
  ASSERT_TRUE(g.engine->loadState(state).isOk());
  auto [second, unused] = everyoneUploads(g, startWith(g, 2), {5, 0, 0}, 2);
  EXPECT_EQ(second.round.round, 2u);
  EXPECT_DOUBLE_EQ(*second.round.dp_epsilon, epsilonAfter(0.5, 1.0, 2));
  EXPECT_NE(*second.round.dp_clip, 1.0);  // round 1 moved it
  EXPECT_EQ(
      *second.round.dp_clip, *[&] {
        CentralDp dp(o);
        // The privacy section: the sixth, after generator, selector, optimiser, control and
        // partitions (this run has no blocks).
        auto reader = EngineStateReader::open(state);
        EXPECT_TRUE(reader.isOk());
        for (const char* before : {"generator", "selector", "optimiser", "control", "partitions"}) {
          EXPECT_TRUE(reader->section(before).isOk());
        }
        auto privacy = reader->section("privacy");
        EXPECT_TRUE(privacy.isOk());
        EXPECT_EQ(privacy->size(), 16u);
        EXPECT_TRUE(dp.loadState(*privacy).isOk());
        return std::optional<double>(dp.clip());
      }());

  // A state saved without differential privacy does not resume a private run.
  EngineOptions plain = baseOptions(2, 2, 2);
  Fixture p(plain);
  Fixture h(resumed);
  Status st = h.engine->loadState(p.engine->saveState());
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("no privacy section"), std::string::npos) << st.message();
  // A damaged section is refused.
  CentralDp dp(o);
  EXPECT_EQ(dp.loadState("short").code(), StatusCode::kCorrupt);
  std::string zero_clip(16, '\0');
  EXPECT_EQ(dp.loadState(zero_clip).code(), StatusCode::kCorrupt);
}

TEST(CentralDp, CombinationsThatCannotWorkAreRefusedWithTheReason) {
  struct Case {
    std::function<void(EngineOptions&)> edit;
    std::string says;
  };
  const Case cases[] = {
      {[](EngineOptions& o) { o.aggregator = AggregatorKind::kFedNova; }, "fedavg"},
      {[](EngineOptions& o) { o.aggregator = AggregatorKind::kMedian; }, "fedavg"},
      {[](EngineOptions& o) { o.async = true; }, "policy.mode"},
      {[](EngineOptions& o) { o.clip_norm = 2; }, "aggregation.clip_norm = 0"},
      {[](EngineOptions& o) { o.dp.noise_multiplier = 0; }, "noise_multiplier"},
      {[](EngineOptions& o) { o.dp.clip_norm = -1; }, "dp.clip_norm"},
      {[](EngineOptions& o) { o.dp.population = 1; }, "dp.population"},
      {[](EngineOptions& o) { o.dp.delta = 0.3; }, "below 1 / dp.population"},
      {[](EngineOptions& o) {
         o.dp.adaptive_clip = true;
         o.dp.count_stddev = 0.4;
       },
       "must exceed dp.noise_multiplier / 2"},
      {[](EngineOptions& o) { o.dp.target_epsilon = 1e-6; }, "allows no round"},
      {[](EngineOptions& o) {
         o.dp.adaptive_clip = true;
         o.dp.count_stddev = 1;
         o.secagg.enabled = true;  // the clients clip: no norm to count
       },
       "adaptive_clip' is not available with dp.mode = \"central\" under secure aggregation"},
      {[](EngineOptions& o) { o.blocks.count = 2; }, "[blocks]"},
  };
  for (const auto& c : cases) {
    EngineOptions o = dpOptions(2, 1.0);
    ASSERT_TRUE(validateDpOptions(o).isOk());
    c.edit(o);
    Status st = validateDpOptions(o);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.says;
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace fedfleet::engine::engine_test
