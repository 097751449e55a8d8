// allreduce (ring all-reduce of every iteration's delta; pipeline 2: Pipe-SGD, one step stale)
// and local (DiLoCo: H local steps, then an all-reduce of the pseudo-gradient and an outer
// Nesterov step), as peer/peer_engine.h describes them.
#include <algorithm>
#include <map>
#include <set>

#include "common/compress/codec.h"
#include "common/compress/error_feedback.h"
#include "common/splitmix.h"
#include "peer/outer_optimizer.h"
#include "peer/peer_algorithm.h"
#include "peer/ring_allreduce.h"

namespace fedfleet::peer {
namespace {

// Ring all-reduce of every iteration's delta (allreduce; pipeline 2: Pipe-SGD), or of the
// pseudo-gradient after H steps with an outer Nesterov step (local).
class AllReduceImpl : public PeerAlgorithm {
 public:
  AllReduceImpl(const PeerOptions& o, uint32_t self, std::vector<float> x)
      : PeerAlgorithm(o, self, std::move(x)),
        local_(o.algorithm == Algorithm::kLocal),
        outer_(local_ ? x_.size() : 0, o.outer_lr, o.outer_momentum),
        reduce_residual_(x_.size()),
        gather_residual_(x_.size()) {
    if (o.codec.name != "none") {
      auto codec = compress::makeCodec(o.codec);
      FEDFLEET_CHECK(codec.isOk());
      codec_ = std::move(codec).value();
    }
  }

  void start() override { startCompute(0); }

  void computed(uint64_t t, std::vector<float> delta, uint64_t samples, double loss) override {
    checkComputed(t, delta, samples, loss);
    if (local_) {
      for (float& v : delta) v = -v;  // the pseudo-gradient x_prev - x_i
    }
    RingCompression c;
    if (codec_) {
      c.codec = codec_.get();
      // Error feedback for every codec: the residual is what the ring did not carry, added
      // back next time these elements go out.
      c.reduce_residual = &reduce_residual_;
      c.gather_residual = &gather_residual_;
      c.seed = splitMix64(o_.seed) ^ self_;
    }
    auto [it, inserted] = rings_.emplace(
        t, Pending{RingAllReduce(allPeers(o_.peers), self_, 0, t, std::move(delta), c), samples,
                   loss, staleness_at_compute_});
    FEDFLEET_CHECK(inserted);
    for (auto& m : it->second.ring.start()) send(std::move(m));
    // Chunks that came before this peer computed.
    if (auto e = early_.find(t); e != early_.end()) {
      auto msgs = std::move(e->second);
      early_.erase(e);
      for (auto& m : msgs) {
        if (!feed(it->second.ring, std::move(m))) return;
      }
    }
    computed_through_ = t + 1;
    settle();
  }

  void message(PeerMessage m) override {
    if (m.kind != PeerMessageKind::kChunk || m.group != 0) {
      return fail(unexpected(m, "only all-reduce chunks are exchanged"));
    }
    if (m.iteration < applied_) return fail(unexpected(m, "its all-reduce is over"));
    if (auto it = rings_.find(m.iteration); it != rings_.end()) {
      if (!feed(it->second.ring, std::move(m))) return;
      return settle();
    }
    // A ring this peer has not joined yet: its predecessor computed first. No peer gets more
    // than a pipeline ahead of another (each all-reduce needs everyone).
    if (m.iteration > applied_ + 2 * o_.pipeline + 2) {
      return fail(unexpected(m, "more than the pipeline ahead"));
    }
    if (early_[m.iteration].size() >= 2 * size_t{o_.peers}) {
      return fail(unexpected(m, "more chunks than a ring has"));
    }
    early_[m.iteration].push_back(std::move(m));
  }

  void peerDown(uint32_t peer) override {
    failOnDeadPeer(peer, "every all-reduce needs every peer");
  }

 private:
  struct Pending {
    RingAllReduce ring;
    uint64_t samples;
    double loss;
    uint32_t staleness;
  };

  bool feed(RingAllReduce& ring, PeerMessage m) {
    std::vector<PeerMessage> sends;
    Status s = ring.onChunk(std::move(m), &sends);
    if (!s.isOk()) {
      fail(s);
      return false;
    }
    for (auto& x : sends) send(std::move(x));
    return true;
  }

  void startCompute(uint64_t t) {
    staleness_at_compute_ = static_cast<uint32_t>(t - applied_);
    compute(t, local_ ? o_.local_steps : o_.steps_per_iteration);
  }

  // Applies the finished all-reduces in iteration order, then starts the next Compute when
  // the pipeline allows: iteration t + 1 needs the all-reduce of t + 1 - pipeline applied.
  void settle() {
    while (!failed_) {
      auto it = rings_.find(applied_);
      if (it == rings_.end() || !it->second.ring.done()) break;
      Pending p = std::move(it->second);
      rings_.erase(it);
      std::vector<float>& sum = p.ring.values();
      const float inv = 1.0f / static_cast<float>(o_.peers);
      for (float& v : sum) v *= inv;
      if (local_) {
        outer_.step(x_, sum);
      } else {
        for (size_t i = 0; i < x_.size(); ++i) x_[i] += sum[i];
      }
      ++applied_;
      iterationDone(
          IterationDone{applied_ - 1, p.ring.received(), p.staleness, false, p.loss, p.samples});
    }
    const uint64_t next = computed_through_;
    if (!failed_ && !computing_ && moreToCompute(next) && applied_ + o_.pipeline >= next + 1) {
      startCompute(next);
    }
  }

  const bool local_;
  std::unique_ptr<compress::Codec> codec_;
  NesterovOuter outer_;
  compress::ErrorFeedback reduce_residual_, gather_residual_;

  std::map<uint64_t, Pending> rings_;
  std::map<uint64_t, std::vector<PeerMessage>> early_;
  uint64_t applied_ = 0;           // all-reduces applied (iterations over)
  uint64_t computed_through_ = 0;  // iterations computed
  uint32_t staleness_at_compute_ = 0;
};

}  // namespace

std::unique_ptr<PeerAlgorithm> makeAllReduce(const PeerOptions& options, uint32_t self,
                                             std::vector<float> x) {
  return std::make_unique<AllReduceImpl>(options, self, std::move(x));
}

}  // namespace fedfleet::peer
