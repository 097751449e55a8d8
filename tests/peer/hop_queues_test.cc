#include "peer/hop_queues.h"

#include <gtest/gtest.h>

namespace fedfleet::peer {
namespace {

using Ids = std::vector<uint32_t>;

TEST(HopQueuesTest, BackupWorkersTakeTheFirstNMinusBInArrivalOrder) {
  HopQueues q({1, 2, 3}, /*backup=*/1, /*bound=*/2);
  EXPECT_EQ(q.required(), 2u);
  EXPECT_FALSE(q.chosenFor(0).has_value());
  EXPECT_TRUE(q.onUpdate(3, 0));
  EXPECT_FALSE(q.chosenFor(0).has_value());
  EXPECT_TRUE(q.onUpdate(1, 0));
  ASSERT_TRUE(q.chosenFor(0).has_value());
  EXPECT_EQ(*q.chosenFor(0), (Ids{3, 1}));  // arrival order, not id order
  EXPECT_TRUE(q.onUpdate(2, 0));
  EXPECT_EQ(*q.chosenFor(0), (Ids{3, 1}));  // the late one is the backup
  EXPECT_FALSE(q.onUpdate(7, 0));           // not an in-neighbour
  // Iteration 1: a newer tag counts (neighbour 2 is ahead at 3).
  EXPECT_TRUE(q.onUpdate(2, 3));
  EXPECT_FALSE(q.chosenFor(1).has_value());
  EXPECT_TRUE(q.onUpdate(1, 1));
  EXPECT_EQ(*q.chosenFor(1), (Ids{2, 1}));
}

TEST(HopQueuesTest, WithoutBackupEveryNeighbourIsNeeded) {
  HopQueues q({4, 5}, 0, 1);
  EXPECT_EQ(q.required(), 2u);
  q.onUpdate(4, 0);
  EXPECT_FALSE(q.chosenFor(0).has_value());
  q.onUpdate(5, 0);
  EXPECT_EQ(*q.chosenFor(0), (Ids{4, 5}));
}

TEST(HopQueuesTest, IterationGapBound) {
  HopQueues q({1, 2}, 1, /*bound=*/2);
  // Nothing heard (-1): iterations 0, 1, 2 may start (t - 1 - 2 <= -1), 3 may not.
  EXPECT_TRUE(q.mayStart(0));
  EXPECT_TRUE(q.mayStart(2));
  EXPECT_FALSE(q.mayStart(3));
  q.onUpdate(1, 0);
  EXPECT_FALSE(q.mayStart(3));  // neighbour 2 still at -1
  q.onUpdate(2, 0);
  EXPECT_TRUE(q.mayStart(3));
  EXPECT_FALSE(q.mayStart(4));
  // A dead neighbour holds nobody back.
  q.onDown(2);
  q.onUpdate(1, 5);
  EXPECT_TRUE(q.mayStart(8));
  EXPECT_FALSE(q.mayStart(9));
  EXPECT_EQ(q.live(), 1u);
  EXPECT_EQ(q.required(), 1u);  // min(n - b, live)
}

TEST(HopQueuesTest, SkipWhenBehindByTheBound) {
  HopQueues q({1, 2}, 1, /*bound=*/2);
  q.onUpdate(1, 1);
  // At iteration 1 (1 completed): neighbour 1 completed 2, one ahead: no skip.
  EXPECT_FALSE(q.skipTarget(1).has_value());
  q.onUpdate(2, 4);
  // Neighbour 2 completed 5, four ahead: resume at 5 (skip 1 .. 4).
  ASSERT_TRUE(q.skipTarget(1).has_value());
  EXPECT_EQ(*q.skipTarget(1), 5u);
  EXPECT_EQ(*q.skipTarget(3), 5u);            // two ahead: the bound
  EXPECT_FALSE(q.skipTarget(4).has_value());  // one ahead
  q.onDown(2);
  EXPECT_FALSE(q.skipTarget(1).has_value());  // a dead neighbour is no reason
}

}  // namespace
}  // namespace fedfleet::peer
