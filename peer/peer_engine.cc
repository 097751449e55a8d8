#include "peer/peer_engine.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/check.h"
#include "common/compress/codec.h"
#include "common/compress/error_feedback.h"
#include "common/splitmix.h"
#include "peer/hop_queues.h"
#include "peer/outer_optimizer.h"
#include "peer/peer_algorithm.h"
#include "peer/ring_allreduce.h"
#include "peer/topology.h"

namespace fedfleet::peer {

const char* algorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kAllReduce:
      return "allreduce";
    case Algorithm::kDpsgd:
      return "dpsgd";
    case Algorithm::kAdpsgd:
      return "adpsgd";
    case Algorithm::kPrague:
      return "prague";
    case Algorithm::kHop:
      return "hop";
    case Algorithm::kLocal:
      return "local";
  }
  return "unknown";
}

Result<Algorithm> parseAlgorithm(const std::string& text) {
  for (Algorithm a : {Algorithm::kAllReduce, Algorithm::kDpsgd, Algorithm::kAdpsgd,
                      Algorithm::kPrague, Algorithm::kHop, Algorithm::kLocal}) {
    if (text == algorithmName(a)) return a;
  }
  return invalidArgument("unknown decentralised algorithm \"" + text +
                         "\"; choose allreduce, dpsgd, adpsgd, prague, hop or local");
}

const char* topologyName(Topology t) {
  switch (t) {
    case Topology::kRing:
      return "ring";
    case Topology::kTorus:
      return "torus";
    case Topology::kRandom:
      return "random";
  }
  return "unknown";
}

Result<Topology> parseTopology(const std::string& text) {
  for (Topology t : {Topology::kRing, Topology::kTorus, Topology::kRandom}) {
    if (text == topologyName(t)) return t;
  }
  return invalidArgument("unknown topology \"" + text + "\"; choose ring, torus or random");
}

Status validate(const PeerOptions& o) {
  auto bad = [](const std::string& what, const std::string& why) {
    return invalidArgument("peer options: " + what + " " + why);
  };
  if (o.peers < 2) return bad("peers", "must be at least 2");
  if (o.pipeline != 1 && o.pipeline != 2) return bad("pipeline", "must be 1 or 2");
  if (o.pipeline == 2 && o.algorithm != Algorithm::kAllReduce) {
    return bad("pipeline", "2 applies to allreduce only");
  }
  FEDFLEET_RETURN_IF_ERROR(compress::validate(o.codec));
  if (o.topology == Topology::kRandom &&
      (o.degree < 1 || o.degree >= o.peers || (uint64_t{o.peers} * o.degree) % 2 != 0)) {
    return bad("degree", "must be in [1, peers - 1] with peers * degree even");
  }
  if (o.algorithm == Algorithm::kPrague && (o.group_size < 2 || o.group_size > o.peers)) {
    return bad("group_size", "must be in [2, peers]");
  }
  if (o.group_buffer == 0) return bad("group_buffer", "must be at least 1");
  if (o.algorithm == Algorithm::kHop) {
    const Graph g = makeGraph(o.topology, o.peers, o.degree, o.seed);
    size_t least = g.neighbours[0].size();
    for (const auto& n : g.neighbours) least = std::min(least, n.size());
    if (o.hop_backup >= least) {
      return bad("hop_backup", "(" + std::to_string(o.hop_backup) +
                                   ") must be below the fewest neighbours a peer has (" +
                                   std::to_string(least) + ")");
    }
  }
  if (o.local_steps == 0) return bad("local_steps", "must be at least 1");
  if (o.steps_per_iteration == 0) return bad("steps_per_iteration", "must be at least 1");
  if (!(o.outer_lr > 0)) return bad("outer_lr", "must be > 0");
  if (!(o.outer_momentum >= 0 && o.outer_momentum < 1)) {
    return bad("outer_momentum", "must be in [0, 1)");
  }
  return Status::ok();
}

std::vector<uint32_t> allPeers(uint32_t p) {
  std::vector<uint32_t> out(p);
  for (uint32_t i = 0; i < p; ++i) out[i] = i;
  return out;
}

// ---- PeerEngine ------------------------------------------------------------------------------

PeerEngine::PeerEngine(const PeerOptions& options, uint32_t self, std::vector<float> initial) {
  Status s = validate(options);
  FEDFLEET_CHECK_MSG(s.isOk(), s.message().c_str());
  FEDFLEET_CHECK_MSG(self < options.peers, "peer id past the peer count");
  switch (options.algorithm) {
    case Algorithm::kAllReduce:
    case Algorithm::kLocal:
      impl_ = makeAllReduce(options, self, std::move(initial));
      break;
    case Algorithm::kDpsgd:
      impl_ = makeDpsgd(options, self, std::move(initial));
      break;
    case Algorithm::kAdpsgd:
      impl_ = makeAdpsgd(options, self, std::move(initial));
      break;
    case Algorithm::kPrague:
      impl_ = makePrague(options, self, std::move(initial));
      break;
    case Algorithm::kHop:
      impl_ = makeHop(options, self, std::move(initial));
      break;
  }
}

PeerEngine::~PeerEngine() = default;

std::vector<PeerAction> PeerEngine::start() {
  impl_->start();
  return impl_->take();
}

std::vector<PeerAction> PeerEngine::onComputed(uint64_t iteration, std::vector<float> delta,
                                               uint64_t samples, double loss) {
  if (impl_->failed_) return {};
  impl_->computed(iteration, std::move(delta), samples, loss);
  return impl_->take();
}

std::vector<PeerAction> PeerEngine::onMessage(PeerMessage message) {
  if (impl_->failed_) return {};
  if (message.to != impl_->self_ || message.from > impl_->o_.peers ||
      (message.from < impl_->o_.peers && !impl_->live_[message.from])) {
    // A message from a peer declared dead is dropped: it may have been in flight.
    if (message.from < impl_->o_.peers && !impl_->live_[message.from]) return {};
    impl_->fail(invalidArgument("peer " + std::to_string(impl_->self_) + ": a message from " +
                                std::to_string(message.from) + " to " +
                                std::to_string(message.to)));
    return impl_->take();
  }
  impl_->message(std::move(message));
  return impl_->take();
}

std::vector<PeerAction> PeerEngine::onPeerDown(uint32_t peer) {
  if (impl_->failed_ || peer >= impl_->o_.peers || peer == impl_->self_) return {};
  impl_->peerDown(peer);
  impl_->live_[peer] = false;
  return impl_->take();
}

const std::vector<float>& PeerEngine::model() const { return impl_->x_; }
uint32_t PeerEngine::self() const { return impl_->self_; }
uint64_t PeerEngine::iteration() const { return impl_->completed_; }
bool PeerEngine::finished() const { return impl_->finished_; }
bool PeerEngine::failed() const { return impl_->failed_; }

}  // namespace fedfleet::peer
