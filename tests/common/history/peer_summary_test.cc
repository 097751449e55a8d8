#include "common/history/peer_summary.h"

#include <gtest/gtest.h>

#include <limits>

namespace fedfleet::history {
namespace {

PeerIterationRecord row(uint32_t peer, uint64_t iteration, double t_start, double t_end,
                        uint32_t staleness) {
  PeerIterationRecord r;
  r.peer = peer;
  r.iteration = iteration;
  r.t_start = t_start;
  r.t_end = t_end;
  r.compute_s = 0.5;
  r.comm_s = 0.25;
  r.wait_s = 0.125 * peer;
  r.bytes_sent = 100;
  r.bytes_received = 40;
  r.exchanges = 2;
  r.staleness = staleness;
  return r;
}

// Rows in any order: one summary per peer, by peer, with the sums, staleness mean and maximum,
// and the first start and last end of its iterations.
TEST(PeerSummary, SumsEachPeersIterations) {
  PeerIterationRecord skipped = row(3, 1, 1.0, 1.25, 0);
  skipped.skipped = true;
  const std::vector<PeerSummary> peers =
      summarizePeers({row(3, 2, 2.0, 3.5, 2), row(0, 0, 0.0, 1.0, 0), skipped,
                      row(3, 0, 0.5, 1.0, 1), row(0, 1, 1.0, 2.5, 1)});
  ASSERT_EQ(peers.size(), 2u);
  EXPECT_EQ(peers[0].peer, 0u);
  EXPECT_EQ(peers[0].iterations, 2u);
  EXPECT_EQ(peers[0].skipped, 0u);
  EXPECT_EQ(peers[0].exchanges, 4u);
  EXPECT_EQ(peers[0].bytes_sent, 200u);
  EXPECT_EQ(peers[0].bytes_received, 80u);
  EXPECT_DOUBLE_EQ(peers[0].compute_s, 1.0);
  EXPECT_DOUBLE_EQ(peers[0].wait_s, 0.0);
  EXPECT_DOUBLE_EQ(peers[0].mean_staleness, 0.5);
  EXPECT_EQ(peers[0].max_staleness, 1u);
  EXPECT_DOUBLE_EQ(peers[0].first_start, 0.0);
  EXPECT_DOUBLE_EQ(peers[0].last_end, 2.5);
  EXPECT_EQ(peers[1].peer, 3u);
  EXPECT_EQ(peers[1].iterations, 3u);
  EXPECT_EQ(peers[1].skipped, 1u);
  EXPECT_DOUBLE_EQ(peers[1].comm_s, 0.75);
  EXPECT_DOUBLE_EQ(peers[1].wait_s, 3 * 0.375);
  EXPECT_DOUBLE_EQ(peers[1].mean_staleness, 1.0);
  EXPECT_EQ(peers[1].max_staleness, 2u);
  EXPECT_DOUBLE_EQ(peers[1].first_start, 0.5);
  EXPECT_DOUBLE_EQ(peers[1].last_end, 3.5);
}

TEST(PeerSummary, ByteSumsSaturateAndNoRowsGiveNoPeers) {
  PeerIterationRecord big = row(1, 0, 0, 1, 0);
  big.bytes_sent = std::numeric_limits<uint64_t>::max() - 10;
  const auto peers = summarizePeers({big, row(1, 1, 1, 2, 0)});
  ASSERT_EQ(peers.size(), 1u);
  EXPECT_EQ(peers[0].bytes_sent, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(peers[0].bytes_received, 80u);
  EXPECT_TRUE(summarizePeers({}).empty());
}

}  // namespace
}  // namespace fedfleet::history
