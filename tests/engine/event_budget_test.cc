#include "engine/event_budget.h"

#include <gtest/gtest.h>

namespace fedfleet::engine {
namespace {

TEST(EventBudget, RowsPastTheCapAreCountedAndReportedOncePerClient) {
  EventBudget budget(3);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(budget.admit("a")) << i;
  EXPECT_FALSE(budget.admit("a"));
  EXPECT_FALSE(budget.admit("a"));
  EXPECT_TRUE(budget.admit("b"));
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(budget.admit("")) << "rows naming no client";
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
  EXPECT_TRUE(budget.admit("a"));
  EXPECT_FALSE(budget.admit("a"));
  EXPECT_EQ(budget.closeRound(1, 1, 0).size(), 1u);
  EXPECT_TRUE(budget.admit("a"));
  EXPECT_TRUE(budget.closeRound(1, 2, 0).empty());
}

TEST(EventBudget, CapZeroMeansNoCap) {
  EventBudget budget(0);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(budget.admit("a"));
  EXPECT_TRUE(budget.closeRound(1, 1, 0).empty());
}

}  // namespace
}  // namespace fedfleet::engine
