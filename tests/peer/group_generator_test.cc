#include "peer/group_generator.h"

#include <gtest/gtest.h>

#include <map>

#include "peer/peer_engine.h"

namespace fedfleet::peer {
namespace {

using Groups = std::vector<std::vector<uint32_t>>;

wire::PeerMessage request(uint32_t peer, uint32_t peers, uint64_t iteration = 0) {
  wire::PeerMessage m;
  m.kind = wire::PeerMessageKind::kGroupRequest;
  m.from = peer;
  m.to = generatorId(peers);
  m.iteration = iteration;
  return m;
}

TEST(GroupGeneratorTest, GroupDivisionFormsTheReadyPartOfACandidate) {
  // Four peers, groups of up to four: the first batch is one candidate {0, 1, 2, 3} (nobody is
  // late yet, so everyone is drawn into a candidate).
  GroupGenerator gen(4, 4, 1, 9);
  auto r0 = gen.onMessage(request(0, 4), 0);
  ASSERT_TRUE(r0.isOk()) << r0.status().message();
  EXPECT_TRUE(r0.value().empty());                       // alone so far: waits for the others
  EXPECT_FALSE(gen.onMessage(request(0, 4), 0).isOk());  // asked again while waiting
  // Peer 1 arrives: 0 and 1 form a group now; 2 and 3 (still computing) stay behind.
  auto r1 = gen.onMessage(request(1, 4), 0);
  ASSERT_TRUE(r1.isOk());
  ASSERT_EQ(r1.value().size(), 2u);
  for (const auto& m : r1.value()) {
    EXPECT_EQ(m.kind, wire::PeerMessageKind::kGroupAssign);
    EXPECT_EQ(m.from, 4u);
    EXPECT_EQ(m.members, (std::vector<uint32_t>{0, 1}));
    EXPECT_EQ(m.group, 1u);
  }
  EXPECT_EQ(r1.value()[0].to, 0u);
  EXPECT_EQ(r1.value()[1].to, 1u);
  // Peer 2 waits for 3; 3 dies: 2 goes on alone.
  auto r2 = gen.onMessage(request(2, 4), 0);
  ASSERT_TRUE(r2.isOk());
  EXPECT_TRUE(r2.value().empty());
  auto down = gen.onPeerDown(3, 0);
  ASSERT_EQ(down.size(), 1u);
  EXPECT_EQ(down[0].to, 2u);
  EXPECT_EQ(down[0].members, (std::vector<uint32_t>{2}));
  EXPECT_FALSE(gen.onMessage(request(3, 4), 0).isOk());  // dead
  wire::PeerMessage not_request = request(1, 4);
  not_request.kind = wire::PeerMessageKind::kModel;
  EXPECT_FALSE(gen.onMessage(not_request, 0).isOk());
}

TEST(GroupGeneratorTest, APeerWhoseCandidateMovedOnSkipsToTheNextBatch) {
  GroupGenerator gen(3, 3, 1, 5);
  ASSERT_TRUE(gen.onMessage(request(0, 3), 0).isOk());
  auto r = gen.onMessage(request(1, 3), 0);  // {0, 1} formed; 2 still pending in batch 0
  ASSERT_TRUE(r.isOk());
  ASSERT_EQ(r.value().size(), 2u);
  // 0 and 1 ask again: batch 1. 0 waits, 1 forms {0, 1} again.
  ASSERT_TRUE(gen.onMessage(request(0, 3), 0).isOk());
  ASSERT_EQ(gen.onMessage(request(1, 3), 0).value().size(), 2u);
  // 2 arrives late: nobody is left in its batch-0 candidate nor its batch-1 one, so it skips
  // to batch 2 and waits there, where 0 joins it.
  auto late = gen.onMessage(request(2, 3), 0);
  ASSERT_TRUE(late.isOk());
  EXPECT_TRUE(late.value().empty());
  auto r0 = gen.onMessage(request(0, 3), 0);
  ASSERT_TRUE(r0.isOk());
  ASSERT_EQ(r0.value().size(), 2u);
  EXPECT_EQ(r0.value()[0].members, (std::vector<uint32_t>{0, 2}));
}

// Peers 0..5 compute for one tick, peers 6 and 7 for five (5x slower); a peer asks when its
// compute is done and computes again once its group formed. Returns how many groups of two or
// more each peer was in, and in *requests how many times each asked.
std::vector<int> membershipOverRun(uint64_t seed, std::vector<Groups>* assignments = nullptr,
                                   std::vector<int>* requests = nullptr) {
  const uint32_t kPeers = 8;
  GroupGenerator gen(kPeers, 3, 4, seed);
  std::vector<int> ready_at(kPeers, 0);  // -1: waiting for its group
  std::vector<int> memberships(kPeers, 0);
  if (requests) requests->assign(kPeers, 0);
  for (int tick = 0; tick < 400; ++tick) {
    for (uint32_t p = 0; p < kPeers; ++p) {
      if (ready_at[p] != tick) continue;
      auto r = gen.onMessage(request(p, kPeers, tick), tick);
      EXPECT_TRUE(r.isOk());
      if (requests) ++(*requests)[p];
      ready_at[p] = -1;
      Groups round;
      for (const auto& m : r.value()) {
        ready_at[m.to] = tick + (m.to < 6 ? 1 : 5);
        if (m.members.size() >= 2) ++memberships[m.to];
        if (m.to == m.members.front()) round.push_back(m.members);
      }
      if (assignments) assignments->push_back(round);
    }
  }
  return memberships;
}

TEST(GroupGeneratorTest, SlowerPeersAreInFewerGroupsAndTheDrawIsSeeded) {
  std::vector<Groups> a, b, c;
  std::vector<int> requests;
  auto m = membershipOverRun(3, &a, &requests);
  membershipOverRun(3, &b);
  membershipOverRun(4, &c);
  EXPECT_EQ(a, b);

  EXPECT_NE(a, c);
  double fast = 0, slow = 0, fast_requests = 0, slow_requests = 0;
  for (uint32_t p = 0; p < 8; ++p) {
    (p < 6 ? fast : slow) += m[p];
    (p < 6 ? fast_requests : slow_requests) += requests[p];
  }
  // The fast peers seldom wait for the slow ones: they ask most ticks (the slow every fifth),
  // and are in groups at most of their requests; the slow ones far less often.
  EXPECT_GT(fast_requests / 6, 0.7 * 400);
  EXPECT_GT(fast / fast_requests, 0.6);
  EXPECT_LT(slow / slow_requests, 0.5 * fast / fast_requests);
}

}  // namespace
}  // namespace fedfleet::peer
