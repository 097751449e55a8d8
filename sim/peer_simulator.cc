#include "sim/peer_simulator.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <future>
#include <limits>
#include <map>
#include <queue>
#include <sstream>
#include <variant>

#include "common/check.h"
#include "common/clock.h"
#include "common/compress/codec_spec.h"
#include "common/model/export.h"
#include "common/model/model.h"
#include "common/wire/peer_control.h"
#include "common/wire/sim_job.h"
#include "driver/peer_options.h"
#include "driver/run_setup.h"
#include "peer/group_generator.h"
#include "sim/fleet.h"
#include "sim/fleet_data.h"
#include "sim/hash.h"
#include "sim/model_cost.h"
#include "sim/sim_jobs.h"
#include "sim/worker_pool.h"

namespace fedfleet::sim {
namespace {

std::shared_ptr<const std::string> bytesOf(const std::vector<float>& v) {
  return std::make_shared<const std::string>(reinterpret_cast<const char*>(v.data()),
                                             v.size() * sizeof(float));
}

constexpr double kNever = std::numeric_limits<double>::infinity();

// sim.peer_fail_at: "peer:seconds" pairs separated by commas ("3:12.5,7:40"), each peer at most
// once, peers below `peers`, times finite and >= 0. Returns the time each peer leaves (kNever:
// it stays); INVALID_ARGUMENT naming the key and the pair at fault.
Result<std::vector<double>> parsePeerFailAt(const std::string& text, uint32_t peers) {
  std::vector<double> at(peers, kNever);
  const std::string key = "'sim.peer_fail_at' ";
  std::stringstream in(text);
  std::string pair;
  uint32_t listed = 0;
  while (std::getline(in, pair, ',')) {
    const size_t colon = pair.find(':');
    size_t used_peer = 0, used_time = 0;
    unsigned long peer = 0;
    double t = 0;
    bool ok = colon != std::string::npos && colon > 0 && colon + 1 < pair.size();
    if (ok) {
      try {
        const std::string peer_text = pair.substr(0, colon), time_text = pair.substr(colon + 1);
        ok = peer_text.find_first_not_of(" 0123456789") == std::string::npos;
        if (ok) peer = std::stoul(peer_text, &used_peer);
        if (ok) t = std::stod(time_text, &used_time);
        ok = ok && time_text.find_first_not_of(' ', used_time) == std::string::npos;
      } catch (const std::exception&) {  // std::sto* on text that is no number
        ok = false;
      }
    }
    if (!ok) {
      return invalidArgument(
          key + "takes peer:seconds pairs separated by commas (\"3:12.5,7:40\"); got \"" + pair +
          "\"");
    }
    if (peer >= peers) {
      return invalidArgument(key + "names peer " + std::to_string(peer) + " of " +
                             std::to_string(peers) + " (decentralized.peers)");
    }
    if (!(t >= 0 && std::isfinite(t))) {
      return invalidArgument(key + "peer " + std::to_string(peer) +
                             ": the time must be finite and >= 0");
    }
    if (at[peer] != kNever) {
      return invalidArgument(key + "names peer " + std::to_string(peer) + " twice");
    }
    at[peer] = t;
    ++listed;
  }
  if (listed >= peers) return invalidArgument(key + "leaves no peer (someone must be left)");
  return at;
}

class Simulator final : public PeerSimulator {
 public:
  explicit Simulator(const config::Config& config) : config_(config) {}

  Status init();
  Result<PeerSimSummary> run() override;
  void stop() override { stop_.store(true); }
  int64_t runId() const override { return run_id_; }
  history::HistoryStore& history() override { return *history_; }

 private:
  // Events of the loop, in virtual-time order (ties: the order they were scheduled in).
  struct ComputeDone {
    uint32_t peer;
    uint64_t iteration;
    double seconds;
    std::shared_ptr<std::future<wire::SimTrainResult>> result;
  };
  struct Deliver {
    peer::PeerMessage message;
    double sent;  // when its last byte left the sender's uplink
  };
  struct Evaluate {};
  // Peer `peer` leaves for good (sim.peer_fail_at / sim.peer_failures).
  struct Leave {
    uint32_t peer;
  };
  // The others' heartbeats from `peer` have been missing for coordinator.liveness_s.
  struct Down {
    uint32_t peer;
  };
  using Event = std::variant<ComputeDone, Deliver, Evaluate, Leave, Down>;
  struct Entry {
    double t;
    uint64_t seq;
    Event ev;
  };
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const {
      return a.t != b.t ? a.t > b.t : a.seq > b.seq;
    }
  };
  struct Link {
    double up = 0, down = 0, latency = 0;  // bytes/s, bytes/s, s
  };

  void push(double t, Event e) { events_.push(Entry{t, seq_++, std::move(e)}); }
  Status handle(uint32_t peer, std::vector<peer::PeerAction> actions);
  void send(uint32_t from, peer::PeerMessage m);
  double computeSeconds(uint32_t peer, uint64_t iteration, uint32_t steps);
  Status planFailures();
  Status recordEvent(const std::string& kind, uint32_t peer, const std::string& detail);
  Status onDown(uint32_t peer);
  // Keeps what was done (the iteration rows, a peer_failed event) and returns `failure`.
  Status failRun(uint32_t peer, Status failure);
  bool allLiveDone() const;
  Status evaluate();
  Status flushIterations();

  const config::Config config_;
  peer::PeerOptions options_;
  std::unique_ptr<FleetData> data_;
  std::vector<float> initial_;
  double ref_samples_per_s_ = 0;
  std::vector<Link> links_;             // per peer; links_[P]: the group generator
  std::vector<double> speed_;           // per peer, slow_factor applied
  std::vector<double> slowdown_until_;  // per peer: a transient slowdown lasts until then
  std::vector<double> leaves_at_;       // per peer: when it leaves (kNever: it stays)
  std::string leave_cause_;             // the key that made them leave, for the events
  std::unique_ptr<history::HistoryStore> history_;
  int64_t run_id_ = 0;
  std::unique_ptr<WorkerPool> pool_;
  std::atomic<bool> stop_{false};

  std::vector<std::unique_ptr<peer::PeerEngine>> engines_;
  std::unique_ptr<peer::GroupGenerator> generator_;
  std::priority_queue<Entry, std::vector<Entry>, Later> events_;
  uint64_t seq_ = 0;
  double now_ = 0;
  std::vector<double> uplink_free_;
  // Each peer's iteration row in the making: what it did since its last iteration ended (its
  // start, compute and transfer time, bytes sent and received); the rest is filled in when the
  // iteration is done.
  std::vector<history::PeerIterationRecord> tally_;
  std::vector<bool> done_;
  std::vector<bool> gone_;  // left: no compute, no sends, nothing delivered to it
  std::vector<bool> down_;  // declared down to the others (coordinator.liveness_s after leaving)
  std::vector<history::PeerIterationRecord> pending_rows_;
  PeerSimSummary summary_;
  uint64_t iterations_ = 0;
  static constexpr size_t kSmoothing = 3;  // evaluations averaged for the target
  std::deque<double> recent_;              // the last kSmoothing accuracies
};

Status Simulator::init() {
  if (config_.policy.mode != config::PolicyMode::kDecentralized) {
    return invalidArgument("policy.mode must be \"decentralized\" for the peer simulator");
  }
  FEDFLEET_ASSIGN_OR_RETURN(options_, driver::peerOptionsFromConfig(config_));
  const uint32_t p = options_.peers;
  const auto& sc = config_.sim;
  if (!sc.peer_fail_at.empty()) {  // before the data loads: a typo fails at once
    FEDFLEET_ASSIGN_OR_RETURN(leaves_at_, parsePeerFailAt(sc.peer_fail_at, p));
  }
  AvailabilityOptions avail;  // peers are always online: availability is the round simulator's
  FEDFLEET_ASSIGN_OR_RETURN(Fleet fleet, Fleet::create(sc.fleet, p, config_.run.seed, avail));
  FEDFLEET_ASSIGN_OR_RETURN(data_, FleetData::create(config_, p));
  FEDFLEET_ASSIGN_OR_RETURN(const ClientShard first, data_->shard(0));
  FEDFLEET_ASSIGN_OR_RETURN(
      auto model, driver::createRunModel(config_, data_->inputShape(), {first.data.get()}));
  initial_ = model->flatParameters();
  ref_samples_per_s_ =
      sc.reference_gflops * 1e9 / trainFlopsPerSample(config_.model.name, initial_.size());

  // Links and speeds.
  const auto& dc = config_.decentralized;
  const uint32_t slow = static_cast<uint32_t>(std::lround(sc.slow_fraction * p));
  for (uint32_t i = 0; i < p; ++i) {
    const ClientProfile prof = fleet.profile(i);
    Link l{prof.up_bytes_per_s, prof.down_bytes_per_s, prof.latency_s};
    if (dc.mbps > 0) l.up = l.down = dc.mbps * 1e6 / 8;
    if (dc.latency_ms >= 0) l.latency = dc.latency_ms / 1000;
    links_.push_back(l);
    speed_.push_back(prof.speed / (i >= p - slow ? sc.slow_factor : 1.0));
  }
  links_.push_back(Link{0, 0, dc.latency_ms >= 0 ? dc.latency_ms / 1000 : 0.02});
  slowdown_until_.assign(p, -1);
  FEDFLEET_RETURN_IF_ERROR(planFailures());

  const std::string& db = config_.history.db;
  FEDFLEET_ASSIGN_OR_RETURN(history_, driver::openRunHistory(db, /*in_memory_ok=*/true));
  FEDFLEET_ASSIGN_OR_RETURN(
      run_id_, history_->beginRun(driver::newRunRecord(
                   config_, "virtual",
                   model::describeModel(*model, data_->inputShape(), config_.model.path))));
  pool_ = std::make_unique<WorkerPool>(sc.workers);
  spdlog::info(
      "sim: run {}: decentralised {} over {} peers ({} slowed {}x), model {} ({} parameters), "
      "{} workers; reference device {:.0f} samples/s",
      run_id_, peer::algorithmName(options_.algorithm), p, slow, sc.slow_factor, config_.model.name,
      initial_.size(), pool_->size(), ref_samples_per_s_);
  return Status::ok();
}

// Who leaves when. sim.peer_fail_at gives the times; sim.peer_failures draws that many distinct
// peers (a partial Fisher-Yates shuffle of the ids, hashed from run.seed) and for each a time
// uniform in [0, T): T is the virtual time the slowest peer needs to compute its iterations
// (without transient slowdowns or communication: a lower bound of the run's length, so every
// drawn failure happens mid-run), capped by decentralized.time_budget_s when that is set.
Status Simulator::planFailures() {
  const uint32_t p = options_.peers;
  const auto& sc = config_.sim;
  if (!sc.peer_fail_at.empty()) {  // parsed by init
    leave_cause_ = "sim.peer_fail_at";
    return Status::ok();
  }
  leaves_at_.assign(p, kNever);
  if (sc.peer_failures == 0) return Status::ok();
  leave_cause_ = "sim.peer_failures";
  const auto& dc = config_.decentralized;
  double horizon = kNever;
  if (dc.iterations > 0) {
    const uint32_t steps = options_.algorithm == peer::Algorithm::kLocal
                               ? options_.local_steps
                               : options_.steps_per_iteration;
    const double slowest = *std::min_element(speed_.begin(), speed_.end());
    horizon = static_cast<double>(dc.iterations) * steps * config_.train.batch /
              (slowest * ref_samples_per_s_);
  }
  if (dc.time_budget_s > 0) horizon = std::min(horizon, dc.time_budget_s);
  std::vector<uint32_t> ids(p);
  for (uint32_t i = 0; i < p; ++i) ids[i] = i;
  const uint64_t seed = config_.run.seed ^ 0x1ea7e5ull;
  for (uint32_t k = 0; k < sc.peer_failures; ++k) {
    std::swap(ids[k], ids[k + mix(seed, k, 0) % (p - k)]);
    leaves_at_[ids[k]] = unitInterval(mix(seed, ids[k], 1)) * horizon;
  }
  return Status::ok();
}

double Simulator::computeSeconds(uint32_t peer, uint64_t iteration, uint32_t steps) {
  const auto& sc = config_.sim;
  double speed = speed_[peer];
  if (sc.slowdown_probability > 0 && sc.slowdown_factor > 1) {
    if (now_ >= slowdown_until_[peer] && unitInterval(mix(config_.run.seed ^ 0x510ed0ull, peer,
                                                          iteration)) < sc.slowdown_probability) {
      slowdown_until_[peer] = now_ + sc.slowdown_s;
    }
    if (now_ < slowdown_until_[peer]) speed /= sc.slowdown_factor;
  }
  const double samples = static_cast<double>(steps) * config_.train.batch;
  return samples / (speed * ref_samples_per_s_);
}

void Simulator::send(uint32_t from, peer::PeerMessage m) {
  const uint32_t to = m.to;
  const uint64_t bytes = m.wireBytes();
  double arrive = now_, sent = now_;
  const uint32_t gen = options_.peers;
  if (from == gen || to == gen) {
    arrive += links_[gen].latency;  // the generator's short messages: latency only
  } else {
    const double rate = std::min(links_[from].up, links_[to].down);
    const double start = std::max(now_, uplink_free_[from]);
    const double transfer = static_cast<double>(bytes) / rate;
    uplink_free_[from] = start + transfer;
    tally_[from].comm_s += transfer;
    sent = start + transfer;
    arrive = sent + links_[from].latency;
  }
  if (from < gen) tally_[from].bytes_sent += bytes;
  summary_.bytes_sent += bytes;
  push(arrive, Deliver{std::move(m), sent});
}

Status Simulator::handle(uint32_t p, std::vector<peer::PeerAction> actions) {
  for (auto& a : actions) {
    if (auto* c = std::get_if<peer::Compute>(&a)) {
      const double seconds = computeSeconds(p, c->iteration, c->steps);
      auto job = std::make_shared<wire::SimTrainJob>();
      job->client = p;
      job->recipe = modelRecipeOf(config_, data_->inputShape());
      job->max_steps = c->steps;
      job->batch_size = config_.train.batch;
      job->lr = static_cast<float>(config_.train.lr);
      job->momentum = static_cast<float>(config_.train.momentum);
      job->weight_decay = static_cast<float>(config_.train.weight_decay);
      job->optimizer = wire::parseOptimizer(config_.train.optimizer).value();  // validated
      job->seed = mix(config_.run.seed, p, c->iteration);
      job->start = bytesOf(*c->params);
      const FleetData* data = data_.get();
      auto result = std::make_shared<std::future<wire::SimTrainResult>>(
          pool_->submit([job, data] { return runTrainJob(*job, *data); }));
      tally_[p].compute_s += seconds;
      push(now_ + seconds, ComputeDone{p, c->iteration, seconds, std::move(result)});
    } else if (auto* s = std::get_if<peer::Send>(&a)) {
      send(p, std::move(s->message));
    } else if (auto* d = std::get_if<peer::IterationDone>(&a)) {
      history::PeerIterationRecord& r = tally_[p];
      r.run_id = run_id_;
      r.peer = p;
      r.iteration = d->iteration;
      r.t_end = now_;
      if (d->skipped) r.compute_s = 0;
      r.wait_s = std::max(0.0, (r.t_end - r.t_start) - r.compute_s - r.comm_s);
      r.exchanges = d->exchanges;
      r.staleness = d->staleness;
      r.skipped = d->skipped;
      pending_rows_.push_back(r);
      r = history::PeerIterationRecord{};
      r.t_start = now_;
      ++iterations_;
      if (pending_rows_.size() >= 4096) FEDFLEET_RETURN_IF_ERROR(flushIterations());
    } else if (std::holds_alternative<peer::Finished>(a)) {
      done_[p] = true;
    } else if (auto* f = std::get_if<peer::Fail>(&a)) {
      return failRun(p, f->status.withContext("peer " + std::to_string(p)));
    }
  }
  return Status::ok();
}

Status Simulator::recordEvent(const std::string& kind, uint32_t peer, const std::string& detail) {
  history::EventRecord e;
  e.run_id = run_id_;
  e.time = now_;  // virtual seconds: the run's clock is "virtual"
  e.kind = kind;
  e.client_id = wire::peerKeyName(peer);
  e.detail = detail;
  return history_->recordEvent(e);
}

Status Simulator::failRun(uint32_t peer, Status failure) {
  spdlog::error("sim: t = {:.3f} s virtual: {}", now_, failure.message());
  Status recorded = recordEvent("peer_failed", peer, failure.message());
  Status flushed = flushIterations();
  if (!recorded.isOk()) spdlog::warn("sim: cannot record the failure: {}", recorded.message());
  if (!flushed.isOk()) spdlog::warn("sim: cannot record iterations: {}", flushed.message());
  return failure;
}

// Every live peer, then Prague's generator, learns that `peer` is gone, in that order.
Status Simulator::onDown(uint32_t peer) {
  FEDFLEET_RETURN_IF_ERROR(recordEvent(
      "peer_down", peer,
      fmt::format("silent for {:g} s (coordinator.liveness_s) since it left at t = {:g} s",
                  config_.coordinator.liveness_s, leaves_at_[peer])));
  for (uint32_t i = 0; i < options_.peers; ++i) {
    if (!gone_[i]) FEDFLEET_RETURN_IF_ERROR(handle(i, engines_[i]->onPeerDown(peer)));
  }
  if (generator_) {
    for (auto& m : generator_->onPeerDown(peer, now_)) send(options_.peers, std::move(m));
  }
  return Status::ok();
}

bool Simulator::allLiveDone() const {
  for (size_t i = 0; i < done_.size(); ++i) {
    if (!done_[i] && !gone_[i]) return false;
  }
  return true;
}

Status Simulator::flushIterations() {
  if (pending_rows_.empty()) return Status::ok();
  Status s = history_->recordPeerIterations(pending_rows_);
  pending_rows_.clear();
  return s;
}

// The average of the live peers' models on the test set (a peer that left took its model).
Status Simulator::evaluate() {
  uint32_t p = 0;
  std::vector<double> sum(initial_.size(), 0.0);
  for (const auto& e : engines_) {
    if (gone_[e->self()]) continue;
    const auto& x = e->model();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += x[i];
    ++p;
  }
  auto avg = std::make_shared<std::vector<float>>(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) (*avg)[i] = static_cast<float>(sum[i] / p);
  const auto test = data_->testSet();
  constexpr uint32_t kPiece = 250;
  const wire::SimModelRecipe recipe = modelRecipeOf(config_, data_->inputShape());
  std::vector<std::future<Result<std::vector<wire::SimEvalPiece>>>> pieces;
  for (uint64_t begin = 0; begin < test->size(); begin += kPiece) {
    const uint64_t end = std::min<uint64_t>(test->size(), begin + kPiece);
    pieces.push_back(
        pool_->submit([=] { return evaluateTestPieces(recipe, *avg, *test, begin, end, kPiece); }));
  }
  double loss = 0;
  uint64_t correct = 0, n = 0;
  bool has_accuracy = false;
  for (auto& f : pieces) {
    FEDFLEET_ASSIGN_OR_RETURN(std::vector<wire::SimEvalPiece> ps, f.get());
    for (const auto& piece : ps) {
      loss += piece.loss_sum;
      correct += piece.correct;
      n += piece.n;
      has_accuracy = piece.has_accuracy;
    }
  }
  history::PeerEvalRecord r;
  r.run_id = run_id_;
  r.time_s = now_;
  r.iterations = iterations_;
  r.peers_averaged = p;
  r.loss = n ? loss / static_cast<double>(n) : 0;
  r.accuracy = has_accuracy && n ? static_cast<double>(correct) / static_cast<double>(n) : NAN;
  FEDFLEET_RETURN_IF_ERROR(history_->recordPeerEval(r));
  ++summary_.evaluations;
  if (!std::isnan(r.accuracy)) {
    summary_.final_accuracy = r.accuracy;
    summary_.best_accuracy = std::max(summary_.best_accuracy.value_or(0.0), r.accuracy);
    recent_.push_back(r.accuracy);
    if (recent_.size() > kSmoothing) recent_.pop_front();
    double mean = 0;
    for (double a : recent_) mean += a / static_cast<double>(recent_.size());
    if (config_.run.target_accuracy > 0 && !summary_.time_to_target &&
        recent_.size() == kSmoothing && mean >= config_.run.target_accuracy) {
      summary_.time_to_target = now_;
    }
  }
  spdlog::info("sim: t = {:.1f} s virtual, {} iterations: accuracy {:.4f}, loss {:.4f}", now_,
               iterations_, has_accuracy ? r.accuracy : 0.0, r.loss);
  return Status::ok();
}

Result<PeerSimSummary> Simulator::run() {
  const double wall_start = unixNow();
  const uint32_t p = options_.peers;
  summary_.run_id = run_id_;
  summary_.algorithm = peer::algorithmName(options_.algorithm);
  summary_.peers = p;
  summary_.db_path = config_.history.db;
  for (uint32_t i = 0; i < p; ++i) {
    engines_.push_back(std::make_unique<peer::PeerEngine>(options_, i, initial_));
  }
  if (options_.algorithm == peer::Algorithm::kPrague) {
    generator_ = std::make_unique<peer::GroupGenerator>(p, options_.group_size,
                                                        options_.group_buffer, options_.seed);
  }
  uplink_free_.assign(p, 0);
  tally_.assign(p, history::PeerIterationRecord{});
  done_.assign(p, false);
  gone_.assign(p, false);
  down_.assign(p, false);
  const auto& dc = config_.decentralized;
  for (uint32_t i = 0; i < p; ++i) {
    if (leaves_at_[i] != kNever) push(leaves_at_[i], Leave{i});
  }
  push(dc.eval_every_s, Evaluate{});
  for (uint32_t i = 0; i < p; ++i) FEDFLEET_RETURN_IF_ERROR(handle(i, engines_[i]->start()));

  bool target_reached = false;
  while (!events_.empty() && !stop_.load()) {
    Entry e = events_.top();
    events_.pop();
    if (dc.time_budget_s > 0 && e.t > dc.time_budget_s) break;
    now_ = e.t;
    if (auto* c = std::get_if<ComputeDone>(&e.ev)) {
      if (gone_[c->peer]) continue;  // it left while computing: the work is lost
      wire::SimTrainResult r = c->result->get();
      if (!r.status.isOk()) {
        return r.status.withContext("training peer " + std::to_string(c->peer) + " iteration " +
                                    std::to_string(c->iteration));
      }
      FEDFLEET_RETURN_IF_ERROR(handle(
          c->peer, engines_[c->peer]->onComputed(c->iteration, std::move(r.delta),
                                                 r.steps * config_.train.batch, r.mean_loss)));
    } else if (auto* d = std::get_if<Deliver>(&e.ev)) {
      const uint32_t to = d->message.to, from = d->message.from;
      // A leaver's message arrives when its last byte left the uplink before it left; what it
      // still had queued or on the wire is lost. Nothing reaches a peer that left.
      if (from < p && d->sent > leaves_at_[from]) continue;
      if (to < p && gone_[to]) continue;
      if (to == p) {
        // The generator, like the engines, drops what a peer declared down had in flight.
        if (from < p && down_[from]) continue;
        FEDFLEET_ASSIGN_OR_RETURN(auto sends, generator_->onMessage(d->message, now_));
        for (auto& s : sends) send(p, std::move(s));
      } else {
        tally_[to].bytes_received += d->message.wireBytes();
        FEDFLEET_RETURN_IF_ERROR(handle(to, engines_[to]->onMessage(std::move(d->message))));
      }
    } else if (auto* l = std::get_if<Leave>(&e.ev)) {
      gone_[l->peer] = true;
      spdlog::info("sim: t = {:.3f} s virtual: peer {} leaves ({})", now_, l->peer, leave_cause_);
      FEDFLEET_RETURN_IF_ERROR(
          recordEvent("peer_left", l->peer, "left for good (" + leave_cause_ + ")"));
      ++summary_.peers_left;
      push(now_ + config_.coordinator.liveness_s, Down{l->peer});
    } else if (auto* dn = std::get_if<Down>(&e.ev)) {
      down_[dn->peer] = true;
      FEDFLEET_RETURN_IF_ERROR(onDown(dn->peer));
    } else {
      FEDFLEET_RETURN_IF_ERROR(evaluate());
      if (summary_.time_to_target) {
        target_reached = true;
        break;
      }
      if (!allLiveDone()) push(now_ + dc.eval_every_s, Evaluate{});
    }
    // Every live peer finished: what is still in flight (AD-PSGD's last answers, Prague's
    // leaves) changes no model that matters any more.
    if (allLiveDone()) break;
  }
  if (!target_reached && !stop_.load()) FEDFLEET_RETURN_IF_ERROR(evaluate());
  FEDFLEET_RETURN_IF_ERROR(flushIterations());
  summary_.virtual_seconds = now_;
  summary_.iterations = iterations_;
  summary_.wall_seconds = unixNow() - wall_start;
  return summary_;
}

}  // namespace

Result<std::unique_ptr<PeerSimulator>> PeerSimulator::create(const config::Config& config) {
  FEDFLEET_RETURN_IF_ERROR(config.validate());
  auto sim = std::make_unique<Simulator>(config);
  FEDFLEET_RETURN_IF_ERROR(sim->init());
  return std::unique_ptr<PeerSimulator>(std::move(sim));
}

std::string formatPeerSummary(const PeerSimSummary& s) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(1);
  out << "decentralized " << s.algorithm << ": " << s.peers << " peers, " << s.iterations
      << " iterations in " << s.virtual_seconds << " s virtual (" << s.wall_seconds << " s wall), "
      << s.bytes_sent / 1000000.0 << " MB sent, " << s.evaluations << " evaluations\n";
  if (s.peers_left > 0) out << "peers left: " << s.peers_left << " of " << s.peers << "\n";
  out.precision(4);
  if (s.final_accuracy) {
    out << "accuracy: final " << *s.final_accuracy << ", best " << s.best_accuracy.value_or(0)
        << "\n";
  }
  out.precision(2);
  if (s.time_to_target) out << "time to target: " << *s.time_to_target << " s virtual\n";
  return out.str();
}

}  // namespace fedfleet::sim
