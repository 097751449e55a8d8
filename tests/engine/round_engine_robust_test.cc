// The norm bound over rounds (protocol step 8a): its reference comes from the rounds settled
// before, so a persistent attacker cannot walk it up with the damage its clipped updates do;
// clients flagged round after round are quarantined; a run whose rounds keep failing stops
// naming the suspects; and reference and quarantine survive a resume.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/round_engine.h"
#include "tests/engine/round_engine_fixture.h"

namespace fedfleet::engine {
namespace {

using namespace engine_test;

std::vector<std::string> detailsOf(const std::vector<Action>& actions, const std::string& kind,
                                   const std::string& client) {
  std::vector<std::string> out;
  for (const auto& e : actionsOf<RecordEvent>(actions)) {
    if (e.event.kind == kind && e.event.client_id == client) out.push_back(e.event.detail);
  }
  return out;
}

double norm(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += double{v} * v;
  return std::sqrt(s);
}

// Honest clients a, b, c send -x + 0.1 e_i: a pull back to the origin, as a gradient step on
// |x|^2 would, so the more the model is damaged the larger their norms. Client d sends 1e20
// everywhere. `rounds` rounds are driven; per round the clients sampled, and |x| after it.
struct AttackRun {
  std::vector<std::set<std::string>> sampled;
  std::vector<double> model_norm;
  std::vector<std::optional<double>> bound_before;  // normBound() when the round's tasks went out
};

AttackRun runAttack(Fixture& f, uint32_t rounds, const std::vector<std::string>& ids = {"a", "b", "c", "d"}) {
  AttackRun run;
  f.engine->start(0);
  for (const auto& id : ids) f.engine->onHello(id, hello(id), 0);
  double t = 1;
  // (A round's end dispatches the next round's tasks at once: they come with its actions.)
  auto tasks = actionsOf<SendTask>(f.take());
  for (uint32_t r = 1; r <= rounds && !f.engine->finished(); ++r) {
    run.bound_before.push_back(f.engine->normBound());
    const std::vector<float> x = f.engine->params();
    std::set<std::string> who;
    for (const auto& task : tasks) {
      who.insert(task.client);
      std::vector<float> delta(3, 1e20f);
      if (task.client != "d") {
        const int i = task.client[0] - 'a';
        for (int j = 0; j < 3; ++j) delta[j] = -x[j] + (j == i ? 0.1f : 0.0f);
      }
      f.upload(task.client, task.task.task_token, delta, 1, t);
    }
    t += 1;
    tasks = actionsOf<SendTask>(f.take());
    run.sampled.push_back(who);
    run.model_norm.push_back(norm(f.engine->params()));
  }
  return run;
}

// The attack that walked the old bound (5 x the round's median: the clipped update's damage
// grew the honest norms, which grew the bound, 1.5 x a round here). With the defaults the
// attacker is clipped in rounds 1 and 2, quarantined for 10 rounds, clipped once more in
// rounds 13 and 24 and quarantined again at once: the model stays near the origin.
TEST(RoundEngineRobust, APersistentAttackerIsClippedThenQuarantinedAndTheModelStaysPut) {
  EngineOptions o = baseOptions(4, 4, 2);
  o.rounds = 30;
  Fixture f(o, {0, 0, 0});
  const AttackRun run = runAttack(f, 30);
  ASSERT_EQ(run.sampled.size(), 30u);
  for (uint32_t r = 1; r <= 30; ++r) {
    const bool d_in = run.sampled[r - 1].count("d") > 0;
    EXPECT_EQ(d_in, r == 1 || r == 2 || r == 13 || r == 24) << "round " << r;
    EXPECT_EQ(run.sampled[r - 1].size(), d_in ? 4u : 3u) << "round " << r;
    EXPECT_LT(run.model_norm[r - 1], 0.25) << "round " << r;
  }
  EXPECT_EQ(detailsOf(f.log, "update_clipped", "d").size(), 4u);
  const auto quarantined = detailsOf(f.log, "client_quarantined", "d");
  ASSERT_EQ(quarantined.size(), 3u);
  EXPECT_EQ(quarantined[0],
            "round 2: the norm bound clipped or rejected its updates in 2 of its rounds in a "
            "row; not sampled before round 13 (aggregation.quarantine_after = 2, "
            "aggregation.quarantine_rounds = 10)");
  EXPECT_NE(quarantined[1].find("round 13: "), std::string::npos) << quarantined[1];
  EXPECT_NE(quarantined[1].find("in 3 of its rounds in a row; not sampled before round 24"),
            std::string::npos)
      << quarantined[1];
  // No honest client was ever flagged.
  for (const char* id : {"a", "b", "c"}) {
    EXPECT_TRUE(detailsOf(f.log, "update_clipped", id).empty()) << id;
    EXPECT_TRUE(detailsOf(f.log, "client_quarantined", id).empty()) << id;
  }
}

// Without the quarantine, the attacker is clipped every round. A reference that is the last
// round's median and may grow without bound (norm_window 1, norm_growth 1e9) follows the damage
// and the model runs away; the default reference (median over 5 rounds, growth 2) lags the
// damage, and the walk is 20 times slower.
TEST(RoundEngineRobust, TheReferenceFromEarlierRoundsSlowsAWalkingAttackerWithoutQuarantine) {
  EngineOptions o = baseOptions(4, 4, 2);
  o.rounds = 30;
  o.quarantine_after = 0;
  Fixture slow(o, {0, 0, 0});
  const AttackRun windowed = runAttack(slow, 30);
  o.norm_window = 1;
  o.norm_growth = 1e9;
  Fixture fast(o, {0, 0, 0});
  const AttackRun follows = runAttack(fast, 30);
  ASSERT_EQ(windowed.model_norm.size(), 30u);
  ASSERT_EQ(follows.model_norm.size(), 30u);
  EXPECT_GT(follows.model_norm.back(), 50);
  EXPECT_LT(windowed.model_norm.back(), 6);
  EXPECT_TRUE(detailsOf(slow.log, "client_quarantined", "d").empty());
}

// Honest updates whose norm grows ten-fold every round (a model being damaged): each is
// clipped, and the bound grows by at most norm_growth = 2 a round. By hand, norms 10^r:
//   round 1: own median 10, bound 50; reference after it 10
//   round 2: all at the bound 50; medians [10, 50] -> 10; bound 50
//   round 3: medians [10, 50, 50] -> 50, capped at 2 x 10 = 20; bound 100
//   round 4: observed 100; medians [10, 50, 50, 100] -> 50, capped at 40; bound 200
//   round 5: observed 200; medians [10, 50, 50, 100, 200] -> 50; bound 250
//   round 6: observed 250; medians [50, 50, 100, 200, 250] -> 100; bound 500
TEST(RoundEngineRobust, TheBoundGrowsAtMostNormGrowthARound) {
  EngineOptions o = baseOptions(3, 3, 2);
  o.rounds = 7;
  o.quarantine_after = 0;  // every update is flagged here; this test is about the bound
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
  std::vector<std::optional<double>> bounds;
  double scale = 1;
  for (int r = 1; r <= 6; ++r) {
    scale *= 10;
    auto tasks = actionsOf<SendTask>(f.take());
    ASSERT_EQ(tasks.size(), 3u) << "round " << r;
    bounds.push_back(f.engine->normBound());
    for (const auto& task : tasks) {
      std::vector<float> delta(3, 0.0f);
      delta[task.client[0] - 'a'] = static_cast<float>(scale);
      f.upload(task.client, task.task.task_token, delta, 1, r);
    }
  }
  f.take();
  bounds.push_back(f.engine->normBound());
  EXPECT_FALSE(bounds[0].has_value()) << "the first round is judged against its own median";
  const std::vector<double> expected = {50, 50, 100, 200, 250, 500};
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_TRUE(bounds[i + 1].has_value());
    EXPECT_DOUBLE_EQ(*bounds[i + 1], expected[i]) << "after round " << i + 1;
  }
  const auto clipped = detailsOf(f.log, "update_clipped", "a");
  ASSERT_EQ(clipped.size(), 5u);  // rounds 2 to 6
  EXPECT_EQ(clipped[0],
            "round 2: norm 100.000000 clipped to 50.000000 (aggregation.norm_bound 5.000000 x "
            "the reference norm 10.000000)");
}

// Two clients and a quorum of 2: the quarantined attacker is sampled all the same, since the
// round could not reach its quorum without it (and the norm bound still clips it).
TEST(RoundEngineRobust, AQuarantineNeverKeepsARoundFromItsQuorum) {
  EngineOptions o = baseOptions(2, 2, 2);
  o.rounds = 4;
  Fixture f(o, {0, 0, 0});
  const AttackRun run = runAttack(f, 4, {"a", "d"});
  ASSERT_EQ(run.sampled.size(), 4u);
  for (const auto& who : run.sampled) EXPECT_EQ(who, (std::set<std::string>{"a", "d"}));
  EXPECT_FALSE(detailsOf(f.log, "client_quarantined", "d").empty());
  EXPECT_EQ(detailsOf(f.log, "update_clipped", "d").size(), 4u);
}

// A stop after max_failed_rounds names the client whose updates were refused in those rounds.
// Quorum 4 of 4 with d's 1e20 rejected: every round fails.
TEST(RoundEngineRobust, AStopAfterFailedRoundsNamesTheSuspectClients) {
  EngineOptions o = baseOptions(4, 4, 4);
  o.rounds = 10;
  o.max_failed_rounds = 3;
  o.norm_bound_action = NormBoundAction::kReject;
  Fixture f(o, {0, 0, 0});
  runAttack(f, 10);
  ASSERT_TRUE(f.engine->finished());
  const auto done = actionsOf<RunFinished>(f.log);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok);
  EXPECT_NE(done[0].message.find("3 rounds in a row failed (coordinator.max_failed_rounds = 3)"),
            std::string::npos)
      << done[0].message;
  EXPECT_NE(done[0].message.find(
                ". Suspect clients, by updates clipped or rejected in these rounds: d (3). Fix "
                "the cause"),
            std::string::npos)
      << done[0].message;
}

// The reference, the strikes and the quarantine are engine state: a run resumed after round 2
// (d quarantined until round 13) judges and samples as the uninterrupted run does.
TEST(RoundEngineRobust, ReferenceAndQuarantineSurviveAResume) {
  EngineOptions o = baseOptions(4, 4, 2);
  o.rounds = 2;
  Fixture f(o, {0, 0, 0});
  runAttack(f, 2);
  ASSERT_TRUE(f.engine->finished());
  ASSERT_TRUE(f.engine->normBound().has_value());
  const std::string state = f.engine->saveState();

  o.rounds = 4;
  o.first_round = 3;
  o.model_version = f.engine->modelVersion();
  RoundEngine resumed(o, f.engine->params());
  ASSERT_TRUE(resumed.loadState(state).isOk());
  EXPECT_EQ(resumed.normBound(), f.engine->normBound());
  EXPECT_TRUE(resumed.quarantined("d"));
  EXPECT_FALSE(resumed.quarantined("a"));
  resumed.start(10);
  for (const char* id : {"a", "b", "c", "d"}) resumed.onHello(id, hello(id), 10);
  std::set<std::string> who;
  for (const auto& task : actionsOf<SendTask>(resumed.takeActions())) who.insert(task.client);
  EXPECT_EQ(who, (std::set<std::string>{"a", "b", "c"}));

  // A state saved before these sections existed (generator to partitions) still loads: both
  // start afresh.
  auto reader = EngineStateReader::open(state);
  ASSERT_TRUE(reader.isOk());
  EngineStateWriter old;
  for (const char* what : {"generator", "selector", "optimiser", "control", "partitions"}) {
    auto section = reader->section(what);
    ASSERT_TRUE(section.isOk()) << what;
    old.section(*section);
  }
  RoundEngine fresh(o, f.engine->params());
  EXPECT_TRUE(fresh.loadState(std::move(old).finish()).isOk());
  EXPECT_FALSE(fresh.normBound().has_value());
  EXPECT_FALSE(fresh.quarantined("d"));
}

}  // namespace
}  // namespace fedfleet::engine
