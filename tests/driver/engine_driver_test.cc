// EngineDriver: the engine's actions carried out once for both drivers. A whole round goes
// through it into a history (rows, clock columns from the port, hooks after the writes), and
// the first failed history write stops everything after it.
#include "driver/engine_driver.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/history/history.h"
#include "tests/engine/round_engine_fixture.h"

namespace fedfleet::driver {
namespace {

using engine::engine_test::baseOptions;
using engine::engine_test::chunkOf;
using engine::engine_test::hello;

// A memory history whose event writes fail from the `fail_from`-th on (counting from 1), as a
// full disk would.
class FailingHistory final : public history::HistoryStore {
 public:
  explicit FailingHistory(uint64_t fail_from) : fail_from_(fail_from) {}
  Result<int64_t> beginRun(const history::RunRecord& run) override { return inner_->beginRun(run); }
  Status upsertClient(const history::ClientRecord& c) override { return inner_->upsertClient(c); }
  Status commitRound(const history::RoundRecord& round,
                     const std::vector<history::UpdateRecord>& updates,
                     const std::optional<history::CheckpointRecord>& checkpoint) override {
    return inner_->commitRound(round, updates, checkpoint);
  }
  Status recordEvent(const history::EventRecord& event) override {
    if (++event_writes_ >= fail_from_) return ioError("disk full");
    return inner_->recordEvent(event);
  }
  Result<std::vector<history::RunRecord>> runs() override { return inner_->runs(); }
  Result<std::vector<history::RoundRecord>> rounds(int64_t run_id) override {
    return inner_->rounds(run_id);
  }
  Result<std::vector<history::UpdateRecord>> updates(int64_t run_id,
                                                     std::optional<uint32_t> round) override {
    return inner_->updates(run_id, round);
  }
  Result<std::vector<history::ClientRecord>> clients() override { return inner_->clients(); }
  Result<std::vector<history::EventRecord>> events(std::optional<int64_t> run_id) override {
    return inner_->events(run_id);
  }
  Result<history::CheckpointRecord> latestCheckpoint(int64_t run_id) override {
    return inner_->latestCheckpoint(run_id);
  }
  Result<std::vector<uint32_t>> checkpointRounds(int64_t run_id) override {
    return inner_->checkpointRounds(run_id);
  }
  Status pruneCheckpoints(int64_t run_id, uint32_t keep_last, bool keep_best) override {
    return inner_->pruneCheckpoints(run_id, keep_last, keep_best);
  }
  uint64_t eventWrites() const { return event_writes_; }

 private:
  std::unique_ptr<history::HistoryStore> inner_ = history::createMemoryHistory();
  uint64_t fail_from_;
  uint64_t event_writes_ = 0;
};

// A driver's port that evaluates at once (loss 2, accuracy 0.25) and notes what it was asked.
class RecordingPort final : public DriverPort {
 public:
  engine::RoundEngine* engine = nullptr;
  std::vector<engine::SendTask> tasks;
  std::vector<uint32_t> stamped, committed;
  uint64_t events_recorded = 0;

  void sendTask(engine::SendTask& send) override { tasks.push_back(send); }
  void sendCancel(const engine::SendCancel&) override { ++other_messages; }
  void sendGrant(const engine::SendGrant&) override { ++other_messages; }
  void sendSecAgg(const engine::SendSecAgg&) override { ++other_messages; }
  void sendError(const engine::SendError&) override { ++other_messages; }
  void sendBye(const engine::SendBye&) override { ++other_messages; }
  void evaluate(const engine::Evaluate& ev) override {
    engine->onEvaluated(ev.round, engine::EvalOutcome{2.0, 0.25}, 0);
  }
  void evaluateBlocks(const engine::EvaluateBlocks& ev) override {
    engine->onBlocksEvaluated(ev.round, {}, 0);
  }
  void stampRound(engine::CommitRound& commit) override {
    stamped.push_back(commit.round.round);
    commit.round.wall_start = 1000 + commit.round.round;
    commit.round.wall_end = 2000 + commit.round.round;
  }
  void roundCommitted(const engine::CommitRound& commit) override {
    committed.push_back(commit.round.round);
  }
  void eventRecorded(const history::EventRecord&) override { ++events_recorded; }
  uint64_t other_messages = 0;
};

struct DrivenRun {
  std::unique_ptr<FailingHistory> history;
  RecordingPort port;
  std::unique_ptr<engine::RoundEngine> engine;
  std::unique_ptr<EngineDriver> driver;
  int64_t run_id = 0;

  explicit DrivenRun(uint64_t fail_events_from) {
    history = std::make_unique<FailingHistory>(fail_events_from);
    history::RunRecord run;
    run.name = "driver";
    run_id = history->beginRun(run).value();
    engine::EngineOptions o = baseOptions(1, 1, 1);
    o.run_id = run_id;
    o.rounds = 1;
    o.bye_on_finish = false;
    engine = std::make_unique<engine::RoundEngine>(o, std::vector<float>{0, 0, 0});
    port.engine = engine.get();
    driver = std::make_unique<EngineDriver>(*history, port, CheckpointKeep{3, false}, "s");
  }
};

TEST(EngineDriver, ARoundGoesIntoTheHistoryWithThePortsClockAndHooksAfterTheWrites) {
  DrivenRun r(/*fail_events_from=*/UINT64_MAX);
  r.engine->start(0);
  r.engine->onHello("a", hello("a"), 0);
  ASSERT_TRUE(r.driver->carryOut(*r.engine).isOk());
  ASSERT_EQ(r.port.tasks.size(), 1u);
  EXPECT_EQ(r.port.tasks[0].client, "a");
  EXPECT_FALSE(r.driver->finished());

  const uint64_t token = r.port.tasks[0].task.task_token;
  r.engine->onChunk("a", chunkOf(token, 0, {0.5f, -1.0f, 2.0f}, true), 100, 1);
  wire::Summary s;
  s.task_token = token;
  s.n_samples = 10;
  s.steps = 3;
  s.mean_loss = 1;
  r.engine->onSummary("a", s, 50, 1);
  ASSERT_TRUE(r.driver->carryOut(*r.engine).isOk());

  // Round 0 (the initial model's evaluation) and round 1, each stamped before its write and
  // announced after it.
  EXPECT_EQ(r.port.stamped, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(r.port.committed, (std::vector<uint32_t>{0, 1}));
  auto rounds = r.history->rounds(r.run_id).value();
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[1].round, 1u);
  EXPECT_EQ(rounds[1].status, "ok");
  EXPECT_EQ(rounds[1].wall_start, 1001);
  EXPECT_EQ(rounds[1].wall_end, 2001);
  ASSERT_TRUE(rounds[1].test_accuracy.has_value());
  EXPECT_DOUBLE_EQ(*rounds[1].test_accuracy, 0.25);
  auto updates = r.history->updates(r.run_id, 1u).value();
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].client_id, "a");
  EXPECT_EQ(updates[0].status, "completed");
  // Every event the engine emitted was written, and the port heard of each.
  EXPECT_EQ(r.port.events_recorded, r.history->eventWrites());
  EXPECT_GT(r.port.events_recorded, 0u);

  EXPECT_TRUE(r.driver->finished());
  EXPECT_TRUE(r.driver->runOk());
  EXPECT_TRUE(r.driver->fatal().isOk());
  EXPECT_EQ(r.driver->committedRounds(), 1u);  // round 0 is not a training round
  EXPECT_EQ(r.driver->failedRounds(), 0u);
  EXPECT_FALSE(r.driver->everyRoundFailed());
}

// The only round fails (its one update holds NaN and is refused): the run ends, and the driver
// says every round failed, with the round's and the update's reasons, for a non-zero exit.
TEST(EngineDriver, ARunWhoseEveryRoundFailedIsToldApartWithTheReasons) {
  DrivenRun r(/*fail_events_from=*/UINT64_MAX);
  r.engine->start(0);
  r.engine->onHello("a", hello("a"), 0);
  ASSERT_TRUE(r.driver->carryOut(*r.engine).isOk());
  ASSERT_EQ(r.port.tasks.size(), 1u);
  const uint64_t token = r.port.tasks[0].task.task_token;
  r.engine->onChunk("a", chunkOf(token, 0, {0.5f, std::nanf(""), 2.0f}, true), 100, 1);
  ASSERT_TRUE(r.driver->carryOut(*r.engine).isOk());
  auto rounds = r.history->rounds(r.run_id).value();
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[1].status, "failed");
  EXPECT_EQ(r.driver->committedRounds(), 1u);
  EXPECT_EQ(r.driver->failedRounds(), 1u);
  EXPECT_TRUE(r.driver->everyRoundFailed());
  const Status st = r.driver->everyRoundFailedError("h.db");
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("every one of the 1 training rounds failed"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("(the last: " + r.driver->lastRoundFailure() + ")"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("the last update refused: a: "), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("fedfleet history --db h.db events"), std::string::npos);
}

// Through the driver into a history: client "a" sends 25 chunks naming unknown tokens in each
// of 1,000 rounds of 0.1 s. The events table then holds, by any time t, at most 30 + t / 10
// rows about it (events_left_out included): 39 by 99.9 s, and the run's end one more with the
// count still owed. Every event is in a row or counted in one.
TEST(EngineDriver, OneClientsRowsInTheHistoryStayWithinTheDocumentedRate) {
  auto history = history::createMemoryHistory();
  history::RunRecord run;
  run.name = "storm";
  const int64_t run_id = history->beginRun(run).value();
  engine::EngineOptions o = baseOptions(1, 1, 1);
  o.run_id = run_id;
  o.rounds = 1000;
  o.bye_on_finish = false;
  engine::RoundEngine engine(o, {0, 0, 0});
  RecordingPort port;
  port.engine = &engine;
  EngineDriver driver(*history, port, CheckpointKeep{3, false}, "s");
  engine.start(0);
  engine.onHello("a", hello("a"), 0);
  ASSERT_TRUE(driver.carryOut(engine).isOk());
  uint64_t bogus = 1;
  for (int r = 0; r < 1000; ++r) {
    const double t = r * 0.1;
    ASSERT_EQ(port.tasks.size(), static_cast<size_t>(r + 1));
    const uint64_t token = port.tasks.back().task.task_token;
    for (int i = 0; i < 25; ++i) {
      if (++bogus == token) ++bogus;
      engine.onChunk("a", chunkOf(bogus, 0, {1, 1, 1}, true), 100, t);
    }
    engine.onChunk("a", chunkOf(token, 0, {0.01f, 0.01f, 0.01f}, true), 100, t);
    wire::Summary s;
    s.task_token = token;
    s.n_samples = 10;
    s.steps = 3;
    s.mean_loss = 1;
    engine.onSummary("a", s, 50, t);
    ASSERT_TRUE(driver.carryOut(engine).isOk());
  }
  ASSERT_TRUE(driver.finished());
  auto events = history->events(run_id);
  ASSERT_TRUE(events.isOk());
  std::vector<history::EventRecord> rows;
  for (const auto& e : *events) {
    if (e.client_id == "a") rows.push_back(e);
  }
  ASSERT_EQ(rows.size(), 40u);
  uint64_t written = 0, counted = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i + 1 < rows.size()) {
      EXPECT_LE(static_cast<double>(i + 1), 30 + rows[i].time / 10) << "row " << i;
    }
    if (rows[i].kind == "events_left_out") {
      counted += std::stoull(rows[i].detail.substr(rows[i].detail.find(": ") + 2));
    } else {
      ++written;
    }
  }
  EXPECT_EQ(rows.back().kind, "events_left_out");
  EXPECT_EQ(written + counted, 25001u);  // client_joined and 25,000 unknown tokens
}

TEST(EngineDriver, TheFirstFailedWriteStopsEveryActionAfterItAndStaysTheAnswer) {
  // The client's join event is the first event written; its task comes after it.
  DrivenRun r(/*fail_events_from=*/1);
  r.engine->start(0);
  r.engine->onHello("a", hello("a"), 0);
  Status st = r.driver->carryOut(*r.engine);
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("history: event"), std::string::npos) << st.toString();
  EXPECT_NE(st.message().find("disk full"), std::string::npos) << st.toString();
  EXPECT_EQ(r.history->eventWrites(), 1u);  // nothing was tried after the failure
  EXPECT_TRUE(r.port.tasks.empty());
  EXPECT_EQ(r.port.events_recorded, 0u);

  // Later calls carry out nothing more and give the same error; the driver's own rows too.
  r.engine->onHello("b", hello("b"), 1);
  history::EventRecord own;
  own.run_id = r.run_id;
  own.kind = "run_interrupted";
  r.driver->recordEvent(own);
  Status again = r.driver->carryOut(*r.engine);
  EXPECT_EQ(again.toString(), st.toString());
  EXPECT_EQ(r.history->eventWrites(), 1u);
  EXPECT_TRUE(r.port.tasks.empty());
  EXPECT_FALSE(r.driver->finished());
}

}  // namespace
}  // namespace fedfleet::driver
