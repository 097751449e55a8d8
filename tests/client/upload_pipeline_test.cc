// The upload pipeline: how a delta is cut into chunks, that the chunks' payloads decode back to
// the delta (exactly for "none", within QSGD's bound for qsgd8), error feedback carried from one
// upload to the next, ordering, the queue bound, the non-pipelined baseline, and overlap.
#include "client/upload_pipeline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "common/compress/codec.h"
#include "common/compress/lowrank.h"
#include "common/compress/payload.h"
#include "tests/client/pipeline_helpers.h"

namespace fedfleet::client {
namespace {

using ::testing::HasSubstr;

// Decodes every chunk into a dense delta.
std::vector<float> decodeAll(const std::vector<EncodedChunk>& chunks, size_t n) {
  std::vector<float> out(n, std::nanf(""));
  for (const auto& c : chunks) {
    Status st = compress::decodePayload(c.payload, c.range.elements, out.data() + c.range.offset);
    EXPECT_TRUE(st.isOk()) << "chunk " << c.index << ": " << st.toString();
  }
  return out;
}

// ---- chunk plan -------------------------------------------------------------------------

// Where a range lies in a layout: the (non-empty) tensor holding its first element, and
// whether it is a run of whole tensors or a piece of that one tensor.
struct Coverage {
  size_t first = 0;
  bool whole = false;
};
Coverage coverage(const model::Layout& l, const ChunkRange& r) {
  Coverage c;
  c.first = l.tensors.size();
  for (size_t i = 0; i < l.tensors.size(); ++i) {
    const auto& t = l.tensors[i];
    if (t.numel > 0 && t.offset <= r.offset && r.offset < t.offset + t.numel) c.first = i;
  }
  if (c.first == l.tensors.size() || l.tensors[c.first].offset != r.offset) return c;
  uint64_t covered = 0;
  for (size_t j = c.first; j < l.tensors.size() && covered < r.elements; ++j) {
    covered += l.tensors[j].numel;
  }
  c.whole = covered == r.elements;
  return c;
}

class ChunkPlan
    : public ::testing::TestWithParam<std::tuple<std::vector<size_t>, size_t /*chunk_bytes*/>> {};

TEST_P(ChunkPlan, CoversTheDeltaAlongTensorBoundariesWithinTheChunkSize) {
  const auto& [sizes, chunk_bytes] = GetParam();
  const model::Layout l = layoutOf(sizes);
  const uint64_t max_elems = std::max<size_t>(1, chunk_bytes / 4);
  const auto plan = planChunks(l, chunk_bytes);
  ASSERT_FALSE(plan.empty());
  uint64_t next = 0;
  std::vector<size_t> pieces(sizes.size(), 0);
  for (size_t k = 0; k < plan.size(); ++k) {
    const ChunkRange& r = plan[k];
    SCOPED_TRACE("chunk " + std::to_string(k));
    EXPECT_EQ(r.offset, next);  // contiguous, increasing
    next += r.elements;
    EXPECT_LE(r.elements, max_elems);
    if (l.total == 0) continue;
    EXPECT_GT(r.elements, 0u);
    const Coverage c = coverage(l, r);
    ASSERT_LT(c.first, sizes.size());
    EXPECT_EQ(r.tensor_index, c.first);  // names the tensor it starts in
    if (!c.whole) {
      // A piece of one tensor: inside it.
      const auto& t = l.tensors[c.first];
      EXPECT_GT(t.numel, max_elems) << "only tensors over the chunk size are split";
      EXPECT_GE(r.offset, t.offset);
      EXPECT_LE(r.offset + r.elements, t.offset + t.numel);
      ++pieces[c.first];
    } else if (k + 1 < plan.size()) {
      // A run of whole tensors is as long as it can be: the next tensor did not fit.
      const Coverage n = coverage(l, plan[k + 1]);
      if (n.whole) {
        EXPECT_GT(r.elements + plan[k + 1].elements, max_elems);
      }
    }
  }
  EXPECT_EQ(next, l.total);  // elements sum to n
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > max_elems) {
      EXPECT_EQ(pieces[i], (sizes[i] + max_elems - 1) / max_elems) << "tensor " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ChunkPlan,
    ::testing::Combine(::testing::Values(
                           // The CNN of the benchmarks (conv1, conv2, fc1, fc2 weights and biases).
                           std::vector<size_t>{800, 32, 51200, 64, 1605632, 512, 5120, 10},
                           std::vector<size_t>{784 * 256, 256, 256 * 10, 10},  // MLP
                           std::vector<size_t>{7850},                          // one tensor
                           std::vector<size_t>{1, 1, 1, 1, 1, 1, 1, 1, 1},     // many tiny ones
                           std::vector<size_t>{5, 0, 7, 0, 0, 300, 0},  // empty tensors between
                           std::vector<size_t>{0, 0},                   // nothing at all
                           std::vector<size_t>{}),
                       ::testing::Values(size_t{0}, size_t{40}, size_t{4096}, size_t{1} << 20,
                                         size_t{1} << 30)));

TEST(ChunkPlanRule, SplitsLargeTensorsEvenlyAndGroupsSmallOnes) {
  // 1 MiB chunks = 262144 elements.
  const auto plan = planChunks(layoutOf({800, 32, 51200, 64, 1605632, 512, 5120, 10}), 1 << 20);
  ASSERT_EQ(plan.size(), 9u);
  EXPECT_EQ(plan[0], (ChunkRange{0, 0, 800 + 32 + 51200 + 64}));  // conv layers together
  // fc1.weight: 1605632 = 7 pieces of 229376.
  for (size_t p = 0; p < 7; ++p) {
    EXPECT_EQ(plan[1 + p], (ChunkRange{4, 52096 + p * 229376, 229376})) << p;
  }
  EXPECT_EQ(plan[8], (ChunkRange{5, 52096 + 1605632, 512 + 5120 + 10}));
  // Uneven split: the first numel % pieces are one longer.
  EXPECT_EQ(planChunks(layoutOf({10}), 16),
            (std::vector<ChunkRange>{{0, 0, 4}, {0, 4, 3}, {0, 7, 3}}));
  EXPECT_EQ(planChunks(model::Layout{}, 1 << 20), (std::vector<ChunkRange>{{0, 0, 0}}));
  EXPECT_EQ(planChunks(flatLayout(10), 1 << 20), (std::vector<ChunkRange>{{0, 0, 10}}));
}

// Top-k uploads: every tensor in chunks of its own (large ones still split), so each tensor is
// selected from alone; other codecs group as before.
TEST(ChunkPlanRule, TopkUploadsCutOneTensorAChunk) {
  const model::Layout cnn = layoutOf({800, 32, 51200, 64, 1605632, 512, 5120, 10});
  const auto topk = compress::parseCodecSpec("topk:0.01").value();
  const auto plan = planUploadChunks(cnn, 1 << 20, false, topk);
  EXPECT_EQ(plan, planChunks(cnn, 1 << 20, true));
  ASSERT_EQ(plan.size(), 14u);
  EXPECT_EQ(plan[0], (ChunkRange{0, 0, 800}));
  EXPECT_EQ(plan[1], (ChunkRange{1, 800, 32}));
  EXPECT_EQ(plan[2], (ChunkRange{2, 832, 51200}));
  EXPECT_EQ(plan[3], (ChunkRange{3, 52032, 64}));
  for (size_t p = 0; p < 7; ++p) {
    EXPECT_EQ(plan[4 + p], (ChunkRange{4, 52096 + p * 229376, 229376})) << p;
  }
  EXPECT_EQ(plan[11], (ChunkRange{5, 1657728, 512}));
  EXPECT_EQ(plan[12], (ChunkRange{6, 1658240, 5120}));
  EXPECT_EQ(plan[13], (ChunkRange{7, 1663360, 10}));
  // Empty tensors are still skipped; other codecs group.
  EXPECT_EQ(planChunks(layoutOf({5, 0, 7}), 1 << 20, true),
            (std::vector<ChunkRange>{{0, 0, 5}, {2, 5, 7}}));
  for (const char* other : {"none", "qsgd8", "sign"}) {
    EXPECT_EQ(planUploadChunks(cnn, 1 << 20, false, compress::parseCodecSpec(other).value()),
              planChunks(cnn, 1 << 20))
        << other;
  }
  // SCAFFOLD: both halves cut alike.
  const auto twice = planUploadChunks(cnn, 1 << 20, true, topk);
  ASSERT_EQ(twice.size(), 28u);
  EXPECT_EQ(twice[14], (ChunkRange{8, 1663370, 800}));
}

// dense_below: the chunks of smaller tensors are marked dense (all pieces of a split tensor
// alike), the rest are not; no mark without the key, and the SCAFFOLD half repeats the marks.
TEST(ChunkPlanRule, DenseBelowMarksTheChunksOfSmallTensors) {
  const model::Layout cnn = layoutOf({800, 32, 51200, 64, 1605632, 512, 5120, 10});
  const auto spec = compress::parseCodecSpec("topk:0.01,dense_below=10000").value();
  const auto plan = planUploadChunks(cnn, 1 << 20, false, spec);
  ASSERT_EQ(plan.size(), 14u);
  const std::vector<bool> want = {true,  true,  false, true,  false, false, false,
                                  false, false, false, false, true,  true,  true};
  for (size_t i = 0; i < plan.size(); ++i) {
    EXPECT_EQ(plan[i].dense, want[i]) << i;
    ChunkRange plain = plan[i];
    plain.dense = false;
    EXPECT_EQ(plain, planChunks(cnn, 1 << 20, true)[i]) << i;  // same ranges as plain topk
  }
  for (const ChunkRange& c :
       planUploadChunks(cnn, 1 << 20, false, compress::parseCodecSpec("topk:0.01").value())) {
    EXPECT_FALSE(c.dense);
  }
  // A tensor split into pieces (4 KiB chunks: 1024 elements) is dense in every piece.
  const auto pieces =
      planUploadChunks(layoutOf({3000, 20000}), 4 << 10, false,
                       compress::parseCodecSpec("topk:0.01,dense_below=3001").value());
  ASSERT_EQ(pieces.size(), 3u + 20u);
  for (size_t i = 0; i < pieces.size(); ++i) EXPECT_EQ(pieces[i].dense, i < 3) << i;
  const auto twice = planUploadChunks(cnn, 1 << 20, true, spec);
  ASSERT_EQ(twice.size(), 28u);
  for (size_t i = 0; i < 14; ++i) EXPECT_EQ(twice[14 + i].dense, want[i]) << i;
}

// A SCAFFOLD update (delta, then control delta): the delta's plan, then the same ranges again
// P elements and T tensors on; no chunk holds values of both halves, even where planChunks over
// one 2P-long layout would group the last tensors of the delta with the first of the control.
TEST(ChunkPlanRule, ScaffoldUpdatesRepeatTheDeltaPlanOverTheSecondHalf) {
  const model::Layout l = layoutOf({7840, 10});
  EXPECT_EQ(planUploadChunks(l, 8 << 10, false), planChunks(l, 8 << 10));
  const auto plan = planUploadChunks(l, 8 << 10, true);
  ASSERT_EQ(plan.size(), 10u);  // weight in 4 pieces of 1960, bias alone; twice
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(plan[i + 5].offset, plan[i].offset + 7850) << i;
    EXPECT_EQ(plan[i + 5].elements, plan[i].elements) << i;
    EXPECT_EQ(plan[i + 5].tensor_index, plan[i].tensor_index + 2) << i;
  }
  uint64_t next = 0;
  for (const ChunkRange& c : plan) {
    EXPECT_EQ(c.offset, next);
    EXPECT_TRUE(c.offset + c.elements <= 7850 || c.offset >= 7850) << c.offset;
    next += c.elements;
  }
  EXPECT_EQ(next, 2u * 7850);
  // One chunk would hold the whole model: still two, one a half.
  EXPECT_EQ(planUploadChunks(l, 1 << 20, true),
            (std::vector<ChunkRange>{{0, 0, 7850}, {2, 7850, 7850}}));
}

// lowrank: a chunk is a whole tensor read as shape[0] rows, or blocks of whole rows when the
// factors of the whole would not fit in a chunk, or one-row pieces when not even one row fits.
TEST(ChunkPlanRule, LowrankCutsTensorsAsMatricesOfWholeRows) {
  model::Layout cnn;
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {32, 1, 5, 5}, {32}, {64, 32, 5, 5}, {64}, {512, 3136}, {512}, {10, 512}, {10}}) {
    size_t numel = 1;
    for (int64_t d : shape) numel *= static_cast<size_t>(d);
    cnn.tensors.push_back({"t", shape, numel, cnn.total});
    cnn.total += numel;
  }
  const auto spec = compress::parseCodecSpec("lowrank:10").value();
  const auto whole = planUploadChunks(cnn, 1 << 20, false, spec);
  const std::vector<uint32_t> rows = {32, 1, 64, 1, 512, 1, 10, 1};
  ASSERT_EQ(whole.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(whole[i], (ChunkRange{static_cast<uint32_t>(i), cnn.tensors[i].offset,
                                    cnn.tensors[i].numel, false, rows[i]}))
        << i;
  }
  // 70,000 bytes: fc1's body for b rows is 4 + 40 + 20 (b + 3136) bytes, so at most 361 rows
  // fit: two blocks of 256.
  const auto blocks = planUploadChunks(cnn, 70000, false, spec);
  ASSERT_EQ(blocks.size(), 9u);
  EXPECT_EQ(blocks[4], (ChunkRange{4, 52096, 256 * 3136, false, 256}));
  EXPECT_EQ(blocks[5], (ChunkRange{4, 52096 + 256 * 3136, 256 * 3136, false, 256}));
  EXPECT_EQ(blocks[2], whole[2]);
  // 20,000 bytes: a block of b < 10 rows has rank b, a body of 4 + 4b + 2b (b + 3136) bytes:
  // 3 rows fit (18,850 bytes), so 171 blocks, 170 of 3 rows and one of 2.
  const auto thin = planUploadChunks(cnn, 20000, false, spec);
  size_t fc1 = 0;
  for (const ChunkRange& c : thin) {
    if (c.tensor_index != 4) continue;
    ++fc1;
    EXPECT_EQ(c.elements, c.rows * 3136u);
    EXPECT_EQ(c.rows, fc1 <= 170 ? 3u : 2u) << fc1;
  }
  EXPECT_EQ(fc1, 171u);
  // 4,000 bytes: not one row of fc1 fits (4 + 4 + 2 * 3137 bytes); one-row pieces of at most
  // (4000 - 10) / 2 = 1,995 values, 805 of them, cut evenly (462 of 1,995 and 343 of 1,994).
  const auto pieces = planUploadChunks(cnn, 4000, false, spec);
  fc1 = 0;
  uint64_t next = 0;
  for (const ChunkRange& c : pieces) {
    EXPECT_EQ(c.offset, next);
    next += c.elements;
    EXPECT_LE(compress::lowrankPayloadBytes(
                  compress::lowrankEffectiveRank(10, c.rows, c.elements / c.rows), c.rows,
                  c.elements / c.rows) -
                  compress::kPayloadHeaderBytes,
              4000u);
    if (c.tensor_index != 4) continue;
    ++fc1;
    EXPECT_EQ(c.rows, 1u);
    EXPECT_EQ(c.elements, fc1 <= 462 ? 1995u : 1994u) << fc1;
  }
  EXPECT_EQ(fc1, 805u);
  EXPECT_EQ(next, cnn.total);
  // A chunk's payload carries its rows and decodes to the tensor's rank-2 approximation.
  model::Layout small;
  small.tensors.push_back({"w", {6, 8}, 48, 0});
  small.tensors.push_back({"b", {8}, 8, 48});
  small.total = 56;
  const auto two = compress::parseCodecSpec("lowrank:2").value();
  const auto plan = planUploadChunks(small, 1 << 20, false, two);
  ASSERT_EQ(plan, (std::vector<ChunkRange>{{0, 0, 48, false, 6}, {1, 48, 8, false, 1}}));
  // Rank 2 exactly: the outer products of two pairs of vectors.
  std::vector<float> delta(56);
  for (size_t i = 0; i < 6; ++i) {
    for (size_t c = 0; c < 8; ++c) delta[i * 8 + c] = float(i + 1) * float(c) - float(c * c) * 0.1f;
  }
  for (size_t c = 0; c < 8; ++c) delta[48 + c] = 0.5f - float(c);
  const auto codec = compress::makeCodec(two).value();
  std::vector<float> back(56);
  for (const ChunkRange& r : plan) {
    std::string payload;
    ASSERT_TRUE(encodeUploadChunk(*codec, r, delta.data() + r.offset, nullptr, 1, &payload).isOk());
    uint32_t payload_rows;
    std::memcpy(&payload_rows, payload.data() + compress::kPayloadHeaderBytes, 4);
    EXPECT_EQ(payload_rows, r.rows);
    ASSERT_TRUE(compress::decodePayload(payload, r.elements, back.data() + r.offset).isOk());
  }
  for (size_t i = 0; i < 56; ++i) {
    EXPECT_NEAR(back[i], delta[i], 2e-3 * (std::fabs(delta[i]) + 1)) << i;
  }
}

TEST(ChunkSeed, DiffersByChunkAndByTaskSeed) {
  std::set<uint64_t> seen;
  for (uint64_t task = 0; task < 16; ++task) {
    for (size_t i = 0; i < 64; ++i) seen.insert(chunkSeed(task, i));
  }
  EXPECT_EQ(seen.size(), 16u * 64);
  EXPECT_EQ(chunkSeed(7, 3), chunkSeed(7, 3));
}

// ---- payloads ---------------------------------------------------------------------------

TEST(UploadPipeline, NonePayloadsDecodeToTheDeltaBitForBit) {
  const model::Layout l = layoutOf({800, 32, 51200, 64, 40000, 512, 5120, 10});
  const std::vector<float> delta = randomDelta(l.total, 1);
  UploadPipeline p(delta, planChunks(l, 64 << 10), codecFor("none"), nullptr, 42);
  const auto chunks = drain(p);
  ASSERT_TRUE(p.status().isOk());
  ASSERT_EQ(chunks.size(), p.chunkCount());
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].index, i);
    EXPECT_EQ(chunks[i].last, i + 1 == chunks.size());
    EXPECT_EQ(chunks[i].payload.size(),
              compress::kPayloadHeaderBytes + 4 * chunks[i].range.elements);
  }
  const auto decoded = decodeAll(chunks, l.total);
  EXPECT_EQ(std::memcmp(decoded.data(), delta.data(), delta.size() * 4), 0);
  EXPECT_GT(p.encodeSeconds(), 0);
}

TEST(UploadPipeline, Qsgd8PayloadsAreWithinTheQuantisationBoundAndSeededPerChunk) {
  const model::Layout l = layoutOf({800, 32, 51200, 64, 100000, 512, 5120, 10});
  const std::vector<float> delta = randomDelta(l.total, 2);
  const auto codec = codecFor("qsgd8");
  const uint64_t task_seed = 99;
  const auto plan = planChunks(l, 100 << 10);
  UploadPipeline p(delta, plan, codec, nullptr, task_seed);
  const auto chunks = drain(p);
  ASSERT_EQ(chunks.size(), plan.size());
  const auto decoded = decodeAll(chunks, l.total);
  // Each element is off by at most one level, scale = ||bucket||_2 / 127, buckets of 512
  // counted from the start of each chunk.
  for (const auto& c : chunks) {
    for (uint64_t b = 0; b < c.range.elements; b += 512) {
      const uint64_t lo = c.range.offset + b;
      const uint64_t hi = c.range.offset + std::min<uint64_t>(c.range.elements, b + 512);
      double norm = 0;
      for (uint64_t i = lo; i < hi; ++i) norm += double(delta[i]) * delta[i];
      const double bound = std::sqrt(norm) / 127 * (1 + 1e-5) + 1e-12;
      for (uint64_t i = lo; i < hi; ++i) {
        ASSERT_LE(std::abs(double(decoded[i]) - delta[i]), bound) << "element " << i;
      }
    }
    // Chunk i was encoded with chunkSeed(task seed, i): the same bytes again.
    std::string again;
    codec->encode(delta.data() + c.range.offset, c.range.elements, chunkSeed(task_seed, c.index),
                  &again);
    EXPECT_EQ(again, c.payload) << "chunk " << c.index;
  }
  // Different chunks draw different random numbers: the same values in two chunks do not give
  // the same levels (identical 50000-element halves, one chunk each).
  std::vector<float> twice(100000);
  for (size_t i = 0; i < 50000; ++i) twice[i] = twice[i + 50000] = delta[i];
  UploadPipeline q(twice, planChunks(layoutOf({50000, 50000}), 200000), codec, nullptr, 5);
  const auto halves = drain(q);
  ASSERT_EQ(halves.size(), 2u);
  EXPECT_NE(halves[0].payload, halves[1].payload);
}

TEST(UploadPipeline, ErrorFeedbackCarriesTheResidualAcrossUploads) {
  const model::Layout l = layoutOf({3000, 30, 20000, 200});
  const auto codec = codecFor("topk:0.01");
  ASSERT_TRUE(compress::usesErrorFeedback(codec->spec()));
  compress::ErrorFeedback residual(l.total);
  const auto plan = planChunks(l, 16 << 10);
  ASSERT_GT(plan.size(), 2u);
  const std::vector<float> x1 = randomDelta(l.total, 11), x2 = randomDelta(l.total, 12);

  std::vector<float> sent(l.total, 0.0f), r(l.total);
  {
    UploadPipeline p(x1, plan, codec, &residual, 1);
    const auto d = decodeAll(drain(p), l.total);
    for (size_t i = 0; i < l.total; ++i) sent[i] += d[i];
  }
  residual.residual(0, l.total, r.data());
  // After one upload the residual is what top-k dropped: x1 - decoded, nonzero.
  size_t nonzero = 0;
  for (size_t i = 0; i < l.total; ++i) {
    ASSERT_EQ(r[i], x1[i] - sent[i]) << i;
    nonzero += r[i] != 0;
  }
  EXPECT_GT(nonzero, l.total / 2);
  {
    UploadPipeline p(x2, plan, codec, &residual, 2);
    const auto d = decodeAll(drain(p), l.total);
    for (size_t i = 0; i < l.total; ++i) sent[i] += d[i];
  }
  residual.residual(0, l.total, r.data());
  // Nothing is lost, only delayed: what was sent plus what is held is the sum of the deltas.
  for (size_t i = 0; i < l.total; ++i) {
    const float total = x1[i] + x2[i];
    const float scale = std::abs(x1[i]) + std::abs(x2[i]) + std::abs(r[i]) + std::abs(sent[i]);
    ASSERT_NEAR(sent[i] + r[i], total, 8 * std::numeric_limits<float>::epsilon() * scale) << i;
  }
  // The second upload sent some of the first one's residual: elements small in x2 but large in
  // x1 + x2 were picked.
  EXPECT_NE(sent, decodeAll(drain(*std::make_unique<UploadPipeline>(x2, plan, codec, nullptr, 2)),
                            l.total));
}

// A dense chunk goes as fp16 (each value rounded to nearest, so within 2^-11 relative), the
// others as top-k; with error feedback a dense chunk's residual is only fp16's rounding error
// (x - decoded, exactly), and a top-k chunk's keeps what was dropped.
TEST(UploadPipeline, DenseChunksGoAsFp16AndKeepOnlyTheRoundingInTheResidual) {
  const model::Layout l = layoutOf({300, 20000, 40});
  const auto codec = codecFor("topk:0.01,dense_below=1000");
  const auto plan = planUploadChunks(l, 1 << 20, false, codec->spec());
  ASSERT_EQ(plan.size(), 3u);
  ASSERT_TRUE(plan[0].dense && !plan[1].dense && plan[2].dense);
  const std::vector<float> x = randomDelta(l.total, 21);
  compress::ErrorFeedback residual(l.total);
  UploadPipeline p(x, plan, codec, &residual, 5);
  const auto chunks = drain(p);
  ASSERT_EQ(chunks.size(), 3u);
  const std::vector<compress::CodecKind> kinds = {
      compress::CodecKind::kFp16, compress::CodecKind::kTopk, compress::CodecKind::kFp16};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(compress::readPayloadHeader(chunks[i].payload).value().kind, kinds[i]) << i;
  }
  // 300 fp16 values: the header and 600 bytes; the top-k chunk keeps 200 of 20000.
  EXPECT_EQ(chunks[0].payload.size(), compress::kPayloadHeaderBytes + 600);
  EXPECT_EQ(compress::readPayloadHeader(chunks[1].payload).value().param, 200u);
  const auto d = decodeAll(chunks, l.total);
  std::vector<float> r(l.total);
  residual.residual(0, l.total, r.data());
  size_t kept = 0;
  for (size_t i = 0; i < l.total; ++i) {
    ASSERT_EQ(r[i], x[i] - d[i]) << i;
    const bool dense = i < 300 || i >= 20300;
    if (dense) {
      ASSERT_LE(std::abs(x[i] - d[i]), std::abs(x[i]) * 0x1p-11f) << i;
    } else {
      kept += d[i] != 0;
    }
  }
  EXPECT_EQ(kept, 200u);
  // encodeUploadChunk without a residual gives the same bytes for a dense chunk.
  std::string direct;
  ASSERT_TRUE(encodeUploadChunk(*codec, plan[0], x.data(), nullptr, 1, &direct).isOk());
  EXPECT_EQ(direct, chunks[0].payload);
}

TEST(UploadPipeline, NonFiniteDeltaFailsBeforeAnyChunk) {
  const model::Layout l = layoutOf({100, 100});
  std::vector<float> delta = randomDelta(l.total, 3);
  delta[150] = std::numeric_limits<float>::infinity();
  compress::ErrorFeedback residual(l.total);
  UploadPipeline p(delta, planChunks(l, 400), codecFor("topk:0.1"), &residual, 1);
  EXPECT_FALSE(p.pop(30).has_value());
  EXPECT_TRUE(p.failed());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("non-finite"));
  EXPECT_EQ(residual.memoryBytes(), 0u);  // untouched
}

// ---- threading --------------------------------------------------------------------------

// A "none" codec that counts and optionally sleeps in encode (a slow compressor).
class SlowCodec final : public compress::Codec {
 public:
  explicit SlowCodec(double sleep_s) : inner_(codecFor("none")), sleep_s_(sleep_s) {}
  const compress::CodecSpec& spec() const override { return inner_->spec(); }
  void encode(const float* x, size_t n, uint64_t seed, std::string* out) const override {
    ++calls;
    if (sleep_s_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s_));
    inner_->encode(x, n, seed, out);
  }
  Status decode(std::string_view p, size_t n, float* out) const override {
    return inner_->decode(p, n, out);
  }
  Status decodeAccumulate(std::string_view p, size_t n, float w, float* acc) const override {
    return inner_->decodeAccumulate(p, n, w, acc);
  }
  bool biased() const override { return false; }
  size_t maxEncodedBytes(size_t n) const override { return inner_->maxEncodedBytes(n); }

  mutable std::atomic<int> calls{0};

 private:
  std::shared_ptr<const compress::Codec> inner_;
  double sleep_s_;
};

bool waitUntil(const std::function<bool()>& cond, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(UploadPipeline, EncoderStaysAtMostQueueDepthAhead) {
  const model::Layout l = layoutOf({1000});
  auto codec = std::make_shared<SlowCodec>(0);
  UploadPipelineOptions o;
  o.queue_depth = 3;
  UploadPipeline p(randomDelta(l.total, 4), planChunks(l, 40), codec, nullptr, 1, o);
  ASSERT_EQ(p.chunkCount(), 100u);
  ASSERT_TRUE(waitUntil([&] { return codec->calls.load() == 3; }, 30));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(codec->calls.load(), 3);  // waiting for room
  ASSERT_TRUE(p.tryPop().has_value());
  ASSERT_TRUE(waitUntil([&] { return codec->calls.load() == 4; }, 30));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(codec->calls.load(), 4);
  const auto rest = drain(p);
  ASSERT_EQ(rest.size(), 99u);
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i].index, i + 1);
  EXPECT_FALSE(p.tryPop().has_value());
}

TEST(UploadPipeline, NonPipelinedReleasesNothingUntilEverythingIsEncoded) {
  const model::Layout l = layoutOf({1000});
  auto codec = std::make_shared<SlowCodec>(0.002);
  UploadPipelineOptions o;
  o.pipelined = false;
  UploadPipeline p(randomDelta(l.total, 5), planChunks(l, 400), codec, nullptr, 1, o);
  ASSERT_EQ(p.chunkCount(), 10u);
  auto first = p.pop(30);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(codec->calls.load(), 10);
  for (size_t i = 1; i < 10; ++i) {
    auto c = p.tryPop();  // all there already
    ASSERT_TRUE(c.has_value()) << i;
    EXPECT_EQ(c->index, i);
  }
  EXPECT_TRUE(p.drained());
}

TEST(UploadPipeline, CancelAndDestroyMidUploadDoNotHang) {
  const model::Layout l = layoutOf({10000});
  auto codec = std::make_shared<SlowCodec>(0.001);
  auto p = std::make_unique<UploadPipeline>(randomDelta(l.total, 6), planChunks(l, 40), codec,
                                            nullptr, 1);
  ASSERT_TRUE(p->pop(30).has_value());
  p->cancel();
  EXPECT_FALSE(p->tryPop().has_value());
  EXPECT_FALSE(p->drained());
  p.reset();  // joins
  EXPECT_LT(codec->calls.load(), 1000);
}

// Overlap with a fake link: the sender sleeps per chunk three times as long as the encoder
// takes. In order, intact, and chunks are encoded while others are being sent.
TEST(UploadPipeline, SendingOverlapsEncodingAndKeepsOrder) {
  const double per_chunk = 0.02;
  const model::Layout l = layoutOf({5000});
  const std::vector<float> delta = randomDelta(l.total, 7);
  auto codec = std::make_shared<SlowCodec>(per_chunk);
  UploadPipeline p(delta, planChunks(l, 2000), codec, nullptr, 1);
  ASSERT_EQ(p.chunkCount(), 10u);
  std::vector<EncodedChunk> got;
  // Overlap, checked by what happened rather than by how long it took (a loaded machine
  // stretches both): chunks the encoder finished while this thread was "sending" another.
  // Encoding only when asked would finish none then.
  int encoded_while_sending = 0;
  while (!p.drained()) {
    auto c = p.pop(30);
    ASSERT_TRUE(c.has_value());
    const int before = codec->calls.load();
    // "Sending" takes three encodes' time, so the encoder (whose next chunk starts when this
    // one is taken) finishes one meanwhile even when the machine is slow to wake it.
    std::this_thread::sleep_for(std::chrono::duration<double>(3 * per_chunk));
    encoded_while_sending += codec->calls.load() - before;
    got.push_back(std::move(*c));
  }
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].index, i);
  const auto decoded = decodeAll(got, l.total);
  EXPECT_EQ(decoded, delta);
  EXPECT_GE(encoded_while_sending, 2) << "encode and send did not overlap";
  EXPECT_GE(p.encodeSeconds(), per_chunk * got.size() * 0.99);
}

}  // namespace
}  // namespace fedfleet::client
