// Prague's group generator (Luo et al., ASPLOS 2020), the coordinator side of the prague
// algorithm (peer/peer_engine.h), as a sans-I/O object driven like a PeerEngine.
//
// A peer that finished an iteration sends a GroupRequest; the generator answers, once the
// peer's group is formed, with a GroupAssign to every member, who then average their models
// with one ring all-reduce over the group (Partial All-Reduce).
//
//  Group Buffer. Candidate groups are generated ahead, `buffer` batches at a time; a batch
//    divides the live peers into disjoint candidates of up to group_size (a seeded shuffle cut
//    in pieces). A peer takes its candidate in each batch in turn (its cursor), so one request
//    is all it costs and the generator draws only when a peer reaches the end of the buffer.
//  Group Division. A candidate is not waited for whole: when a peer arrives and at least one
//    other member of its candidate is already waiting, the waiting members and it form a group
//    at once, and the candidate's members still computing stay behind for a later group. A
//    peer waits only while it is the sole arrival of its candidate, and only when one of the
//    members still computing is expected here next (its cursor at this batch, and its last
//    assignment plus its busy time, below, within the peer's own busy time; a member not yet
//    measured counts as fast as this peer); otherwise it leaves the candidate to them and tries its
//    next batch (at most one new draw a request; then it goes on alone this time). A peer
//    whose candidate's other members all formed their groups already (or died) skips to its
//    next batch too, so a slow peer catches up with the batches the fast ones are in.
//    No deadlock: the waiting peer of the lowest batch waits only for peers whose cursor is at
//    that batch or below, which are computing and will arrive.
//  Slower peers in fewer groups. The generator reads no clock: the driver passes the time
//    with each event. A peer's busy time is from its last assignment to its next request (its
//    compute and its group's average, without its waits at the generator), kept as a moving
//    average b = 0.7 b + 0.3 busy. In each batch a peer is put in a candidate with probability
//    max(0.1, b_min / b)^2 (b_min: the fastest live peer's; 1 before it has one) and is
//    otherwise a candidate of its own (it goes on alone that time): a peer 5x slower than the
//    fastest is in a candidate in about 4% of the batches, so fast peers seldom wait for it.
//  A dead peer leaves every candidate; a peer waiting only for dead ones goes on alone.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "common/status.h"
#include "common/wire/peer_message.h"

namespace fedfleet::peer {

class GroupGenerator {
 public:
  GroupGenerator(uint32_t peers, uint32_t group_size, uint32_t buffer, uint64_t seed);

  // A GroupRequest (message.to == generatorId(P)) at time now_s (seconds, any origin,
  // non-decreasing); returns the GroupAssigns it forms. A Leave (the peer finished) takes the
  // peer out of every candidate, as onPeerDown does. INVALID_ARGUMENT for another kind, a
  // sender that is not a live peer, or a peer that asks again before its group formed.
  Result<std::vector<wire::PeerMessage>> onMessage(const wire::PeerMessage& message, double now_s);
  std::vector<wire::PeerMessage> onPeerDown(uint32_t peer, double now_s);
  // The same for a driver without a clock: the number of requests so far stands in for time,
  // so a peer's busy time counts the other peers' requests in between (a slow peer sees many).
  Result<std::vector<wire::PeerMessage>> onMessage(const wire::PeerMessage& message) {
    return onMessage(message, static_cast<double>(++logical_clock_));
  }
  std::vector<wire::PeerMessage> onPeerDown(uint32_t peer) {
    return onPeerDown(peer, static_cast<double>(logical_clock_));
  }

  // Groups formed so far (of one member included).
  uint64_t groupsFormed() const { return next_group_id_ - 1; }
  // A peer's busy-time average (0: none yet).
  double busySeconds(uint32_t peer) const { return busy_[peer]; }

 private:
  enum class State : uint8_t { kPending, kWaiting, kDone };
  struct Candidate {
    std::vector<uint32_t> members;  // sorted
    std::vector<State> state;
  };
  struct Batch {
    std::vector<Candidate> candidates;
    std::vector<int32_t> of_peer;  // candidate index of each peer (-1: not in this batch)
  };
  void generate();
  std::vector<wire::PeerMessage> form(Candidate& c, double now_s);
  // The members' GroupAssigns; advance: their cursors move past the current batch.
  std::vector<wire::PeerMessage> assign(const std::vector<uint32_t>& members, double now_s,
                                        bool advance = true);
  void dropFinishedBatches();

  // Constant after construction.
  const uint32_t peers_, group_size_, buffer_;

  std::mt19937_64 rng_;
  std::deque<Batch> batches_;  // batch first_batch_ + i
  uint64_t first_batch_ = 0;
  uint64_t next_group_id_ = 1;    // 0 is the all-peers ring's id
  uint64_t logical_clock_ = 0;    // the clockless overloads' time
  std::vector<uint64_t> cursor_;  // per peer: its current batch
  std::vector<bool> waiting_;     // per peer: asked, group not formed yet
  std::vector<bool> live_;
  std::vector<double> busy_;         // per peer, see above (0: none yet)
  std::vector<double> assigned_at_;  // per peer: when its last group formed (-1: never)
};

}  // namespace fedfleet::peer
