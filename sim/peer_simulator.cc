#include "sim/peer_simulator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <queue>
#include <sstream>
#include <variant>

#include "client/peer_runtime.h"
#include "common/check.h"
#include "common/compress/codec_spec.h"
#include "common/model/export.h"
#include "common/model/model.h"
#include "common/wire/sim_job.h"
#include "coordinator/run_setup.h"
#include "peer/group_generator.h"
#include "sim/fleet.h"
#include "sim/fleet_data.h"
#include "sim/hash.h"
#include "sim/model_cost.h"
#include "sim/sim_jobs.h"
#include "sim/worker_pool.h"

namespace fedfleet::sim {
namespace {

double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::shared_ptr<const std::string> bytesOf(const std::vector<float>& v) {
  return std::make_shared<const std::string>(reinterpret_cast<const char*>(v.data()),
                                             v.size() * sizeof(float));
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
  };
  struct Evaluate {};
  using Event = std::variant<ComputeDone, Deliver, Evaluate>;
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
  // What a peer did since its last iteration ended (for its PeerIterationRecord).
  struct Tally {
    double t_start = 0;
    double compute_s = 0;
    double comm_s = 0;
    uint64_t bytes_sent = 0;
    uint64_t bytes_received = 0;
  };
  struct Link {
    double up = 0, down = 0, latency = 0;  // bytes/s, bytes/s, s
  };

  void push(double t, Event e) { events_.push(Entry{t, seq_++, std::move(e)}); }
  Status handle(uint32_t peer, std::vector<peer::PeerAction> actions);
  void send(uint32_t from, peer::PeerMessage m);
  double computeSeconds(uint32_t peer, uint64_t iteration, uint32_t steps);
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
  std::vector<Tally> tally_;
  std::vector<bool> done_;
  std::vector<history::PeerIterationRecord> pending_rows_;
  PeerSimSummary summary_;
  uint64_t iterations_ = 0;
  static constexpr size_t kSmoothing = 3;  // evaluations averaged for the target
  std::deque<double> recent_;              // the last kSmoothing accuracies
};

Status Simulator::init() {
  if (config_.policy.mode != "decentralized") {
    return invalidArgument("policy.mode must be \"decentralized\" for the peer simulator");
  }
  FEDFLEET_ASSIGN_OR_RETURN(options_, client::peerOptionsFromConfig(config_));
  const uint32_t p = options_.peers;
  const auto& sc = config_.sim;
  AvailabilityOptions avail;  // peers are always online: availability is the round simulator's
  FEDFLEET_ASSIGN_OR_RETURN(Fleet fleet, Fleet::create(sc.fleet, p, config_.run.seed, avail));
  FEDFLEET_ASSIGN_OR_RETURN(data_, FleetData::create(config_, p));
  FEDFLEET_ASSIGN_OR_RETURN(
      auto model, model::createModel(config_.model.name, config_.run.seed, config_.model.path,
                                     data_->inputShape()));
  model->setLoss(wire::parseLoss(config_.train.loss).value());  // validated
  if (!config_.model.init.empty()) {
    FEDFLEET_RETURN_IF_ERROR(model::loadWeights(*model, config_.model.init));
  }
  {
    FEDFLEET_ASSIGN_OR_RETURN(const ClientShard first, data_->shard(0));
    FEDFLEET_RETURN_IF_ERROR(
        coordinator::checkModelFitsConfigData(*model, *first.data, config_, "training"));
  }
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

  const std::string& db = config_.history.db;
  if (db == ":memory:") {
    history_ = history::createMemoryHistory();
  } else {
    FEDFLEET_ASSIGN_OR_RETURN(history_, history::openSqliteHistory(db));
  }
  history::RunRecord run;
  run.name = config_.run.name;
  run.config_json = config_.toJson().dump();
  run.started_at = unixNow();
  run.seed = config_.run.seed;
  run.clock = "virtual";
  run.model_json = model::describeModel(*model, data_->inputShape(), config_.model.path);
  FEDFLEET_ASSIGN_OR_RETURN(run_id_, history_->beginRun(run));
  pool_ = std::make_unique<WorkerPool>(sc.workers);
  spdlog::info(
      "sim: run {}: decentralised {} over {} peers ({} slowed {}x), model {} ({} parameters), "
      "{} workers; reference device {:.0f} samples/s",
      run_id_, peer::algorithmName(options_.algorithm), p, slow, sc.slow_factor, config_.model.name,
      initial_.size(), pool_->size(), ref_samples_per_s_);
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
  double arrive = now_;
  const uint32_t gen = options_.peers;
  if (from == gen || to == gen) {
    arrive += links_[gen].latency;  // the generator's short messages: latency only
  } else {
    const double rate = std::min(links_[from].up, links_[to].down);
    const double start = std::max(now_, uplink_free_[from]);
    const double transfer = static_cast<double>(bytes) / rate;
    uplink_free_[from] = start + transfer;
    tally_[from].comm_s += transfer;
    arrive = start + transfer + links_[from].latency;
  }
  if (from < gen) tally_[from].bytes_sent += bytes;
  summary_.bytes_sent += bytes;
  push(arrive, Deliver{std::move(m)});
}

Status Simulator::handle(uint32_t p, std::vector<peer::PeerAction> actions) {
  for (auto& a : actions) {
    if (auto* c = std::get_if<peer::Compute>(&a)) {
      const double seconds = computeSeconds(p, c->iteration, c->steps);
      auto job = std::make_shared<wire::SimTrainJob>();
      job->client = p;
      const model::InputShape shape = data_->inputShape();
      job->recipe = {config_.model.name, config_.model.path,
                     config_.run.seed,   shape.sample,
                     shape.classes,      wire::parseLoss(config_.train.loss).value(),
                     config_.sim.device};
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
      Tally& t = tally_[p];
      history::PeerIterationRecord r;
      r.run_id = run_id_;
      r.peer = p;
      r.iteration = d->iteration;
      r.t_start = t.t_start;
      r.t_end = now_;
      r.compute_s = d->skipped ? 0 : t.compute_s;
      r.comm_s = t.comm_s;
      r.wait_s = std::max(0.0, (r.t_end - r.t_start) - r.compute_s - r.comm_s);
      r.bytes_sent = t.bytes_sent;
      r.bytes_received = t.bytes_received;
      r.exchanges = d->exchanges;
      r.staleness = d->staleness;
      r.skipped = d->skipped;
      pending_rows_.push_back(r);
      t = Tally{};
      t.t_start = now_;
      ++iterations_;
      if (pending_rows_.size() >= 4096) FEDFLEET_RETURN_IF_ERROR(flushIterations());
    } else if (std::holds_alternative<peer::Finished>(a)) {
      done_[p] = true;
    } else if (auto* f = std::get_if<peer::Fail>(&a)) {
      return f->status.withContext("peer " + std::to_string(p));
    }
  }
  return Status::ok();
}

Status Simulator::flushIterations() {
  if (pending_rows_.empty()) return Status::ok();
  Status s = history_->recordPeerIterations(pending_rows_);
  pending_rows_.clear();
  return s;
}

// The average of the peers' models on the test set.
Status Simulator::evaluate() {
  const uint32_t p = options_.peers;
  std::vector<double> sum(initial_.size(), 0.0);
  for (const auto& e : engines_) {
    const auto& x = e->model();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += x[i];
  }
  auto avg = std::make_shared<std::vector<float>>(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) (*avg)[i] = static_cast<float>(sum[i] / p);
  const auto test = data_->testSet();
  constexpr uint32_t kPiece = 250;
  const model::InputShape shape = data_->inputShape();
  const wire::SimModelRecipe recipe{config_.model.name, config_.model.path,
                                    config_.run.seed,   shape.sample,
                                    shape.classes,      wire::parseLoss(config_.train.loss).value(),
                                    config_.sim.device};
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
  tally_.assign(p, Tally{});
  done_.assign(p, false);
  const auto& dc = config_.decentralized;
  push(dc.eval_every_s, Evaluate{});
  for (uint32_t i = 0; i < p; ++i) FEDFLEET_RETURN_IF_ERROR(handle(i, engines_[i]->start()));

  bool target_reached = false;
  while (!events_.empty() && !stop_.load()) {
    Entry e = events_.top();
    events_.pop();
    if (dc.time_budget_s > 0 && e.t > dc.time_budget_s) break;
    now_ = e.t;
    if (auto* c = std::get_if<ComputeDone>(&e.ev)) {
      wire::SimTrainResult r = c->result->get();
      if (!r.status.isOk()) {
        return r.status.withContext("training peer " + std::to_string(c->peer) + " iteration " +
                                    std::to_string(c->iteration));
      }
      FEDFLEET_RETURN_IF_ERROR(handle(
          c->peer, engines_[c->peer]->onComputed(c->iteration, std::move(r.delta),
                                                 r.steps * config_.train.batch, r.mean_loss)));
    } else if (auto* d = std::get_if<Deliver>(&e.ev)) {
      const uint32_t to = d->message.to;
      if (to == p) {
        FEDFLEET_ASSIGN_OR_RETURN(auto sends, generator_->onMessage(d->message, now_));
        for (auto& s : sends) send(p, std::move(s));
      } else {
        tally_[to].bytes_received += d->message.wireBytes();
        FEDFLEET_RETURN_IF_ERROR(handle(to, engines_[to]->onMessage(std::move(d->message))));
      }
    } else {
      FEDFLEET_RETURN_IF_ERROR(evaluate());
      if (summary_.time_to_target) {
        target_reached = true;
        break;
      }
      if (!std::all_of(done_.begin(), done_.end(), [](bool x) { return x; })) {
        push(now_ + dc.eval_every_s, Evaluate{});
      }
    }
    // Every peer finished: what is still in flight (AD-PSGD's last answers, Prague's leaves)
    // changes no model that matters any more.
    if (std::all_of(done_.begin(), done_.end(), [](bool x) { return x; })) break;
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
