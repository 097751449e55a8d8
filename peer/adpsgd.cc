// AD-PSGD (Lian et al., ICML 2018): active peers average with one passive neighbour at a time,
// passives answer, as peer/peer_engine.h describes it.
#include <algorithm>
#include <map>
#include <set>

#include "common/splitmix.h"
#include "peer/peer_algorithm.h"
#include "peer/topology.h"

namespace fedfleet::peer {
namespace {

class AdpsgdImpl : public PeerAlgorithm {
 public:
  AdpsgdImpl(const PeerOptions& o, uint32_t self, std::vector<float> x)
      : PeerAlgorithm(o, self, std::move(x)),
        partners_(averagingPartners(makeGraph(o.topology, o.peers, o.degree, o.seed), self)),
        rng_(splitMix64(o.seed ^ (0xad95ull << 32) ^ self)) {}

  void start() override { begin(); }

  void computed(uint64_t t, std::vector<float> delta, uint64_t samples, double loss) override {
    checkComputed(t, delta, samples, loss);
    delta_ = std::move(delta);
    if (isActive(self_)) {
      requestAverage();
    } else {
      // A passive applies its delta to whatever its model became meanwhile.
      apply(averagings_ - averagings_at_compute_, 0);
    }
  }

  void message(PeerMessage m) override {
    if (Status s = checkValues(m); !s.isOk()) return fail(s);
    if (m.from >= o_.peers || isActive(m.from) == isActive(self_)) {
      return fail(unexpected(m, "not an averaging partner (actives pair with passives only)"));
    }
    if (m.kind == PeerMessageKind::kAverageRequest && !isActive(self_)) {
      for (size_t i = 0; i < x_.size(); ++i) x_[i] = 0.5f * (x_[i] + m.values[i]);
      ++averagings_;
      send(model(PeerMessageKind::kAverageReply, m.from, m.iteration));
      return;
    }
    if (m.kind == PeerMessageKind::kAverageReply && isActive(self_) && partner_ &&
        *partner_ == m.from && m.iteration == completed_) {
      x_ = std::move(m.values);
      partner_.reset();
      return apply(0, 1);
    }
    fail(unexpected(m, "not a step of this peer's averaging"));
  }

  void peerDown(uint32_t peer) override {
    if (peer >= live_.size() || !live_[peer]) return;
    live_[peer] = false;
    if (partner_ && *partner_ == peer) {
      partner_.reset();
      requestAverage();  // the same delta, another partner
    }
  }

 private:
  void begin() {
    averagings_at_compute_ = averagings_;
    compute(completed_, o_.steps_per_iteration);
  }

  void requestAverage() {
    std::vector<uint32_t> live;
    for (uint32_t j : partners_) {
      if (live_[j]) live.push_back(j);
    }
    if (live.empty()) return apply(0, 0);  // nobody left to average with: go on alone
    std::uniform_int_distribution<size_t> pick(0, live.size() - 1);
    partner_ = live[pick(rng_)];
    send(model(PeerMessageKind::kAverageRequest, *partner_, completed_));
  }

  void apply(uint64_t staleness, uint32_t exchanges) {
    for (size_t i = 0; i < x_.size(); ++i) x_[i] += delta_[i];
    iterationDone(IterationDone{completed_, exchanges, static_cast<uint32_t>(staleness), false,
                                loss_, samples_});
    if (!finished_) begin();
  }

  const std::vector<uint32_t> partners_;
  std::mt19937_64 rng_;
  std::optional<uint32_t> partner_;  // active: the passive asked, awaiting its reply
  uint64_t averagings_ = 0;          // passive: averagings answered
  uint64_t averagings_at_compute_ = 0;
  std::vector<float> delta_;
};

}  // namespace

std::unique_ptr<PeerAlgorithm> makeAdpsgd(const PeerOptions& options, uint32_t self,
                                          std::vector<float> x) {
  return std::make_unique<AdpsgdImpl>(options, self, std::move(x));
}

}  // namespace fedfleet::peer
