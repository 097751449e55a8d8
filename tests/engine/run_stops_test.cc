// No run waits for ever: the engine ends a run that cannot go on, with its cause and the key
// that changes it (a cohort that never forms, rounds that keep failing, asynchronous rounds
// with no client left), and a driver that wakes it exactly when it asked to be woken sees that
// happen at once instead of waking it again and again at the same time.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "engine/round_engine.h"
#include "tests/engine/round_engine_fixture.h"

namespace fedfleet::engine {
namespace {

using namespace engine_test;

// Ticks `engine` the way the simulator does: always exactly at nextWakeup(). Returns how many
// ticks it took until the run finished (or `limit` when it never did).
int tickAtWakeups(RoundEngine& engine, int limit) {
  for (int i = 0; i < limit; ++i) {
    if (engine.finished()) return i;
    const auto wake = engine.nextWakeup();
    if (!wake) return limit;
    engine.onTick(*wake);
  }
  return limit;
}

TEST(RunStops, AWaitForTheCohortEndsAtTheWakeupTheEngineAskedFor) {
  EngineOptions o = baseOptions(2, 2, 1);
  o.liveness_s = 0;  // as in the simulator
  // A start time whose sum with wait_clients_s is not exact in binary: (0.1 + 100) - 0.1 is
  // below 100, so a check written as "now - since > wait" never held at the wakeup itself.
  RoundEngine engine(o, {0, 0, 0});
  engine.start(0.1);
  engine.onEvaluated(0, EvalOutcome{1, 0.1}, 0.1);
  engine.onHello("a", hello("a"), 0.1);
  engine.takeActions();
  EXPECT_EQ(tickAtWakeups(engine, 3), 1);
  ASSERT_TRUE(engine.finished());
  bool found = false;
  for (const auto& done : actionsOf<RunFinished>(engine.takeActions())) {
    found = true;
    EXPECT_FALSE(done.ok);
    EXPECT_NE(done.message.find("only 1 of 2 clients available"), std::string::npos)
        << done.message;
    EXPECT_NE(done.message.find("coordinator.wait_clients_s"), std::string::npos);
    EXPECT_NE(done.message.find("coordinator.min_clients"), std::string::npos);
  }
  EXPECT_TRUE(found);
}

// One round in which client "a" sends a non-finite update (rejected), or a finite one.
void roundOf(Fixture& f, bool finite, double t) {
  const auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 1u);
  const float v = finite ? 0.5f : NAN;
  f.upload("a", tasks[0].task.task_token, {v, v, v}, 2, t);
}

// An engine of `rounds` rounds, K = 1, that client "a" has joined.
std::unique_ptr<Fixture> oneClient(uint32_t rounds, uint32_t max_failed_rounds) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = rounds;
  o.max_failed_rounds = max_failed_rounds;
  auto f = std::make_unique<Fixture>(o);
  f->engine->start(0);
  f->engine->onHello("a", hello("a"), 0);
  return f;
}

std::vector<CommitRound> trainingCommits(const std::vector<Action>& log) {
  std::vector<CommitRound> out;
  for (const auto& c : actionsOf<CommitRound>(log)) {
    if (c.round.round > 0) out.push_back(c);
  }
  return out;
}

TEST(RunStops, RoundsThatKeepFailingEndTheRunWithTheLatestReason) {
  auto run = oneClient(10, 3);
  Fixture& f = *run;
  for (int r = 1; r <= 3; ++r) roundOf(f, /*finite=*/false, r);
  f.take();
  ASSERT_TRUE(f.engine->finished());
  const auto done = actionsOf<RunFinished>(f.log);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok);
  const std::string& m = done[0].message;
  EXPECT_NE(m.find("3 rounds in a row failed (coordinator.max_failed_rounds = 3)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("round 3: 0 updates, quorum 1"), std::string::npos) << m;
  EXPECT_NE(m.find("1 update rejected"), std::string::npos) << m;
  EXPECT_NE(m.find("NaN or infinity"), std::string::npos) << m;
  EXPECT_NE(m.find("diverged (lower train.lr"), std::string::npos) << m;
  // Exactly the three failed rounds are recorded; no fourth task went out.
  const auto commits = trainingCommits(f.log);
  ASSERT_EQ(commits.size(), 3u);
  for (const auto& c : commits) EXPECT_EQ(c.round.status, "failed");
  EXPECT_EQ(actionsOf<SendTask>(f.log).size(), 3u);
  EXPECT_EQ(eventsOf(f.log, "run_failed"), 1);
}

TEST(RunStops, AnOkRoundStartsTheCountAgain) {
  auto run = oneClient(5, 2);
  Fixture& f = *run;
  roundOf(f, false, 1);
  roundOf(f, true, 2);  // ok: the count starts again
  roundOf(f, false, 3);
  roundOf(f, true, 4);
  roundOf(f, false, 5);
  f.take();
  const auto done = actionsOf<RunFinished>(f.log);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].ok) << done[0].message;  // all 5 rounds ran: never 2 failures in a row
  EXPECT_EQ(trainingCommits(f.log).size(), 5u);
}

TEST(RunStops, ZeroMeansRoundsMayFailForEver) {
  auto run = oneClient(6, 0);
  Fixture& f = *run;
  for (int r = 1; r <= 6; ++r) roundOf(f, false, r);
  f.take();
  EXPECT_EQ(trainingCommits(f.log).size(), 6u);
  const auto done = actionsOf<RunFinished>(f.log);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].ok);  // every round ran; the run itself says it ended
}

TEST(RunStops, AsynchronousRoundsWithNoClientLeftEndAfterWaitClients) {
  EngineOptions o = asyncOptions();  // C = 3, needs 3 to start
  o.liveness_s = 0;
  Fixture f(o);
  f.engine->start(0);
  for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
  ASSERT_EQ(actionsOf<SendTask>(f.take()).size(), 3u);
  for (const char* id : {"a", "b", "c"}) f.engine->onBye(id, 1);  // every client leaves
  f.take();
  ASSERT_FALSE(f.engine->finished());
  const auto wake = f.engine->nextWakeup();
  ASSERT_TRUE(wake);
  EXPECT_DOUBLE_EQ(*wake, 1 + o.wait_clients_s);
  f.engine->onTick(*wake - 1);  // not yet
  EXPECT_FALSE(f.engine->finished());
  EXPECT_EQ(tickAtWakeups(*f.engine, 3), 1);
  f.take();
  const auto done = actionsOf<RunFinished>(f.log);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok);
  EXPECT_NE(done[0].message.find("no task in flight and no client"), std::string::npos)
      << done[0].message;
}

TEST(RunStops, AClientThatComesBackKeepsAnAsynchronousRunGoing) {
  EngineOptions o = asyncOptions();
  o.liveness_s = 0;
  Fixture f(o);
  f.engine->start(0);
  for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
  f.take();
  for (const char* id : {"a", "b", "c"}) f.engine->onBye(id, 1);
  f.take();
  f.engine->onHello("a", hello("a"), 50);  // back before wait_clients_s
  EXPECT_EQ(actionsOf<SendTask>(f.take()).size(), 1u);
  f.engine->onTick(1 + o.wait_clients_s + 1);
  EXPECT_FALSE(f.engine->finished());
}

}  // namespace
}  // namespace fedfleet::engine
