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

// ---- the common part -------------------------------------------------------------------------

class PeerEngine::Impl {
 public:
  Impl(const PeerOptions& o, uint32_t self, std::vector<float> x)
      : o_(o), self_(self), x_(std::move(x)), live_(o.peers, true) {}
  virtual ~Impl() = default;

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

  // The driver's answer to the outstanding Compute.
  void checkComputed(uint64_t iteration, const std::vector<float>& delta) {
    FEDFLEET_CHECK_MSG(computing_ && *computing_ == iteration,
                       "onComputed for an iteration that was not asked for");
    FEDFLEET_CHECK_MSG(delta.size() == x_.size(), "onComputed with a delta of the wrong size");
    computing_.reset();
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
  bool finished_ = false;
  bool failed_ = false;
  std::vector<PeerAction> out_;
};

namespace {

std::vector<uint32_t> allPeers(uint32_t p) {
  std::vector<uint32_t> out(p);
  for (uint32_t i = 0; i < p; ++i) out[i] = i;
  return out;
}

// ---- allreduce and local ---------------------------------------------------------------------

// Ring all-reduce of every iteration's delta (allreduce; pipeline 2: Pipe-SGD), or of the
// pseudo-gradient after H steps with an outer Nesterov step (local).
class AllReduceImpl : public PeerEngine::Impl {
 public:
  AllReduceImpl(const PeerOptions& o, uint32_t self, std::vector<float> x)
      : Impl(o, self, std::move(x)),
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
    checkComputed(t, delta);
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

// ---- dpsgd -----------------------------------------------------------------------------------

class DpsgdImpl : public PeerEngine::Impl {
 public:
  DpsgdImpl(const PeerOptions& o, uint32_t self, std::vector<float> x)
      : Impl(o, self, std::move(x)), graph_(makeGraph(o.topology, o.peers, o.degree, o.seed)) {
    weights_ = metropolisWeights(graph_, self_);
  }

  void start() override { begin(); }

  void computed(uint64_t t, std::vector<float> delta, uint64_t samples, double loss) override {
    checkComputed(t, delta);
    delta_ = std::move(delta);
    samples_ = samples;
    loss_ = loss;
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
  uint64_t samples_ = 0;
  double loss_ = 0;
};

// ---- adpsgd ----------------------------------------------------------------------------------

class AdpsgdImpl : public PeerEngine::Impl {
 public:
  AdpsgdImpl(const PeerOptions& o, uint32_t self, std::vector<float> x)
      : Impl(o, self, std::move(x)),
        partners_(averagingPartners(makeGraph(o.topology, o.peers, o.degree, o.seed), self)),
        rng_(splitMix64(o.seed ^ (0xad95ull << 32) ^ self)) {}

  void start() override { begin(); }

  void computed(uint64_t t, std::vector<float> delta, uint64_t samples, double loss) override {
    checkComputed(t, delta);
    delta_ = std::move(delta);
    samples_ = samples;
    loss_ = loss;
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
  uint64_t samples_ = 0;
  double loss_ = 0;
};

// ---- prague ----------------------------------------------------------------------------------

class PragueImpl : public PeerEngine::Impl {
 public:
  using Impl::Impl;

  void start() override { compute(0, o_.steps_per_iteration); }

  void computed(uint64_t t, std::vector<float> delta, uint64_t samples, double loss) override {
    checkComputed(t, delta);
    for (size_t i = 0; i < x_.size(); ++i) x_[i] += delta[i];
    samples_ = samples;
    loss_ = loss;
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
  uint64_t samples_ = 0;
  double loss_ = 0;
};

// ---- hop -------------------------------------------------------------------------------------

class HopImpl : public PeerEngine::Impl {
 public:
  HopImpl(const PeerOptions& o, uint32_t self, std::vector<float> x)
      : Impl(o, self, std::move(x)),
        graph_(makeGraph(o.topology, o.peers, o.degree, o.seed)),
        queues_(graph_.neighbours[self], o.hop_backup, o.hop_bound) {}

  void start() override { tryStart(); }

  void computed(uint64_t t, std::vector<float> delta, uint64_t samples, double loss) override {
    checkComputed(t, delta);
    for (size_t i = 0; i < x_.size(); ++i) x_[i] += delta[i];
    samples_ = samples;
    loss_ = loss;
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
  uint64_t samples_ = 0;
  double loss_ = 0;
};

}  // namespace

// ---- PeerEngine ------------------------------------------------------------------------------

PeerEngine::PeerEngine(const PeerOptions& options, uint32_t self, std::vector<float> initial) {
  Status s = validate(options);
  FEDFLEET_CHECK_MSG(s.isOk(), s.message().c_str());
  FEDFLEET_CHECK_MSG(self < options.peers, "peer id past the peer count");
  switch (options.algorithm) {
    case Algorithm::kAllReduce:
    case Algorithm::kLocal:
      impl_ = std::make_unique<AllReduceImpl>(options, self, std::move(initial));
      break;
    case Algorithm::kDpsgd:
      impl_ = std::make_unique<DpsgdImpl>(options, self, std::move(initial));
      break;
    case Algorithm::kAdpsgd:
      impl_ = std::make_unique<AdpsgdImpl>(options, self, std::move(initial));
      break;
    case Algorithm::kPrague:
      impl_ = std::make_unique<PragueImpl>(options, self, std::move(initial));
      break;
    case Algorithm::kHop:
      impl_ = std::make_unique<HopImpl>(options, self, std::move(initial));
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
