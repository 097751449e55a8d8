// Prague (Luo et al., ASPLOS 2020): Partial All-Reduce in groups the generator assigns
// (peer/group_generator.h), as peer/peer_engine.h describes it.
#include <algorithm>
#include <map>
#include <set>

#include "peer/peer_algorithm.h"
#include "peer/ring_allreduce.h"

namespace fedfleet::peer {
namespace {

class PragueImpl : public PeerAlgorithm {
 public:
  using PeerAlgorithm::PeerAlgorithm;

  void start() override { compute(0, o_.steps_per_iteration); }

  void computed(uint64_t t, std::vector<float> delta, uint64_t samples, double loss) override {
    checkComputed(t, delta, samples, loss);
    for (size_t i = 0; i < x_.size(); ++i) x_[i] += delta[i];
    waiting_ = true;
    PeerMessage m;
    m.kind = PeerMessageKind::kGroupRequest;
    m.from = self_;
    m.to = generatorId(o_.peers);
    m.iteration = t;
    send(std::move(m));
  }

  void message(PeerMessage m) override {
    if (m.kind == PeerMessageKind::kGroupAssign) {
      if (m.from != generatorId(o_.peers) || !waiting_ || ring_) {
        return fail(unexpected(m, "no group was asked for"));
      }
      if (!std::binary_search(m.members.begin(), m.members.end(), self_)) {
        return fail(unexpected(m, "a group without this peer"));
      }
      if (early_group_ && *early_group_ != m.group) {
        return fail(unexpected(m, "chunks came for another group"));
      }
      for (uint32_t p : m.members) {
        if (!live_[p]) {  // a member already known dead: its partners' chunks may still come
          finished_groups_.insert(m.group);
          return abandon();
        }
      }
      ring_group_ = m.group;
      ring_.emplace(m.members, self_, m.group, completed_, x_);
      for (auto& s : ring_->start()) send(std::move(s));
      auto early = std::exchange(early_, {});
      early_group_.reset();
      for (auto& c : early) {
        if (!feed(std::move(c))) return;
      }
      return settle();
    }
    if (m.kind != PeerMessageKind::kChunk || m.group == 0) {
      return fail(unexpected(m, "prague exchanges group chunks"));
    }
    if (finished_groups_.count(m.group)) return;  // an abandoned group's late chunks
    if (ring_ && m.group == ring_group_) {
      if (!feed(std::move(m))) return;
      return settle();
    }
    // Before this peer's assignment came: only for the one group it is about to join.
    if ((early_group_ && *early_group_ != m.group) || early_.size() >= 2 * size_t{o_.peers}) {
      return fail(unexpected(m, "chunks of more than one pending group"));
    }
    early_group_ = m.group;
    early_.push_back(std::move(m));
  }

  void peerDown(uint32_t peer) override {
    if (peer >= live_.size() || !live_[peer]) return;
    live_[peer] = false;
    if (ring_ && std::binary_search(ring_->members().begin(), ring_->members().end(), peer)) {
      abandon();
    }
  }

 private:
  bool feed(PeerMessage m) {
    std::vector<PeerMessage> sends;
    if (Status s = ring_->onChunk(std::move(m), &sends); !s.isOk()) {
      fail(s);
      return false;
    }
    for (auto& x : sends) send(std::move(x));
    return true;
  }

  void settle() {
    if (!ring_ || !ring_->done()) return;
    const float inv = 1.0f / static_cast<float>(ring_->members().size());
    x_ = std::move(ring_->values());
    for (float& v : x_) v *= inv;
    finish(ring_->received());
  }

  // A member died: keep this peer's own model for the iteration.
  void abandon() { finish(0); }

  void finish(uint32_t exchanges) {
    if (ring_) finished_groups_.insert(ring_group_);
    ring_.reset();
    if (early_group_ && finished_groups_.count(*early_group_)) {
      early_.clear();
      early_group_.reset();
    }
    waiting_ = false;
    iterationDone(IterationDone{completed_, exchanges, 0, false, loss_, samples_});
    if (!finished_) return compute(completed_, o_.steps_per_iteration);
    // Done: the generator must not keep others waiting for this peer.
    PeerMessage leave;
    leave.kind = PeerMessageKind::kLeave;
    leave.from = self_;
    leave.to = generatorId(o_.peers);
    leave.iteration = completed_;
    send(std::move(leave));
  }

  std::optional<RingAllReduce> ring_;
  uint64_t ring_group_ = 0;
  bool waiting_ = false;
  std::optional<uint64_t> early_group_;
  std::vector<PeerMessage> early_;
  std::set<uint64_t> finished_groups_;
};

}  // namespace

std::unique_ptr<PeerAlgorithm> makePrague(const PeerOptions& options, uint32_t self,
                                          std::vector<float> x) {
  return std::make_unique<PragueImpl>(options, self, std::move(x));
}

}  // namespace fedfleet::peer
