#include "common/format.h"

#include <gtest/gtest.h>

#include <limits>

namespace fedfleet {
namespace {

TEST(FormatDuration, EachRangeInItsUnit) {
  EXPECT_EQ(formatDuration(0), "0 ms");
  EXPECT_EQ(formatDuration(0.8509), "850 ms");
  EXPECT_EQ(formatDuration(4.104756), "4.1 s");
  EXPECT_EQ(formatDuration(10.0), "10 s");
  EXPECT_EQ(formatDuration(59.99), "59 s");
  EXPECT_EQ(formatDuration(300.0), "5 min 0 s");
  EXPECT_EQ(formatDuration(303.7), "5 min 3 s");
  EXPECT_EQ(formatDuration(2 * 3600 + 5 * 60 + 9), "2 h 5 min");
  EXPECT_EQ(formatDuration(3 * 86400 + 4 * 3600 + 1), "3 d 4 h");
  EXPECT_EQ(formatDuration(-4.1), "-4.1 s");
  EXPECT_EQ(formatDuration(std::numeric_limits<double>::quiet_NaN()), "?");
}

}  // namespace
}  // namespace fedfleet
