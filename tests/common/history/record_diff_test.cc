// firstDifference: the schema's columns decide what a replayed row is compared in.
#include "common/history/record_diff.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace fedfleet::history {
namespace {

UpdateRecord update() {
  UpdateRecord u;
  u.run_id = 1;
  u.round = 2;
  u.client_id = "v1";
  u.status = "completed";
  u.loss = 0.5;
  u.served_block = 0;
  u.served_sha256_hex = "ab";
  u.eval_metrics = {{"mse", 0.25}};
  return u;
}

TEST(RecordDiff, TheSameRowHasNoDifference) {
  EXPECT_EQ(firstDifference(update(), update()), "");
  RoundRecord r;
  r.train_loss = std::numeric_limits<double>::quiet_NaN();  // NaN is the same NaN
  EXPECT_EQ(firstDifference(r, r), "");
}

TEST(RecordDiff, WallClockColumnsArePassedOver) {
  UpdateRecord b = update();
  b.wall_compute_s = 9;
  b.encode_s = 9;
  b.decode_s = 9;
  EXPECT_EQ(firstDifference(update(), b), "");
  RoundRecord r1, r2;
  r2.wall_start = 5;
  r2.wall_end = 6;
  EXPECT_EQ(firstDifference(r1, r2), "");
  r2.dp_clip = 1.0;
  EXPECT_EQ(firstDifference(r1, r2), "dp_clip: null recorded, 1 replayed");
}

TEST(RecordDiff, NumbersCompareBitForBitAndTheFirstColumnIsNamed) {
  UpdateRecord b = update();
  b.loss = std::nextafter(0.5, 1.0);
  EXPECT_EQ(firstDifference(update(), b), "loss: 0.5 recorded, 0.50000000000000011 replayed");
  b.client_id = "v2";  // before loss in the table
  EXPECT_EQ(firstDifference(update(), b), "client_id: 'v1' recorded, 'v2' replayed");
}

TEST(RecordDiff, ServedMetricsAndEventColumnsAreCompared) {
  UpdateRecord b = update();
  b.served_sha256_hex = "cd";
  EXPECT_EQ(firstDifference(update(), b), "served_sha256: 'ab' recorded, 'cd' replayed");
  b = update();
  b.eval_metrics = {{"mse", 0.5}};
  EXPECT_EQ(firstDifference(update(), b), "eval_metrics: {mse=0.25} recorded, {mse=0.5} replayed");
  EventRecord e1, e2;
  e2.run_id = 3;
  EXPECT_EQ(firstDifference(e1, e2), "run_id: 0 recorded, 3 replayed");
  BlockMetricRecord m1, m2;
  m2.block = "b1";
  EXPECT_EQ(firstDifference(m1, m2), "block: '' recorded, 'b1' replayed");
}

}  // namespace
}  // namespace fedfleet::history
