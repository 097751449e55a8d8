#include "engine/update_assembler.h"

#include <gtest/gtest.h>

#include "engine/engine_options.h"
#include "tests/engine/round_engine_fixture.h"

namespace fedfleet::engine {
namespace {

using engine_test::chunkOf;
using V = std::vector<float>;

struct Assembly {
  EngineOptions options;
  std::unique_ptr<Aggregator> aggregator;
  std::unique_ptr<UpdateAssembler> assembler;
  Participant p;

  explicit Assembly(EngineOptions o, uint64_t n_params = 4) : options(std::move(o)) {
    aggregator = Aggregator::create(options, n_params);
    assembler = std::make_unique<UpdateAssembler>(options, *aggregator, n_params);
    p.planned.epochs = 1;
    p.planned.batch_size = 1;
    p.max_steps = 100;
  }
};

TEST(UpdateAssembler, ChunksInOrderFoldWithTheirWeightAndCountTheNorm) {
  Assembly a{EngineOptions{}};
  EXPECT_FALSE(a.assembler->addChunk(a.p, 1, chunkOf(1, 0, {1, 2}, false, 10, 3)));
  EXPECT_FALSE(a.assembler->addChunk(a.p, 1, chunkOf(1, 2, {2, 4}, true, 10, 3)));
  EXPECT_EQ(a.p.next_offset, 4u);
  EXPECT_TRUE(a.p.last_chunk);
  EXPECT_EQ(a.p.weight, 10);
  EXPECT_EQ(a.p.fold_weight, 10);          // FedAvg: n
  EXPECT_EQ(a.p.sq_norm, 1 + 4 + 4 + 16);  // 25: norm 5
  EXPECT_FALSE(a.p.codec.empty());
  V sum(4, 1.0f);
  ASSERT_TRUE(a.assembler->fold(1, 0.5f, sum.data()).isOk());
  EXPECT_EQ(sum, (V{1.5f, 2, 2, 3}));
  V whole(4);
  ASSERT_TRUE(a.assembler->decode(1, whole.data()).isOk());
  EXPECT_EQ(whole, (V{1, 2, 2, 4}));
}

TEST(UpdateAssembler, ChunksOutOfPlaceOrOfAnotherWeightAreRejectedWithTheReason) {
  Assembly a{EngineOptions{}};
  EXPECT_EQ(*a.assembler->addChunk(a.p, 1, chunkOf(1, 2, {1}, false)),
            "chunk at offset 2, expected 0");
  EXPECT_EQ(*a.assembler->addChunk(a.p, 1, chunkOf(1, 0, {1, 2, 3, 4, 5}, false)),
            "chunk ends at 5, past the update's 4 values");
  EXPECT_FALSE(a.assembler->addChunk(a.p, 1, chunkOf(1, 0, {1, 2}, false, 10, 3)));
  EXPECT_EQ(*a.assembler->addChunk(a.p, 1, chunkOf(1, 2, {1, 2}, true, 11, 3)),
            "chunk declares 11 samples and 3 steps, earlier chunks 10 and 3");
  Participant done;
  done.last_chunk = true;
  EXPECT_EQ(*a.assembler->addChunk(done, 2, chunkOf(2, 0, {1}, false)),
            "chunk after the last chunk");
}

// `last` must say what the offsets say: a chunk that ends the update is the last, and no other.
TEST(UpdateAssembler, TheLastFlagMustMarkTheChunkThatEndsTheUpdate) {
  Assembly a{EngineOptions{}};
  EXPECT_EQ(*a.assembler->addChunk(a.p, 1, chunkOf(1, 0, {1, 2}, true)),
            "last chunk ends at 2 of the update's 4 values");
  Assembly b{EngineOptions{}};
  EXPECT_EQ(*b.assembler->addChunk(b.p, 1, chunkOf(1, 0, {1, 2, 3, 4}, false)),
            "chunk not marked last ends at 4 of the update's 4 values");
  Assembly c{EngineOptions{}};
  EXPECT_FALSE(c.assembler->addChunk(c.p, 1, chunkOf(1, 0, {1, 2}, false)));
  EXPECT_EQ(*c.assembler->addChunk(c.p, 1, chunkOf(1, 2, {3, 4}, false)),
            "chunk not marked last ends at 4 of the update's 4 values");
  // Masked chunks are placed by the same rule.
  Assembly d{EngineOptions{}};
  EXPECT_EQ(*d.assembler->addMaskedChunk(d.p, chunkOf(1, 0, {1, 2}, true)),
            "last chunk ends at 2 of the update's 4 values");
}

TEST(UpdateAssembler, ClaimsAreBoundedByThePartitionAndThePlan) {
  EngineOptions o;
  o.partition_sizes = {5};
  Assembly a{o};
  EXPECT_EQ(*a.assembler->addChunk(a.p, 1, chunkOf(1, 0, {1}, false, 6, 3)),
            "claims 6 samples, partition 0 holds 5");
  a.p.max_steps = 2;
  EXPECT_EQ(*a.assembler->addChunk(a.p, 1, chunkOf(1, 0, {1}, false, 5, 3)),
            "claims 3 local steps, its task planned at most 2");
}

TEST(UpdateAssembler, ScaffoldUpdatesAreTwiceAsLongAndOnlyTheDeltaCountsForTheNorm) {
  EngineOptions o;
  o.aggregator = AggregatorKind::kScaffold;
  Assembly a{o, 2};
  EXPECT_FALSE(a.assembler->addChunk(a.p, 1, chunkOf(1, 0, {3, 4, 100, 100}, true, 10, 3)));
  EXPECT_EQ(a.p.sq_norm, 25);
  EXPECT_EQ(a.p.fold_weight, 1);  // unweighted
}

TEST(UpdateAssembler, ASummaryCompletesOnlyAWholeUpdateWithItsWeightAndSaneLosses) {
  EngineOptions o;
  o.max_loss = 10;
  Assembly a{o, 2};
  wire::Summary s;
  s.n_samples = 10;
  s.steps = 3;
  s.mean_loss = 1;
  s.sum_sq_loss = 10;
  s.compute_seconds = 50;
  wire::Summary checked;
  EXPECT_EQ(*a.assembler->checkSummary(a.p, s, checked, 0),
            "summary after 0 of 2 values (no last chunk)");
  ASSERT_FALSE(a.assembler->addChunk(a.p, 1, chunkOf(1, 0, {1, 1}, true, 10, 3)));
  a.p.sent_at = 100;
  EXPECT_FALSE(a.assembler->checkSummary(a.p, s, checked, 120));
  EXPECT_EQ(checked.compute_seconds, 20);  // clamped to the time since the task was sent
  wire::Summary other = s;
  other.n_samples = 9;
  EXPECT_EQ(*a.assembler->checkSummary(a.p, other, checked, 120),
            "summary reports 9 samples and 3 steps, the chunks 10 and 3");
  wire::Summary lossy = s;
  lossy.mean_loss = 11;
  EXPECT_NE(a.assembler->checkSummary(a.p, lossy, checked, 120)->find("mean loss"),
            std::string::npos);
}

// A served-model evaluation's sample count is bounded as a federated evaluation's is, and its
// figures must be in range.
TEST(UpdateAssembler, AServedModelReportIsBoundedLikeAnEvaluation) {
  EngineOptions o;
  o.max_loss = 10;
  o.max_samples_per_update = 1000;
  Assembly a{o, 2};
  ASSERT_FALSE(a.assembler->addChunk(a.p, 1, chunkOf(1, 0, {1, 1}, true, 10, 3)));
  wire::Summary s;
  s.n_samples = 10;
  s.steps = 3;
  s.mean_loss = 1;
  s.served_samples = 1000;
  s.served_loss = 0.5;
  s.served_accuracy = 0.75;
  wire::Summary checked;
  EXPECT_FALSE(a.assembler->checkSummary(a.p, s, checked, 0));
  s.served_samples = 1001;
  EXPECT_EQ(*a.assembler->checkSummary(a.p, s, checked, 0),
            "summary's served-model evaluation claims 1001 held-out samples, more than "
            "coordinator.max_samples_per_update = 1000");
  s.served_samples = 5;
  s.served_accuracy = 1.5;
  EXPECT_NE(a.assembler->checkSummary(a.p, s, checked, 0)->find("is out of range"),
            std::string::npos);
}

}  // namespace
}  // namespace fedfleet::engine
