// Hop (Luo et al., ASPLOS 2019): neighbours' queues, an iteration-gap bound, backup workers and
// skipping, as peer/peer_engine.h describes it.
#include <algorithm>
#include <map>
#include <set>

#include "peer/hop_queues.h"
#include "peer/peer_algorithm.h"
#include "peer/topology.h"

namespace fedfleet::peer {
namespace {

class HopImpl : public PeerAlgorithm {
 public:
  HopImpl(const PeerOptions& o, uint32_t self, std::vector<float> x)
      : PeerAlgorithm(o, self, std::move(x)),
        graph_(makeGraph(o.topology, o.peers, o.degree, o.seed)),
        queues_(graph_.neighbours[self], o.hop_backup, o.hop_bound) {}

  void start() override { tryStart(); }

  void computed(uint64_t t, std::vector<float> delta, uint64_t samples, double loss) override {
    checkComputed(t, delta, samples, loss);
    for (size_t i = 0; i < x_.size(); ++i) x_[i] += delta[i];
    for (uint32_t j : graph_.neighbours[self_]) {
      if (live_[j]) send(model(PeerMessageKind::kModel, j, t));
    }
    mixing_ = true;
    tryMix();
  }

  void message(PeerMessage m) override {
    if (m.kind != PeerMessageKind::kModel) return fail(unexpected(m, "hop exchanges models"));
    if (Status s = checkValues(m); !s.isOk()) return fail(s);
    if (!queues_.onUpdate(m.from, m.iteration)) return fail(unexpected(m, "not a neighbour"));
    if (queues_.newest(m.from) == static_cast<int64_t>(m.iteration)) {
      newest_[m.from] = std::move(m.values);
    }
    advance();
  }

  void peerDown(uint32_t peer) override {
    if (peer >= live_.size() || !live_[peer]) return;
    if (o_.hop_backup == 0) {
      return failOnDeadPeer(peer, "hop_backup = 0 waits for every neighbour");
    }
    live_[peer] = false;
    queues_.onDown(peer);
    newest_.erase(peer);
    advance();
  }

 private:
  void advance() {
    if (mixing_) {
      tryMix();
    } else if (waiting_start_) {
      tryStart();
    }
  }

  // Iteration completed_: skip ahead if far behind, wait for the bound, or compute.
  void tryStart() {
    waiting_start_ = false;
    if (finished_ || failed_) return;
    if (auto s = queues_.skipTarget(completed_); s && *s > completed_) {
      // Catch up: average with the neighbours' newest models and skip the iterations between.
      const uint64_t from = completed_;
      average(neighboursAtLeast(from));
      const uint64_t target = o_.iterations ? std::min<uint64_t>(*s, o_.iterations) : *s;
      while (completed_ < target && !finished_) {
        iterationDone(
            IterationDone{completed_, 0, static_cast<uint32_t>(target - from), true, 0, 0});
      }
      queues_.prune(completed_);
      if (finished_) return;
    }
    if (!queues_.mayStart(completed_)) {
      waiting_start_ = true;
      return;
    }
    compute(completed_, o_.steps_per_iteration);
  }

  void tryMix() {
    auto chosen = queues_.chosenFor(completed_);
    if (!chosen) return;
    mixing_ = false;
    average(*chosen);
    iterationDone(IterationDone{completed_, static_cast<uint32_t>(chosen->size()), 0, false, loss_,
                                samples_});
    queues_.prune(completed_);
    tryStart();
  }

  std::vector<uint32_t> neighboursAtLeast(uint64_t t) const {
    std::vector<uint32_t> out;
    for (uint32_t j : graph_.neighbours[self_]) {
      if (live_[j] && queues_.newest(j) >= static_cast<int64_t>(t)) out.push_back(j);
    }
    return out;
  }

  void average(const std::vector<uint32_t>& with) {
    if (with.empty()) return;
    const float inv = 1.0f / static_cast<float>(with.size() + 1);
    for (uint32_t j : with) {
      const std::vector<float>& xj = newest_.at(j);
      for (size_t i = 0; i < x_.size(); ++i) x_[i] += xj[i];
    }
    for (float& v : x_) v *= inv;
  }

  const Graph graph_;
  HopQueues queues_;
  std::map<uint32_t, std::vector<float>> newest_;  // each neighbour's newest model
  bool mixing_ = false;                            // computed, awaiting n - b updates
  bool waiting_start_ = false;                     // held back by the bound
};

}  // namespace

std::unique_ptr<PeerAlgorithm> makeHop(const PeerOptions& options, uint32_t self,
                                       std::vector<float> x) {
  return std::make_unique<HopImpl>(options, self, std::move(x));
}

}  // namespace fedfleet::peer
