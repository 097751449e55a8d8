// PeerAlgorithm: what every decentralised algorithm of the peer engine shares (the model, the
// live peers, the iteration count, the outstanding Compute, the action queue and the checks of
// a peer's messages), and the interface each algorithm implements, one per file:
// peer/allreduce.cc (allreduce, Pipe-SGD and local/DiLoCo), peer/dpsgd.cc, peer/adpsgd.cc,
// peer/prague.cc and peer/hop.cc. PeerEngine (peer/peer_engine.h) owns one and forwards its
// events; the protocol of each algorithm is written out in peer_engine.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "peer/peer_engine.h"

namespace fedfleet::peer {

class PeerAlgorithm {
 public:
  PeerAlgorithm(const PeerOptions& o, uint32_t self, std::vector<float> x)
      : o_(o), self_(self), x_(std::move(x)), live_(o.peers, true) {}
  virtual ~PeerAlgorithm() = default;

  virtual void start() = 0;
  virtual void computed(uint64_t iteration, std::vector<float> delta, uint64_t samples,
                        double loss) = 0;
  virtual void message(PeerMessage m) = 0;
  virtual void peerDown(uint32_t peer) = 0;

  std::vector<PeerAction> take() { return std::exchange(out_, {}); }

  void fail(Status status) {
    if (failed_) return;
    failed_ = true;
    out_.push_back(Fail{std::move(status)});
  }

  void failOnDeadPeer(uint32_t peer, const std::string& why) {
    fail(unavailable("peer " + std::to_string(peer) + " is down: " + algorithmName(o_.algorithm) +
                     " cannot continue without it (" + why +
                     "); adpsgd, prague and hop with hop_backup >= 1 carry on without a dead "
                     "peer"));
  }

  void compute(uint64_t iteration, uint32_t steps) {
    FEDFLEET_CHECK(!computing_);
    computing_ = iteration;
    out_.push_back(Compute{iteration, std::make_shared<const std::vector<float>>(x_), steps});
  }

  // The driver's answer to the outstanding Compute: its samples and mean loss are kept
  // (samples_, loss_) for the IterationDone of the iteration it belongs to.
  void checkComputed(uint64_t iteration, const std::vector<float>& delta, uint64_t samples,
                     double loss) {
    FEDFLEET_CHECK_MSG(computing_ && *computing_ == iteration,
                       "onComputed for an iteration that was not asked for");
    FEDFLEET_CHECK_MSG(delta.size() == x_.size(), "onComputed with a delta of the wrong size");
    computing_.reset();
    samples_ = samples;
    loss_ = loss;
  }

  void send(PeerMessage m) { out_.push_back(Send{std::move(m)}); }

  PeerMessage model(PeerMessageKind kind, uint32_t to, uint64_t iteration) const {
    PeerMessage m;
    m.kind = kind;
    m.from = self_;
    m.to = to;
    m.iteration = iteration;
    m.values = x_;
    return m;
  }

  // Records iteration `done.iteration` as over; emits Finished after the last.
  void iterationDone(IterationDone done) {
    out_.push_back(done);
    ++completed_;
    if (o_.iterations > 0 && completed_ >= o_.iterations && !finished_) {
      finished_ = true;
      out_.push_back(Finished{});
    }
  }
  bool moreToCompute(uint64_t next) const { return o_.iterations == 0 || next < o_.iterations; }

  Status unexpected(const PeerMessage& m, const std::string& why) const {
    return invalidArgument(std::string("peer ") + std::to_string(self_) + ": unexpected " +
                           wire::peerMessageKindName(m.kind) + " from " + std::to_string(m.from) +
                           " (iteration " + std::to_string(m.iteration) + "): " + why);
  }
  Status checkValues(const PeerMessage& m) const {
    if (m.values.size() != x_.size()) {
      return unexpected(m, "holds " + std::to_string(m.values.size()) + " values, the model " +
                               std::to_string(x_.size()));
    }
    return Status::ok();
  }

  // Constant after construction.
  const PeerOptions o_;
  const uint32_t self_;

  std::vector<float> x_;
  std::vector<bool> live_;
  uint64_t completed_ = 0;
  std::optional<uint64_t> computing_;
  uint64_t samples_ = 0;  // of the last Compute answered
  double loss_ = 0;
  bool finished_ = false;
  bool failed_ = false;
  std::vector<PeerAction> out_;
};

// The peers 0 .. p - 1.
std::vector<uint32_t> allPeers(uint32_t p);

// One algorithm each, for peer `self` of `options` starting from `x` (options validated).
std::unique_ptr<PeerAlgorithm> makeAllReduce(const PeerOptions& options, uint32_t self,
                                             std::vector<float> x);  // allreduce and local
std::unique_ptr<PeerAlgorithm> makeDpsgd(const PeerOptions& options, uint32_t self,
                                         std::vector<float> x);
std::unique_ptr<PeerAlgorithm> makeAdpsgd(const PeerOptions& options, uint32_t self,
                                          std::vector<float> x);
std::unique_ptr<PeerAlgorithm> makePrague(const PeerOptions& options, uint32_t self,
                                          std::vector<float> x);
std::unique_ptr<PeerAlgorithm> makeHop(const PeerOptions& options, uint32_t self,
                                       std::vector<float> x);

}  // namespace fedfleet::peer
