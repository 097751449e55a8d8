#include "engine/event_budget.h"

#include <gtest/gtest.h>

#include <string>

namespace fedfleet::engine {
namespace {

TEST(EventBudget, RowsPastTheCapAreCountedAndReportedOncePerClient) {
  EventBudget budget(3);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(budget.admit("a", 0)) << i;
  EXPECT_FALSE(budget.admit("a", 0));
  EXPECT_FALSE(budget.admit("a", 0));
  EXPECT_TRUE(budget.admit("b", 0));
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(budget.admit("", 0)) << "rows naming no client";
  auto rows = budget.closeRound(7, 4, 12.5);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].run_id, 7);
  EXPECT_EQ(rows[0].client_id, "a");
  EXPECT_EQ(rows[0].kind, "events_left_out");
  EXPECT_DOUBLE_EQ(rows[0].time, 12.5);
  EXPECT_EQ(rows[0].detail,
            "round 4: 2 more events of this client left out "
            "(limits.events_per_client_round = 3)");
}

TEST(EventBudget, ANewRoundStartsFromZero) {
  EventBudget budget(1);
  EXPECT_TRUE(budget.admit("a", 0));
  EXPECT_FALSE(budget.admit("a", 0));
  EXPECT_EQ(budget.closeRound(1, 1, 0).size(), 1u);
  EXPECT_TRUE(budget.admit("a", 0));
  EXPECT_TRUE(budget.closeRound(1, 2, 0).empty());
}

TEST(EventBudget, CapZeroMeansNoCap) {
  EventBudget budget(0);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(budget.admit("a", 0));
  EXPECT_TRUE(budget.closeRound(1, 1, 0).empty());
}

// Burst 3, one row every 10 s: rows at 0, 0, 0, then none until 10 s have refilled one; and
// while a count is owed, that row is the one that reports it. (Times chosen so that the refills
// add up exactly in binary.)
TEST(EventBudget, RowsInTimeAreABucketOfBurstRefilledOneEveryInterval) {
  EventBudget budget(/*per_round=*/0, /*burst=*/3, /*every_s=*/10);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(budget.admit("a", 0)) << i;
  EXPECT_FALSE(budget.admit("a", 0));
  EXPECT_FALSE(budget.admit("a", 5));
  EXPECT_FALSE(budget.admit("a", 10)) << "a row is there, but it is owed to the count";
  EXPECT_TRUE(budget.admit("b", 10)) << "each client has its own budget";
  auto rows = budget.closeRound(1, 1, 15);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].client_id, "a");
  EXPECT_EQ(rows[0].detail,
            "round 1: 3 more events of this client left out (limits.events_burst = 3 at once, "
            "then one every limits.events_every_s = 10 s)");
  // Half a row left at 15 s: the next one waits for 20 s, and its count with it.
  EXPECT_FALSE(budget.admit("a", 15));
  EXPECT_TRUE(budget.closeRound(1, 2, 19).empty());
  rows = budget.closeRound(1, 3, 20);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].detail,
            "rounds 2 to 3: 1 more events of this client left out (limits.events_burst = 3 at "
            "once, then one every limits.events_every_s = 10 s)");
  // Full again after 30 quiet seconds: the client is forgotten, and starts with a full burst.
  EXPECT_TRUE(budget.closeRound(1, 4, 50).empty());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(budget.admit("a", 50)) << i;
  EXPECT_FALSE(budget.admit("a", 50));
  // The run's end writes what is still owed, whatever the budget.
  rows = budget.closeRun(1, 5, 50);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].detail,
            "round 5: 1 more events of this client left out (limits.events_burst = 3 at once, "
            "then one every limits.events_every_s = 10 s)");
}

// The case that wrote 70 rows a second: rounds every 0.1 s for 100 s, the client asking for 25
// rows in each (past the cap of 20 a round). With 30 at once and then one every 10 s, the rows
// written by time t (events and events_left_out alike) never exceed 30 + t / 10: 39 in all by
// 99.9 s. Nothing is lost: what was left out is counted, and the count is written once the
// budget allows a row.
TEST(EventBudget, OneClientIsHeldToTheDocumentedRateHoweverFastTheRounds) {
  EventBudget budget(/*per_round=*/20, /*burst=*/30, /*every_s=*/10);
  uint64_t asked = 0, admitted = 0, reported = 0, rows = 0, left_out_rows = 0;
  for (int r = 0; r < 1000; ++r) {
    const double t = r * 0.1;
    for (int i = 0; i < 25; ++i) {
      ++asked;
      if (budget.admit("a", t)) {
        ++admitted;
        ++rows;
      }
    }
    for (const auto& e : budget.closeRound(1, r + 1, t)) {
      ++rows;
      ++left_out_rows;
      reported += std::stoull(e.detail.substr(e.detail.find(": ") + 2));
    }
    ASSERT_LE(rows, 30 + t / 10) << "at " << t << " s";
  }
  EXPECT_EQ(rows, 39u);
  EXPECT_GE(left_out_rows, 1u);
  // A quiet minute later, the round's end reports the rest.
  for (const auto& e : budget.closeRound(1, 1001, 160)) {
    reported += std::stoull(e.detail.substr(e.detail.find(": ") + 2));
  }
  EXPECT_EQ(admitted + reported, asked);
}

}  // namespace
}  // namespace fedfleet::engine
