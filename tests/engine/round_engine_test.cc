#include "engine/round_engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "common/compress/codec.h"
#include "common/crypto/sha256.h"
#include "tests/engine/round_engine_fixture.h"

namespace fedfleet::engine {
namespace {

using namespace engine_test;

TEST(RoundEngine, Round0IsTheInitialEvaluation) {
  EngineOptions o = baseOptions(1, 1, 1);
  RoundEngine engine(o, {1, 2});
  engine.start(100);
  auto first = engine.takeActions();
  EXPECT_TRUE(actionsOf<CommitRound>(first).empty());  // not before the evaluation
  auto evals = actionsOf<Evaluate>(first);
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_EQ(evals[0].round, 0u);
  EXPECT_EQ(*evals[0].params, (std::vector<float>{1, 2}));
  engine.onEvaluated(0, EvalOutcome{3.0, 0.25}, 101);
  auto commits = actionsOf<CommitRound>(engine.takeActions());
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.round, 0u);
  EXPECT_EQ(commits[0].round.status, "initial");
  EXPECT_DOUBLE_EQ(*commits[0].round.test_loss, 3.0);
  EXPECT_DOUBLE_EQ(*commits[0].round.test_accuracy, 0.25);
}

TEST(RoundEngine, WaitsForMinClientsThenSamplesKWithDistinctTokens) {
  Fixture f(baseOptions(2, 3, 1));
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 1);
  f.engine->onHello("b", hello("b"), 1);
  EXPECT_TRUE(actionsOf<SendTask>(f.take()).empty());
  f.engine->onHello("c", hello("c"), 2);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_NE(tasks[0].client, tasks[1].client);
  EXPECT_NE(tasks[0].task.task_token, tasks[1].task.task_token);
  EXPECT_EQ(tasks[0].task.round, 1u);
  EXPECT_EQ(tasks[0].task.run_id, 7u);
  // The model goes as one shared buffer, the same for every task of the round.
  EXPECT_TRUE(tasks[0].task.model_bytes.empty());
  ASSERT_NE(tasks[0].model_bytes, nullptr);
  EXPECT_EQ(tasks[0].model_bytes, tasks[1].model_bytes);
  EXPECT_EQ(tasks[0].model_bytes->size(), 3 * sizeof(float));
  EXPECT_EQ(tasks[0].task.model_sha256, crypto::sha256(*tasks[0].model_bytes));
  EXPECT_DOUBLE_EQ(tasks[0].task.deadline_s, 10);
  // Clients were assigned partitions 0, 1, 2 in join order; each task names its client's.
  for (const auto& t : tasks) {
    EXPECT_EQ(t.task.data.index, static_cast<uint32_t>(t.client[0] - 'a'));
    EXPECT_EQ(t.task.data.num_partitions, 4u);
  }
}

TEST(RoundEngine, SampleWeightedFedAvgMatchesHandComputedValues) {
  Fixture f(baseOptions(2, 2, 2), {1, 1, 1});
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  f.engine->onHello("b", hello("b"), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 2u);
  std::map<std::string, uint64_t> token;
  for (auto& t : tasks) token[t.client] = t.task.task_token;
  // n_a = 1, D_a = (1, 2, 3); n_b = 3, D_b = (3, 4, 5):
  // x = 1 + (1*D_a + 3*D_b) / 4 = (1 + 2.5, 1 + 3.5, 1 + 4.5).
  f.upload("a", token["a"], {1, 2, 3}, 1, 1);
  f.upload("b", token["b"], {3, 4, 5}, 3, 2);
  auto commits = actionsOf<CommitRound>(f.take());
  ASSERT_EQ(commits.size(), 1u);
  const auto& r = commits[0].round;
  EXPECT_EQ(r.status, "ok");
  EXPECT_EQ(r.completed, 2u);
  EXPECT_EQ(r.model_version, 1u);
  EXPECT_EQ(r.bytes_up, 2u * (2 * 100 + 50));
  EXPECT_FLOAT_EQ(f.engine->params()[0], 3.5f);
  EXPECT_FLOAT_EQ(f.engine->params()[1], 4.5f);
  EXPECT_FLOAT_EQ(f.engine->params()[2], 5.5f);
  ASSERT_EQ(commits[0].updates.size(), 2u);
  for (const auto& u : commits[0].updates) {
    EXPECT_EQ(u.status, "completed");
    EXPECT_DOUBLE_EQ(u.weight, u.client_id == "a" ? 0.25 : 0.75);
  }
  ASSERT_TRUE(commits[0].checkpoint.has_value());
  std::vector<float> cp(3);
  std::memcpy(cp.data(), commits[0].checkpoint->blob.data(), 12);
  EXPECT_EQ(cp, f.engine->params());
  // The next round starts at once and sends the new model.
  auto next = actionsOf<SendTask>(f.log);
  ASSERT_EQ(next.size(), 4u);
  std::vector<float> sent(3);
  std::memcpy(sent.data(), next[2].model_bytes->data(), 12);
  EXPECT_EQ(sent, f.engine->params());
  EXPECT_EQ(next[2].task.model_version, 1u);
  EXPECT_EQ(next[2].task.model_sha256, crypto::sha256(*next[2].model_bytes));
  // A new version is a new buffer; round 1's, which sent tasks may still reference, is intact.
  EXPECT_NE(next[2].model_bytes, next[0].model_bytes);
  std::vector<float> first(3);
  std::memcpy(first.data(), next[0].model_bytes->data(), 12);
  EXPECT_EQ(first, (std::vector<float>{1, 1, 1}));
}

TEST(RoundEngine, NextRoundIsDispatchedBeforeThePreviousModelIsEvaluated) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 2;
  RoundEngine engine(o, {0, 0, 0});
  engine.start(0);
  engine.onEvaluated(0, EvalOutcome{1, 0.1}, 0);
  engine.onHello("a", hello("a"), 0);
  auto tasks = actionsOf<SendTask>(engine.takeActions());
  ASSERT_EQ(tasks.size(), 1u);
  const uint64_t token = tasks[0].task.task_token;
  wire::Chunk c = chunkOf(token, 0, {1, 2, 3}, true, 10);
  engine.onChunk("a", c, 12, 1);
  wire::Summary s;
  s.task_token = token;
  s.n_samples = 10;
  s.steps = 3;
  engine.onSummary("a", s, 8, 1);
  auto actions = engine.takeActions();
  // Round 2's task, then the evaluation of round 1's model; no commit yet.
  ASSERT_GE(actions.size(), 2u);
  size_t task_at = actions.size(), eval_at = actions.size();
  for (size_t i = 0; i < actions.size(); ++i) {
    if (std::holds_alternative<SendTask>(actions[i])) task_at = std::min(task_at, i);
    if (std::holds_alternative<Evaluate>(actions[i])) eval_at = std::min(eval_at, i);
  }
  ASSERT_LT(task_at, actions.size());
  ASSERT_LT(eval_at, actions.size());
  EXPECT_LT(task_at, eval_at);
  EXPECT_TRUE(actionsOf<CommitRound>(actions).empty());
  EXPECT_EQ(*std::get<Evaluate>(actions[eval_at]).params, (std::vector<float>{1, 2, 3}));
  engine.onEvaluated(1, EvalOutcome{0.7, 0.8}, 2);
  auto commits = actionsOf<CommitRound>(engine.takeActions());
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.round, 1u);
  EXPECT_DOUBLE_EQ(*commits[0].round.test_accuracy, 0.8);
  EXPECT_FALSE(engine.finished());
}

TEST(RoundEngine, DeadlineMarksLateCancelsAndAggregatesTheRest) {
  Fixture f(baseOptions(2, 2, 1));
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  f.engine->onHello("b", hello("b"), 0);
  std::map<std::string, uint64_t> token;
  for (auto& t : actionsOf<SendTask>(f.take())) token[t.client] = t.task.task_token;
  f.upload("a", token["a"], {2, 2, 2}, 5, 1);
  f.engine->onHeartbeat("b", 2);
  ASSERT_TRUE(f.engine->nextWakeup().has_value());
  EXPECT_LE(*f.engine->nextWakeup(), 10.0);
  f.engine->onHeartbeat("b", 9);
  f.engine->onHeartbeat("a", 9);
  f.engine->onTick(9.5);
  EXPECT_TRUE(actionsOf<CommitRound>(f.take()).empty());
  f.engine->onTick(10.0);
  auto actions = f.take();
  auto cancels = actionsOf<SendCancel>(actions);
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_EQ(cancels[0].client, "b");
  EXPECT_EQ(cancels[0].cancel.task_token, token["b"]);
  auto commits = actionsOf<CommitRound>(actions);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.completed, 1u);
  EXPECT_EQ(commits[0].round.late, 1u);
  EXPECT_EQ(commits[0].round.status, "ok");
  EXPECT_FLOAT_EQ(f.engine->params()[0], 2.0f);
  // The late client's upload after the deadline is stale: one error, one event, model untouched.
  f.upload("b", token["b"], {100, 100, 100}, 5, 11);
  auto after = f.take();
  EXPECT_EQ(actionsOf<SendError>(after).size(), 1u);
  auto events = actionsOf<RecordEvent>(after);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].event.kind, "stale_update");
  EXPECT_FLOAT_EQ(f.engine->params()[0], 2.0f);
}

TEST(RoundEngine, LostClientIsDroppedAndItsPartialUploadIsNeverAggregated) {
  Fixture f(baseOptions(2, 2, 1));
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  f.engine->onHello("b", hello("b"), 0);
  std::map<std::string, uint64_t> token;
  for (auto& t : actionsOf<SendTask>(f.take())) token[t.client] = t.task.task_token;
  // b sends the first two of three values, then dies.
  wire::Chunk c = chunkOf(token["b"], 0, {1000, 1000}, false, 4);
  f.engine->onChunk("b", c, 10, 0.5);
  f.upload("a", token["a"], {1, 2, 3}, 4, 1.0);
  f.engine->onHeartbeat("a", 3.0);
  f.engine->onTick(3.6);  // b silent since 0.5 > liveness 3 s
  auto commits = actionsOf<CommitRound>(f.take());
  ASSERT_EQ(commits.size(), 1u);  // everyone is done or dropped: no need to wait for the deadline
  EXPECT_EQ(commits[0].round.dropped, 1u);
  EXPECT_EQ(commits[0].round.completed, 1u);
  EXPECT_EQ(f.engine->params(), (std::vector<float>{1, 2, 3}));
  for (const auto& u : commits[0].updates) {
    EXPECT_EQ(u.status, u.client_id == "b" ? "dropped" : "completed");
  }
}

TEST(RoundEngine, QuorumNotMetFailsTheRoundAndKeepsTheModel) {
  Fixture f(baseOptions(2, 2, 2), {5, 5, 5});
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  f.engine->onHello("b", hello("b"), 0);
  std::map<std::string, uint64_t> token;
  for (auto& t : actionsOf<SendTask>(f.take())) token[t.client] = t.task.task_token;
  f.upload("a", token["a"], {1, 1, 1}, 4, 1.0);
  f.engine->onHeartbeat("b", 9);
  f.engine->onHeartbeat("a", 9);
  f.engine->onTick(10);
  auto commits = actionsOf<CommitRound>(f.take());
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.status, "failed");
  EXPECT_FALSE(commits[0].checkpoint.has_value());
  EXPECT_EQ(commits[0].round.model_version, 0u);
  EXPECT_EQ(f.engine->params(), (std::vector<float>{5, 5, 5}));
}

// A payload of `v` made by the codec `spec` names.
std::string encodeWith(const std::string& spec, const std::vector<float>& v, uint64_t seed) {
  auto codec = compress::makeCodec(compress::parseCodecSpec(spec).value()).value();
  std::string out;
  codec->encode(v.data(), v.size(), seed, &out);
  return out;
}

TEST(RoundEngine, RejectsBadUploads) {
  struct Case {
    const char* name;
    std::function<void(RoundEngine&, uint64_t)> send;
  };
  std::vector<Case> cases = {
      {"out of order",
       [](RoundEngine& e, uint64_t t) {
         wire::Chunk c = chunkOf(t, 1, {1}, false);
         e.onChunk("a", c, 4, 1);
       }},
      {"past the end",
       [](RoundEngine& e, uint64_t t) {
         wire::Chunk c = chunkOf(t, 0, {1, 2, 3, 4}, true);
         e.onChunk("a", c, 4, 1);
       }},
      {"ragged payload",
       [](RoundEngine& e, uint64_t t) {
         wire::Chunk c = chunkOf(t, 0, {1, 2, 3}, true);
         c.payload = "abcde";
         e.onChunk("a", c, 4, 1);
       }},
      {"summary too early",
       [](RoundEngine& e, uint64_t t) {
         wire::Chunk c = chunkOf(t, 0, {1, 2}, false);
         e.onChunk("a", c, 4, 1);
         wire::Summary s;
         s.task_token = t;
         s.n_samples = 10;
         s.steps = 3;
         e.onSummary("a", s, 4, 1);
       }},
      {"another codec than the task's",
       [](RoundEngine& e, uint64_t t) {
         wire::Chunk c = chunkOf(t, 0, {1, 2, 3}, true);
         c.payload = encodeWith("qsgd8", {1, 2, 3}, 1);
         e.onChunk("a", c, 4, 1);
       }},
      {"non-finite",
       [](RoundEngine& e, uint64_t t) {
         wire::Chunk c = chunkOf(t, 0, {1, NAN, 3}, true);
         e.onChunk("a", c, 4, 1);
         wire::Summary s;
         s.task_token = t;
         s.n_samples = 10;
         s.steps = 3;
         e.onSummary("a", s, 4, 1);
       }},
  };
  for (const auto& tc : cases) {
    SCOPED_TRACE(tc.name);
    Fixture f(baseOptions(1, 1, 1), {0, 0, 0});
    f.engine->start(0);
    f.engine->onHello("a", hello("a"), 0);
    auto tasks = actionsOf<SendTask>(f.take());
    ASSERT_EQ(tasks.size(), 1u);
    tc.send(*f.engine, tasks[0].task.task_token);
    auto actions = f.take();
    auto errors = actionsOf<SendError>(actions);
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_EQ(errors[0].error.code, wire::ErrorCode::kRejected);
    auto commits = actionsOf<CommitRound>(actions);
    ASSERT_EQ(commits.size(), 1u);
    EXPECT_EQ(commits[0].round.rejected, 1u);
    EXPECT_EQ(commits[0].round.status, "failed");
    EXPECT_EQ(f.engine->params(), (std::vector<float>{0, 0, 0}));
  }
}

TEST(RoundEngine, RepeatedHelloKeepsTheTaskButARestartedClientLosesIt) {
  Fixture f(baseOptions(1, 1, 1), {0, 0, 0});
  f.engine->start(0);
  wire::Hello h = hello("a");
  h.session = 11;
  f.engine->onHello("a", h, 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 1u);
  f.engine->onHello("a", h, 1);  // the same process greets again
  EXPECT_TRUE(actionsOf<CommitRound>(f.take()).empty());
  h.session = 12;  // a new process under the same id: the task in flight is lost
  f.engine->onHello("a", h, 2);
  auto actions = f.take();
  auto commits = actionsOf<CommitRound>(actions);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.dropped, 1u);
  EXPECT_EQ(commits[0].round.status, "failed");
  // The restarted client is idle again and gets the next round's task.
  auto next = actionsOf<SendTask>(actions);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].task.round, 2u);
  EXPECT_NE(next[0].task.task_token, tasks[0].task.task_token);
}

TEST(RoundEngine, UnknownTokenIsAnsweredAndRecordedOnce) {
  Fixture f(baseOptions(1, 1, 1));
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  f.take();
  wire::Chunk c = chunkOf(12345, 0, {1}, true);
  f.engine->onChunk("a", c, 4, 1);
  f.engine->onChunk("a", c, 4, 1);
  auto actions = f.take();
  EXPECT_EQ(actionsOf<SendError>(actions).size(), 1u);
  auto events = actionsOf<RecordEvent>(actions);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].event.kind, "unknown_token");
}

// A coordinator restarted during a round: a client's upload of the earlier session's task
// reaches the new engine after the client said Hello again, before this engine sent it any
// task. It is answered as stale but is not an event; an unknown token from a client that has
// been sent a task still is.
TEST(RoundEngine, ATokenFromAClientSentNoTaskYetIsAnsweredButNotRecorded) {
  Fixture f(baseOptions(1, 1, 1));
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 1u);  // "a" has its task; "b" joins while the round runs
  f.engine->onHello("b", hello("b"), 0.5);
  f.take();

  const uint64_t earlier = 777;
  f.engine->onChunk("b", chunkOf(earlier, 0, {1}, true), 4, 1);
  f.engine->onUploadRequest("b", earlier, 1);
  auto actions = f.take();
  auto errors = actionsOf<SendError>(actions);
  ASSERT_EQ(errors.size(), 1u);  // answered once
  EXPECT_EQ(errors[0].client, "b");
  EXPECT_EQ(errors[0].error.code, wire::ErrorCode::kStaleTask);
  EXPECT_EQ(errors[0].error.task_token, earlier);
  EXPECT_TRUE(actionsOf<RecordEvent>(actions).empty());

  f.engine->onChunk("a", chunkOf(778, 0, {1}, true), 4, 2);
  actions = f.take();
  EXPECT_EQ(actionsOf<SendError>(actions).size(), 1u);
  auto events = actionsOf<RecordEvent>(actions);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].event.kind, "unknown_token");
  EXPECT_EQ(events[0].event.client_id, "a");
}

// After a coordinator restart a client says Hello to the new process naming the session it last
// worked for, is sent a new task, and only then does the rest of its upload of the earlier
// process's task arrive: answered as stale, not an event. Once a frame of this engine's task has
// come from it, an unknown token is recorded again; a client naming this process's own session
// (a reconnect, not a restart) gets no such allowance.
TEST(RoundEngine, TheRestOfAnEarlierProcesssUploadAfterTheNewTaskIsAnsweredButNotRecorded) {
  EngineOptions o = baseOptions(2, 2, 2);
  o.coordinator_session = 1001;
  Fixture f(o);
  f.engine->start(0);
  wire::Hello ha = hello("a");
  ha.last_coordinator_session = 1000;  // worked for the process before this one
  wire::Hello hb = hello("b");
  hb.last_coordinator_session = 1001;  // this process's session: a reconnect
  f.engine->onHello("a", ha, 0);
  f.engine->onHello("b", hb, 0);
  std::map<std::string, uint64_t> token;
  for (const auto& t : actionsOf<SendTask>(f.take())) token[t.client] = t.task.task_token;
  ASSERT_EQ(token.size(), 2u);

  const uint64_t earlier = token["a"] ^ 0x5a5a5a5a5a5a5a5aULL;
  f.engine->onChunk("a", chunkOf(earlier, 0, {1}, false), 4, 1);
  f.engine->onChunk("a", chunkOf(earlier, 1, {1}, false), 4, 1.1);
  auto actions = f.take();
  auto errors = actionsOf<SendError>(actions);
  ASSERT_EQ(errors.size(), 1u);  // answered once
  EXPECT_EQ(errors[0].error.code, wire::ErrorCode::kStaleTask);
  EXPECT_EQ(errors[0].error.task_token, earlier);
  EXPECT_TRUE(actionsOf<RecordEvent>(actions).empty());

  // "b" said it had worked for this very process: its unknown token is an event.
  f.engine->onChunk("b", chunkOf(token["b"] ^ 0x77, 0, {1}, true), 4, 1.2);
  actions = f.take();
  auto events = actionsOf<RecordEvent>(actions);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].event.kind, "unknown_token");
  EXPECT_EQ(events[0].event.client_id, "b");

  // "a" starts its upload of this engine's task; another token it was not given is an event.
  f.engine->onChunk("a", chunkOf(token["a"], 0, {1}, false), 4, 1.3);
  f.engine->onChunk("a", chunkOf(earlier ^ 0x1, 0, {1}, true), 4, 1.4);
  actions = f.take();
  events = actionsOf<RecordEvent>(actions);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].event.kind, "unknown_token");
  EXPECT_EQ(events[0].event.client_id, "a");
}

// unstartedTask names a task its driver may send again (to a connection that replaced the one
// the task went to): only while nothing of its upload has come, and only to that client.
TEST(RoundEngine, ATaskIsUnstartedUntilItsUploadAsksOrItsFirstChunkComes) {
  Fixture f(baseOptions(2, 2, 2));
  f.engine->start(0);
  EXPECT_EQ(f.engine->unstartedTask("a"), 0u);  // unknown
  f.engine->onHello("a", hello("a"), 0);
  EXPECT_EQ(f.engine->unstartedTask("a"), 0u);  // idle: the round waits for "b"
  f.engine->onHello("b", hello("b"), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 2u);
  std::map<std::string, uint64_t> token;
  for (const auto& t : tasks) token[t.client] = t.task.task_token;
  EXPECT_EQ(f.engine->unstartedTask("a"), token["a"]);
  EXPECT_EQ(f.engine->unstartedTask("b"), token["b"]);
  // The same process greeting again keeps its task, still unstarted.
  f.engine->onHello("a", hello("a"), 0.5);
  EXPECT_EQ(f.engine->unstartedTask("a"), token["a"]);
  f.engine->onUploadRequest("a", token["a"], 1);
  EXPECT_EQ(f.engine->unstartedTask("a"), 0u);
  f.engine->onChunk("b", chunkOf(token["b"], 0, {1}, false), 4, 1);
  EXPECT_EQ(f.engine->unstartedTask("b"), 0u);
  f.take();
}

// A task lost with its client is not unstarted: a new process (another session) lost it.
TEST(RoundEngine, ATaskLostWithANewSessionIsNotUnstarted) {
  Fixture f(baseOptions(1, 1, 1));
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  ASSERT_EQ(actionsOf<SendTask>(f.take()).size(), 1u);
  const uint64_t old = f.engine->unstartedTask("a");
  ASSERT_NE(old, 0u);
  wire::Hello again = hello("a");
  again.session += 1;
  f.engine->onHello("a", again, 1);
  auto fresh = actionsOf<SendTask>(f.take());
  // Its task was dropped; a new one may go out at once (the next round), never the old one.
  EXPECT_NE(f.engine->unstartedTask("a"), old);
  const uint64_t now_held = fresh.empty() ? 0u : fresh.back().task.task_token;
  EXPECT_EQ(f.engine->unstartedTask("a"), now_held);
}

TEST(RoundEngine, SameSeedSameSelection) {
  auto selections = [](uint64_t seed) {
    EngineOptions o = baseOptions(3, 8, 1);
    o.seed = seed;
    o.rounds = 1;
    Fixture f(o);
    f.engine->start(0);
    for (char ch = 'h'; ch >= 'a'; --ch)
      f.engine->onHello(std::string(1, ch), hello(std::string(1, ch)), 0);
    std::vector<std::string> picked;
    for (auto& t : actionsOf<SendTask>(f.take())) picked.push_back(t.client);
    return picked;
  };
  EXPECT_EQ(selections(1), selections(1));
  bool differs = false;
  for (uint64_t s = 2; s < 10; ++s) differs |= selections(s) != selections(1);
  EXPECT_TRUE(differs);
}

// The simulator's path: quiet registration, an eligibility predicate, and sampling among many
// registered clients (the rank-sampling branch) that is uniform and independent of the order
// in which clients were registered.
TEST(RoundEngine, RegisteredClientsAreSampledUniformlyAmongTheEligible) {
  auto run = [](bool reversed, uint64_t seed, std::map<std::string, int>* counts) {
    EngineOptions o = baseOptions(20, 20, 1);
    o.num_partitions = 2000;
    o.liveness_s = 0;
    o.rounds = 1;
    o.seed = seed;
    o.bye_on_finish = false;
    Fixture f(o);
    for (int i = 0; i < 2000; ++i) {
      const int k = reversed ? 1999 - i : i;
      char id[16];
      std::snprintf(id, sizeof(id), "v%04d", k);
      f.engine->registerClient(id, hello(id, k), 0);
    }
    EXPECT_TRUE(f.engine->takeActions().empty());  // registration is silent
    // Only clients whose number is a multiple of 3 are eligible.
    f.engine->setEligibility(
        [](const std::string& id, double) { return std::stoi(id.substr(1)) % 3 == 0; });
    f.engine->start(0);
    std::vector<std::string> picked;
    for (auto& t : actionsOf<SendTask>(f.take())) {
      picked.push_back(t.client);
      EXPECT_EQ(t.task.data.index, static_cast<uint32_t>(std::stoi(t.client.substr(1))));
      if (counts) ++(*counts)[t.client];
    }
    return picked;
  };
  const auto a = run(false, 3, nullptr);
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(std::set<std::string>(a.begin(), a.end()).size(), 20u);  // distinct
  for (const auto& id : a) EXPECT_EQ(std::stoi(id.substr(1)) % 3, 0) << id;
  EXPECT_EQ(run(true, 3, nullptr), a);  // registration order does not matter
  // Uniform over the 667 eligible: over 200 rounds (seeds), each eligible client is picked
  // 200 * 20 / 667 = 6.0 times on average, and the expected number never picked is
  // 667 * (1 - 20/667)^200 = 1.5; a biased sampler (say, only the low ranks) would leave
  // hundreds unpicked. The two halves of the id range also get equal shares.
  std::map<std::string, int> counts;
  for (uint64_t seed = 100; seed < 300; ++seed) run(false, seed, &counts);
  EXPECT_GE(counts.size(), 667u - 10u);
  int low = 0, high = 0;
  for (const auto& [id, n] : counts) (std::stoi(id.substr(1)) < 1000 ? low : high) += n;
  EXPECT_NEAR(static_cast<double>(low) / (low + high), 0.5, 0.03);
}

TEST(RoundEngine, FewEligibleClientsStillFillTheRoundWhenPossible) {
  EngineOptions o = baseOptions(5, 5, 1);
  o.num_partitions = 1000;
  o.liveness_s = 0;
  o.rounds = 1;
  Fixture f(o);
  for (int i = 0; i < 1000; ++i) {
    char id[16];
    std::snprintf(id, sizeof(id), "c%d", 1000 + i);
    f.engine->registerClient(id, hello(id, i), 0);
  }
  // 7 of 1000 eligible: rank sampling mostly misses, the engine falls back to listing them.
  f.engine->setEligibility(
      [](const std::string& id, double) { return std::stoi(id.substr(1)) % 150 == 0; });
  f.engine->start(0);
  const auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 5u);
  for (const auto& t : tasks) EXPECT_EQ(std::stoi(t.client.substr(1)) % 150, 0) << t.client;
}

TEST(RoundEngine, PartitionModeNamesSampledPartitions) {
  EngineOptions o = baseOptions(2, 2, 1);
  o.sample_partitions = true;
  o.num_partitions = 100;
  Fixture f(o);
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  f.engine->onHello("b", hello("b"), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_NE(tasks[0].task.data.index, tasks[1].task.data.index);
  EXPECT_LT(tasks[0].task.data.index, 100u);
  EXPECT_EQ(tasks[0].task.data.num_partitions, 100u);
}

TEST(RoundEngine, GivesUpWhenClientsNeverCome) {
  Fixture f(baseOptions(2, 2, 1));
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  for (double t = 1; t <= 101; t += 1) {
    f.engine->onHeartbeat("a", t);
    f.engine->onTick(t);
  }
  auto done = actionsOf<RunFinished>(f.take());
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok);
  EXPECT_TRUE(f.engine->finished());
}

TEST(RoundEngine, RunsAllRoundsThenSaysBye) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 2;
  Fixture f(o);
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  for (int round = 1; round <= 2; ++round) {
    auto tasks = actionsOf<SendTask>(f.take());
    ASSERT_EQ(tasks.size(), 1u) << round;
    EXPECT_EQ(tasks[0].task.round, static_cast<uint32_t>(round));
    f.upload("a", tasks[0].task.task_token, {1, 1, 1}, 2, round);
  }
  auto actions = f.take();
  EXPECT_EQ(actionsOf<SendBye>(actions).size(), 1u);
  auto done = actionsOf<RunFinished>(actions);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].ok);
  EXPECT_EQ(f.engine->params(), (std::vector<float>{2, 2, 2}));
  EXPECT_EQ(f.engine->modelVersion(), 2u);
}

// Compressed chunks are decoded and folded as they arrive; the aggregate is the weighted mean
// of what the payloads decode to.
TEST(RoundEngine, FoldsCompressedChunksAsTheyArrive) {
  EngineOptions o = baseOptions(2, 2, 2);
  o.codec = "qsgd8";
  Fixture f(o, std::vector<float>(6, 0.0f));
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  f.engine->onHello("b", hello("b"), 0);
  std::map<std::string, uint64_t> token;
  for (auto& t : actionsOf<SendTask>(f.take())) {
    token[t.client] = t.task.task_token;
    EXPECT_EQ(t.task.codec, "qsgd8");
  }
  const std::vector<float> da = {0.5f, -0.25f, 1.0f, 0.125f, -2.0f, 0.75f};
  const std::vector<float> db = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  std::vector<float> expect(6, 0.0f);
  for (const auto& [id, delta, n] :
       {std::tuple{"a", da, uint64_t{30}}, std::tuple{"b", db, uint64_t{10}}}) {
    for (size_t off = 0; off < 6; off += 3) {
      const std::vector<float> part(delta.begin() + off, delta.begin() + off + 3);
      wire::Chunk c = chunkOf(token[id], off, part, off == 3, n);
      c.payload = encodeWith("qsgd8", part, off + 7);
      std::vector<float> decoded(3);
      ASSERT_TRUE(compress::decodePayload(c.payload, 3, decoded.data()).isOk());
      for (size_t i = 0; i < 3; ++i) expect[off + i] += static_cast<float>(n) * decoded[i];
      f.engine->onChunk(id, c, 40, 1);
    }
    wire::Summary s;
    s.task_token = token[id];
    s.n_samples = n;
    s.steps = 3;
    s.encode_seconds = 0.25;
    f.engine->onSummary(id, s, 20, 1);
  }
  auto commits = actionsOf<CommitRound>(f.take());
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.completed, 2u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(f.engine->params()[i], expect[i] / 40.0f, 1e-6);
  for (const auto& u : commits[0].updates) {
    EXPECT_EQ(u.codec, "qsgd");
    EXPECT_EQ(u.encode_s, 0.25);
  }
}

// A topk task with dense_below: small tensors arrive as fp16, the rest as topk. The engine folds
// both and names the update by its largest payload (topk), whichever chunk came first.
TEST(RoundEngine, MixedFp16AndTopkChunksFoldAndAreNamedTopk) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.codec = "topk:0.25,dense_below=3";
  Fixture f(o, std::vector<float>(10, 0.0f));
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  const auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_EQ(tasks[0].task.codec, "topk:0.25,dense_below=3");
  const uint64_t token = tasks[0].task.task_token;
  const std::vector<float> bias = {0.5f, -0.25f};  // a 2-element tensor: fp16, exact here
  const std::vector<float> weight = {0.0f, 4.0f, 0.0f, 0.0f, -2.0f, 0.0f, 0.0f, 1.0f};
  wire::Chunk c1 = chunkOf(token, 0, bias, false, 10);
  c1.payload = encodeWith("fp16", bias, 1);
  wire::Chunk c2 = chunkOf(token, 2, weight, true, 10);
  c2.payload = encodeWith("topk:0.25", weight, 2);  // keeps 4.0 and -2.0
  f.engine->onChunk("a", c1, 40, 1);
  f.engine->onChunk("a", c2, 40, 1);
  wire::Summary s;
  s.task_token = token;
  s.n_samples = 10;
  s.steps = 3;
  f.engine->onSummary("a", s, 20, 1);
  auto commits = actionsOf<CommitRound>(f.take());
  ASSERT_EQ(commits.size(), 1u);
  ASSERT_EQ(commits[0].updates.size(), 1u);
  EXPECT_EQ(commits[0].updates[0].codec, "topk");
  const std::vector<float> want = {0.5f, -0.25f, 0, 4.0f, 0, 0, -2.0f, 0, 0, 0};
  for (size_t i = 0; i < 10; ++i) EXPECT_FLOAT_EQ(f.engine->params()[i], want[i]) << i;
}

// The coordinator decodes only the payload kinds the task asked for: a client cannot pick a
// costlier decoder, or send fp16 where a topk task without dense_below asked for sparse values.
// The refusal names both codecs, and the model is untouched.
TEST(RoundEngine, RefusesPayloadsOfAnotherCodecThanTheTasks) {
  for (const auto& [asked, sent, named] :
       {std::tuple{"topk:0.25", "fp16", "fp16, the task asked for topk:0.25"},
        std::tuple{"qsgd8", "lowrank:2", "lowrank, the task asked for qsgd8"},
        std::tuple{"none", "topk:0.5", "topk, the task asked for none"}}) {
    SCOPED_TRACE(std::string(asked) + " <- " + sent);
    EngineOptions o = baseOptions(1, 1, 1);
    o.codec = asked;
    Fixture f(o, std::vector<float>(4, 0.0f));
    f.engine->start(0);
    f.engine->onHello("a", hello("a"), 0);
    const auto tasks = actionsOf<SendTask>(f.take());
    ASSERT_EQ(tasks.size(), 1u);
    EXPECT_EQ(tasks[0].task.codec, asked);
    const std::vector<float> v = {1, -2, 3, -4};
    wire::Chunk c = chunkOf(tasks[0].task.task_token, 0, v, true);
    c.payload = encodeWith(sent, v, 5);
    f.engine->onChunk("a", c, 40, 1);
    const auto actions = f.take();
    const auto errors = actionsOf<SendError>(actions);
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_EQ(errors[0].error.code, wire::ErrorCode::kRejected);
    EXPECT_NE(errors[0].error.message.find(std::string("chunk payload made by codec ") + named),
              std::string::npos)
        << errors[0].error.message;
    const auto commits = actionsOf<CommitRound>(actions);
    ASSERT_EQ(commits.size(), 1u);
    EXPECT_EQ(commits[0].round.rejected, 1u);
    EXPECT_EQ(f.engine->params(), std::vector<float>(4, 0.0f));
  }
}

// A straggler's chunks were folded before the deadline; at the deadline they are taken back out,
// and a client whose declared weight changes mid-upload is rejected and taken back out too.
TEST(RoundEngine, PartialChunksOfLateAndRejectedUpdatesAreTakenBack) {
  for (uint64_t bound : {uint64_t{64} << 20, uint64_t{0}}) {  // in memory, and spilled to a file
    SCOPED_TRACE("partial buffer bound " + std::to_string(bound));
    EngineOptions o = baseOptions(3, 3, 1);
    o.partial_buffer_bytes = bound;
    Fixture f(o, {0, 0, 0, 0});
    f.engine->start(0);
    for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
    std::map<std::string, uint64_t> token;
    for (auto& t : actionsOf<SendTask>(f.take())) token[t.client] = t.task.task_token;
    // b: half its delta, then silence until the deadline (alive: heartbeats).
    f.engine->onChunk("b", chunkOf(token["b"], 0, {0.3f, 0.7f}, false, 7), 30, 1);
    // c: a chunk declaring 5 samples, then one declaring 6: rejected.
    f.engine->onChunk("c", chunkOf(token["c"], 0, {100.1f, -3.3f}, false, 5), 30, 1);
    f.engine->onChunk("c", chunkOf(token["c"], 2, {1, 1}, true, 6), 30, 1.5);
    f.upload("a", token["a"], {0.25f, 0.5f, 0.75f, 1.0f}, 4, 2.0);
    for (double t = 2.5; t < 10; t += 2) {
      f.engine->onHeartbeat("b", t);
      f.engine->onHeartbeat("c", t);
    }
    f.engine->onTick(10);
    auto actions = f.take();
    auto commits = actionsOf<CommitRound>(actions);
    ASSERT_EQ(commits.size(), 1u);
    EXPECT_EQ(commits[0].round.completed, 1u);
    EXPECT_EQ(commits[0].round.late, 1u);
    EXPECT_EQ(commits[0].round.rejected, 1u);
    // Only a's delta is aggregated (up to one rounding per taken-back value).
    const std::vector<float> want = {0.25f, 0.5f, 0.75f, 1.0f};
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(f.engine->params()[i], want[i], 1e-5) << i;
    bool saw_reason = false;
    for (const auto& e : actionsOf<SendError>(actions)) {
      saw_reason |= e.error.message.find("declares 6 samples") != std::string::npos;
    }
    EXPECT_TRUE(saw_reason);
  }
}

TEST(RoundEngine, SummaryWeightMustMatchTheChunks) {
  Fixture f(baseOptions(1, 1, 1), {0, 0});
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  const auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 1u);
  const uint64_t t = tasks[0].task.task_token;
  f.engine->onChunk("a", chunkOf(t, 0, {1, 2}, true, 8), 30, 1);
  wire::Summary s;
  s.task_token = t;
  s.n_samples = 800;  // a client inflating its weight after the fact
  s.steps = 3;
  f.engine->onSummary("a", s, 20, 1);
  auto actions = f.take();
  auto commits = actionsOf<CommitRound>(actions);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.rejected, 1u);
  EXPECT_EQ(f.engine->params(), (std::vector<float>{0, 0}));
}

// The coordinator asks clients on slow links (measured from their last upload) for a stronger
// codec.
TEST(RoundEngine, SlowLinksGetTheSlowLinkCodec) {
  EngineOptions o = baseOptions(2, 2, 1);
  o.codec = "fp16";
  o.slow_link_codec = "topk:0.01,warmup=4";
  o.slow_link_mbps = 10;
  Fixture f(o, {0, 0});
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  f.engine->onHello("b", hello("b"), 0);
  std::map<std::string, uint64_t> token;
  for (auto& t : actionsOf<SendTask>(f.take())) {
    token[t.client] = t.task.task_token;
    EXPECT_EQ(t.task.codec, "fp16");  // nothing measured yet
  }
  // a uploads 100 + 100 bytes in 0.1 ms (16 Mbit/s); b the same in 1 s (1.6 kbit/s).
  for (const auto& [id, secs] : {std::pair{"a", 1e-4}, std::pair{"b", 1.0}}) {
    wire::Chunk c = chunkOf(token[id], 0, {1, 1}, true, 5);
    c.payload = encodeWith("fp16", {1, 1}, 0);  // the codec both tasks asked for
    f.engine->onChunk(id, c, 100, 1);
    wire::Summary s;
    s.task_token = token[id];
    s.n_samples = 5;
    s.steps = 3;
    s.upload_seconds = secs;
    f.engine->onSummary(id, s, 100, 1);
  }
  std::map<std::string, std::string> codec;
  for (auto& t : actionsOf<SendTask>(f.take())) codec[t.client] = t.task.codec;
  ASSERT_EQ(codec.size(), 2u);
  EXPECT_EQ(codec["a"], "fp16");
  EXPECT_EQ(codec["b"], "topk:0.08");  // round 2 of topk's warm-up: 8x the ratio
}

// Top-k's sparsity warm-up: the coordinator asks for 16x, 8x, 4x, 2x the configured ratio in
// rounds 1 to 4, then the ratio; without warmup the ratio from the start.
TEST(RoundEngine, TopkTasksFollowTheWarmupSchedule) {
  for (const auto& [configured, want] :
       {std::pair<std::string, std::vector<std::string>>{
            "topk:0.01,warmup=4",
            {"topk:0.16", "topk:0.08", "topk:0.04", "topk:0.02", "topk:0.01", "topk:0.01"}},
        {"topk:0.01", std::vector<std::string>(6, "topk:0.01")}}) {
    EngineOptions o = baseOptions(1, 1, 1);
    o.rounds = 6;
    o.codec = configured;
    Fixture f(o, {0, 0});
    f.engine->start(0);
    f.engine->onHello("a", hello("a"), 0);
    for (size_t r = 0; r < want.size(); ++r) {
      const auto tasks = actionsOf<SendTask>(f.take());
      ASSERT_EQ(tasks.size(), 1u) << configured << " round " << r + 1;
      EXPECT_EQ(tasks[0].task.codec, want[r]) << configured << " round " << r + 1;
      const double t = static_cast<double>(r + 1);
      wire::Chunk c = chunkOf(tasks[0].task.task_token, 0, {1, 1}, true, 5);
      c.payload = encodeWith(want[r], {1, 1}, r);
      f.engine->onChunk("a", c, 100, t);
      wire::Summary s;
      s.task_token = tasks[0].task.task_token;
      s.n_samples = 5;
      s.steps = 3;
      f.engine->onSummary("a", s, 100, t);
    }
  }
}

TEST(RoundEngine, EvalEveryEvaluatesOnlyEveryNthRoundAndTheLast) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 5;
  o.eval_every = 2;
  Fixture f(o, {0, 0});
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  std::vector<uint32_t> evaluated, committed;
  for (int r = 1; r <= 5; ++r) {
    auto actions = f.take();
    for (const auto& e : actionsOf<Evaluate>(actions)) evaluated.push_back(e.round);
    for (const auto& c : actionsOf<CommitRound>(actions)) {
      committed.push_back(c.round.round);
      EXPECT_EQ(c.round.test_accuracy.has_value(), c.round.round % 2 == 0 || c.round.round == 5)
          << c.round.round;
    }
    auto tasks = actionsOf<SendTask>(actions);
    ASSERT_EQ(tasks.size(), 1u);
    f.upload("a", tasks[0].task.task_token, {1, 1}, 4, r);
  }
  auto actions = f.take();
  for (const auto& e : actionsOf<Evaluate>(actions)) evaluated.push_back(e.round);
  for (const auto& c : actionsOf<CommitRound>(actions)) committed.push_back(c.round.round);
  EXPECT_EQ(evaluated, (std::vector<uint32_t>{0, 2, 4, 5}));
  EXPECT_EQ(committed, (std::vector<uint32_t>{0, 1, 2, 3, 4, 5}));
}

// ---- Straggler policies ----

TEST(RoundEnginePolicies, OverSelectionAggregatesTheFirstKAndCancelsTheRest) {
  EngineOptions o = baseOptions(2, 3, 2);
  o.over_selection = 0.5;  // ceil(2 x 1.5) = 3 selected
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 3u);
  auto token = tokensOf(tasks);
  f.upload("c", token["c"], {2, 2, 2}, 1, 1);
  EXPECT_TRUE(actionsOf<CommitRound>(f.take()).empty());
  f.upload("a", token["a"], {4, 0, 0}, 3, 2);
  auto actions = f.take();
  auto commits = actionsOf<CommitRound>(actions);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.completed, 2u);
  EXPECT_EQ(commits[0].round.late, 1u);
  EXPECT_DOUBLE_EQ(commits[0].round.end_time, 2);  // at the K-th completion, not the deadline
  // (1 x (2,2,2) + 3 x (4,0,0)) / 4 = (3.5, 0.5, 0.5)
  EXPECT_FLOAT_EQ(f.engine->params()[0], 3.5f);
  EXPECT_FLOAT_EQ(f.engine->params()[1], 0.5f);
  auto cancels = actionsOf<SendCancel>(actions);
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_EQ(cancels[0].client, "b");
  // The late client's upload after the cut is stale and changes nothing.
  f.upload("b", token["b"], {100, 100, 100}, 1, 3);
  EXPECT_FLOAT_EQ(f.engine->params()[0], 3.5f);
}

TEST(RoundEnginePolicies, PercentileDeadlineFollowsRecentDurationsWithLateOnesCensored) {
  EngineOptions o = baseOptions(2, 2, 1);
  o.deadline_mode = DeadlineMode::kPercentile;
  o.deadline_percentile = 0.5;
  o.deadline_slack = 1.0;
  o.deadline_window = 2;
  o.rounds = 4;
  o.liveness_s = 0;  // no heartbeats in this test
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  f.engine->onHello("b", hello("b"), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_DOUBLE_EQ(tasks[0].task.deadline_s, 10);  // nothing measured yet: deadline_s
  auto token = tokensOf(tasks);
  f.upload("a", token["a"], {1, 1, 1}, 1, 2);  // took 2 s
  f.upload("b", token["b"], {1, 1, 1}, 1, 6);  // took 6 s
  tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 2u);
  // Median of {2, 6} = 4; the round started at 6, so its deadline is at 10.
  EXPECT_DOUBLE_EQ(tasks[0].task.deadline_s, 4);
  token = tokensOf(tasks);
  f.upload("a", token["a"], {1, 1, 1}, 1, 7);  // 1 s
  f.engine->onTick(10);                        // b is late: censored at 4 s
  tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 2u);
  // Durations {2, 6} and {1, 4}: the median of {1, 2, 4, 6} is 3.
  EXPECT_DOUBLE_EQ(tasks[0].task.deadline_s, 3);
}

TEST(RoundEnginePolicies, PartialWorkAsksToStopBeforeTheDeadlineLessMeasuredOverhead) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.partial_work = true;
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_DOUBLE_EQ(tasks[0].task.hparams.stop_after_s, 8);  // unknown overhead: 80% of 10 s
  // Sent at 0, done at 3 after 1 s of compute: 2 s of download and upload.
  f.upload("a", tasks[0].task.task_token, {1, 1, 1}, 1, 3, 2, 3, 1.0);
  tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_DOUBLE_EQ(tasks[0].task.hparams.stop_after_s, 10 - 1.25 * 2);
}

TEST(RoundEnginePolicies, AdaptiveStepsSizeWorkToTheMeasuredSpeed) {
  EngineOptions o = baseOptions(2, 2, 1);
  o.adaptive_steps = true;
  o.adaptive_target = 0.8;
  o.adaptive_max_factor = 1.0;
  o.hparams.epochs = 1;
  o.hparams.batch_size = 10;
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  wire::Hello ha = hello("a"), hb = hello("b");
  ha.data_size = 100;  // configured work: 1 epoch of 10 steps
  hb.data_size = 100;
  f.engine->onHello("a", ha, 0);
  f.engine->onHello("b", hb, 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 2u);
  for (const auto& t : tasks) EXPECT_EQ(t.task.hparams.max_steps, 0u);  // not measured yet
  auto token = tokensOf(tasks);
  // a: 10 steps in 5 s of compute, done at 6 (1 s overhead): 2 steps/s.
  f.upload("a", token["a"], {1, 1, 1}, 100, 6, 2, 10, 5.0);
  // b: 10 steps in 20 s... would be late at 10; it reports at 9 with compute 8 s: 1.25 steps/s.
  f.upload("b", token["b"], {1, 1, 1}, 100, 9, 2, 10, 8.0);
  tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 2u);
  std::map<std::string, uint32_t> steps;
  for (const auto& t : tasks) steps[t.client] = t.task.hparams.max_steps;
  // a: floor(2 x (8 - 1)) = 14, capped at the configured 10. b: floor(1.25 x (8 - 1)) = 8.
  EXPECT_EQ(steps["a"], 10u);
  EXPECT_EQ(steps["b"], 8u);
}

// What a client says it holds is taken no further than what the engine knows: its partition's
// size, else coordinator.max_samples_per_update (work sizing, its history row).
TEST(RoundEnginePolicies, AClientsDataSizeIsBoundedByWhatTheEngineKnows) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.partition_sizes.clear();  // its own files: sizes unknown
  o.max_samples_per_update = 500;
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  wire::Hello big = hello("a");
  big.data_size = 1000000000000ull;
  f.engine->onHello("a", big, 0);
  wire::Hello small = hello("b");
  small.data_size = 42;
  f.engine->onHello("b", small, 0);
  std::map<std::string, uint64_t> sizes;
  for (const auto& u : actionsOf<UpsertClient>(f.take())) {
    sizes[u.client.client_id] = u.client.data_size;
  }
  EXPECT_EQ(sizes["a"], 500u);
  EXPECT_EQ(sizes["b"], 42u);

  EngineOptions known = baseOptions(1, 1, 1);
  known.partition_sizes = {30, 30, 30, 30};
  Fixture g(known, {0, 0, 0});
  g.engine->start(0);
  g.engine->onHello("a", big, 0);
  auto rows = actionsOf<UpsertClient>(g.take());
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows.back().client.data_size, 30u);
}

// ---- FedBuff ----

TEST(RoundEngineAsync, BuffersKUpdatesWithStalenessWeights) {
  Fixture f(asyncOptions(), {0, 0, 0});
  f.engine->start(0);
  for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 3u);  // concurrency 3
  for (const auto& t : tasks) EXPECT_EQ(t.task.model_version, 0u);
  auto token = tokensOf(tasks);
  f.upload("a", token["a"], {1, 1, 1}, 1, 1);
  auto next = actionsOf<SendTask>(f.take());
  ASSERT_EQ(next.size(), 1u);  // a is idle again and refills the slot (from version 0)
  EXPECT_EQ(next[0].client, "a");
  f.upload("b", token["b"], {3, 3, 3}, 7, 2);  // buffer full: x += (1/2)(1 + 3) = 2
  auto actions = f.take();
  auto commits = actionsOf<CommitRound>(actions);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.round, 1u);
  EXPECT_EQ(commits[0].round.completed, 2u);
  EXPECT_EQ(commits[0].round.model_version, 1u);
  for (const auto& u : commits[0].updates) EXPECT_DOUBLE_EQ(u.weight, 0.5);
  EXPECT_FLOAT_EQ(f.engine->params()[0], 2.0f);
  next = actionsOf<SendTask>(actions);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].client, "b");
  EXPECT_EQ(next[0].task.model_version, 1u);
  // c trained from version 0 (staleness 1, weight 1/sqrt(2)); b's second task from version 1.
  f.upload("c", token["c"], {4, 0, 0}, 1, 3);
  f.upload("b", next[0].task.task_token, {0, 2, 0}, 1, 4);
  commits = actionsOf<CommitRound>(f.take());
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.round, 2u);
  const float w = static_cast<float>(1 / std::sqrt(2.0));
  EXPECT_FLOAT_EQ(f.engine->params()[0], 2.0f + 0.5f * 4 * w);
  EXPECT_FLOAT_EQ(f.engine->params()[1], 2.0f + 0.5f * 2);
  EXPECT_FLOAT_EQ(f.engine->params()[2], 2.0f);
  // The last step cancels what is still out (a's second task, c's new one) and records it.
  EXPECT_EQ(commits[0].round.late, 2u);
  EXPECT_TRUE(f.engine->finished());
  std::map<std::string, double> weight;
  for (const auto& u : commits[0].updates) weight[u.client_id + u.status] = u.weight;
  EXPECT_NEAR(weight["ccompleted"], 0.5 / std::sqrt(2.0), 1e-12);
  EXPECT_DOUBLE_EQ(weight["bcompleted"], 0.5);
}

TEST(RoundEngineAsync, TooStaleUpdatesAreRejectedAndRecorded) {
  EngineOptions o = asyncOptions();
  o.max_staleness = 0;
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
  auto token = tokensOf(actionsOf<SendTask>(f.take()));
  f.upload("a", token["a"], {1, 1, 1}, 1, 1);
  f.upload("b", token["b"], {1, 1, 1}, 1, 2);  // step 1: version 1
  f.take();
  f.upload("c", token["c"], {50, 50, 50}, 1, 3);  // from version 0: 1 behind
  auto actions = f.take();
  EXPECT_FLOAT_EQ(f.engine->params()[0], 1.0f);
  EXPECT_GE(eventsOf(actions, "stale_update"), 1);
}

TEST(RoundEngineAsync, EachTaskHasItsOwnDeadline) {
  EngineOptions o = asyncOptions();
  o.deadline_s = 5;
  o.min_clients = 1;  // tasks go out as clients arrive
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  f.engine->onHello("b", hello("b"), 0);
  f.engine->onHello("c", hello("c"), 2);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 3u);
  EXPECT_DOUBLE_EQ(*f.engine->nextWakeup(), 3);  // liveness_s 3 after the first hellos
  f.engine->onHeartbeat("a", 2.9);
  f.engine->onHeartbeat("b", 2.9);
  f.engine->onHeartbeat("a", 4.9);
  f.engine->onHeartbeat("b", 4.9);
  f.engine->onHeartbeat("c", 4.9);
  f.engine->onTick(5);  // a's and b's tasks (sent at 0) expire; c's (sent at 2) does not
  auto actions = f.take();
  auto cancels = actionsOf<SendCancel>(actions);
  ASSERT_EQ(cancels.size(), 2u);
  auto again = actionsOf<SendTask>(actions);
  EXPECT_EQ(again.size(), 2u);  // the freed slots are refilled at once
}

// ---- Upload credits (protocol step 4) ----

// Tokens granted so far, in grant order (from everything taken).
std::vector<uint64_t> grantsIn(const std::vector<Action>& log) {
  std::vector<uint64_t> out;
  for (const auto& g : actionsOf<SendGrant>(log)) out.push_back(g.grant.task_token);
  return out;
}

EngineOptions creditOptions(uint32_t k, uint32_t credits) {
  EngineOptions o = baseOptions(k, k, 1);
  o.max_concurrent_uploads = credits;
  o.liveness_s = 0;  // no heartbeats in these tests unless one says so
  return o;
}

// Five clients, two credits: never more than two uploads hold a grant, grants go in the order
// asked, a chunk without a grant rejects the update, and grant waits reach the update rows.
TEST(RoundEngineCredits, AtMostTwoUploadsInFlightGrantedInTheOrderAsked) {
  Fixture f(creditOptions(5, 2), {0, 0, 0});
  f.engine->start(0);
  const std::vector<std::string> ids = {"a", "b", "c", "d", "e"};
  for (const auto& id : ids) f.engine->onHello(id, hello(id), 0);
  auto token = tokensOf(actionsOf<SendTask>(f.take()));
  ASSERT_EQ(token.size(), 5u);
  // They ask in the order e, d, c, b (a never asks and sends without a grant).
  double t = 1;
  for (const char* id : {"e", "d", "c", "b"}) f.engine->onUploadRequest(id, token[id], t++);
  f.take();
  EXPECT_EQ(grantsIn(f.log), (std::vector<uint64_t>{token["e"], token["d"]}));
  EXPECT_EQ(f.engine->uploadsInFlight(), 2u);
  EXPECT_EQ(f.engine->uploadsWaiting(), 2u);
  // Asking twice changes nothing; a granted task asking again gets its grant again.
  f.engine->onUploadRequest("c", token["c"], 5);
  f.engine->onUploadRequest("e", token["e"], 5);
  f.take();
  EXPECT_EQ(grantsIn(f.log), (std::vector<uint64_t>{token["e"], token["d"], token["e"]}));
  EXPECT_EQ(f.engine->uploadsWaiting(), 2u);
  // a sends without a grant: rejected, and it takes no credit.
  f.engine->onChunk("a", chunkOf(token["a"], 0, {9, 9, 9}, true), 100, 5);
  auto actions = f.take();
  ASSERT_EQ(actionsOf<SendError>(actions).size(), 1u);
  EXPECT_EQ(actionsOf<SendError>(actions)[0].error.code, wire::ErrorCode::kRejected);
  EXPECT_EQ(f.engine->uploadsInFlight(), 2u);
  // Uploads complete one by one; each completion hands its credit to the next in line.
  f.upload("d", token["d"], {2, 2, 2}, 1, 6);  // c granted at 6
  f.take();
  EXPECT_EQ(grantsIn(f.log).back(), token["c"]);
  EXPECT_LE(f.engine->uploadsInFlight(), 2u);
  f.upload("e", token["e"], {4, 4, 4}, 1, 7);  // b granted at 7
  f.take();
  EXPECT_EQ(grantsIn(f.log).back(), token["b"]);
  EXPECT_EQ(f.engine->uploadsWaiting(), 0u);
  f.upload("c", token["c"], {0, 0, 0}, 1, 8);
  f.upload("b", token["b"], {6, 0, 0}, 1, 9);
  auto commits = actionsOf<CommitRound>(f.take());
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.completed, 4u);
  EXPECT_EQ(commits[0].round.rejected, 1u);
  EXPECT_EQ(f.engine->peakUploadsInFlight(), 2u);
  EXPECT_EQ(f.engine->uploadsInFlight(), 0u);
  // (2 + 4 + 0 + 6, 2 + 4, 2 + 4) / 4
  EXPECT_EQ(f.engine->params(), (std::vector<float>{3, 1.5, 1.5}));
  // Asked at: e 1, d 2, c 3, b 4; granted at: e 1, d 2, c 6, b 7; a never asked.
  std::map<std::string, double> wait;
  for (const auto& u : commits[0].updates) wait[u.client_id] = u.grant_wait_s;
  EXPECT_EQ(wait,
            (std::map<std::string, double>{{"a", 0}, {"b", 3}, {"c", 3}, {"d", 0}, {"e", 0}}));
}

// A granted upload that sends nothing for upload_idle_s is rejected and its credit goes to the
// next in line; one that keeps sending chunks keeps it.
TEST(RoundEngineCredits, AStalledGrantIsRejectedAndItsCreditGoesToTheNextInLine) {
  EngineOptions o = creditOptions(3, 1);
  o.upload_idle_s = 2;
  o.deadline_s = 100;
  Fixture f(o, {0, 0, 0, 0});
  f.engine->start(0);
  for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
  auto token = tokensOf(actionsOf<SendTask>(f.take()));
  ASSERT_EQ(token.size(), 3u);
  f.engine->onUploadRequest("a", token["a"], 1);  // a takes the credit and stalls
  f.engine->onUploadRequest("b", token["b"], 1.5);
  f.take();
  EXPECT_EQ(grantsIn(f.log), (std::vector<uint64_t>{token["a"]}));
  ASSERT_TRUE(f.engine->nextWakeup().has_value());
  EXPECT_DOUBLE_EQ(*f.engine->nextWakeup(), 3.0);  // a's grant at 1 + 2 s
  f.engine->onTick(2.9);
  f.take();
  EXPECT_EQ(grantsIn(f.log).size(), 1u);
  f.engine->onTick(3.0);
  auto actions = f.take();
  ASSERT_EQ(actionsOf<SendError>(actions).size(), 1u);
  EXPECT_EQ(actionsOf<SendError>(actions)[0].client, "a");
  EXPECT_EQ(eventsOf(actions, "update_rejected"), 1);
  EXPECT_EQ(grantsIn(f.log), (std::vector<uint64_t>{token["a"], token["b"]}));
  // b sends a chunk every 1.5 s: never idle for 2 s, so it keeps the credit to the end.
  const std::vector<float> delta = {4, 4, 4, 4};
  for (int i = 0; i < 3; ++i) {
    const double t = 3.0 + 1.5 * (i + 1);
    f.engine->onTick(t - 0.01);
    wire::Chunk c = chunkOf(token["b"], i, {delta[i]}, false, 10, 3);
    f.engine->onChunk("b", c, 100, t);
  }
  f.engine->onTick(9.4);
  f.engine->onChunk("b", chunkOf(token["b"], 3, {delta[3]}, true, 10, 3), 100, 9.4);
  wire::Summary s;
  s.task_token = token["b"];
  s.n_samples = 10;
  s.steps = 3;
  s.mean_loss = 1;
  f.engine->onSummary("b", s, 50, 9.5);
  f.engine->onUploadRequest("c", token["c"], 9.6);
  f.take();
  EXPECT_EQ(grantsIn(f.log), (std::vector<uint64_t>{token["a"], token["b"], token["c"]}));
  f.upload("c", token["c"], {0, 0, 0, 0}, 10, 10);
  auto commits = actionsOf<CommitRound>(f.take());
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.completed, 2u);
  EXPECT_EQ(commits[0].round.rejected, 1u);
  EXPECT_EQ(f.engine->params(), (std::vector<float>{2, 2, 2, 2}));  // (4 + 0) / 2
}

// A credit comes back whichever way its upload ends: the client lost mid-upload, the update
// rejected, cancelled by over-selection, or the round's deadline.
TEST(RoundEngineCredits, CreditsComeBackWhenTheHolderIsLostRejectedCancelledOrLate) {
  EngineOptions o = creditOptions(2, 1);
  o.clients_per_round = 2;
  o.min_clients = 4;
  o.over_selection = 1.0;  // 4 selected, the first 2 to complete end the round
  o.liveness_s = 3;
  o.deadline_s = 10;
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  const std::vector<std::string> ids = {"a", "b", "c", "d"};
  for (const auto& id : ids) f.engine->onHello(id, hello(id), 0);
  auto token = tokensOf(actionsOf<SendTask>(f.take()));
  ASSERT_EQ(token.size(), 4u);
  for (const char* id : {"a", "b", "c", "d"}) f.engine->onUploadRequest(id, token[id], 0.5);
  f.take();
  ASSERT_EQ(grantsIn(f.log), (std::vector<uint64_t>{token["a"]}));
  // a sends one chunk of three values, then dies: lost at the liveness check, credit to b.
  f.engine->onChunk("a", chunkOf(token["a"], 0, {1000, 1000}, false), 100, 1);
  for (const char* id : {"b", "c", "d"}) f.engine->onHeartbeat(id, 3);
  f.engine->onTick(4.5);
  f.take();
  EXPECT_EQ(grantsIn(f.log).back(), token["b"]);
  EXPECT_EQ(f.engine->uploadsInFlight(), 1u);
  // b sends a chunk past the model's end: rejected, credit to c.
  f.engine->onChunk("b", chunkOf(token["b"], 0, {1, 1, 1, 1}, true), 100, 5);
  f.take();
  EXPECT_EQ(grantsIn(f.log).back(), token["c"]);
  // c completes (credit to d); d sends one chunk and stops (one completion; K is 2).
  f.upload("c", token["c"], {3, 3, 3}, 1, 6);
  f.take();
  EXPECT_EQ(grantsIn(f.log).back(), token["d"]);
  f.engine->onChunk("d", chunkOf(token["d"], 0, {7, 7}, false), 100, 6.5);
  EXPECT_EQ(f.engine->uploadsInFlight(), 1u);
  for (const char* id : {"b", "c", "d"}) f.engine->onHeartbeat(id, 9.5);
  f.engine->onHello("a", hello("a"), 9.5);  // a comes back (idle, for round 2)
  // The deadline ends the round with d late mid-upload: cancelled, its credit returned.
  f.engine->onTick(10);
  auto actions = f.take();
  auto commits = actionsOf<CommitRound>(actions);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.late, 1u);
  EXPECT_EQ(commits[0].round.dropped, 1u);
  EXPECT_EQ(commits[0].round.rejected, 1u);
  EXPECT_EQ(f.engine->params(), (std::vector<float>{3, 3, 3}));  // nothing partial aggregated
  EXPECT_EQ(f.engine->uploadsInFlight(), 0u);
  EXPECT_EQ(f.engine->uploadsWaiting(), 0u);

  // Round 2: everyone asks at once; the second completion ends the round and cancels the two
  // still waiting for the credit, which nothing then holds.
  auto next = tokensOf(actionsOf<SendTask>(actions));
  ASSERT_EQ(next.size(), 4u);
  for (const auto& [id, tok] : next) f.engine->onUploadRequest(id, tok, 11);
  f.take();
  EXPECT_EQ(grantsIn(f.log).back(), next["a"]);  // asked first (in id order)
  EXPECT_EQ(f.engine->uploadsWaiting(), 3u);
  f.upload("a", next["a"], {1, 1, 1}, 1, 12);  // credit to b
  f.take();
  EXPECT_EQ(grantsIn(f.log).back(), next["b"]);
  f.upload("b", next["b"], {5, 5, 5}, 1, 13);
  actions = f.take();
  commits = actionsOf<CommitRound>(actions);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.completed, 2u);
  EXPECT_EQ(commits[0].round.late, 2u);
  EXPECT_EQ(actionsOf<SendCancel>(actions).size(), 2u);
  EXPECT_EQ(f.engine->uploadsInFlight(), 0u);
  EXPECT_EQ(f.engine->uploadsWaiting(), 0u);
  EXPECT_EQ(f.engine->peakUploadsInFlight(), 1u);
}

// Over-selection cancels a task that holds a credit part-way through its upload.
TEST(RoundEngineCredits, OverSelectionCancelsAnUploadHoldingACredit) {
  EngineOptions o = creditOptions(1, 2);
  o.over_selection = 1.0;  // 2 selected, the first to complete ends the round
  o.min_clients = 2;
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  for (const char* id : {"a", "b"}) f.engine->onHello(id, hello(id), 0);
  auto token = tokensOf(actionsOf<SendTask>(f.take()));
  for (const char* id : {"a", "b"}) f.engine->onUploadRequest(id, token[id], 1);
  f.take();
  EXPECT_EQ(f.engine->uploadsInFlight(), 2u);
  f.engine->onChunk("b", chunkOf(token["b"], 0, {8, 8}, false), 100, 1.5);
  f.upload("a", token["a"], {1, 2, 3}, 1, 2);
  auto actions = f.take();
  ASSERT_EQ(actionsOf<SendCancel>(actions).size(), 1u);
  EXPECT_EQ(actionsOf<SendCancel>(actions)[0].client, "b");
  EXPECT_EQ(f.engine->uploadsInFlight(), 0u);
  EXPECT_EQ(f.engine->params(), (std::vector<float>{1, 2, 3}));
}

// Unbounded credits (0): every request is granted at once, and chunks need no grant (the
// simulator's virtual clients never ask).
TEST(RoundEngineCredits, UnboundedGrantsAtOnceAndAnswersStaleRequests) {
  Fixture f(creditOptions(3, 0), {0, 0, 0});
  f.engine->start(0);
  for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
  auto token = tokensOf(actionsOf<SendTask>(f.take()));
  for (const char* id : {"a", "b"}) f.engine->onUploadRequest(id, token[id], 1);
  f.take();
  EXPECT_EQ(grantsIn(f.log), (std::vector<uint64_t>{token["a"], token["b"]}));
  EXPECT_EQ(f.engine->uploadsInFlight(), 2u);
  f.upload("c", token["c"], {3, 3, 3}, 1, 2);  // never asked
  f.engine->onUploadRequest("a", 12345, 2);    // unknown token: an Error, no grant
  auto actions = f.take();
  ASSERT_EQ(actionsOf<SendError>(actions).size(), 1u);
  EXPECT_EQ(actionsOf<SendError>(actions)[0].error.code, wire::ErrorCode::kStaleTask);
  EXPECT_TRUE(actionsOf<SendGrant>(actions).empty());
  f.upload("a", token["a"], {0, 0, 0}, 1, 3);
  f.upload("b", token["b"], {0, 0, 0}, 1, 3);
  auto commits = actionsOf<CommitRound>(f.take());
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.completed, 3u);
  EXPECT_EQ(f.engine->uploadsInFlight(), 0u);
}

// FedBuff with one credit: tasks keep training in parallel, uploads go one at a time, the
// server steps are those without credits, and the per-task deadline returns a credit.
TEST(RoundEngineCredits, FedBuffUploadsOneAtATimeAndDeadlinesReturnCredits) {
  EngineOptions o = asyncOptions();
  o.max_concurrent_uploads = 1;
  o.liveness_s = 0;
  o.deadline_s = 20;
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  for (const char* id : {"a", "b", "c"}) f.engine->onHello(id, hello(id), 0);
  auto token = tokensOf(actionsOf<SendTask>(f.take()));
  ASSERT_EQ(token.size(), 3u);
  for (const char* id : {"a", "b", "c"}) f.engine->onUploadRequest(id, token[id], 1);
  f.take();
  EXPECT_EQ(grantsIn(f.log), (std::vector<uint64_t>{token["a"]}));
  f.upload("a", token["a"], {1, 1, 1}, 1, 2);  // credit to b; a gets a new task
  auto next = actionsOf<SendTask>(f.take());
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(grantsIn(f.log).back(), token["b"]);
  f.upload("b", token["b"], {3, 3, 3}, 7, 3);  // step: x += (1/2)(1 + 3) = 2; credit to c
  f.take();
  EXPECT_FLOAT_EQ(f.engine->params()[0], 2.0f);
  EXPECT_EQ(grantsIn(f.log).back(), token["c"]);
  // a's second task asks and waits behind c; c never sends: its deadline (sent at 0) passes.
  f.engine->onUploadRequest("a", next[0].task.task_token, 4);
  f.take();
  EXPECT_EQ(f.engine->uploadsWaiting(), 1u);
  f.engine->onTick(20);
  f.take();
  EXPECT_EQ(grantsIn(f.log).back(), next[0].task.task_token);
  EXPECT_EQ(f.engine->uploadsInFlight(), 1u);
  EXPECT_EQ(f.engine->peakUploadsInFlight(), 1u);
}

TEST(RoundEngine, TargetAccuracyEndsTheRunAndCancelsTheNextRound) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.rounds = 10;
  o.target_accuracy = 0.5;  // the fixture reports accuracy 0.5 for every evaluation
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 1u);  // round 0 (initial) reaching it does not count
  f.upload("a", tasks[0].task.task_token, {1, 1, 1}, 1, 1);
  auto actions = f.take();
  auto commits = actionsOf<CommitRound>(actions);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.round, 1u);
  EXPECT_TRUE(f.engine->finished());
  // Round 2 went out before round 1's evaluation; it is cancelled and never recorded.
  auto sent = actionsOf<SendTask>(actions);
  ASSERT_EQ(sent.size(), 1u);
  auto cancels = actionsOf<SendCancel>(actions);
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_EQ(cancels[0].cancel.task_token, sent[0].task.task_token);
  auto done = actionsOf<RunFinished>(actions);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].ok);
}

// Oort through the engine: a restarted engine given the checkpoint's engine state selects the
// same clients as the one that kept running.
TEST(RoundEngineSelection, OortStateInTheCheckpointContinuesSelectionAfterARestart) {
  EngineOptions o = baseOptions(2, 6, 1);
  o.rounds = 3;
  o.selector.kind = SelectorKind::kOort;
  o.selector.explore_initial = 0.5;
  const std::vector<std::string> ids = {"a", "b", "c", "d", "e", "f"};
  Fixture first(o, {0, 0, 0});
  first.engine->start(0);
  for (const auto& id : ids) first.engine->onHello(id, hello(id), 0);
  auto round1 = actionsOf<SendTask>(first.take());
  ASSERT_EQ(round1.size(), 2u);
  double t = 1;
  for (const auto& st : round1) first.upload(st.client, st.task.task_token, {1, 1, 1}, 10, t++);
  auto actions = first.take();
  auto commits = actionsOf<CommitRound>(actions);
  ASSERT_EQ(commits.size(), 1u);
  ASSERT_TRUE(commits[0].checkpoint.has_value());
  const std::string state = commits[0].checkpoint->engine_state;
  EXPECT_EQ(state.substr(0, 4), "FFE1");
  auto round2 = actionsOf<SendTask>(actions);
  ASSERT_EQ(round2.size(), 2u);

  EngineOptions resumed = o;
  resumed.first_round = 2;
  resumed.model_version = 1;
  resumed.evaluate_initial = false;
  Fixture second(resumed, first.engine->params());
  ASSERT_TRUE(second.engine->loadState(state).isOk());
  second.engine->start(10);
  for (const auto& id : ids) second.engine->onHello(id, hello(id), 10);
  auto again = actionsOf<SendTask>(second.take());
  ASSERT_EQ(again.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(again[i].client, round2[i].client);

  // A corrupt state is refused and changes nothing.
  EXPECT_FALSE(second.engine->loadState(state.substr(0, state.size() - 3)).isOk());
  EXPECT_FALSE(second.engine->loadState("nonsense").isOk());
}

TEST(RoundEngineAggregation, FedNovaNormalisesByLocalSteps) {
  EngineOptions o = baseOptions(2, 2, 2);
  o.aggregator = AggregatorKind::kFedNova;
  Fixture f(o, {0, 0, 0});
  // n = 1, 3; tau = 2, 4: d_a = (1, 1, 1), d_b = (1, 0, 2); sum p d = (1, 0.25, 1.75);
  // tau_eff = (1 x 2 + 3 x 4) / 4 = 3.5; x = 3.5 x (1, 0.25, 1.75).
  auto c = oneRound(f, {"a", "b"}, {{"a", {2, 2, 2}, 1, 2}, {"b", {4, 0, 8}, 3, 4}});
  EXPECT_EQ(c.round.status, "ok");
  EXPECT_FLOAT_EQ(f.engine->params()[0], 3.5f);
  EXPECT_FLOAT_EQ(f.engine->params()[1], 0.875f);
  EXPECT_FLOAT_EQ(f.engine->params()[2], 6.125f);
}

TEST(RoundEngineAggregation, FedNovaWithEqualStepsIsFedAvg) {
  EngineOptions o = baseOptions(2, 2, 2);
  Fixture avg(o, {1, 1, 1});
  o.aggregator = AggregatorKind::kFedNova;
  o.hparams.momentum = 0.9f;
  Fixture nova(o, {1, 1, 1});
  const std::vector<Upload> ups = {{"a", {2, -2, 2}, 1, 5}, {"b", {4, 0, 8}, 3, 5}};
  oneRound(avg, {"a", "b"}, ups);
  oneRound(nova, {"a", "b"}, ups);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(nova.engine->params()[i], avg.engine->params()[i], 1e-5);
}

TEST(RoundEngineAggregation, CoordinateWiseMedianIgnoresAnOutlier) {
  EngineOptions o = baseOptions(3, 3, 3);
  o.aggregator = AggregatorKind::kMedian;
  Fixture f(o, {0, 0, 0});
  auto c = oneRound(f, {"a", "b", "c"},
                    {{"a", {1, 10, -1}, 1}, {"b", {2, 0, 5}, 50}, {"c", {1000, 5, 0}, 1}});
  EXPECT_EQ(c.round.status, "ok");
  EXPECT_EQ(f.engine->params(), (std::vector<float>{2, 5, 0}));
}

TEST(RoundEngineAggregation, TrimmedMeanDropsTheEnds) {
  EngineOptions o = baseOptions(4, 4, 4);
  o.aggregator = AggregatorKind::kTrimmedMean;
  o.trim_fraction = 0.25;      // floor(0.25 x 4) = 1 dropped at each end
  o.robust_buffer_bytes = 16;  // forces the later updates to spill to a file
  Fixture f(o, {0, 0, 0});
  oneRound(f, {"a", "b", "c", "d"},
           {{"a", {1, 0, 0}}, {"b", {2, 0, 0}}, {"c", {4, 0, 9}}, {"d", {100, 0, -9}}});
  EXPECT_EQ(f.engine->params(), (std::vector<float>{3, 0, 0}));
}

TEST(RoundEngineAggregation, NormClippingScalesLargeUpdatesBeforeAveraging) {
  EngineOptions o = baseOptions(2, 2, 2);
  o.clip_norm = 1;
  Fixture f(o, {0, 0, 0});
  // (3, 4, 0) has norm 5 -> (0.6, 0.8, 0); (0, 0, 0.5) is left; weights 1 and 1.
  oneRound(f, {"a", "b"}, {{"a", {3, 4, 0}}, {"b", {0, 0, 0.5f}}});
  EXPECT_FLOAT_EQ(f.engine->params()[0], 0.3f);
  EXPECT_FLOAT_EQ(f.engine->params()[1], 0.4f);
  EXPECT_FLOAT_EQ(f.engine->params()[2], 0.25f);
}

TEST(RoundEngineAggregation, ScaffoldAveragesDeltasAndUpdatesTheServerControlVariate) {
  EngineOptions o = baseOptions(2, 4, 2);
  o.aggregator = AggregatorKind::kScaffold;
  o.hparams.scaffold = true;
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  for (const char* id : {"a", "b", "c", "d"}) f.engine->onHello(id, hello(id), 0);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_EQ(tasks[0].task.control_bytes, std::string(12, '\0'));  // c starts at 0
  // Updates are 2P long: D_k then Dc_k. Weights (n) do not matter to SCAFFOLD.
  const std::vector<std::vector<float>> up = {{1, 2, 3, 4, 4, 4}, {3, 2, 1, 0, 0, 8}};
  for (size_t i = 0; i < 2; ++i) {
    f.upload(tasks[i].client, tasks[i].task.task_token, up[i], i == 0 ? 1 : 7, 1.0 + i);
  }
  auto actions = f.take();
  ASSERT_EQ(actionsOf<CommitRound>(actions).size(), 1u);
  EXPECT_EQ(f.engine->params(), (std::vector<float>{2, 2, 2}));  // mean of the deltas
  auto next = actionsOf<SendTask>(actions);
  ASSERT_FALSE(next.empty());
  // c = (Dc_a + Dc_b) / N with N = 4 registered clients = (1, 1, 3).
  std::vector<float> c(3);
  ASSERT_EQ(next[0].task.control_bytes.size(), 12u);
  std::memcpy(c.data(), next[0].task.control_bytes.data(), 12);
  EXPECT_EQ(c, (std::vector<float>{1, 1, 3}));
}

TEST(RoundEngineAggregation, ServerMomentumCarriesAcrossRounds) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.server.kind = ServerOptimizerKind::kFedAvgM;
  o.server.momentum = 0.5;
  o.rounds = 2;
  Fixture f(o, {0, 0, 0});
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 0);
  for (int round = 0; round < 2; ++round) {
    auto tasks = actionsOf<SendTask>(f.take());
    ASSERT_EQ(tasks.size(), 1u);
    f.upload("a", tasks[0].task.task_token, {2, 0, -2}, 1, 1.0 + round);
  }
  f.take();
  // m1 = G, x1 = G; m2 = 0.5 G + G, x2 = 2.5 G with G = (2, 0, -2).
  EXPECT_EQ(f.engine->params(), (std::vector<float>{5, 0, -5}));
}

// ---- Blocks (block-cyclic training; protocol steps B1-B5 in round_engine.h) ----

// Clients c0..c{n-1} with partitions 0..n-1; M blocks of `per_block` rounds; liveness off.
EngineOptions blockOptions(uint32_t k, uint32_t rounds, uint32_t blocks, uint32_t per_block,
                           BlockMode mode) {
  EngineOptions o = baseOptions(k, 1, 1);
  o.rounds = rounds;
  o.liveness_s = 0;
  o.num_partitions = 64;  // client ci asks for partition i
  o.blocks.count = blocks;
  o.blocks.rounds_per_block = per_block;
  o.block_mode = mode;
  return o;
}

struct BlockRun {
  Fixture f;
  std::vector<EvaluateBlocks> asked;                              // every EvaluateBlocks seen
  std::vector<history::BlockMetricRecord> rows;                   // every row recorded
  std::map<std::pair<uint32_t, std::string>, double> validation;  // (block, model) -> loss
  bool answer_blocks = true;
  std::vector<SendTask> tasks;  // sent and not yet answered by round()

  BlockRun(EngineOptions o, std::vector<float> params, uint32_t clients) : f(o, std::move(params)) {
    for (uint32_t i = 0; i < clients; ++i) {
      const std::string id = "c" + std::to_string(i);
      f.engine->registerClient(id, hello(id, static_cast<int32_t>(i)), 0);
    }
    f.engine->start(0);
  }
  // Takes the actions (Evaluate answered by the fixture); answers EvaluateBlocks with accuracy
  // 0.1 x (block + 1) (+ 0.5 for chains), validation losses from `validation` (default 1).
  std::vector<Action> take() {
    std::vector<Action> all;
    while (true) {
      auto a = f.take();
      if (a.empty()) break;
      for (const auto& action : a) {
        if (auto* t = std::get_if<SendTask>(&action)) tasks.push_back(*t);
        if (auto* r = std::get_if<RecordBlockMetrics>(&action)) {
          rows.insert(rows.end(), r->rows.begin(), r->rows.end());
        }
        auto* e = std::get_if<EvaluateBlocks>(&action);
        if (!e) continue;
        asked.push_back(*e);
        if (!answer_blocks) continue;
        std::vector<BlockEvalOutcome> out;
        for (const auto& m : e->models) {
          BlockEvalOutcome o;
          o.block = m.block;
          o.model = m.model;
          auto v = validation.find({m.block, m.model});
          o.validation_loss = v == validation.end() ? 1.0 : v->second;
          o.accuracy = 0.1 * (m.block + 1) + (m.model == "chain" ? 0.5 : 0);
          o.loss = 2;
          out.push_back(o);
        }
        f.engine->onBlocksEvaluated(e->round, out, 0);
      }
      all.insert(all.end(), a.begin(), a.end());
    }
    return all;
  }
  // Every task of the round uploads `delta` (n = 10); returns the tasks. Summaries say the
  // client holds the served model its task named unless `lacks_served`.
  std::vector<SendTask> round(const std::vector<float>& delta, double now,
                              bool lacks_served = false) {
    take();
    std::vector<SendTask> sent;
    sent.swap(tasks);
    for (const auto& t : sent) {
      f.served_echo = lacks_served ? wire::Sha256{} : t.task.served.sha256;
      f.upload(t.client, t.task.task_token, delta, 10, now);
    }
    return sent;
  }
};

std::vector<float> floatsOf(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

TEST(RoundEngineBlocks, OnlyClientsOfTheCurrentBlockAreSampled) {
  // 12 clients, 3 blocks of 2 rounds: block m is c{m}, c{m+3}, c{m+6}, c{m+9}; K = 2 of 4.
  BlockRun run(blockOptions(2, 12, 3, 2, BlockMode::kSingle), {0, 0}, 12);
  std::set<std::string> seen;
  for (uint32_t r = 1; r <= 12; ++r) {
    auto tasks = run.round({0.5f, 0}, r);
    ASSERT_EQ(tasks.size(), 2u) << "round " << r;
    const uint32_t block = ((r - 1) / 2) % 3;
    for (const auto& t : tasks) {
      const int index = std::stoi(t.client.substr(1));
      EXPECT_EQ(index % 3, static_cast<int>(block)) << "round " << r << " sampled " << t.client;
      seen.insert(t.client);
    }
  }
  EXPECT_GT(seen.size(), 6u);  // the sampling still spreads within each block
  run.take();
  // One EvaluateBlocks per block visit (after rounds 2, 4, ..., 12), each asking x on 3 blocks.
  ASSERT_EQ(run.asked.size(), 6u);
  EXPECT_EQ(run.asked[0].round, 2u);
  EXPECT_EQ(run.asked[1].ended_block, 1u);
  EXPECT_EQ(run.asked[0].models.size(), 3u);
  // Rows: shared and served (= shared in single mode) for each block, each evaluation.
  ASSERT_EQ(run.rows.size(), 6u * 6u);
  EXPECT_EQ(run.rows[3].model, "served");
  EXPECT_EQ(run.rows[3].block, "0");
  EXPECT_DOUBLE_EQ(*run.rows[3].accuracy, 0.1);
  EXPECT_EQ(eventsOf(run.f.log, "block_started"), 6);
  EXPECT_TRUE(run.f.engine->finished());
}

TEST(RoundEngineBlocks, PluralisticAveragesTheEndOfBlockModels) {
  // Two blocks of one round, one client each: x moves by (1, 0) in block 0 and (0, 2) in block 1.
  BlockRun run(blockOptions(1, 4, 2, 1, BlockMode::kPluralistic), {0, 0}, 2);
  run.round({1, 0}, 1);  // x = (1, 0): z_0 = (1, 0)
  run.round({0, 2}, 2);  // x = (1, 2): z_1 = (1, 2)
  run.round({1, 0}, 3);  // x = (2, 2): z_0 = mean((1, 0), (2, 2)) = (1.5, 1)
  EXPECT_EQ(run.f.engine->blockModels()->average(0), (std::vector<float>{1.5f, 1}));
  EXPECT_EQ(run.f.engine->servedModel(0), (std::vector<float>{1.5f, 1}));
  EXPECT_EQ(run.f.engine->servedModel(1), (std::vector<float>{1, 2}));
  run.round({0, 2}, 4);  // x = (2, 4): z_1 = mean((1, 2), (2, 4)) = (1.5, 3)
  run.take();
  EXPECT_EQ(run.f.engine->params(), (std::vector<float>{2, 4}));
  EXPECT_EQ(run.f.engine->servedModel(1), (std::vector<float>{1.5f, 3}));
  // The evaluation after round 3 asked for z_0 = (1.5, 1) on block 0.
  ASSERT_EQ(run.asked.size(), 4u);
  bool found = false;
  for (const auto& m : run.asked[2].models) {
    if (m.block == 0 && m.model == "pluralistic") {
      found = true;
      EXPECT_EQ(*m.params, (std::vector<float>{1.5f, 1}));
    }
  }
  EXPECT_TRUE(found);
  EXPECT_TRUE(run.f.engine->finished());
}

TEST(RoundEngineBlocks, MultichainTrainsTheBlockChainApartAndServesTheLowerLoss) {
  // Two blocks of two rounds: in each visit the 1st round trains x, the 2nd the block's chain.
  BlockRun run(blockOptions(1, 4, 2, 2, BlockMode::kMultichain), {0, 0}, 2);
  run.validation[{0, "chain"}] = 0.4;  // block 0: the chain wins; block 1: the average
  run.validation[{0, "pluralistic"}] = 0.9;
  run.validation[{1, "chain"}] = 0.8;
  run.validation[{1, "pluralistic"}] = 0.2;
  auto t1 = run.round({1, 0}, 1);  // x = (1, 0)
  ASSERT_EQ(t1.size(), 1u);
  EXPECT_EQ(floatsOf(*t1[0].model_bytes), (std::vector<float>{0, 0}));
  auto t2 = run.round({0, 3}, 2);  // y_0 starts as x = (1, 0), then (1, 3); x stays (1, 0)
  ASSERT_EQ(t2.size(), 1u);
  EXPECT_EQ(floatsOf(*t2[0].model_bytes), (std::vector<float>{1, 0}));
  EXPECT_EQ(t2[0].task.model_sha256, crypto::sha256(*t2[0].model_bytes));
  run.take();
  EXPECT_EQ(run.f.engine->params(), (std::vector<float>{1, 0}));
  EXPECT_EQ(run.f.engine->blockModels()->chain(0), (std::vector<float>{1, 3}));
  EXPECT_EQ(run.f.engine->blockModels()->average(0), (std::vector<float>{1, 0}));
  // Evaluated after round 2: block 0's chain had the lower validation loss, so it is served.
  EXPECT_EQ(run.f.engine->servedModel(0), (std::vector<float>{1, 3}));
  std::map<std::string, double> acc;  // model -> block 0 accuracy after round 2
  for (const auto& r : run.rows) {
    if (r.round == 2 && r.block == "0") acc[r.model] = *r.accuracy;
  }
  EXPECT_DOUBLE_EQ(acc["chain"], 0.6);
  EXPECT_DOUBLE_EQ(acc["pluralistic"], 0.1);
  EXPECT_DOUBLE_EQ(acc["served"], 0.6);
  auto t3 = run.round({0, 1}, 3);  // block 1, x: (1, 1)
  ASSERT_EQ(t3.size(), 1u);
  EXPECT_EQ(floatsOf(*t3[0].model_bytes), (std::vector<float>{1, 0}));
  auto t4 = run.round({2, 0}, 4);  // y_1 from (1, 1) to (3, 1)
  ASSERT_EQ(t4.size(), 1u);
  EXPECT_EQ(floatsOf(*t4[0].model_bytes), (std::vector<float>{1, 1}));
  run.take();
  EXPECT_EQ(run.f.engine->blockModels()->chain(1), (std::vector<float>{3, 1}));
  EXPECT_EQ(run.f.engine->params(), (std::vector<float>{1, 1}));
  EXPECT_EQ(run.f.engine->servedModel(1), (std::vector<float>{1, 1}));  // z_1 won
  EXPECT_EQ(run.f.engine->modelVersion(), 4u);
  EXPECT_TRUE(run.f.engine->finished());
}

TEST(RoundEngineBlocks, AClockScheduleFollowsTheEngineTime) {
  // Blocks of 10 s: rounds ending before t = 10 stay in block 0; the first round ending after
  // it closes the visit, and the next round goes to block 1's client.
  EngineOptions o = blockOptions(1, 3, 2, 0, BlockMode::kPluralistic);
  o.blocks.block_s = 10;
  BlockRun run(o, {0, 0}, 2);
  auto t1 = run.round({1, 0}, 5);
  auto t2 = run.round({1, 0}, 12);
  auto t3 = run.round({0, 1}, 14);
  run.take();
  ASSERT_EQ(t1.size(), 1u);
  ASSERT_EQ(t2.size(), 1u);
  ASSERT_EQ(t3.size(), 1u);
  EXPECT_EQ(t1[0].client, "c0");
  EXPECT_EQ(t2[0].client, "c0");
  EXPECT_EQ(t3[0].client, "c1");
  ASSERT_EQ(run.asked.size(), 2u);  // after round 2 (t = 12) and after the last round
  EXPECT_EQ(run.asked[0].round, 2u);
  EXPECT_EQ(run.asked[0].ended_block, 0u);
  EXPECT_EQ(run.f.engine->blockModels()->average(0), (std::vector<float>{2, 0}));
  EXPECT_EQ(run.f.engine->blockModels()->average(1), (std::vector<float>{2, 1}));
}

TEST(RoundEngineBlocks, OneBlockOnAClockStillEndsAVisitAtEachBoundary) {
  // M = 1, windows of 10 s: the block number never changes, but the visit does. Rounds end at
  // t = 5, 12, 14, 25: the visit of [0, 10) ends after round 2, that of [10, 20) after round 4
  // (the last), so the running average is the mean of x after round 2 and after round 4.
  EngineOptions o = blockOptions(1, 4, 1, 0, BlockMode::kPluralistic);
  o.blocks.block_s = 10;
  BlockRun run(o, {0, 0}, 1);
  for (double t : {5.0, 12.0, 14.0, 25.0}) ASSERT_EQ(run.round({1, 0}, t).size(), 1u) << t;
  run.take();
  ASSERT_EQ(run.asked.size(), 2u);
  EXPECT_EQ(run.asked[0].round, 2u);
  EXPECT_EQ(run.asked[1].round, 4u);
  EXPECT_EQ(run.f.engine->blockModels()->visits(0), 2u);
  EXPECT_EQ(run.f.engine->blockModels()->average(0), (std::vector<float>{3, 0}));
  EXPECT_EQ(eventsOf(run.f.log, "block_started"), 2);
}

TEST(RoundEngineBlocks, TheRunEndsOnlyAfterTheLastBlockReport) {
  BlockRun run(blockOptions(1, 2, 2, 1, BlockMode::kPluralistic), {0, 0}, 2);
  run.answer_blocks = false;
  run.round({1, 0}, 1);
  run.round({1, 0}, 2);
  run.take();
  ASSERT_EQ(run.asked.size(), 2u);
  EXPECT_FALSE(run.f.engine->finished());
  EXPECT_TRUE(actionsOf<RunFinished>(run.f.log).empty());
  run.f.engine->onBlocksEvaluated(1, {}, 3);
  run.take();
  EXPECT_FALSE(run.f.engine->finished());
  run.f.engine->onBlocksEvaluated(2, {}, 3);
  run.f.engine->onBlocksEvaluated(2, {}, 3);  // a second report is ignored
  run.take();
  EXPECT_TRUE(run.f.engine->finished());
  EXPECT_EQ(actionsOf<RunFinished>(run.f.log).size(), 1u);
}

TEST(RoundEngineBlocks, BlockModelsSurviveARestart) {
  EngineOptions o = blockOptions(1, 6, 2, 2, BlockMode::kMultichain);
  BlockRun run(o, {0, 0}, 2);
  run.validation[{0, "chain"}] = 0.1;
  for (uint32_t r = 1; r <= 3; ++r) run.round({1, static_cast<float>(r)}, r);
  run.take();
  std::string state;
  for (const auto& c : actionsOf<CommitRound>(run.f.log)) {
    if (c.checkpoint && c.round.round == 3) state = c.checkpoint->engine_state;
  }
  ASSERT_FALSE(state.empty());
  // Resume from round 3's checkpoint: x = (2, 4), z_0 = (1, 1), y_0 = (2, 3), and the choice
  // made when block 0 was evaluated after round 2 (the chain).
  EngineOptions resumed = o;
  resumed.first_round = 4;
  RoundEngine again(resumed, {2, 4});
  ASSERT_TRUE(again.loadState(state).isOk());
  EXPECT_EQ(again.blockModels()->average(0), (std::vector<float>{1, 1}));
  EXPECT_EQ(again.blockModels()->chain(0), (std::vector<float>{2, 3}));
  EXPECT_EQ(again.servedModel(0), (std::vector<float>{2, 3}));
  EXPECT_EQ(again.blockModels()->visits(0), 1u);
  EXPECT_EQ(again.currentBlock(), 1u);
  // A damaged state (cut short in its last section) is refused and changes nothing.
  RoundEngine other(resumed, {2, 4});
  EXPECT_FALSE(other.loadState(state.substr(0, state.size() - 4)).isOk());
  EXPECT_TRUE(other.blockModels()->average(0).empty());
}

TEST(RoundEngineBlocks, ABlockClientIsServedItsBlocksModelOnlyWhenItChanged) {
  // Two blocks of three rounds, one client each (c0 in block 0, c1 in block 1), pluralistic.
  BlockRun run(blockOptions(1, 9, 2, 3, BlockMode::kPluralistic), {0, 0}, 2);
  std::vector<SendTask> t;
  for (uint32_t r = 1; r <= 6; ++r) {
    auto sent = run.round({1, static_cast<float>(r)}, r);
    ASSERT_EQ(sent.size(), 1u);
    // Before block m's first visit ends it is served x, the task's own model: no extra bytes.
    EXPECT_EQ(sent[0].task.served.source, wire::ServedSource::kTaskModel) << "round " << r;
    EXPECT_EQ(sent[0].task.served.sha256, sent[0].task.model_sha256);
    EXPECT_EQ(sent[0].task.served.model, "shared");
    EXPECT_EQ(sent[0].served_bytes, nullptr);
  }
  // Round 7, block 0 again: z_0 = x after round 3 = (3, 6), not the task's x = (6, 21).
  run.take();
  ASSERT_EQ(run.tasks.size(), 1u);
  const SendTask r7 = run.tasks[0];
  EXPECT_EQ(r7.client, "c0");
  EXPECT_EQ(r7.task.served.source, wire::ServedSource::kAttached);
  EXPECT_EQ(r7.task.served.block, 0u);
  EXPECT_EQ(r7.task.served.model, "pluralistic");
  EXPECT_EQ(r7.task.served.version, 6u);  // the model version when it was first sent
  ASSERT_NE(r7.served_bytes, nullptr);
  const std::vector<float>& want = run.f.engine->servedModel(0);
  EXPECT_EQ(want, (std::vector<float>{3, 6}));
  ASSERT_EQ(r7.served_bytes->size(), want.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(r7.served_bytes->data(), want.data(), r7.served_bytes->size()), 0);
  EXPECT_EQ(r7.task.served.sha256, crypto::sha256(*r7.served_bytes));
  EXPECT_NE(r7.task.served.sha256, r7.task.model_sha256);
  // The client says it does not hold it (it lost it): round 8 sends it again.
  run.round({1, 0}, 7, /*lacks_served=*/true);
  auto r8 = run.round({1, 0}, 8);
  ASSERT_EQ(r8.size(), 1u);
  EXPECT_EQ(r8[0].task.served.source, wire::ServedSource::kAttached);
  ASSERT_NE(r8[0].served_bytes, nullptr);
  EXPECT_EQ(r8[0].served_bytes, r7.served_bytes);  // the same shared buffer
  // Round 9: unchanged, and the client has it: nothing is sent but its name.
  auto r9 = run.round({1, 0}, 9);
  ASSERT_EQ(r9.size(), 1u);
  EXPECT_EQ(r9[0].task.served.source, wire::ServedSource::kUnchanged);
  EXPECT_EQ(r9[0].served_bytes, nullptr);
  EXPECT_EQ(r9[0].task.served.sha256, r7.task.served.sha256);
  EXPECT_EQ(r9[0].task.served.version, 6u);
  run.take();
  // The update rows: served bytes counted in bytes_down, the client's report of the served
  // model where it held the one named.
  std::map<uint32_t, history::UpdateRecord> rows;
  for (const auto& c : actionsOf<CommitRound>(run.f.log)) {
    for (const auto& u : c.updates) rows[u.round] = u;
  }
  ASSERT_EQ(rows.size(), 9u);
  EXPECT_EQ(rows[7].served_block, 0);
  EXPECT_EQ(rows[7].served_model, "pluralistic");
  EXPECT_EQ(rows[7].served_sha256_hex, crypto::toHex(r7.task.served.sha256));
  EXPECT_EQ(rows[7].served_bytes, 8u);
  EXPECT_EQ(rows[7].bytes_down, 16u);
  EXPECT_EQ(rows[7].served_samples, 0u);  // it did not hold it: no report
  EXPECT_FALSE(rows[7].served_accuracy.has_value());
  EXPECT_EQ(rows[8].served_bytes, 8u);
  EXPECT_EQ(rows[8].served_samples, 20u);
  EXPECT_DOUBLE_EQ(*rows[8].served_accuracy, 0.65);
  EXPECT_DOUBLE_EQ(*rows[8].served_loss, 0.7);
  EXPECT_EQ(rows[9].served_bytes, 0u);
  EXPECT_EQ(rows[9].bytes_down, 8u);
  EXPECT_EQ(rows[1].served_model, "shared");
  EXPECT_EQ(rows[1].served_bytes, 0u);
  EXPECT_EQ(rows[4].served_block, 1);
  EXPECT_EQ(eventsOf(run.f.log, "served_mismatch"), 1);
}

TEST(RoundEngineBlocks, ARestartedClientIsSentItsServedModelAgain) {
  // One block of three rounds, one client: z_0 exists from round 4 on.
  BlockRun run(blockOptions(1, 6, 1, 3, BlockMode::kPluralistic), {0, 0}, 1);
  for (uint32_t r = 1; r <= 3; ++r) run.round({1, 0}, r);
  auto r4 = run.round({1, 0}, 4);
  ASSERT_EQ(r4.size(), 1u);
  // z_0 is x as the visit ended: the very model round 4 trains, so no extra bytes.
  EXPECT_EQ(r4[0].task.served.source, wire::ServedSource::kTaskModel);
  EXPECT_EQ(r4[0].task.served.model, "pluralistic");
  run.take();
  ASSERT_EQ(run.tasks.size(), 1u);
  EXPECT_EQ(run.tasks[0].task.served.source, wire::ServedSource::kUnchanged);  // round 5
  // A new process of c0 (another session) while round 5 trains: that task is lost, and the
  // new process may have lost the served model too.
  wire::Hello h = hello("c0", 0);
  h.session = 99;
  run.f.engine->onHello("c0", h, 5);
  run.take();
  ASSERT_EQ(run.tasks.size(), 2u);
  const SendTask& r6 = run.tasks[1];
  EXPECT_EQ(r6.task.round, 6u);
  EXPECT_EQ(r6.task.served.sha256, r4[0].task.served.sha256);       // z_0 unchanged...
  EXPECT_EQ(r6.task.served.source, wire::ServedSource::kAttached);  // ...but sent again
  ASSERT_NE(r6.served_bytes, nullptr);
  EXPECT_EQ(floatsOf(*r6.served_bytes), run.f.engine->servedModel(0));
  EXPECT_EQ(floatsOf(*r6.served_bytes), (std::vector<float>{3, 0}));
}

TEST(RoundEngineBlocks, WithoutBlocksNoServedModelIsNamed) {
  Fixture f(baseOptions(1, 1, 1));
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 1);
  auto tasks = actionsOf<SendTask>(f.take());
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_EQ(tasks[0].task.served.source, wire::ServedSource::kNone);
  EXPECT_EQ(tasks[0].served_bytes, nullptr);
}

TEST(RoundEngineSelection, BadSelectorAndOptimiserOptionsAreStartUpErrors) {
  EngineOptions o = baseOptions(1, 1, 1);
  EXPECT_TRUE(checkEngineOptions(o).isOk());
  o.selector.kind = SelectorKind::kOort;
  o.selector.explore_min = 1.5;
  Status st = checkEngineOptions(o);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("explore_min"), std::string::npos) << st.message();
  o = baseOptions(1, 1, 1);
  o.server.kind = ServerOptimizerKind::kFedAdam;
  o.server.tau = 0;
  st = checkEngineOptions(o);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("tau"), std::string::npos) << st.message();
}

// Protocol step 9 with max_evaluations_behind = 1: round 2 still overlaps round 1's evaluation,
// but round 3 waits until it is reported, however long that takes (no wait_clients_s failure).
TEST(RoundEngine, ARoundWaitsWhileMaxEvaluationsBehindAwaitTheirEvaluation) {
  EngineOptions o = baseOptions(1, 1, 1);
  o.max_evaluations_behind = 1;
  RoundEngine engine(o, {0, 0, 0});
  engine.start(0);
  engine.onEvaluated(0, EvalOutcome{1, 0.1}, 0);
  engine.onHello("a", hello("a"), 0);
  // Client a uploads the task of `actions`; returns the actions that follow.
  auto upload = [&](const std::vector<Action>& actions, double now) {
    auto tasks = actionsOf<SendTask>(actions);
    EXPECT_EQ(tasks.size(), 1u);
    if (tasks.empty()) return std::vector<Action>{};
    const uint64_t token = tasks[0].task.task_token;
    engine.onChunk("a", chunkOf(token, 0, {1, 1, 1}, true, 10), 12, now);
    wire::Summary s;
    s.task_token = token;
    s.n_samples = 10;
    s.steps = 3;
    engine.onSummary("a", s, 8, now);
    return engine.takeActions();
  };
  auto after1 = upload(engine.takeActions(), 1);  // round 2 goes out, round 1 is evaluated
  EXPECT_EQ(actionsOf<Evaluate>(after1).size(), 1u);
  ASSERT_EQ(actionsOf<SendTask>(after1).size(), 1u);
  auto after2 = upload(after1, 2);  // round 1 is not evaluated yet: round 3 waits
  EXPECT_EQ(actionsOf<Evaluate>(after2).size(), 1u);
  EXPECT_TRUE(actionsOf<SendTask>(after2).empty());
  engine.onHeartbeat("a", 500);
  engine.onTick(500);  // past wait_clients_s (100 s): still waiting, not failed
  EXPECT_TRUE(actionsOf<RunFinished>(engine.takeActions()).empty());
  EXPECT_FALSE(engine.finished());
  engine.onEvaluated(1, EvalOutcome{0.7, 0.8}, 501);
  auto after_eval = engine.takeActions();
  auto commits = actionsOf<CommitRound>(after_eval);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].round.round, 1u);
  auto tasks = actionsOf<SendTask>(after_eval);
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_EQ(tasks[0].task.round, 3u);
}

}  // namespace
}  // namespace fedfleet::engine
