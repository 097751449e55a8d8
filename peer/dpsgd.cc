// D-PSGD (Lian et al., NeurIPS 2017): each iteration a peer sends its model to its neighbours and
// mixes theirs with Metropolis weights, as peer/peer_engine.h describes it.
#include <algorithm>
#include <map>
#include <set>

#include "peer/peer_algorithm.h"
#include "peer/topology.h"

namespace fedfleet::peer {
namespace {

class DpsgdImpl : public PeerAlgorithm {
 public:
  DpsgdImpl(const PeerOptions& o, uint32_t self, std::vector<float> x)
      : PeerAlgorithm(o, self, std::move(x)),
        graph_(makeGraph(o.topology, o.peers, o.degree, o.seed)) {
    weights_ = metropolisWeights(graph_, self_);
  }

  void start() override { begin(); }

  void computed(uint64_t t, std::vector<float> delta, uint64_t samples, double loss) override {
    checkComputed(t, delta, samples, loss);
    delta_ = std::move(delta);
    have_delta_ = true;
    tryMix();
  }

  void message(PeerMessage m) override {
    if (m.kind != PeerMessageKind::kModel) return fail(unexpected(m, "dpsgd exchanges models"));
    if (!std::binary_search(graph_.neighbours[self_].begin(), graph_.neighbours[self_].end(),
                            m.from)) {
      return fail(unexpected(m, "not a neighbour"));
    }
    if (Status s = checkValues(m); !s.isOk()) return fail(s);
    // A neighbour is at most one iteration ahead: its next needs this peer's model.
    if (m.iteration < completed_ || m.iteration > completed_ + 1) {
      return fail(unexpected(m, "not this iteration or the next"));
    }
    auto& slot = received_[m.iteration];
    if (slot.count(m.from)) return fail(unexpected(m, "a second model for the iteration"));
    slot.emplace(m.from, std::move(m.values));
    tryMix();
  }

  void peerDown(uint32_t peer) override {
    failOnDeadPeer(peer, "every iteration mixes every neighbour's model, and waits spread");
  }

 private:
  void begin() {
    for (uint32_t j : graph_.neighbours[self_]) {
      send(model(PeerMessageKind::kModel, j, completed_));
    }
    compute(completed_, o_.steps_per_iteration);
  }

  void tryMix() {
    const uint64_t t = completed_;
    auto it = received_.find(t);
    const size_t have = it == received_.end() ? 0 : it->second.size();
    if (!have_delta_ || have < graph_.neighbours[self_].size()) return;
    std::vector<float> next(x_.size(), 0.0f);
    for (auto [j, w] : weights_) {
      const std::vector<float>& xj = j == self_ ? x_ : it->second.at(j);
      const float wf = static_cast<float>(w);
      for (size_t i = 0; i < next.size(); ++i) next[i] += wf * xj[i];
    }
    for (size_t i = 0; i < next.size(); ++i) next[i] += delta_[i];
    x_ = std::move(next);
    received_.erase(it);
    have_delta_ = false;
    iterationDone(IterationDone{t, static_cast<uint32_t>(have), 0, false, loss_, samples_});
    if (!finished_) begin();
  }

  const Graph graph_;
  std::vector<std::pair<uint32_t, double>> weights_;
  std::map<uint64_t, std::map<uint32_t, std::vector<float>>> received_;
  std::vector<float> delta_;
  bool have_delta_ = false;
};

}  // namespace

std::unique_ptr<PeerAlgorithm> makeDpsgd(const PeerOptions& options, uint32_t self,
                                         std::vector<float> x) {
  return std::make_unique<DpsgdImpl>(options, self, std::move(x));
}

}  // namespace fedfleet::peer
