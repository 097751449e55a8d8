// TokenBucket with made-up times: nothing here sleeps or reads a clock.
#include "client/token_bucket.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

namespace fedfleet::client {
namespace {

TEST(TokenBucket, UnlimitedPassesEverythingAtOnce) {
  TokenBucket b(0, 1000, 5.0);
  EXPECT_TRUE(b.unlimited());
  EXPECT_EQ(b.reserve(1 << 30, 5.0), 5.0);
  EXPECT_EQ(b.reserve(1 << 30, 5.0), 5.0);
  EXPECT_EQ(b.reserve(1, 7.5), 7.5);
}

TEST(TokenBucket, MbitPerSecondIsTenToTheSixBits) {
  EXPECT_DOUBLE_EQ(TokenBucket::bytesPerSecond(20), 2.5e6);
  EXPECT_DOUBLE_EQ(TokenBucket::bytesPerSecond(0), 0);
}

TEST(TokenBucket, AFullBucketPassesTheBurstAtOnceThenHoldsToTheRate) {
  TokenBucket b(1000, 500, 10.0);  // 1000 B/s, 500 B burst
  EXPECT_DOUBLE_EQ(b.level(10.0), 500);
  EXPECT_DOUBLE_EQ(b.reserve(200, 10.0), 10.0);
  EXPECT_DOUBLE_EQ(b.reserve(300, 10.0), 10.0);  // the burst is used up exactly
  EXPECT_DOUBLE_EQ(b.level(10.0), 0);
  EXPECT_DOUBLE_EQ(b.reserve(100, 10.0), 10.1);   // 100 B at 1000 B/s
  EXPECT_DOUBLE_EQ(b.reserve(250, 10.0), 10.35);  // queued behind the previous reservation
  EXPECT_DOUBLE_EQ(b.level(10.2), 0);             // still waiting: nothing accrues
}

TEST(TokenBucket, RefillIsCappedAtTheBurst) {
  TokenBucket b(1000, 500, 0.0);
  EXPECT_DOUBLE_EQ(b.reserve(500, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(b.level(0.2), 200);
  EXPECT_DOUBLE_EQ(b.level(100.0), 500);  // a long idle spell saves only the burst
  EXPECT_DOUBLE_EQ(b.reserve(500, 100.0), 100.0);
  EXPECT_DOUBLE_EQ(b.reserve(1, 100.0), 100.001);
}

TEST(TokenBucket, ASendLargerThanTheBurstWaitsForItsOwnBytes) {
  TokenBucket b(1000, 100, 0.0);
  // Takes the 100 saved tokens and waits for the other 1900.
  EXPECT_DOUBLE_EQ(b.reserve(2000, 0.0), 1.9);
  EXPECT_DOUBLE_EQ(b.level(1.9), 0);
  EXPECT_DOUBLE_EQ(b.reserve(1000, 1.9), 2.9);
  // Asked later than the last one passed: the bucket refilled in between.
  EXPECT_DOUBLE_EQ(b.reserve(150, 3.0), 3.05);  // 100 saved, 50 more
}

TEST(TokenBucket, ASenderThatAsksLateDoesNotGetPastCredit) {
  TokenBucket b(1000, 100, 0.0);
  EXPECT_DOUBLE_EQ(b.reserve(1100, 0.0), 1.0);
  // Asked at 0.5 while the previous send is held until 1.0: waits behind it.
  EXPECT_DOUBLE_EQ(b.reserve(500, 0.5), 1.5);
}

// Long-run average: a sender that reserves back to back (each send asked for the moment the
// previous one passes, or all at once) moves bytes at the rate, less the initial burst; and one
// that pauses now and then never gets more than burst + rate * elapsed.
class TokenBucketAverage : public ::testing::TestWithParam<
                               std::tuple<double /*mbit*/, double /*burst*/, size_t /*chunk*/>> {};

TEST_P(TokenBucketAverage, LongRunRateIsTheConfiguredRateAndNeverMoreThanRatePlusBurst) {
  const auto [mbit, burst, chunk] = GetParam();
  const double rate = TokenBucket::bytesPerSecond(mbit);
  for (const bool at_once : {false, true}) {
    SCOPED_TRACE(at_once ? "all asked at time 0" : "each asked when the previous one passed");
    TokenBucket b(rate, burst, 0.0);
    double t = 0;
    const int sends = 500;
    for (int i = 0; i < sends; ++i) t = b.reserve(chunk, at_once ? 0.0 : t);
    const double bytes = static_cast<double>(chunk) * sends;
    // The burst is free; everything else goes at the rate.
    const double expected = std::max(0.0, (bytes - burst) / rate);
    EXPECT_NEAR(t, expected, 1e-9 * std::max(1.0, expected));
    if (bytes > 100 * burst) {
      EXPECT_NEAR(bytes / t, rate, 0.01 * rate);
    }
  }
  TokenBucket b(rate, burst, 0.0);
  double t = 0, bytes = 0;
  for (int i = 0; i < 300; ++i) {
    const double asked = t + (i % 7) * 0.37 * chunk / rate;  // pauses of 0 to 2.2 sends
    t = b.reserve(chunk, asked);
    bytes += static_cast<double>(chunk);
    ASSERT_GE(t, asked);
    ASSERT_LE(bytes, burst + rate * t + 1e-6 * bytes) << "send " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(RatesBurstsChunks, TokenBucketAverage,
                         ::testing::Combine(::testing::Values(0.5, 20.0, 1000.0),
                                            ::testing::Values(1.0, 64.0 * 1024, 4.0e6),
                                            ::testing::Values(size_t{1500}, size_t{1} << 20)));

}  // namespace
}  // namespace fedfleet::client
