#include "peer/ring_allreduce.h"

#include <gtest/gtest.h>

#include <deque>
#include <numeric>

#include "common/compress/codec.h"

namespace fedfleet::peer {
namespace {

TEST(RingAllReduceTest, ScheduleByHand) {
  // 3 members, member 0: reduce-scatter sends chunk 0 then 2, receives 2 then 1 (so it owns
  // chunk 1 = (0 + 1) mod 3); all-gather sends 1 then 0, receives 0 then 2.
  EXPECT_EQ(ringStep(3, 0, 0).send_chunk, 0u);
  EXPECT_EQ(ringStep(3, 0, 0).recv_chunk, 2u);
  EXPECT_EQ(ringStep(3, 0, 1).send_chunk, 2u);
  EXPECT_EQ(ringStep(3, 0, 1).recv_chunk, 1u);
  EXPECT_TRUE(ringStep(3, 0, 1).reduce);
  EXPECT_EQ(ringStep(3, 0, 2).send_chunk, 1u);
  EXPECT_EQ(ringStep(3, 0, 2).recv_chunk, 0u);
  EXPECT_FALSE(ringStep(3, 0, 2).reduce);
  EXPECT_EQ(ringStep(3, 0, 3).send_chunk, 0u);
  EXPECT_EQ(ringStep(3, 0, 3).recv_chunk, 2u);
  // What r sends at step s, r + 1 receives at step s.
  for (uint32_t m : {2u, 3u, 5u}) {
    for (uint32_t r = 0; r < m; ++r) {
      for (uint32_t s = 0; s < 2 * (m - 1); ++s) {
        EXPECT_EQ(ringStep(m, r, s).send_chunk, ringStep(m, (r + 1) % m, s).recv_chunk);
      }
    }
  }
  // 2 (P - 1) / P of the model: 12 values, 4 members: 18 each.
  EXPECT_EQ(ringValuesSent(12, 4, 0), 18u);
  EXPECT_EQ(ringValuesSent(12, 4, 3), 18u);
}

// Runs one all-reduce among members with the given data, delivering chunks in a shuffled but
// per-link FIFO order. Returns each member's result.
std::vector<std::vector<float>> runRing(std::vector<std::vector<float>> data,
                                        const RingCompression* compression = nullptr,
                                        uint64_t iteration = 0) {
  const uint32_t m = static_cast<uint32_t>(data.size());
  std::vector<uint32_t> members(m);
  std::iota(members.begin(), members.end(), 0u);
  std::vector<RingAllReduce> rings;
  for (uint32_t r = 0; r < m; ++r) {
    rings.emplace_back(members, r, 0, iteration, data[r],
                       compression ? compression[r] : RingCompression{});
  }
  std::deque<wire::PeerMessage> queue;
  for (auto& r : rings) {
    for (auto& s : r.start()) queue.push_back(std::move(s));
  }
  // Deliver the newest first (LIFO) to exercise out-of-step arrival.
  while (!queue.empty()) {
    wire::PeerMessage msg = std::move(queue.back());
    queue.pop_back();
    std::vector<wire::PeerMessage> sends;
    Status s = rings[msg.to].onChunk(std::move(msg), &sends);
    EXPECT_TRUE(s.isOk()) << s.message();
    for (auto& x : sends) queue.push_back(std::move(x));
  }
  std::vector<std::vector<float>> out;
  for (auto& r : rings) {
    EXPECT_TRUE(r.done());
    EXPECT_EQ(r.received(), 2 * (m - 1));
    out.push_back(r.values());
  }
  return out;
}

TEST(RingAllReduceTest, SumIsExact) {
  for (uint32_t m : {2u, 3u, 4u, 7u}) {
    for (size_t n : {size_t{1}, size_t{5}, size_t{13}}) {
      std::vector<std::vector<float>> data(m, std::vector<float>(n));
      std::vector<float> want(n, 0);
      for (uint32_t r = 0; r < m; ++r) {
        for (size_t i = 0; i < n; ++i) {
          data[r][i] = static_cast<float>(r * 10 + i);  // small integers: exact in float
          want[i] += data[r][i];
        }
      }
      for (const auto& got : runRing(data)) EXPECT_EQ(got, want) << m << " " << n;
    }
  }
}

TEST(RingAllReduceTest, RefusesChunksOutOfPlace) {
  RingAllReduce ring({0, 1, 2}, 1, 0, 0, std::vector<float>(6, 1.0f));
  (void)ring.start();
  wire::PeerMessage m;
  m.kind = wire::PeerMessageKind::kChunk;
  m.from = 2;  // not the predecessor (0)
  m.to = 1;
  m.values = {1, 1};
  std::vector<wire::PeerMessage> sends;
  EXPECT_FALSE(ring.onChunk(m, &sends).isOk());
  m.from = 0;
  m.chunk = 2;  // step 0 of member 1 receives chunk 0
  EXPECT_FALSE(ring.onChunk(m, &sends).isOk());
  m.chunk = 0;
  m.values = {1, 1, 1};  // chunk 0 of 6 values in 3 chunks is 2 values
  EXPECT_FALSE(ring.onChunk(m, &sends).isOk());
  m.values = {1, 1};
  EXPECT_TRUE(ring.onChunk(m, &sends).isOk());
  EXPECT_FALSE(ring.onChunk(m, &sends).isOk());  // the same step twice
}

TEST(RingAllReduceTest, CompressedWithErrorFeedbackAgreesAndCatchesUp) {
  // topk keeps 1/4 of each chunk: one all-reduce is far from the sum, but with error feedback
  // what was dropped goes out later, so the running total of T all-reduces of constant data
  // stays within a residual of T times the exact sum, and every member holds the same values.
  auto spec = compress::parseCodecSpec("topk:0.25");
  ASSERT_TRUE(spec.isOk());
  auto codec = compress::makeCodec(spec.value());
  ASSERT_TRUE(codec.isOk());
  const uint32_t m = 3;
  const size_t n = 24;
  std::vector<std::vector<float>> data(m, std::vector<float>(n));
  std::vector<double> exact(n, 0);
  for (uint32_t r = 0; r < m; ++r) {
    for (size_t i = 0; i < n; ++i) {
      data[r][i] = 0.1f * static_cast<float>((i * 7 + r * 3) % 11) - 0.4f;
      exact[i] += data[r][i];
    }
  }
  std::vector<compress::ErrorFeedback> rs, ag;
  for (uint32_t r = 0; r < m; ++r) {
    rs.emplace_back(n);
    ag.emplace_back(n);
  }
  std::vector<RingCompression> c(m);
  for (uint32_t r = 0; r < m; ++r) c[r] = {codec.value().get(), &rs[r], &ag[r], 5};
  const int kT = 60;
  std::vector<double> total(n, 0);
  double first_error = 0;
  for (int t = 0; t < kT; ++t) {
    auto out = runRing(data, c.data(), t);
    for (uint32_t r = 1; r < m; ++r) EXPECT_EQ(out[r], out[0]);
    for (size_t i = 0; i < n; ++i) total[i] += out[0][i];
    if (t == 0) {
      for (size_t i = 0; i < n; ++i)
        first_error = std::max(first_error, std::abs(out[0][i] - exact[i]));
    }
  }
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(total[i] / kT - exact[i]));
  EXPECT_GT(first_error, 0.2);         // one compressed all-reduce is off
  EXPECT_LT(worst, first_error / 10);  // the average over T is close: nothing lost for good
}

}  // namespace
}  // namespace fedfleet::peer
