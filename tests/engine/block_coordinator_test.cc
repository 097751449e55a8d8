#include "engine/block_coordinator.h"

#include <gtest/gtest.h>

#include <cstring>

#include "common/crypto/sha256.h"

namespace fedfleet::engine {
namespace {

using V = std::vector<float>;

BlockScheduleOptions byRounds(uint32_t count, uint32_t rounds_per_block) {
  BlockScheduleOptions o;
  o.count = count;
  o.rounds_per_block = rounds_per_block;
  return o;
}

std::shared_ptr<const std::string> bytesOf(const V& v) {
  auto b = std::make_shared<std::string>(v.size() * sizeof(float), '\0');
  std::memcpy(b->data(), v.data(), b->size());
  return b;
}

TEST(BlockCoordinator, VisitsAlternateMultichainRoundsBetweenXAndTheBlockChain) {
  BlockCoordinator b(byRounds(2, 2), BlockMode::kMultichain);
  V x = {1, 1};
  EXPECT_EQ(b.prepareRound(1, 0, x), "block 0 from round 1 (multichain)");
  EXPECT_EQ(b.roundChain(), -1);  // the visit's first round trains x
  EXPECT_TRUE(b.available(0));
  EXPECT_FALSE(b.available(1));
  EXPECT_FALSE(b.available(-1));
  EXPECT_FALSE(b.prepareRound(2, 0, x).has_value());  // same visit
  ASSERT_EQ(b.roundChain(), 0);                       // its second trains y_0, a copy of x
  EXPECT_EQ(b.chainSha(), crypto::sha256(*bytesOf(x)));
  // The step of a chain round moves y_0 and leaves x alone.
  EXPECT_TRUE(b.applyStep(x, [&] {
    x = {3, 3};
    return true;
  }));
  EXPECT_EQ(x, (V{1, 1}));
  EXPECT_EQ(b.models().chain(0), (V{3, 3}));
  EXPECT_EQ(b.prepareRound(3, 0, x), "block 1 from round 3 (multichain)");
}

TEST(BlockCoordinator, AVisitEndsWithABlockEvaluationWhoseReportChoosesTheServedModel) {
  BlockCoordinator b(byRounds(2, 2), BlockMode::kMultichain);
  V x = {1, 1};
  b.prepareRound(1, 0, x);
  EXPECT_FALSE(b.endRound(1, false, 0, x));  // the visit goes on
  b.prepareRound(2, 0, x);
  b.applyStep(x, [] { return true; });
  std::optional<EvaluateBlocks> ev = b.endRound(2, false, 0, x);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->round, 2u);
  EXPECT_EQ(ev->ended_block, 0u);
  // Block 0: x, z_0 (x at the visit's end) and y_0; block 1: x only.
  ASSERT_EQ(ev->models.size(), 4u);
  EXPECT_EQ(ev->models[0].model, "shared");
  EXPECT_EQ(ev->models[1].model, "pluralistic");
  EXPECT_EQ(ev->models[2].model, "chain");
  EXPECT_EQ(ev->models[3].block, 1u);
  EXPECT_TRUE(b.pending());

  std::vector<BlockEvalOutcome> outcomes = {
      {0, "pluralistic", 0.5, 1.0, 0.1}, {0, "chain", 0.2, 2.0, 0.2}, {1, "shared", {}, 3.0, 0.3}};
  std::optional<RecordBlockMetrics> rec = b.onEvaluated(2, outcomes, 7);
  ASSERT_TRUE(rec);
  EXPECT_FALSE(b.pending());
  ASSERT_EQ(rec->rows.size(), 5u);  // three outcomes, then a served row per block
  EXPECT_EQ(rec->rows[3].model, "served");
  EXPECT_EQ(rec->rows[3].block, "0");
  EXPECT_EQ(*rec->rows[3].loss, 2.0);  // the chain: the lower validation loss
  EXPECT_EQ(rec->rows[4].block, "1");
  EXPECT_EQ(*rec->rows[4].loss, 3.0);  // x
  EXPECT_EQ(rec->rows[4].run_id, 7);
  EXPECT_EQ(b.models().served(0), BlockModels::Served::kChain);
  EXPECT_FALSE(b.onEvaluated(2, outcomes, 7));  // reported once
}

TEST(BlockCoordinator, ServedModelsAreAttachedOnlyWhenTheClientLacksThem) {
  BlockCoordinator b(byRounds(1, 1), BlockMode::kPluralistic);
  V x = {2, 2};
  b.prepareRound(1, 0, x);
  ASSERT_TRUE(b.endRound(1, false, 0, x));  // z_0 = (2, 2)
  b.modelsChanged();
  x = {5, 5};
  auto x_bytes = bytesOf(x);
  const wire::Sha256 x_sha = crypto::sha256(*x_bytes);
  b.prepareRound(2, 0, x);
  std::optional<wire::Sha256> held;
  wire::Task task;
  task.model_sha256 = x_sha;
  auto attach = b.serve(held, task, SharedModel{x, x_bytes, x_sha, 9});
  ASSERT_TRUE(attach);
  EXPECT_EQ(*attach, *bytesOf({2, 2}));
  EXPECT_EQ(task.served.source, wire::ServedSource::kAttached);
  EXPECT_EQ(task.served.model, "pluralistic");
  EXPECT_EQ(task.served.version, 9u);
  EXPECT_EQ(held, crypto::sha256(*attach));
  wire::Task again;
  again.model_sha256 = x_sha;
  EXPECT_FALSE(b.serve(held, again, SharedModel{x, x_bytes, x_sha, 10}));
  EXPECT_EQ(again.served.source, wire::ServedSource::kUnchanged);
  EXPECT_EQ(again.served.version, 9u);  // the version when first sent

  // Single mode serves x itself: the task's own model.
  BlockCoordinator single(byRounds(1, 1), BlockMode::kSingle);
  single.prepareRound(1, 0, x);
  std::optional<wire::Sha256> none;
  wire::Task own;
  own.model_sha256 = x_sha;
  EXPECT_FALSE(single.serve(none, own, SharedModel{x, x_bytes, x_sha, 1}));
  EXPECT_EQ(own.served.source, wire::ServedSource::kTaskModel);
}

TEST(BlockCoordinator, ServedMismatchNamesWhatTheClientHolds) {
  wire::ServedModel named;
  EXPECT_FALSE(BlockCoordinator::servedMismatch(named, wire::Sha256{}));  // none named
  named.source = wire::ServedSource::kAttached;
  named.sha256[0] = 0xab;
  EXPECT_FALSE(BlockCoordinator::servedMismatch(named, named.sha256));
  auto why = BlockCoordinator::servedMismatch(named, wire::Sha256{});
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("the client holds none"), std::string::npos);
}

TEST(BlockCoordinator, StateRoundTripsAndATruncatedOneIsCorrupt) {
  BlockCoordinator a(byRounds(2, 1), BlockMode::kPluralistic);
  V x = {1, 2};
  a.prepareRound(1, 0, x);
  a.endRound(1, false, 0, x);
  a.prepareRound(2, 0, x);
  BlockCoordinator b(byRounds(2, 1), BlockMode::kPluralistic);
  auto saved = b.parse(a.save(), x.size());
  ASSERT_TRUE(saved.isOk()) << saved.status().toString();
  b.restore(std::move(*saved));
  EXPECT_EQ(b.currentBlock(), 1u);
  EXPECT_EQ(b.models().average(0), x);
  EXPECT_EQ(b.parse("abc", x.size()).status().code(), StatusCode::kCorrupt);
}

}  // namespace
}  // namespace fedfleet::engine
