#include "engine/recent_tokens.h"

#include <gtest/gtest.h>

namespace fedfleet::engine {
namespace {

TEST(RecentTokens, InsertReportsNewTokensOnly) {
  RecentTokens t(4);
  EXPECT_TRUE(t.insert(7));
  EXPECT_FALSE(t.insert(7));
  EXPECT_EQ(t.count(7), 1u);
  EXPECT_EQ(t.count(8), 0u);
}

TEST(RecentTokens, ForgetsTheTokensOfRoundsOlderThanTheLastKeepRounds) {
  RecentTokens t(3);
  t.advance(1);
  t.insert(101);
  t.advance(2);
  t.insert(102);
  t.advance(3);  // rounds 1..3 kept
  EXPECT_EQ(t.count(101), 1u);
  t.advance(4);  // rounds 2..4
  EXPECT_EQ(t.count(101), 0u);
  EXPECT_EQ(t.count(102), 1u);
  EXPECT_TRUE(t.insert(101));  // forgotten: new again
  t.advance(3);                // rounds never go back
  EXPECT_EQ(t.count(102), 1u);
  t.advance(100);
  EXPECT_EQ(t.size(), 0u);
}

// What a long run needs: the set stays as large as keep_rounds rounds of tokens.
TEST(RecentTokens, StaysBoundedOverManyRounds) {
  RecentTokens t(32);
  uint64_t token = 1;
  for (uint32_t round = 1; round <= 10000; ++round) {
    t.advance(round);
    for (int k = 0; k < 10; ++k) t.insert(token++);
  }
  EXPECT_EQ(t.size(), 32u * 10u);
  EXPECT_EQ(t.count(token - 1), 1u);
  EXPECT_EQ(t.count(1), 0u);
}

}  // namespace
}  // namespace fedfleet::engine
