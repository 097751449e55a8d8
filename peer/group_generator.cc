#include "peer/group_generator.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "peer/peer_engine.h"

namespace fedfleet::peer {

GroupGenerator::GroupGenerator(uint32_t peers, uint32_t group_size, uint32_t buffer, uint64_t seed)
    : peers_(peers),
      group_size_(group_size),
      buffer_(buffer),
      rng_(seed),
      cursor_(peers, 0),
      waiting_(peers, false),
      live_(peers, true),
      busy_(peers, 0.0),
      assigned_at_(peers, -1.0) {}

void GroupGenerator::generate() {
  double fastest = 0;
  for (uint32_t p = 0; p < peers_; ++p) {
    if (live_[p] && busy_[p] > 0 && (fastest == 0 || busy_[p] < fastest)) fastest = busy_[p];
  }
  for (uint32_t k = 0; k < buffer_; ++k) {
    Batch batch;
    batch.of_peer.assign(peers_, -1);
    std::vector<uint32_t> grouped;
    auto add = [&batch](std::vector<uint32_t> members) {
      std::sort(members.begin(), members.end());
      const int32_t index = static_cast<int32_t>(batch.candidates.size());
      for (uint32_t p : members) batch.of_peer[p] = index;
      Candidate c;
      c.state.assign(members.size(), State::kPending);
      c.members = std::move(members);
      batch.candidates.push_back(std::move(c));
    };
    for (uint32_t p = 0; p < peers_; ++p) {
      if (!live_[p]) continue;
      const double r = busy_[p] > 0 ? std::max(0.1, fastest / busy_[p]) : 1.0;
      // Uniform in [0, 1) from the generator's own bits: the same on every standard library.
      const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
      if (u < r * r) {
        grouped.push_back(p);
      } else {
        add({p});
      }
    }
    for (size_t i = grouped.size(); i > 1; --i) {  // Fisher-Yates on the same bits
      std::swap(grouped[i - 1], grouped[rng_() % i]);
    }
    for (size_t i = 0; i < grouped.size(); i += group_size_) {
      const size_t end = std::min(grouped.size(), i + group_size_);
      add(std::vector<uint32_t>(grouped.begin() + i, grouped.begin() + end));
    }
    batches_.push_back(std::move(batch));
  }
}

std::vector<wire::PeerMessage> GroupGenerator::assign(const std::vector<uint32_t>& members,
                                                      double now_s, bool advance) {
  const uint64_t id = next_group_id_++;
  std::vector<wire::PeerMessage> out;
  for (uint32_t p : members) {
    wire::PeerMessage m;
    m.kind = wire::PeerMessageKind::kGroupAssign;
    m.from = generatorId(peers_);
    m.to = p;
    m.group = id;
    m.members = members;
    out.push_back(std::move(m));
    waiting_[p] = false;
    if (advance) ++cursor_[p];
    assigned_at_[p] = now_s;
  }
  return out;
}

// The waiting members of `c` become a group (Group Division: the pending ones stay).
std::vector<wire::PeerMessage> GroupGenerator::form(Candidate& c, double now_s) {
  std::vector<uint32_t> members;
  for (size_t i = 0; i < c.members.size(); ++i) {
    if (c.state[i] == State::kWaiting) {
      members.push_back(c.members[i]);
      c.state[i] = State::kDone;
    }
  }
  return assign(members, now_s);
}

void GroupGenerator::dropFinishedBatches() {
  while (!batches_.empty()) {
    uint64_t lowest = UINT64_MAX;
    for (uint32_t p = 0; p < peers_; ++p) {
      if (live_[p]) lowest = std::min(lowest, cursor_[p]);
    }
    if (first_batch_ >= lowest) break;
    batches_.pop_front();
    ++first_batch_;
  }
}

Result<std::vector<wire::PeerMessage>> GroupGenerator::onMessage(const wire::PeerMessage& m,
                                                                 double now_s) {
  if (m.kind == wire::PeerMessageKind::kLeave && m.from < peers_ && live_[m.from] &&
      !waiting_[m.from]) {
    return onPeerDown(m.from, now_s);
  }
  if (m.kind != wire::PeerMessageKind::kGroupRequest) {
    return invalidArgument(std::string("group generator: a ") + wire::peerMessageKindName(m.kind) +
                           " is not a group request");
  }
  const uint32_t p = m.from;
  if (p >= peers_ || !live_[p]) {
    return invalidArgument("group generator: request from " + std::to_string(p) +
                           ", not a live peer");
  }
  if (waiting_[p]) {
    return invalidArgument("group generator: peer " + std::to_string(p) +
                           " asked again before its group formed");
  }
  if (assigned_at_[p] >= 0) {
    const double busy = std::max(0.0, now_s - assigned_at_[p]);
    busy_[p] = busy_[p] > 0 ? 0.7 * busy_[p] + 0.3 * busy : busy;
  }
  bool generated = false;
  for (;;) {
    cursor_[p] = std::max(cursor_[p], first_batch_);
    if (cursor_[p] >= first_batch_ + batches_.size()) {
      if (generated) {
        // Nothing to join this time: alone, its cursor left at the end of the buffer, where
        // the next draw will put it in a candidate.
        return assign({p}, now_s, /*advance=*/false);
      }
      generate();
      generated = true;
    }
    Batch& batch = batches_[cursor_[p] - first_batch_];
    const int32_t index = batch.of_peer[p];
    if (index < 0) {  // not in this batch (cannot happen: every live peer is in every batch)
      ++cursor_[p];
      continue;
    }
    Candidate& c = batch.candidates[index];
    size_t waiting = 0, pending = 0, self = 0;
    for (size_t i = 0; i < c.members.size(); ++i) {
      const uint32_t q = c.members[i];
      if (q == p) {
        self = i;
      } else if (live_[q] && c.state[i] == State::kWaiting) {
        ++waiting;
      } else if (live_[q] && c.state[i] == State::kPending) {
        ++pending;
      }
    }
    if (waiting == 0 && pending == 0 && c.members.size() > 1) {
      // Everyone else of this candidate moved on: skip to the next batch.
      c.state[self] = State::kDone;
      ++cursor_[p];
      continue;
    }
    if (waiting == 0 && pending > 0 && busy_[p] > 0) {
      // Alone so far: wait only if a pending member is expected within this peer's own busy
      // time (its last assignment plus its busy time; unknown: now). Otherwise leave the
      // candidate to them and look at the next batch.
      double expected = INFINITY;
      for (size_t i = 0; i < c.members.size(); ++i) {
        const uint32_t q = c.members[i];
        if (q == p || !live_[q] || c.state[i] != State::kPending) continue;
        // A member whose cursor is behind this batch has groups to go through first.
        if (cursor_[q] < cursor_[p]) continue;
        const double busy = busy_[q] > 0 ? busy_[q] : busy_[p];
        expected = std::min(expected, assigned_at_[q] >= 0 ? assigned_at_[q] + busy : now_s);
      }
      if (expected > now_s + busy_[p]) {
        c.state[self] = State::kDone;
        ++cursor_[p];
        continue;
      }
    }
    c.state[self] = State::kWaiting;
    waiting_[p] = true;
    std::vector<wire::PeerMessage> out;
    if (waiting > 0 || pending == 0) out = form(c, now_s);
    dropFinishedBatches();
    return out;
  }
}

std::vector<wire::PeerMessage> GroupGenerator::onPeerDown(uint32_t peer, double now_s) {
  if (peer >= peers_ || !live_[peer]) return {};
  live_[peer] = false;
  waiting_[peer] = false;
  std::vector<wire::PeerMessage> out;
  for (Batch& batch : batches_) {
    const int32_t index = batch.of_peer[peer];
    if (index < 0) continue;
    Candidate& c = batch.candidates[index];
    for (size_t i = 0; i < c.members.size(); ++i) {
      if (c.members[i] == peer) c.state[i] = State::kDone;
    }
    // A lone waiter whose only pending partners are gone goes on alone.
    size_t waiting = 0, pending = 0;
    for (size_t i = 0; i < c.members.size(); ++i) {
      if (!live_[c.members[i]]) continue;
      waiting += c.state[i] == State::kWaiting;
      pending += c.state[i] == State::kPending;
    }
    if (waiting > 0 && pending == 0) {
      auto sends = form(c, now_s);
      out.insert(out.end(), sends.begin(), sends.end());
    }
  }
  dropFinishedBatches();
  return out;
}

}  // namespace fedfleet::peer
