#include "engine/deadline_policy.h"

#include <gtest/gtest.h>

#include "engine/engine_options.h"

namespace fedfleet::engine {
namespace {

EngineOptions percentileOptions() {
  EngineOptions o;
  o.deadline_mode = DeadlineMode::kPercentile;
  o.deadline_s = 60;
  o.clients_per_round = 5;
  o.deadline_percentile = 0.9;
  o.deadline_window = 2;
  o.deadline_slack = 1.2;
  return o;
}

TEST(DeadlineMode, NamesParseToModesAndBack) {
  for (const char* name : {"fixed", "percentile"}) {
    auto mode = parseDeadlineMode(name);
    ASSERT_TRUE(mode.isOk()) << name;
    EXPECT_STREQ(deadlineModeName(*mode), name);
  }
  EXPECT_EQ(parseDeadlineMode("adaptive").status().code(), StatusCode::kInvalidArgument);
}

TEST(DeadlinePolicy, FixedIsAlwaysTheConfiguredDeadline) {
  EngineOptions o;
  o.deadline_s = 42;
  auto d = DeadlinePolicy::create(o);
  EXPECT_EQ(d->startRound(), 42);
  for (int i = 0; i < 10; ++i) d->observe(1);
  EXPECT_EQ(d->startRound(), 42);
}

TEST(DeadlinePolicy, AsynchronousRoundsIgnoreThePercentileMode) {
  EngineOptions o = percentileOptions();
  o.async = true;
  auto d = DeadlinePolicy::create(o);
  for (int i = 0; i < 10; ++i) d->observe(1);
  EXPECT_EQ(d->startRound(), 60);
}

TEST(DeadlinePolicy, PercentileInterpolatesBetweenOrderStatistics) {
  auto d = DeadlinePolicy::create(percentileOptions());
  EXPECT_EQ(d->startRound(), 60);  // nothing known yet
  for (double s : {5.0, 1.0, 4.0, 2.0}) d->observe(s);
  EXPECT_EQ(d->startRound(), 60);  // 4 durations, fewer than one round's worth (5)
  d->observe(3);
  // Sorted 1 2 3 4 5: position 0.9 x 4 = 3.6 -> 4 + 0.6 x (5 - 4) = 4.6; x 1.2 slack = 5.52.
  EXPECT_NEAR(d->startRound(), 5.52, 1e-12);
}

TEST(DeadlinePolicy, PercentileNeverExceedsTheConfiguredDeadline) {
  auto d = DeadlinePolicy::create(percentileOptions());
  d->startRound();
  for (int i = 0; i < 5; ++i) d->observe(100);
  EXPECT_EQ(d->startRound(), 60);
}

TEST(DeadlinePolicy, PercentileForgetsRoundsOutsideItsWindow) {
  EngineOptions o = percentileOptions();
  o.deadline_window = 1;
  o.deadline_percentile = 0.5;
  o.deadline_slack = 1;
  auto d = DeadlinePolicy::create(o);
  d->startRound();  // round 1
  for (int i = 0; i < 5; ++i) d->observe(10);
  EXPECT_EQ(d->startRound(), 10);  // round 2, from round 1
  for (int i = 0; i < 5; ++i) d->observe(2);
  // Round 3, from rounds 1 and 2: median of five 2s and five 10s, position 4.5 -> 2 + 0.5 x 8.
  EXPECT_EQ(d->startRound(), 6);
  for (int i = 0; i < 5; ++i) d->observe(2);
  EXPECT_EQ(d->startRound(), 2);  // round 4, from rounds 2 and 3: round 1 has left the window
}

TEST(DeadlinePolicy, ValidationNamesTheBadOption) {
  EngineOptions o = percentileOptions();
  EXPECT_TRUE(validateDeadlineOptions(o).isOk());
  o.deadline_percentile = 0;
  EXPECT_NE(validateDeadlineOptions(o).message().find("deadline_percentile"), std::string::npos);
  o = percentileOptions();
  o.deadline_window = 0;
  EXPECT_NE(validateDeadlineOptions(o).message().find("deadline_window"), std::string::npos);
  o = percentileOptions();
  o.deadline_slack = 0;
  EXPECT_NE(validateDeadlineOptions(o).message().find("deadline_slack"), std::string::npos);
  o.deadline_mode = DeadlineMode::kFixed;  // not used: not checked
  EXPECT_TRUE(validateDeadlineOptions(o).isOk());
}

}  // namespace
}  // namespace fedfleet::engine
