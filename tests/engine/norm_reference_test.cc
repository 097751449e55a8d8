#include "engine/norm_reference.h"

#include <gtest/gtest.h>

namespace fedfleet::engine {
namespace {

// Window 3, growth 2, by hand: each round's lower median, then the lower median of the last
// three of those, at most twice the reference before.
TEST(NormReference, IsTheMedianOfRecentRoundMediansGrowingAtMostByTheFactor) {
  NormReference ref(/*window=*/3, /*growth=*/2);
  EXPECT_FALSE(ref.reference().has_value());
  ref.observe({3, 1, 2});  // median 2: medians [2]
  EXPECT_EQ(ref.reference(), 2.0);
  ref.observe({10, 10, 1});  // median 10: [2, 10] -> 2
  EXPECT_EQ(ref.reference(), 2.0);
  ref.observe({10, 10, 10});  // [2, 10, 10] -> 10, capped at 2 x 2
  EXPECT_EQ(ref.reference(), 4.0);
  ref.observe({10, 10, 10});  // [10, 10, 10] -> 10, capped at 8
  EXPECT_EQ(ref.reference(), 8.0);
  ref.observe({10, 10, 10});  // 10 (cap 16)
  EXPECT_EQ(ref.reference(), 10.0);
  ref.observe({1});  // [10, 10, 1] -> 10
  EXPECT_EQ(ref.reference(), 10.0);
  ref.observe({1, 1});  // [10, 1, 1] -> 1: it falls as fast as the medians do
  EXPECT_EQ(ref.reference(), 1.0);
  ref.observe({});  // a round without norms changes nothing
  EXPECT_EQ(ref.reference(), 1.0);
}

// One update of 1e20 among honest ones of norm 1 does not move the round's lower median.
TEST(NormReference, OneHugeNormInARoundDoesNotMoveIt) {
  NormReference ref(5, 2);
  for (int i = 0; i < 10; ++i) ref.observe({1, 1, 1, 1e20});
  EXPECT_EQ(ref.reference(), 1.0);
}

TEST(NormReference, SavesAndLoadsAndRefusesWhatDoesNotParse) {
  NormReference ref(3, 2);
  ref.observe({4});
  ref.observe({8});
  ref.observe({6});
  NormReference back(3, 2);
  ASSERT_TRUE(back.load(ref.save()).isOk());
  EXPECT_EQ(back.reference(), ref.reference());
  ref.observe({100});
  back.observe({100});
  EXPECT_EQ(back.reference(), ref.reference());  // the same medians behind it

  // A smaller window keeps the newest medians, [6, 100]; then [100, 1] -> 1.
  NormReference narrow(2, 2);
  ASSERT_TRUE(narrow.load(ref.save()).isOk());
  narrow.observe({1});  // [100, 1] -> 1
  EXPECT_EQ(narrow.reference(), 1.0);

  NormReference untouched(3, 2);
  untouched.observe({5});
  const std::string good = ref.save();
  for (const std::string& bad : {std::string(), std::string("NRF1"), good.substr(0, good.size() - 1),
                                 good + "x", "XXXX" + good.substr(4)}) {
    EXPECT_EQ(untouched.load(bad).code(), StatusCode::kCorrupt);
    EXPECT_EQ(untouched.reference(), 5.0);
  }
}

}  // namespace
}  // namespace fedfleet::engine
