#include "engine/participant.h"

#include <gtest/gtest.h>

namespace fedfleet::engine {
namespace {

Participant finished(UpdateState state) {
  Participant p;
  p.client = "c1";
  p.partition = 4;
  p.state = state;
  p.sent_at = 10;
  p.finished_at = 25;
  p.summary.n_samples = 64;
  p.summary.steps = 8;
  p.bytes_up = 1000;
  p.bytes_down = 2000;
  p.codec = "fp16";
  return p;
}

TEST(UpdateRecord, ACompletedUpdateCarriesItsWeightAndStatus) {
  history::UpdateRecord u = updateRecord(finished(UpdateState::kCompleted), 3, 7, 0.25, 99);
  EXPECT_EQ(u.run_id, 3);
  EXPECT_EQ(u.round, 7u);
  EXPECT_EQ(u.client_id, "c1");
  EXPECT_EQ(u.partition, 4);
  EXPECT_EQ(u.status, "completed");
  EXPECT_DOUBLE_EQ(u.weight, 0.25);
  EXPECT_DOUBLE_EQ(u.start_time, 10);
  EXPECT_DOUBLE_EQ(u.end_time, 25);
  EXPECT_EQ(u.codec, "fp16");
  EXPECT_EQ(u.served_block, -1);  // no served model named
}

TEST(UpdateRecord, AnUpdateThatDidNotCompleteHasNoWeight) {
  EXPECT_EQ(updateRecord(finished(UpdateState::kLate), 1, 1, 0.5, 99).weight, 0.0);
  EXPECT_EQ(updateRecord(finished(UpdateState::kRejected), 1, 1, 0.5, 99).status, "rejected");
  EXPECT_EQ(updateRecord(finished(UpdateState::kDropped), 1, 1, 0.5, 99).status, "dropped");
}

TEST(UpdateRecord, APendingTaskEndsNowAndItsGrantWaitRunsToItsEnd) {
  Participant p = finished(UpdateState::kPending);
  p.finished_at = -1;
  p.upload_asked_at = 20;  // asked, never granted
  history::UpdateRecord u = updateRecord(p, 1, 1, 0, 30);
  EXPECT_EQ(u.status, "pending");
  EXPECT_DOUBLE_EQ(u.end_time, 30);
  EXPECT_DOUBLE_EQ(u.grant_wait_s, 10);
  p.granted_at = 22;
  EXPECT_DOUBLE_EQ(updateRecord(p, 1, 1, 0, 30).grant_wait_s, 2);
}

}  // namespace
}  // namespace fedfleet::engine
