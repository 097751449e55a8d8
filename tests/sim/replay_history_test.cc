// ReplayHistory: recorded rows are compared, not written again; a row that differs stops the
// replay naming its column; what comes after the recorded rows is written.
#include "sim/replay_history.h"

#include <gtest/gtest.h>

#include <cmath>

namespace fedfleet::sim {
namespace {

history::RoundRecord roundRow(int64_t run, uint32_t r, double loss) {
  history::RoundRecord rec;
  rec.run_id = run;
  rec.round = r;
  rec.status = r == 0 ? "initial" : "ok";
  rec.start_time = r;
  rec.end_time = r + 0.5;
  rec.train_loss = loss;
  rec.wall_start = 1e9 + r;  // measured: never compared
  return rec;
}

history::UpdateRecord updateRow(int64_t run, uint32_t r, const std::string& client) {
  history::UpdateRecord u;
  u.run_id = run;
  u.round = r;
  u.client_id = client;
  u.status = "completed";
  u.n_samples = 10;
  return u;
}

history::EventRecord eventRow(int64_t run, double t, const std::string& kind) {
  history::EventRecord e;
  e.run_id = run;
  e.time = t;
  e.kind = kind;
  e.client_id = "v1";
  return e;
}

struct Recorded {
  std::unique_ptr<history::HistoryStore> store = history::createMemoryHistory();
  int64_t run = 0;
  Recorded() {
    history::RunRecord r;
    r.name = "sim";
    run = store->beginRun(r).value();
    EXPECT_TRUE(store->commitRound(roundRow(run, 0, 0), {}, std::nullopt).isOk());
    EXPECT_TRUE(
        store->commitRound(roundRow(run, 1, 0.25), {updateRow(run, 1, "v1")}, std::nullopt).isOk());
    EXPECT_TRUE(store->recordEvent(eventRow(run, 1.5, "client_dropped")).isOk());
  }
};

TEST(ReplayHistory, RecordedRowsAreMatchedAndWhatFollowsIsWritten) {
  Recorded rec;
  auto replay = ReplayHistory::create(*rec.store, rec.run).value();
  EXPECT_EQ(replay->rowsToMatch(), 4u);  // 2 rounds, 1 update, 1 event

  history::RoundRecord r0 = roundRow(rec.run, 0, 0);
  r0.wall_start = 5;  // another host's clock: not a difference
  ASSERT_TRUE(replay->commitRound(r0, {}, std::nullopt).isOk());
  ASSERT_TRUE(
      replay->commitRound(roundRow(rec.run, 1, 0.25), {updateRow(rec.run, 1, "v1")}, std::nullopt)
          .isOk());
  ASSERT_TRUE(replay->recordEvent(eventRow(rec.run, 1.5, "client_dropped")).isOk());
  EXPECT_EQ(replay->rowsToMatch(), 0u);
  EXPECT_EQ(replay->roundsMatched(), 2u);
  // Nothing was written twice.
  EXPECT_EQ(rec.store->rounds(rec.run)->size(), 2u);
  EXPECT_EQ(rec.store->updates(rec.run, std::nullopt)->size(), 1u);
  EXPECT_EQ(rec.store->events(rec.run)->size(), 1u);

  // Past the recorded rows: written.
  ASSERT_TRUE(replay->recordEvent(eventRow(rec.run, 2.0, "client_rejoined")).isOk());
  ASSERT_TRUE(
      replay->commitRound(roundRow(rec.run, 2, 0.125), {updateRow(rec.run, 2, "v2")}, std::nullopt)
          .isOk());
  EXPECT_EQ(rec.store->rounds(rec.run)->size(), 3u);
  EXPECT_EQ(rec.store->updates(rec.run, std::nullopt)->size(), 2u);
  EXPECT_EQ(rec.store->events(rec.run)->back().kind, "client_rejoined");
  EXPECT_EQ(replay->roundsMatched(), 2u);
}

TEST(ReplayHistory, ARowThatDiffersStopsTheReplayNamingItsColumn) {
  Recorded rec;
  auto replay = ReplayHistory::create(*rec.store, rec.run).value();
  ASSERT_TRUE(replay->commitRound(roundRow(rec.run, 0, 0), {}, std::nullopt).isOk());
  // The last bit of the loss differs: a replay must reproduce numbers exactly.
  const double off = std::nextafter(0.25, 1.0);
  Status st =
      replay->commitRound(roundRow(rec.run, 1, off), {updateRow(rec.run, 1, "v1")}, std::nullopt);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("rounds (round 1), train_loss"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("another run.name"), std::string::npos) << st.message();

  auto again = ReplayHistory::create(*rec.store, rec.run).value();
  ASSERT_TRUE(again->commitRound(roundRow(rec.run, 0, 0), {}, std::nullopt).isOk());
  st = again->commitRound(roundRow(rec.run, 1, 0.25), {updateRow(rec.run, 1, "v7")}, std::nullopt);
  EXPECT_NE(st.message().find("client_id: 'v1' recorded, 'v7' replayed"), std::string::npos)
      << st.message();
  ASSERT_TRUE(
      again->commitRound(roundRow(rec.run, 1, 0.25), {updateRow(rec.run, 1, "v1")}, std::nullopt)
          .isOk());
  st = again->recordEvent(eventRow(rec.run, 1.5, "client_rejoined"));
  EXPECT_NE(st.message().find("kind"), std::string::npos) << st.message();
  // Nothing of the refused rows reached the file.
  EXPECT_EQ(rec.store->rounds(rec.run)->size(), 2u);
  EXPECT_EQ(rec.store->events(rec.run)->size(), 1u);
}

}  // namespace
}  // namespace fedfleet::sim
