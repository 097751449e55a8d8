#include "engine/evaluation_backlog.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

namespace fedfleet::engine {
namespace {

CommitRound roundRow(uint32_t round) {
  CommitRound c;
  c.round.round = round;
  c.round.status = "ok";
  c.round.model_version = round;
  return c;
}

ModelSnapshot snapshotOf(float value) { return ModelSnapshot{{value, value}, "opt", "c"}; }

std::vector<uint32_t> roundsOf(const std::vector<CommitRound>& rows) {
  std::vector<uint32_t> out;
  for (const auto& c : rows) out.push_back(c.round.round);
  return out;
}

TEST(EvaluationBacklog, UnboundedIsNeverFull) {
  EvaluationBacklog b(0);
  for (uint32_t r = 0; r < 50; ++r) b.hold(r, roundRow(r), snapshotOf(r));
  EXPECT_FALSE(b.full(50));
  EXPECT_FALSE(b.empty());
}

TEST(EvaluationBacklog, BoundCountsOnlyRoundsBeforeTheLastEnded) {
  EvaluationBacklog b(2);
  b.hold(1, roundRow(1), snapshotOf(1));
  EXPECT_FALSE(b.full(1));  // round 1 itself overlaps the next round
  EXPECT_FALSE(b.full(2));  // one behind of two allowed
  b.hold(2, roundRow(2), snapshotOf(2));
  EXPECT_FALSE(b.full(2));
  b.hold(3, roundRow(3), snapshotOf(3));
  EXPECT_TRUE(b.full(3));  // rounds 1 and 2 await theirs
  b.accept(1);
  EXPECT_FALSE(b.full(3));  // the report brings it below the bound
}

TEST(EvaluationBacklog, AcceptReturnsTheHeldRowAndForgetsTheRound) {
  EvaluationBacklog b(0);
  b.hold(4, roundRow(4), snapshotOf(4));
  EXPECT_TRUE(b.awaiting(4));
  EXPECT_FALSE(b.awaiting(5));
  CommitRound c = b.accept(4);
  EXPECT_EQ(c.round.round, 4u);
  EXPECT_EQ(c.round.model_version, 4u);
  EXPECT_FALSE(b.awaiting(4));
  EXPECT_TRUE(b.empty());
}

TEST(EvaluationBacklog, HoldingARoundAgainKeepsTheFirstRow) {
  EvaluationBacklog b(0);
  b.hold(2, roundRow(2), std::nullopt);
  CommitRound other = roundRow(2);
  other.round.status = "failed";
  b.hold(2, std::move(other), std::nullopt);
  EXPECT_EQ(b.accept(2).round.status, "ok");
}

TEST(EvaluationBacklog, RefusalTakesTheRoundAndLaterOnesWithTheModelBeforeIt) {
  EvaluationBacklog b(0);
  for (uint32_t r = 1; r <= 4; ++r) b.hold(r, roundRow(r), snapshotOf(static_cast<float>(r)));
  EvaluationBacklog::Refusal refusal = b.refuse(2);
  ASSERT_TRUE(refusal.before);
  EXPECT_EQ(refusal.before->params, (std::vector<float>{2, 2}));  // the model before round 2
  EXPECT_EQ(refusal.before->optimizer_state, "opt");
  EXPECT_EQ(refusal.before->aggregator_state, "c");
  EXPECT_EQ(roundsOf(refusal.rounds), (std::vector<uint32_t>{2, 3, 4}));  // in round order
  EXPECT_TRUE(b.awaiting(1));  // an earlier round still awaits its own report
  EXPECT_FALSE(b.awaiting(3));
  // Every snapshot went: round 1's was of a model the refused one was built on, but a second
  // refusal has nothing to go back to (it was taken with the first).
  EvaluationBacklog::Refusal again = b.refuse(1);
  EXPECT_FALSE(again.before);
  EXPECT_EQ(roundsOf(again.rounds), (std::vector<uint32_t>{1}));
  EXPECT_TRUE(b.empty());
}

TEST(EvaluationBacklog, RefusingTheInitialRoundHasNoSnapshot) {
  EvaluationBacklog b(0);
  b.hold(0, roundRow(0), std::nullopt);
  b.hold(1, roundRow(1), snapshotOf(1));
  EvaluationBacklog::Refusal refusal = b.refuse(0);
  EXPECT_FALSE(refusal.before);
  EXPECT_EQ(roundsOf(refusal.rounds), (std::vector<uint32_t>{0, 1}));
}

TEST(EvaluationBacklog, TakeAllEmptiesInRoundOrder) {
  EvaluationBacklog b(1);
  b.hold(7, roundRow(7), snapshotOf(7));
  b.hold(3, roundRow(3), std::nullopt);
  b.hold(5, roundRow(5), snapshotOf(5));
  EXPECT_TRUE(b.full(7));
  EXPECT_EQ(roundsOf(b.takeAll()), (std::vector<uint32_t>{3, 5, 7}));
  EXPECT_TRUE(b.empty());
  EXPECT_FALSE(b.full(7));
}

}  // namespace
}  // namespace fedfleet::engine
