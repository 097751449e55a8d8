#include "engine/quarantine.h"

#include <gtest/gtest.h>

namespace fedfleet::engine {
namespace {

TEST(Quarantine, TwoStrikesInARowQuarantineForTheRoundsAfter) {
  Quarantine q(/*after=*/2, /*rounds=*/3);
  EXPECT_FALSE(q.anyHeld(1));
  EXPECT_FALSE(q.flag("d", 1).has_value());
  EXPECT_FALSE(q.anyHeld(2));
  // Flagged in round 2 as well: not sampled in rounds 3, 4, 5; back in round 6.
  EXPECT_EQ(q.flag("d", 2), 6u);
  for (uint32_t r = 3; r <= 5; ++r) {
    EXPECT_TRUE(q.holds("d", r)) << r;
    EXPECT_TRUE(q.anyHeld(r)) << r;
    EXPECT_FALSE(q.holds("a", r)) << r;
  }
  EXPECT_FALSE(q.holds("d", 6));
  EXPECT_FALSE(q.anyHeld(6));
  // Flagged again when it is back: quarantined again at once (its strikes were not cleared).
  EXPECT_EQ(q.flag("d", 6), 10u);
  EXPECT_EQ(q.strikes("d"), 3u);
}

TEST(Quarantine, AnUpdateWithinTheBoundClearsTheStrikes) {
  Quarantine q(2, 3);
  q.flag("a", 1);
  q.clear("a");
  EXPECT_FALSE(q.flag("a", 3).has_value()) << "not in a row";
  EXPECT_EQ(q.strikes("a"), 1u);
}

TEST(Quarantine, OffNeverHolds) {
  Quarantine q(0, 10);
  for (uint32_t r = 1; r < 10; ++r) EXPECT_FALSE(q.flag("a", r).has_value());
  EXPECT_FALSE(q.anyHeld(5));
  EXPECT_FALSE(q.holds("a", 5));
}

TEST(Quarantine, SavesAndLoadsAndRefusesWhatDoesNotParse) {
  Quarantine q(2, 3);
  q.flag("d", 1);
  q.flag("d", 2);
  q.flag("e", 2);
  Quarantine back(2, 3);
  ASSERT_TRUE(back.load(q.save()).isOk());
  EXPECT_TRUE(back.holds("d", 4));
  EXPECT_TRUE(back.anyHeld(4));
  EXPECT_EQ(back.strikes("e"), 1u);
  EXPECT_EQ(back.flag("e", 3), 7u);

  Quarantine untouched(2, 3);
  untouched.flag("x", 1);
  untouched.flag("x", 2);
  const std::string good = q.save();
  for (const std::string& bad :
       {std::string(), std::string("QRN1"), good.substr(0, good.size() - 1), good + "x"}) {
    EXPECT_EQ(untouched.load(bad).code(), StatusCode::kCorrupt);
    EXPECT_TRUE(untouched.holds("x", 3));
  }
}

}  // namespace
}  // namespace fedfleet::engine
