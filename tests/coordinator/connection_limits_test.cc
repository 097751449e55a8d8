#include "coordinator/connection_limits.h"

#include <gtest/gtest.h>

namespace fedfleet::coordinator {
namespace {

TEST(RateLimit, ABurstThenTheRate) {
  RateLimit limit(/*per_second=*/2, /*burst=*/3);
  EXPECT_TRUE(limit.take(10.0));
  EXPECT_TRUE(limit.take(10.0));
  EXPECT_TRUE(limit.take(10.0));
  EXPECT_FALSE(limit.take(10.0));  // burst spent
  EXPECT_FALSE(limit.take(10.4));  // 0.8 tokens back: not yet one
  EXPECT_TRUE(limit.take(10.6));   // 1.2
  EXPECT_FALSE(limit.take(10.6));
  EXPECT_TRUE(limit.take(20.0));  // refilled, but never beyond the burst
  EXPECT_TRUE(limit.take(20.0));
  EXPECT_TRUE(limit.take(20.0));
  EXPECT_FALSE(limit.take(20.0));
}

TEST(ConnectionLimits, OverOneRateRefusesEverythingAfterAndCounts) {
  ConnectionLimitOptions o;
  o.bad_frames = {1, 2};
  ConnectionLimits limits(o);
  EXPECT_TRUE(limits.admit(ConnectionLimits::kBadFrame, 0));
  EXPECT_TRUE(limits.admit(ConnectionLimits::kHeartbeat, 0));
  EXPECT_TRUE(limits.admit(ConnectionLimits::kBadFrame, 0));
  EXPECT_FALSE(limits.over());
  EXPECT_FALSE(limits.admit(ConnectionLimits::kBadFrame, 0));
  EXPECT_TRUE(limits.over());
  // Once over, the connection is refused whatever it sends, even after the buckets refill.
  EXPECT_FALSE(limits.admit(ConnectionLimits::kHeartbeat, 100));
  EXPECT_FALSE(limits.admit(ConnectionLimits::kHello, 100));
  EXPECT_EQ(limits.refused(), 3u);
  EXPECT_EQ(limits.refusedSummary(),
            "1 bad frames, 1 Hellos, 1 heartbeats refused (limits a connection: bad frames 1/s "
            "burst 2, Hellos 0.2/s burst 5, heartbeats 10/s burst 50)");
}

TEST(ConnectionLimits, AnHonestClientStaysUnder) {
  // One Hello, then a heartbeat a second for an hour.
  ConnectionLimits limits;
  EXPECT_TRUE(limits.admit(ConnectionLimits::kHello, 0));
  for (int t = 1; t <= 3600; ++t) {
    ASSERT_TRUE(limits.admit(ConnectionLimits::kHeartbeat, t)) << t;
  }
  // A reconnecting client's Hellos: five at once, then one every five seconds.
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(limits.admit(ConnectionLimits::kHello, 3600));
  EXPECT_TRUE(limits.admit(ConnectionLimits::kHello, 3605));
  EXPECT_FALSE(limits.over());
}

TEST(EventBudget, CountsWhatIsLeftOut) {
  EventBudget budget(/*burst=*/3, /*refill_s=*/10);
  int written = 0;
  for (int i = 0; i < 10; ++i) written += budget.take(0);
  EXPECT_EQ(written, 3);
  EXPECT_EQ(budget.leftOut(), 7u);
  EXPECT_FALSE(budget.take(5));    // half a row back
  EXPECT_TRUE(budget.take(10.5));  // one row per 10 s
  EXPECT_EQ(budget.takeLeftOut(), 8u);
  EXPECT_EQ(budget.leftOut(), 0u);
}

}  // namespace
}  // namespace fedfleet::coordinator
