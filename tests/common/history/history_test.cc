// HistoryStore behaviour, checked on both backends with the same tests: whatever the SQLite
// store does, the memory store must do too (codes, ordering, atomicity).
#include "common/history/history.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <ostream>
#include <string>
#include <tuple>

namespace fedfleet::history {
namespace {

enum class Backend { kSqlite, kMemory };
void PrintTo(Backend b, std::ostream* os) { *os << (b == Backend::kSqlite ? "sqlite" : "memory"); }

// Every field of each record, for comparing. The structured bindings name every member, so a
// field added to a record stops this file compiling until it is compared here too.
auto fields(const RunRecord& r) {
  const auto& [run_id, name, config_json, started_at, seed, clock, model_json] = r;
  return std::tie(run_id, name, config_json, started_at, seed, clock, model_json);
}
auto fields(const RoundRecord& r) {
  const auto& [run_id, round, start_time, end_time, wall_start, wall_end, selected, completed, late,
               dropped, rejected, status, train_loss, test_loss, test_accuracy, test_metrics,
               bytes_up, bytes_down, model_version, fed_eval_clients, fed_eval_samples,
               fed_eval_loss, fed_eval_accuracy, fed_eval_metrics, dp_epsilon, dp_clip] = r;
  return std::tie(run_id, round, start_time, end_time, wall_start, wall_end, selected, completed,
                  late, dropped, rejected, status, train_loss, test_loss, test_accuracy,
                  test_metrics, bytes_up, bytes_down, model_version, fed_eval_clients,
                  fed_eval_samples, fed_eval_loss, fed_eval_accuracy, fed_eval_metrics, dp_epsilon,
                  dp_clip);
}
auto fields(const UpdateRecord& u) {
  const auto& [run_id, round, client_id, partition, n_samples, steps, loss, compute_s, upload_s,
               start_time, end_time, wall_compute_s, codec, encode_s, decode_s, grant_wait_s,
               bytes_up, bytes_down, weight, status, served_block, served_model, served_version,
               served_sha256_hex, served_bytes, served_samples, served_loss, served_accuracy,
               eval_samples, eval_loss, eval_accuracy, eval_metrics] = u;
  return std::tie(run_id, round, client_id, partition, n_samples, steps, loss, compute_s, upload_s,
                  start_time, end_time, wall_compute_s, codec, encode_s, decode_s, grant_wait_s,
                  bytes_up, bytes_down, weight, status, served_block, served_model, served_version,
                  served_sha256_hex, served_bytes, served_samples, served_loss, served_accuracy,
                  eval_samples, eval_loss, eval_accuracy, eval_metrics);
}
auto fields(const ClientRecord& c) {
  const auto& [client_id, public_key, device_kind, device_name, cores, memory_bytes, data_size,
               first_seen, last_seen] = c;
  return std::tie(client_id, public_key, device_kind, device_name, cores, memory_bytes, data_size,
                  first_seen, last_seen);
}
auto fields(const EventRecord& e) {
  const auto& [run_id, time, kind, client_id, detail] = e;
  return std::tie(run_id, time, kind, client_id, detail);
}
auto fields(const CheckpointRecord& c) {
  const auto& [run_id, round, model_version, sha256_hex, blob, engine_state] = c;
  return std::tie(run_id, round, model_version, sha256_hex, blob, engine_state);
}
auto fields(const BlockMetricRecord& b) {
  const auto& [run_id, round, block, model, accuracy, loss] = b;
  return std::tie(run_id, round, block, model, accuracy, loss);
}
auto fields(const PeerIterationRecord& r) {
  const auto& [run_id, peer, iteration, t_start, t_end, compute_s, comm_s, wait_s, bytes_sent,
               bytes_received, exchanges, staleness, skipped] = r;
  return std::tie(run_id, peer, iteration, t_start, t_end, compute_s, comm_s, wait_s, bytes_sent,
                  bytes_received, exchanges, staleness, skipped);
}
auto fields(const PeerEvalRecord& e) {
  const auto& [run_id, time_s, iterations, peers_averaged, accuracy, loss] = e;
  return std::tie(run_id, time_s, iterations, peers_averaged, accuracy, loss);
}

template <typename T>
void expectSameRecords(const std::vector<T>& got, const std::vector<T>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(fields(got[i]), fields(want[i])) << "row " << i;
}

RoundRecord makeRound(int64_t run_id, uint32_t round) {
  RoundRecord r;
  r.run_id = run_id;
  r.round = round;
  r.start_time = 1700000000.125 + round;
  r.end_time = 1700000003.5 + round;
  r.selected = 10;
  r.completed = 7;
  r.late = 1;
  r.dropped = 1;
  r.rejected = 1;
  r.status = "ok";
  r.train_loss = 0.1 + round;  // not exactly representable: checks full precision
  r.test_loss = 1.0 / 3.0;
  r.test_accuracy = 0.8125;
  r.bytes_up = std::numeric_limits<uint64_t>::max() - round;  // above INT64_MAX
  r.bytes_down = 123456789012345ull;
  r.model_version = 1000 + round;
  r.fed_eval_clients = 3;
  r.fed_eval_samples = 480 + round;
  r.fed_eval_loss = 0.7 + round;
  r.fed_eval_accuracy = 2.0 / 3.0;
  r.test_metrics = {{"mse", 0.1}, {"zeta", -2.5e-7}, {"a", 3}};  // in their order, not sorted
  r.fed_eval_metrics = {{"mae", 1.0 / 3.0}};
  if (round % 2 == 1) {  // and rounds without (NULL) too
    r.dp_epsilon = 0.1 * round + 1.0 / 3.0;
    r.dp_clip = 1e-3 / 7.0;
  }
  return r;
}

UpdateRecord makeUpdate(int64_t run_id, uint32_t round, const std::string& client,
                        const std::string& status) {
  UpdateRecord u;
  u.run_id = run_id;
  u.round = round;
  u.client_id = client;
  u.partition = -1;
  u.n_samples = 600;
  u.steps = 19;
  u.loss = 2.302585092994046;
  u.compute_s = 1e-300;
  u.upload_s = 0.25;
  u.bytes_up = 1u << 20;
  u.bytes_down = 3u << 20;
  u.weight = 0.3;
  u.status = status;
  return u;
}

CheckpointRecord makeCheckpoint(int64_t run_id, uint32_t round) {
  CheckpointRecord c;
  c.run_id = run_id;
  c.round = round;
  c.model_version = 1000 + round;
  c.sha256_hex = std::string(64, static_cast<char>('a' + round % 6));
  c.blob = std::string("\0\x01\xff\x7f", 4) + std::string(1000 + round, static_cast<char>(round));
  c.engine_state = std::string("FFE1\0\xfe", 6) + std::to_string(round);
  return c;
}

class HistoryStoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kMemory) {
      store_ = createMemoryHistory();
      return;
    }
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info->name();  // "Test/Sqlite"
    for (char& c : name) c = (c == '/') ? '_' : c;
    path_ = std::string(FEDFLEET_TEST_TMP) + "/history_test_" + name + "_" +
            std::to_string(::getpid()) + ".db";
    removeFiles();
    auto opened = openSqliteHistory(path_);
    ASSERT_TRUE(opened.isOk()) << opened.status().toString();
    store_ = std::move(opened).value();
  }
  void TearDown() override {
    store_.reset();
    if (!path_.empty()) removeFiles();
  }
  void removeFiles() {
    std::error_code ec;
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path_ + suffix, ec);
  }

  int64_t newRun(const std::string& name = "run") {
    RunRecord run;
    run.name = name;
    run.config_json = R"({"rounds": 3})";
    run.started_at = 1700000000.5;
    run.seed = 42;
    auto id = store_->beginRun(run);
    EXPECT_TRUE(id.isOk()) << id.status().toString();
    return id.isOk() ? *id : -1;
  }

  std::unique_ptr<HistoryStore> store_;
  std::string path_;
};

TEST_P(HistoryStoreTest, BeginRunIdsIncreaseAndRunsRoundTrip) {
  RunRecord a;
  a.run_id = 777;  // ignored
  a.name = "fashion-mnist, non-iid";
  a.config_json = R"({"clients": 100, "note": "quote \" and newline \n"})";
  a.started_at = 1700000000.123456;
  a.seed = std::numeric_limits<uint64_t>::max();
  RunRecord b;
  b.name = "second";
  b.config_json = "{}";
  b.started_at = 1700000100.0;
  b.seed = 0;
  auto id_a = store_->beginRun(a);
  auto id_b = store_->beginRun(b);
  auto id_c = store_->beginRun(b);
  ASSERT_TRUE(id_a.isOk()) << id_a.status().toString();
  ASSERT_TRUE(id_b.isOk() && id_c.isOk());
  EXPECT_LT(*id_a, *id_b);
  EXPECT_LT(*id_b, *id_c);
  EXPECT_NE(*id_a, 0) << "0 means 'no run' in EventRecord";

  auto runs = store_->runs();
  ASSERT_TRUE(runs.isOk()) << runs.status().toString();
  RunRecord want_a = a, want_b = b, want_c = b;
  want_a.run_id = *id_a;
  want_b.run_id = *id_b;
  want_c.run_id = *id_c;
  expectSameRecords(*runs, {want_a, want_b, want_c});
}

TEST_P(HistoryStoreTest, CommitRoundStoresExactValuesAndUpdates) {
  const int64_t run = newRun();
  const RoundRecord round = makeRound(run, 0);
  std::vector<UpdateRecord> updates = {
      makeUpdate(run, 0, "client-b", "completed"), makeUpdate(run, 0, "client-a", "late"),
      makeUpdate(run, 0, "client-c", "dropped"), makeUpdate(run, 0, "client-d", "rejected")};
  updates[1].partition = 17;
  updates[1].loss = -0.0625;
  updates[1].n_samples = std::numeric_limits<uint64_t>::max();
  // A block-cyclic task's served model, one reported on and one not.
  updates[0].served_block = 2;
  updates[0].served_model = "pluralistic";
  updates[0].served_version = std::numeric_limits<uint64_t>::max() - 1;
  updates[0].served_sha256_hex = std::string(64, 'e');
  updates[0].served_bytes = 31840;
  updates[0].served_samples = 250;
  updates[0].served_loss = 0.1 + 0.2;
  updates[0].served_accuracy = 0.876;
  updates[2].served_block = 0;
  updates[2].served_model = "shared";
  // A federated evaluation, reported by one.
  updates[0].eval_samples = std::numeric_limits<uint64_t>::max() - 2;
  updates[0].eval_loss = 0.1 + 0.7;
  updates[0].eval_accuracy = 1.0 / 7.0;
  updates[0].eval_metrics = {{"f1", 0.875}, {"mse", 1e-300}};
  ASSERT_TRUE(store_->commitRound(round, updates, std::nullopt).isOk());

  auto rounds = store_->rounds(run);
  ASSERT_TRUE(rounds.isOk()) << rounds.status().toString();
  expectSameRecords(*rounds, {round});

  auto stored = store_->updates(run, std::nullopt);
  ASSERT_TRUE(stored.isOk()) << stored.status().toString();
  expectSameRecords(*stored, updates);  // insertion order, not client order
  auto of_round = store_->updates(run, 0u);
  ASSERT_TRUE(of_round.isOk());
  expectSameRecords(*of_round, updates);
  auto other_round = store_->updates(run, 1u);
  ASSERT_TRUE(other_round.isOk());
  EXPECT_TRUE(other_round->empty());
  auto other_run = store_->rounds(run + 1);
  ASSERT_TRUE(other_run.isOk());
  EXPECT_TRUE(other_run->empty());
}

TEST_P(HistoryStoreTest, RoundsComeBackInRoundOrderUpdatesInInsertionOrder) {
  const int64_t run = newRun();
  const int64_t other = newRun("other");
  for (uint32_t r : {2u, 0u, 1u}) {
    RoundRecord round = makeRound(run, r);
    round.status = (r == 0) ? "initial" : (r == 1) ? "failed" : "ok";  // every allowed value
    round.test_accuracy.reset();
    ASSERT_TRUE(store_
                    ->commitRound(round, {makeUpdate(run, r, "c" + std::to_string(r), "late")},
                                  std::nullopt)
                    .isOk());
  }
  ASSERT_TRUE(store_->commitRound(makeRound(other, 0), {}, std::nullopt).isOk());

  auto rounds = store_->rounds(run);
  ASSERT_TRUE(rounds.isOk());
  ASSERT_EQ(rounds->size(), 3u);
  for (uint32_t r = 0; r < 3; ++r) {
    EXPECT_EQ((*rounds)[r].round, r);
    EXPECT_FALSE((*rounds)[r].test_accuracy.has_value());
  }
  EXPECT_EQ((*rounds)[0].status, "initial");
  EXPECT_EQ((*rounds)[1].status, "failed");
  EXPECT_EQ((*rounds)[2].status, "ok");
  auto updates = store_->updates(run, std::nullopt);
  ASSERT_TRUE(updates.isOk());
  ASSERT_EQ(updates->size(), 3u);
  EXPECT_EQ((*updates)[0].client_id, "c2");
  EXPECT_EQ((*updates)[1].client_id, "c0");
  EXPECT_EQ((*updates)[2].client_id, "c1");
  auto other_rounds = store_->rounds(other);
  ASSERT_TRUE(other_rounds.isOk());
  EXPECT_EQ(other_rounds->size(), 1u);
}

TEST_P(HistoryStoreTest, DuplicateRoundIsRejectedAndFirstStaysIntact) {
  const int64_t run = newRun();
  const RoundRecord first = makeRound(run, 4);
  const std::vector<UpdateRecord> first_updates = {makeUpdate(run, 4, "a", "completed"),
                                                   makeUpdate(run, 4, "b", "completed")};
  ASSERT_TRUE(store_->commitRound(first, first_updates, makeCheckpoint(run, 4)).isOk());

  RoundRecord second = first;
  second.train_loss = 9.0;
  second.status = "failed";
  CheckpointRecord other_checkpoint = makeCheckpoint(run, 4);
  other_checkpoint.blob = "overwritten";
  Status st = store_->commitRound(second, {makeUpdate(run, 4, "z", "late")}, other_checkpoint);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.toString();
  EXPECT_NE(st.message().find("already committed"), std::string::npos) << st.message();

  auto rounds = store_->rounds(run);
  ASSERT_TRUE(rounds.isOk());
  expectSameRecords(*rounds, {first});
  auto updates = store_->updates(run, std::nullopt);
  ASSERT_TRUE(updates.isOk());
  expectSameRecords(*updates, first_updates);
  auto checkpoint = store_->latestCheckpoint(run);
  ASSERT_TRUE(checkpoint.isOk());
  EXPECT_EQ(fields(*checkpoint), fields(makeCheckpoint(run, 4)));
}

TEST_P(HistoryStoreTest, FailedCommitRollsBackRoundUpdatesAndCheckpoint) {
  const int64_t run = newRun();
  const RoundRecord round0 = makeRound(run, 0);
  const std::vector<UpdateRecord> updates0 = {makeUpdate(run, 0, "a", "completed")};
  ASSERT_TRUE(store_->commitRound(round0, updates0, makeCheckpoint(run, 0)).isOk());

  // The third update carries a status outside the allowed set: in SQLite the round row, the
  // checkpoint and two updates are already written when its CHECK constraint fails.
  std::vector<UpdateRecord> updates1 = {makeUpdate(run, 1, "a", "completed"),
                                        makeUpdate(run, 1, "b", "late"),
                                        makeUpdate(run, 1, "c", "vanished")};
  Status st = store_->commitRound(makeRound(run, 1), updates1, makeCheckpoint(run, 1));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
  EXPECT_NE(st.message().find("status"), std::string::npos) << st.message();

  auto rounds = store_->rounds(run);
  ASSERT_TRUE(rounds.isOk());
  expectSameRecords(*rounds, {round0});
  auto updates = store_->updates(run, std::nullopt);
  ASSERT_TRUE(updates.isOk());
  expectSameRecords(*updates, updates0);
  auto checkpoint = store_->latestCheckpoint(run);
  ASSERT_TRUE(checkpoint.isOk());
  EXPECT_EQ(checkpoint->round, 0u);

  // A bad round status fails the same way.
  RoundRecord bad_round = makeRound(run, 1);
  bad_round.status = "partial";
  st = store_->commitRound(bad_round, {makeUpdate(run, 1, "a", "completed")}, std::nullopt);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
  rounds = store_->rounds(run);
  ASSERT_TRUE(rounds.isOk());
  EXPECT_EQ(rounds->size(), 1u);

  // Nothing was left half-open: the corrected round commits.
  updates1[2].status = "dropped";
  ASSERT_TRUE(store_->commitRound(makeRound(run, 1), updates1, makeCheckpoint(run, 1)).isOk());
  updates = store_->updates(run, 1u);
  ASSERT_TRUE(updates.isOk());
  expectSameRecords(*updates, updates1);
  checkpoint = store_->latestCheckpoint(run);
  ASSERT_TRUE(checkpoint.isOk());
  EXPECT_EQ(checkpoint->round, 1u);
}

TEST_P(HistoryStoreTest, CommitChecksRunAndRowOwnership) {
  const int64_t run = newRun();
  Status st = store_->commitRound(makeRound(run + 100, 0), {}, std::nullopt);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.toString();

  st = store_->commitRound(makeRound(run, 0), {makeUpdate(run, 1, "a", "completed")}, std::nullopt);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
  st = store_->commitRound(makeRound(run, 0), {}, makeCheckpoint(run + 1, 0));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();

  auto rounds = store_->rounds(run);
  ASSERT_TRUE(rounds.isOk());
  EXPECT_TRUE(rounds->empty());
}

TEST_P(HistoryStoreTest, UpsertClientKeepsFirstSeenAndUpdatesTheRest) {
  ClientRecord c;
  c.client_id = "edge-7";
  c.public_key = "rq:rr9#Z<0V-1Vm!wvb5(#Hr/2e%2lG5=vTk3g4pb";
  c.device_kind = "cpu";
  c.device_name = "Cortex-A72";
  c.cores = 4;
  c.memory_bytes = 4ull << 30;
  c.data_size = 600;
  c.first_seen = 1000.5;
  c.last_seen = 1000.5;
  ASSERT_TRUE(store_->upsertClient(c).isOk());

  ClientRecord again = c;
  again.device_kind = "cuda";
  again.device_name = "Jetson Orin";
  again.cores = 8;
  again.memory_bytes = 16ull << 30;
  again.data_size = 1200;
  again.first_seen = 2000.0;  // must not replace the original
  again.last_seen = 2500.25;
  ASSERT_TRUE(store_->upsertClient(again).isOk());

  ClientRecord earlier_name = c;
  earlier_name.client_id = "edge-10";  // sorts before "edge-7"
  ASSERT_TRUE(store_->upsertClient(earlier_name).isOk());

  auto clients = store_->clients();
  ASSERT_TRUE(clients.isOk()) << clients.status().toString();
  ClientRecord want = again;
  want.first_seen = 1000.5;
  expectSameRecords(*clients, {earlier_name, want});

  ClientRecord nameless = c;
  nameless.client_id.clear();
  EXPECT_EQ(store_->upsertClient(nameless).code(), StatusCode::kInvalidArgument);
}

TEST_P(HistoryStoreTest, EventsRoundTripAndFilterByRun) {
  const int64_t run = newRun();
  const int64_t other = newRun("other");
  const std::vector<EventRecord> events = {
      {run, 10.5, "auth_rejected", "mallory", "key not in allow-list"},
      {0, 11.0, "malformed_frame", "", "bad frame, \"size\" 12\nsecond line \xc3\xa9"},
      {other, 12.25, "stale_update", "c1", ""},
      {run, 13.0, "error", "c2", "timeout"},
  };
  for (const EventRecord& e : events) ASSERT_TRUE(store_->recordEvent(e).isOk());

  auto all = store_->events(std::nullopt);
  ASSERT_TRUE(all.isOk()) << all.status().toString();
  expectSameRecords(*all, events);
  auto of_run = store_->events(run);
  ASSERT_TRUE(of_run.isOk());
  expectSameRecords(*of_run, {events[0], events[3]});
  auto unattached = store_->events(int64_t{0});
  ASSERT_TRUE(unattached.isOk());
  expectSameRecords(*unattached, {events[1]});

  Status st = store_->recordEvent({other + 50, 1.0, "error", "", ""});
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.toString();
  all = store_->events(std::nullopt);
  ASSERT_TRUE(all.isOk());
  EXPECT_EQ(all->size(), events.size());
}

TEST_P(HistoryStoreTest, LatestCheckpointPicksHighestRound) {
  const int64_t run = newRun();
  const int64_t other = newRun("other");
  auto none = store_->latestCheckpoint(run);
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound) << none.status().toString();

  for (uint32_t r : {1u, 3u, 2u}) {  // committed out of order
    ASSERT_TRUE(store_->commitRound(makeRound(run, r), {}, makeCheckpoint(run, r)).isOk());
  }
  ASSERT_TRUE(store_->commitRound(makeRound(run, 4), {}, std::nullopt).isOk());  // no checkpoint

  auto latest = store_->latestCheckpoint(run);
  ASSERT_TRUE(latest.isOk()) << latest.status().toString();
  EXPECT_EQ(fields(*latest), fields(makeCheckpoint(run, 3)));  // blob with NUL bytes intact

  auto of_other = store_->latestCheckpoint(other);
  EXPECT_EQ(of_other.status().code(), StatusCode::kNotFound);

  CheckpointRecord empty = makeCheckpoint(other, 0);
  empty.blob.clear();
  ASSERT_TRUE(store_->commitRound(makeRound(other, 0), {}, empty).isOk());
  of_other = store_->latestCheckpoint(other);
  ASSERT_TRUE(of_other.isOk());
  EXPECT_EQ(fields(*of_other), fields(empty));
}

TEST_P(HistoryStoreTest, PruneCheckpointsKeepsTheLatest) {
  const int64_t run = newRun();
  const int64_t other = newRun("other");
  for (uint32_t r = 0; r < 5; ++r) {
    ASSERT_TRUE(store_->commitRound(makeRound(run, r), {}, makeCheckpoint(run, r)).isOk());
  }
  ASSERT_TRUE(store_->commitRound(makeRound(other, 0), {}, makeCheckpoint(other, 0)).isOk());

  EXPECT_EQ(store_->pruneCheckpoints(run, 0, false).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(store_->pruneCheckpoints(run, 10, false).isOk());
  auto kept = store_->checkpointRounds(run);
  ASSERT_TRUE(kept.isOk()) << kept.status().toString();
  EXPECT_EQ(*kept, (std::vector<uint32_t>{0, 1, 2, 3, 4}));

  ASSERT_TRUE(store_->pruneCheckpoints(run, 2, false).isOk());
  kept = store_->checkpointRounds(run);
  ASSERT_TRUE(kept.isOk());
  EXPECT_EQ(*kept, (std::vector<uint32_t>{3, 4}));
  auto latest = store_->latestCheckpoint(run);
  ASSERT_TRUE(latest.isOk());
  EXPECT_EQ(fields(*latest), fields(makeCheckpoint(run, 4)));

  // Rounds stay, and other runs are untouched.
  auto rounds = store_->rounds(run);
  ASSERT_TRUE(rounds.isOk());
  EXPECT_EQ(rounds->size(), 5u);
  auto other_kept = store_->checkpointRounds(other);
  ASSERT_TRUE(other_kept.isOk());
  EXPECT_EQ(*other_kept, (std::vector<uint32_t>{0}));
  EXPECT_TRUE(store_->pruneCheckpoints(other + 99, 1, false).isOk());
}

// With keep_best the checkpoint of the best test accuracy (the earliest of equals) stays beside
// the latest ones; rounds without an accuracy never count as best.
TEST_P(HistoryStoreTest, PruneCheckpointsCanKeepTheBestBesideTheLatest) {
  const int64_t run = newRun();
  // Accuracies of rounds 0..6; round 5 has none.
  const std::vector<std::optional<double>> accuracy = {0.5, 0.8, 0.9, 0.9, 0.7, std::nullopt, 0.6};
  for (uint32_t r = 0; r < accuracy.size(); ++r) {
    RoundRecord round = makeRound(run, r);
    round.test_accuracy = accuracy[r];
    round.fed_eval_accuracy.reset();
    ASSERT_TRUE(store_->commitRound(round, {}, makeCheckpoint(run, r)).isOk());
  }
  ASSERT_TRUE(store_->pruneCheckpoints(run, 2, true).isOk());
  auto kept = store_->checkpointRounds(run);
  ASSERT_TRUE(kept.isOk()) << kept.status().toString();
  EXPECT_EQ(*kept, (std::vector<uint32_t>{2, 5, 6})) << "round 2: 0.9 first; 5 and 6 the latest";
  // Pruning again keeps the same; without keep_best the best goes.
  ASSERT_TRUE(store_->pruneCheckpoints(run, 2, true).isOk());
  EXPECT_EQ(store_->checkpointRounds(run).value(), (std::vector<uint32_t>{2, 5, 6}));
  ASSERT_TRUE(store_->pruneCheckpoints(run, 2, false).isOk());
  EXPECT_EQ(store_->checkpointRounds(run).value(), (std::vector<uint32_t>{5, 6}));
}

// A run evaluated only by its clients: round r + 1's federated accuracy is that of round r's
// model, so it scores round r's checkpoint; the last checkpoint has no score yet.
TEST_P(HistoryStoreTest, PruneCheckpointsKeepsTheBestByFederatedAccuracyWithoutTestAccuracy) {
  const int64_t run = newRun();
  // Federated accuracies of rounds 1..5, i.e. of the models of rounds 0..4.
  const std::vector<std::optional<double>> fed = {std::nullopt, 0.3, 0.6, 0.9, 0.5, 0.4};
  for (uint32_t r = 0; r < fed.size(); ++r) {
    RoundRecord round = makeRound(run, r);
    round.test_accuracy.reset();
    round.fed_eval_accuracy = fed[r];
    ASSERT_TRUE(store_->commitRound(round, {}, makeCheckpoint(run, r)).isOk());
  }
  ASSERT_TRUE(store_->pruneCheckpoints(run, 2, true).isOk());
  EXPECT_EQ(store_->checkpointRounds(run).value(), (std::vector<uint32_t>{2, 4, 5}))
      << "round 2's model scored 0.9 (in round 3); 4 and 5 the latest";
}

// A regression records no accuracy: the best is the lowest test loss (else the next round's
// federated loss), in both backends alike.
TEST_P(HistoryStoreTest, PruneCheckpointsKeepsTheLowestLossWithoutAccuracies) {
  const int64_t run = newRun();
  const std::vector<std::optional<double>> loss = {4.0, 1.5, 0.25, 0.5, 0.25, 0.75, 1.0};
  for (uint32_t r = 0; r < loss.size(); ++r) {
    RoundRecord round = makeRound(run, r);
    round.test_accuracy.reset();
    round.fed_eval_accuracy.reset();
    round.fed_eval_loss.reset();
    round.test_loss = loss[r];
    ASSERT_TRUE(store_->commitRound(round, {}, makeCheckpoint(run, r)).isOk());
  }
  ASSERT_TRUE(store_->pruneCheckpoints(run, 2, true).isOk());
  EXPECT_EQ(store_->checkpointRounds(run).value(), (std::vector<uint32_t>{2, 5, 6}))
      << "round 2: the first of the two losses of 0.25; 5 and 6 the latest";
}

TEST_P(HistoryStoreTest, CheckpointAtReadsOneRoundsCheckpoint) {
  const int64_t run = newRun();
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(store_->commitRound(makeRound(run, r), {}, makeCheckpoint(run, r)).isOk());
  }
  auto one = store_->checkpointAt(run, 1);
  ASSERT_TRUE(one.isOk()) << one.status().toString();
  EXPECT_EQ(fields(*one), fields(makeCheckpoint(run, 1)));
  EXPECT_EQ(store_->checkpointAt(run, 3).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->checkpointAt(run + 1, 1).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(store_->pruneCheckpoints(run, 1, false).isOk());
  EXPECT_EQ(store_->checkpointAt(run, 1).status().code(), StatusCode::kNotFound);
}

TEST_P(HistoryStoreTest, BlockMetricsRoundTripInOrderAllOrNone) {
  const int64_t run = newRun();
  const int64_t other = newRun("other");
  auto row = [](int64_t run_id, uint32_t round, const char* block, const char* model,
                std::optional<double> acc) {
    BlockMetricRecord b;
    b.run_id = run_id;
    b.round = round;
    b.block = block;
    b.model = model;
    b.accuracy = acc;
    b.loss = acc ? std::optional<double>(1 - *acc) : std::nullopt;
    return b;
  };
  ASSERT_TRUE(store_
                  ->recordBlockMetrics(
                      {row(run, 8, "1", "served", 0.625), row(run, 4, "1", "chain", std::nullopt),
                       row(run, 4, "0", "served", 0.5), row(other, 4, "0", "served", 0.25)})
                  .isOk());
  auto rows = store_->blockMetrics(run);
  ASSERT_TRUE(rows.isOk()) << rows.status().toString();
  ASSERT_EQ(rows->size(), 3u);  // by round, block, model; only this run's
  EXPECT_EQ((*rows)[0].round, 4u);
  EXPECT_EQ((*rows)[0].block, "0");
  EXPECT_EQ((*rows)[0].accuracy, 0.5);
  EXPECT_EQ((*rows)[0].loss, 0.5);
  EXPECT_EQ((*rows)[1].model, "chain");
  EXPECT_FALSE((*rows)[1].accuracy.has_value());
  EXPECT_EQ((*rows)[2].round, 8u);
  EXPECT_EQ((*rows)[2].accuracy, 0.625);
  // A row already written, an unknown run, or an empty model: refused, nothing of the batch kept.
  EXPECT_EQ(
      store_->recordBlockMetrics({row(run, 9, "0", "served", 0.1), row(run, 4, "0", "served", 0.9)})
          .code(),
      StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->recordBlockMetrics({row(run + 100, 1, "0", "served", 0.1)}).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(store_->recordBlockMetrics({row(run, 1, "0", "", 0.1)}).code(),
            StatusCode::kInvalidArgument);
  rows = store_->blockMetrics(run);
  ASSERT_TRUE(rows.isOk());
  EXPECT_EQ(rows->size(), 3u);
  EXPECT_EQ((*rows)[0].accuracy, 0.5);
}

// Every field of every record type comes back as written, at the edges of its type: the largest
// unsigned values (above INT64_MAX for uint64_t), the most negative int32_t, infinities, the
// smallest subnormal, empty strings, non-ASCII text and bytes with NULs in blobs.
TEST_P(HistoryStoreTest, EveryFieldOfEveryRecordRoundTripsAtTheEdges) {
  constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();
  constexpr uint32_t kMaxU32 = std::numeric_limits<uint32_t>::max();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  constexpr double kTiny = std::numeric_limits<double>::denorm_min();
  constexpr double kHuge = std::numeric_limits<double>::max();

  RunRecord run{0, "", "{\"k\": \"v\xc3\xa9\"}", -kHuge, kMaxU64, "virtual", "{\"total\": 0}"};
  auto id = store_->beginRun(run);
  ASSERT_TRUE(id.isOk()) << id.status().toString();
  run.run_id = *id;

  RoundRecord round;
  round.run_id = *id;
  round.round = kMaxU32;
  round.start_time = -kInf;
  round.end_time = kInf;
  round.wall_start = kTiny;
  round.wall_end = 1700000000.000001;
  round.selected = kMaxU32;
  round.completed = kMaxU32 - 1;
  round.late = 0;
  round.dropped = 1;
  round.rejected = kMaxU32;
  round.status = "failed";
  round.train_loss = kHuge;
  round.test_loss = -kInf;
  round.test_accuracy = std::nullopt;
  round.bytes_up = kMaxU64;
  round.bytes_down = uint64_t{1} << 63;
  round.model_version = kMaxU64 - 1;

  UpdateRecord served;
  served.run_id = *id;
  served.round = kMaxU32;
  served.client_id = "client \xe2\x9c\x93";
  served.partition = std::numeric_limits<int32_t>::min();
  served.n_samples = kMaxU64;
  served.steps = kMaxU64 - 2;
  served.loss = -kTiny;
  served.compute_s = kInf;
  served.upload_s = 1e-300;
  served.start_time = 1.0 / 3.0;
  served.end_time = 2.0 / 3.0;
  served.wall_compute_s = 1e300;
  served.codec = "topk";
  served.encode_s = 0.1;
  served.decode_s = 0.2;
  served.grant_wait_s = kInf;
  served.bytes_up = kMaxU64;
  served.bytes_down = 0;
  served.weight = -1.5;
  served.status = "rejected";
  served.served_block = std::numeric_limits<int32_t>::max();
  served.served_model = "chain";
  served.served_version = kMaxU64;
  served.served_sha256_hex = std::string(64, 'f');
  served.served_bytes = kMaxU64 - 3;
  served.served_samples = kMaxU64;
  served.served_loss = -kInf;
  served.served_accuracy = std::nullopt;
  UpdateRecord plain;  // no served model, empty codec, everything else at its default
  plain.run_id = *id;
  plain.round = kMaxU32;
  plain.client_id = "c";
  plain.status = "completed";

  CheckpointRecord checkpoint;
  checkpoint.run_id = *id;
  checkpoint.round = kMaxU32;
  checkpoint.model_version = kMaxU64;
  checkpoint.sha256_hex = "";
  checkpoint.blob = "";  // empty, not NULL
  checkpoint.engine_state = std::string("\0\0\xff\0", 4);
  ASSERT_TRUE(store_->commitRound(round, {served, plain}, checkpoint).isOk());

  ClientRecord client{"c\xc3\xa9", "", "cuda", "", kMaxU32, kMaxU64, kMaxU64, -kInf, kTiny};
  ASSERT_TRUE(store_->upsertClient(client).isOk());

  EventRecord attached{*id, kHuge, "error", "", ""};
  EventRecord unattached{0, -kTiny, "", "c\xc3\xa9", "line one\nline two"};
  ASSERT_TRUE(store_->recordEvent(attached).isOk());
  ASSERT_TRUE(store_->recordEvent(unattached).isOk());

  BlockMetricRecord block{*id, kMaxU32, "0", "served", std::nullopt, kInf};
  BlockMetricRecord other{*id, kMaxU32, "1", "pluralistic", kTiny, std::nullopt};
  ASSERT_TRUE(store_->recordBlockMetrics({block, other}).isOk());

  auto runs = store_->runs();
  ASSERT_TRUE(runs.isOk()) << runs.status().toString();
  expectSameRecords(*runs, {run});
  auto rounds = store_->rounds(*id);
  ASSERT_TRUE(rounds.isOk()) << rounds.status().toString();
  expectSameRecords(*rounds, {round});
  auto updates = store_->updates(*id, kMaxU32);
  ASSERT_TRUE(updates.isOk()) << updates.status().toString();
  expectSameRecords(*updates, {served, plain});
  auto latest = store_->latestCheckpoint(*id);
  ASSERT_TRUE(latest.isOk()) << latest.status().toString();
  EXPECT_EQ(fields(*latest), fields(checkpoint));
  auto clients = store_->clients();
  ASSERT_TRUE(clients.isOk()) << clients.status().toString();
  expectSameRecords(*clients, {client});
  auto events = store_->events(std::nullopt);
  ASSERT_TRUE(events.isOk()) << events.status().toString();
  expectSameRecords(*events, {attached, unattached});
  auto blocks = store_->blockMetrics(*id);
  ASSERT_TRUE(blocks.isOk()) << blocks.status().toString();
  expectSameRecords(*blocks, {block, other});
}

TEST_P(HistoryStoreTest, NanFollowsTheStoredAsNullRule) {
  const int64_t run = newRun();
  RoundRecord round = makeRound(run, 0);
  round.train_loss = std::numeric_limits<double>::quiet_NaN();
  round.test_loss = std::numeric_limits<double>::quiet_NaN();
  round.test_accuracy = std::numeric_limits<double>::infinity();
  UpdateRecord update = makeUpdate(run, 0, "a", "completed");
  update.loss = std::numeric_limits<double>::quiet_NaN();
  update.grant_wait_s = std::numeric_limits<double>::quiet_NaN();
  update.served_block = 0;
  update.served_model = "shared";
  update.served_loss = std::numeric_limits<double>::quiet_NaN();
  ASSERT_TRUE(store_->commitRound(round, {update}, std::nullopt).isOk());
  EventRecord event{run, std::numeric_limits<double>::quiet_NaN(), "error", "a", ""};
  ASSERT_TRUE(store_->recordEvent(event).isOk());
  BlockMetricRecord block{run, 0, "0", "shared", std::numeric_limits<double>::quiet_NaN(), 1.0};
  ASSERT_TRUE(store_->recordBlockMetrics({block}).isOk());

  auto rounds = store_->rounds(run);
  ASSERT_TRUE(rounds.isOk());
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_TRUE(std::isnan((*rounds)[0].train_loss));
  EXPECT_FALSE((*rounds)[0].test_loss.has_value());
  ASSERT_TRUE((*rounds)[0].test_accuracy.has_value());
  EXPECT_EQ(*(*rounds)[0].test_accuracy, std::numeric_limits<double>::infinity());
  auto updates = store_->updates(run, std::nullopt);
  ASSERT_TRUE(updates.isOk());
  ASSERT_EQ(updates->size(), 1u);
  EXPECT_TRUE(std::isnan((*updates)[0].loss));
  EXPECT_TRUE(std::isnan((*updates)[0].grant_wait_s));
  EXPECT_FALSE((*updates)[0].served_loss.has_value());
  auto events = store_->events(run);
  ASSERT_TRUE(events.isOk());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_TRUE(std::isnan((*events)[0].time));
  auto blocks = store_->blockMetrics(run);
  ASSERT_TRUE(blocks.isOk());
  ASSERT_EQ(blocks->size(), 1u);
  EXPECT_FALSE((*blocks)[0].accuracy.has_value());
  EXPECT_EQ((*blocks)[0].loss, 1.0);
}

PeerIterationRecord makeIteration(int64_t run_id, uint32_t peer, uint64_t iteration) {
  PeerIterationRecord r;
  r.run_id = run_id;
  r.peer = peer;
  r.iteration = iteration;
  r.t_start = 0.25 * static_cast<double>(iteration) + peer;
  r.t_end = r.t_start + 0.2;
  r.compute_s = 0.125;
  r.comm_s = 0.0625;
  r.wait_s = 0.0125;
  r.bytes_sent = 1000 + peer;
  r.bytes_received = 2000 + iteration;
  r.exchanges = 2;
  r.staleness = peer % 3;
  r.skipped = iteration % 5 == 4;
  return r;
}

// Iteration rows come back as written, ordered by peer then iteration whatever order they were
// written in, across batches, and only the asked run's.
TEST_P(HistoryStoreTest, PeerIterationsRoundTripOrderedByPeerThenIteration) {
  const int64_t run = newRun("dpsgd");
  const int64_t other = newRun("ring");
  PeerIterationRecord edge =
      makeIteration(run, std::numeric_limits<uint32_t>::max(), std::numeric_limits<int64_t>::max());
  edge.bytes_sent = std::numeric_limits<uint64_t>::max();
  edge.bytes_received = 0;
  edge.exchanges = std::numeric_limits<uint32_t>::max();
  edge.staleness = std::numeric_limits<uint32_t>::max();
  edge.t_start = std::numeric_limits<double>::denorm_min();
  edge.t_end = std::numeric_limits<double>::max();
  edge.skipped = true;
  ASSERT_TRUE(store_
                  ->recordPeerIterations({makeIteration(run, 1, 1), edge, makeIteration(run, 0, 2),
                                          makeIteration(other, 0, 0), makeIteration(run, 1, 0)})
                  .isOk());
  ASSERT_TRUE(
      store_->recordPeerIterations({makeIteration(run, 0, 0), makeIteration(run, 0, 1)}).isOk());
  ASSERT_TRUE(store_->recordPeerIterations({}).isOk());
  auto rows = store_->peerIterations(run);
  ASSERT_TRUE(rows.isOk()) << rows.status().toString();
  expectSameRecords(*rows,
                    {makeIteration(run, 0, 0), makeIteration(run, 0, 1), makeIteration(run, 0, 2),
                     makeIteration(run, 1, 0), makeIteration(run, 1, 1), edge});
  auto others = store_->peerIterations(other);
  ASSERT_TRUE(others.isOk());
  expectSameRecords(*others, {makeIteration(other, 0, 0)});
  auto none = store_->peerIterations(other + 100);
  ASSERT_TRUE(none.isOk());
  EXPECT_TRUE(none->empty());
  // A federated run's tables are untouched by a decentralised one.
  auto rounds = store_->rounds(run);
  ASSERT_TRUE(rounds.isOk());
  EXPECT_TRUE(rounds->empty());
}

// A batch with one bad row is refused whole, with the code of what is wrong with it.
TEST_P(HistoryStoreTest, PeerIterationWritesAreCheckedAndAllOrNone) {
  const int64_t run = newRun();
  ASSERT_TRUE(store_->recordPeerIterations({makeIteration(run, 0, 0)}).isOk());
  auto with = [&](auto change) {
    PeerIterationRecord bad = makeIteration(run, 2, 7);
    change(bad);
    return store_->recordPeerIterations({makeIteration(run, 1, 0), bad}).code();
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(with([&](PeerIterationRecord& r) { r.run_id = run + 100; }), StatusCode::kNotFound);
  EXPECT_EQ(with([&](PeerIterationRecord& r) {
              r.peer = 0;
              r.iteration = 0;
            }),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(with([&](PeerIterationRecord& r) {
              r.peer = 1;
              r.iteration = 0;
            }),
            StatusCode::kInvalidArgument);  // the same row twice in one batch
  EXPECT_EQ(with([](PeerIterationRecord& r) { r.t_start = -0.5; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](PeerIterationRecord& r) { r.t_end = r.t_start - 0.001; }),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(with([&](PeerIterationRecord& r) { r.t_end = inf; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([&](PeerIterationRecord& r) { r.t_start = nan; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([&](PeerIterationRecord& r) { r.compute_s = nan; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](PeerIterationRecord& r) { r.comm_s = -1; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([&](PeerIterationRecord& r) { r.wait_s = inf; }), StatusCode::kInvalidArgument);
  // A zero-length iteration is fine.
  EXPECT_EQ(with([](PeerIterationRecord& r) { r.t_end = r.t_start; }), StatusCode::kOk);
  auto rows = store_->peerIterations(run);
  ASSERT_TRUE(rows.isOk());
  expectSameRecords(*rows, {makeIteration(run, 0, 0), makeIteration(run, 1, 0), [&] {
                              PeerIterationRecord r = makeIteration(run, 2, 7);
                              r.t_end = r.t_start;
                              return r;
                            }()});
}

// Evaluations come back by time, equal times in the order written; NaN accuracy (a regression)
// and NaN loss read back as NaN; bad rows are refused.
TEST_P(HistoryStoreTest, PeerEvalsRoundTripByTimeAndAreChecked) {
  const int64_t run = newRun();
  const int64_t other = newRun();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto eval = [](int64_t run_id, double time_s, uint64_t iterations, double accuracy) {
    return PeerEvalRecord{run_id, time_s, iterations, 8, accuracy, 2.5 - accuracy};
  };
  for (const PeerEvalRecord& e :
       {eval(run, 30.0, 300, 0.75), eval(run, 10.0, 100, 0.5), eval(other, 5.0, 50, 0.125),
        eval(run, 10.0, 101, 0.625), eval(run, 0.0, 0, 0.1)}) {
    ASSERT_TRUE(store_->recordPeerEval(e).isOk());
  }
  ASSERT_TRUE(store_->recordPeerEval(PeerEvalRecord{run, 40.0, 400, 3, nan, nan}).isOk());
  auto rows = store_->peerEvals(run);
  ASSERT_TRUE(rows.isOk()) << rows.status().toString();
  ASSERT_EQ(rows->size(), 5u);
  expectSameRecords(std::vector<PeerEvalRecord>(rows->begin(), rows->begin() + 4),
                    {eval(run, 0.0, 0, 0.1), eval(run, 10.0, 100, 0.5), eval(run, 10.0, 101, 0.625),
                     eval(run, 30.0, 300, 0.75)});
  EXPECT_EQ((*rows)[4].peers_averaged, 3u);
  EXPECT_TRUE(std::isnan((*rows)[4].accuracy));
  EXPECT_TRUE(std::isnan((*rows)[4].loss));
  auto others = store_->peerEvals(other);
  ASSERT_TRUE(others.isOk());
  expectSameRecords(*others, {eval(other, 5.0, 50, 0.125)});

  EXPECT_EQ(store_->recordPeerEval(eval(run + 100, 1.0, 1, 0.5)).code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->recordPeerEval(eval(run, -1.0, 1, 0.5)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->recordPeerEval(eval(run, nan, 1, 0.5)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->recordPeerEval(eval(run, 1.0, 1, 1.5)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->recordPeerEval(eval(run, 1.0, 1, -0.25)).code(), StatusCode::kInvalidArgument);
  rows = store_->peerEvals(run);
  ASSERT_TRUE(rows.isOk());
  EXPECT_EQ(rows->size(), 5u);
}

INSTANTIATE_TEST_SUITE_P(Backends, HistoryStoreTest,
                         ::testing::Values(Backend::kSqlite, Backend::kMemory),
                         [](const ::testing::TestParamInfo<Backend>& backend) {
                           return backend.param == Backend::kSqlite ? "Sqlite" : "Memory";
                         });

}  // namespace
}  // namespace fedfleet::history
