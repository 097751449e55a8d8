#include "sim/fleet_simulator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <queue>
#include <set>
#include <unordered_map>
#include <variant>

#include "client/client_session.h"
#include "client/local_dp.h"
#include "client/masked_upload.h"
#include "client/trainer.h"
#include "client/upload_pipeline.h"
#include "common/check.h"
#include "common/clock.h"
#include "common/compress/codec.h"
#include "common/compress/error_feedback.h"
#include "common/crypto/keyed_stream.h"
#include "common/history/format.h"
#include "common/model/evaluate.h"
#include "common/model/export.h"
#include "common/model/local_part.h"
#include "common/model/model.h"
#include "common/wire/messages.h"
#include "driver/engine_driver.h"
#include "driver/resume.h"
#include "driver/run_setup.h"
#include "engine/round_engine.h"
#include "sim/attack.h"
#include "sim/fleet.h"
#include "sim/fleet_data.h"
#include "sim/hash.h"
#include "sim/model_cost.h"
#include "sim/progress.h"
#include "sim/remote_workers.h"
#include "sim/replay_history.h"
#include "sim/secagg_cost.h"
#include "sim/sim_jobs.h"
#include "sim/worker_pool.h"

namespace fedfleet::sim {
namespace {

using engine::Action;
using engine::ClientId;
using engine::RoundEngine;

// Whether this machine's CPUs report native bf16 arithmetic (the avx512_bf16 or amx_bf16 flag
// of /proc/cpuinfo; false where that file is missing).
bool cpuHasFastBf16() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    return line.find(" avx512_bf16") != std::string::npos ||
           line.find(" amx_bf16") != std::string::npos;
  }
  return false;
}

// Samples a Trainer processes: every epoch is a full pass; with max_steps, passes repeat and the
// last batch of a pass may be short (client/trainer.h).
uint64_t plannedSamples(uint64_t n, const wire::HyperParams& hp) {
  if (n == 0) return 0;
  if (hp.max_steps == 0) return n * hp.epochs;
  const uint64_t b = std::max<uint32_t>(hp.batch_size, 1);
  const uint64_t per_pass = (n + b - 1) / b;
  const uint64_t passes = hp.max_steps / per_pass;
  const uint64_t rest = hp.max_steps % per_pass;
  return passes * n + std::min(rest * b, n);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// What a virtual client's training job hands back: the outcome for its session, and the update
// encoded as a client's encoder encodes it (the bytes decide the upload time).
struct TrainOutcome {
  client::TrainingOutcome session;
  std::vector<client::EncodedChunk> chunks;
  double wall_seconds = 0;    // training
  double encode_seconds = 0;  // compressing the chunks
  // Secure aggregation: the delta and its chunk plan, encoded once the client can mask.
  std::vector<float> delta;
  std::vector<client::ChunkRange> plan;
};

// State each virtual client keeps across its tasks (the error-feedback residual of a biased
// codec, its model.local part), made on first use: a client that never needed it holds nothing.
// A client has one task at a time, so each entry has one user at a time; the lock guards only
// the map, and a reference into an unordered_map stays valid as it grows.
template <typename T>
class PerClient {
 public:
  explicit PerClient(std::function<T()> make) : make_(std::move(make)) {}
  T& of(uint64_t client) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(client);
    if (it == map_.end()) it = map_.emplace(client, make_()).first;
    return it->second;
  }

 private:
  std::function<T()> make_;
  std::mutex mu_;
  std::unordered_map<uint64_t, T> map_;  // GUARDED_BY(mu_)
};
using Residuals = PerClient<compress::ErrorFeedback>;

struct EvalPiece {
  double loss_sum = 0;
  uint64_t correct = 0;  // accuracy * n, rounded (exact: accuracy is correct / n)
  bool has_accuracy = false;
  uint64_t n = 0;
  std::vector<std::pair<std::string, double>> metric_sums;  // each metric * n, in order

  // Adds one evaluation's figures (pieces of one model's evaluation: the same metrics).
  void add(const model::EvalResult& r) { add(from(pieceOf(r))); }
  // One piece's sums as a worker job reports them (sim/sim_jobs.h).
  static EvalPiece from(const wire::SimEvalPiece& p) {
    EvalPiece e;
    e.n = p.n;
    e.loss_sum = p.loss_sum;
    e.correct = p.correct;
    e.has_accuracy = p.has_accuracy;
    e.metric_sums = p.metric_sums;
    return e;
  }
  void add(const EvalPiece& o) {
    n += o.n;
    loss_sum += o.loss_sum;
    correct += o.correct;
    has_accuracy = has_accuracy || o.has_accuracy;
    if (metric_sums.empty()) {
      metric_sums = o.metric_sums;
    } else {
      for (size_t i = 0; i < o.metric_sums.size() && i < metric_sums.size(); ++i) {
        metric_sums[i].second += o.metric_sums[i].second;
      }
    }
  }
  std::optional<double> accuracy() const {
    if (!has_accuracy || n == 0) return std::nullopt;
    return static_cast<double>(correct) / static_cast<double>(n);
  }
};

// kSecAggUp: a client's secure-aggregation message reaches the coordinator; kSecAggDown: the
// coordinator's reaches a client (both kept in Simulator::secagg_mail_ under the event's token).
enum class EventKind {
  kTrainDone,
  kChunk,
  kSummary,
  kDropOut,
  kRejoin,
  kClientError,
  kSecAggUp,
  kSecAggDown
};

struct Event {
  double time = 0;
  uint64_t seq = 0;
  EventKind kind = EventKind::kTrainDone;
  uint64_t token = 0;
  uint64_t client = 0;
  uint32_t chunk = 0;
  bool operator>(const Event& o) const { return time != o.time ? time > o.time : seq > o.seq; }
};

// The secure-aggregation stage a dropping client goes in, when not during the key stages.
enum class SecAggDrop { kNone, kDuringUpload, kAtUnmasking };

struct InFlight {
  uint64_t client = 0;
  engine::ClientId id;
  uint32_t round = 0;
  double sent_at = 0;
  double download_s = 0;
  double compute_s = 0;
  double done_at = 0;            // when training ends (infinite: never reports)
  client::TrainOptions options;  // the local work this client does (stragglers, partial work)
  std::future<Result<TrainOutcome>> result;
  std::shared_ptr<std::atomic<bool>> stop;
  // The upload: encoded chunks waiting for the session, then the frames on their way (arrival
  // times on the uplink from upload_base, the grant's time).
  std::vector<client::EncodedChunk> encoded;
  double encode_seconds = 0;
  double upload_base = 0;
  double upload_sent = 0;  // bytes on the uplink so far
  std::vector<wire::Chunk> chunks;
  std::vector<uint64_t> frame_bytes;
  wire::Summary summary;
  uint64_t summary_bytes = 0;
  wire::Error error;  // what the client answered instead of training (kClientError)
  // Secure aggregation: the delta until it is masked, the virtual seconds its masking takes
  // (before the first chunk leaves), and when a dropping client goes (infinite: it stays).
  std::vector<float> delta;
  std::vector<client::ChunkRange> plan;
  double mask_s = 0;
  double drop_at = std::numeric_limits<double>::infinity();
  uint64_t task_seed = 0;  // hparams.seed: the masked chunks' rounding seeds
  // Secure aggregation: a client that trains and then drops in a later stage.
  SecAggDrop secagg_drop = SecAggDrop::kNone;
};

struct PendingEval {
  uint32_t round = 0;
  double at = 0;  // virtual time of the Evaluate action
  // The evaluation's jobs in sample order, each the pieces of its stretch in order.
  std::vector<std::future<Result<std::vector<wire::SimEvalPiece>>>> pieces;
};

class Simulator final : public FleetSimulator, private driver::DriverPort {
 public:
  // Jobs still queued (a cancelled task's training) use data_ and residuals_: finish them first.
  ~Simulator() override { pool_.reset(); }
  Status init(const config::Config& config, std::shared_ptr<RemoteWorkers> remote);
  const std::string& alreadyFinished() const override { return already_finished_; }
  Result<SimSummary> run() override;
  void stop() override { stop_.store(true); }
  int64_t runId() const override { return run_id_; }
  const client::ClientSession* clientSession(uint64_t k) const override {
    auto it = sessions_.find(k);
    return it == sessions_.end() ? nullptr : &it->second;
  }
  void setReceiveFilter(ReceiveFilter filter) override { receive_filter_ = std::move(filter); }

 private:
  engine::ClientId idOf(uint64_t k) const {
    std::string digits = std::to_string(k);
    if (digits.size() < id_width_) digits.insert(0, id_width_ - digits.size(), '0');
    return "v" + digits;
  }
  static uint64_t indexOf(const engine::ClientId& id) { return std::stoull(id.substr(1)); }
  wire::Hello helloFor(uint64_t k, const ClientProfile& p, uint64_t session) const;

  void push(double t, EventKind kind, uint64_t token, uint64_t client, uint32_t chunk = 0) {
    events_.push(Event{t, next_seq_++, kind, token, client, chunk});
  }
  Status carryOut() {
    Status st = driver_->carryOut(*engine_);
    flushTraining();
    return st;
  }
  // DriverPort: messages reach virtual clients as events, evaluations run on the pool.
  void sendTask(engine::SendTask& send) override { dispatch(send); }
  void sendCancel(const engine::SendCancel& a) override { cancel(a); }
  void sendGrant(const engine::SendGrant& a) override { grant(a); }
  void sendSecAgg(const engine::SendSecAgg& a) override { secAggDown(a); }
  void sendError(const engine::SendError& a) override { rejected(a); }
  void sendBye(const engine::SendBye&) override {}  // virtual clients need no goodbye
  void evaluate(const engine::Evaluate& ev) override;
  void evaluateBlocks(const engine::EvaluateBlocks& ev) override;
  void stampRound(engine::CommitRound& commit) override;
  void roundCommitted(const engine::CommitRound& commit) override;
  void blockMetricsRecorded(const std::vector<history::BlockMetricRecord>& rows) override;

  void dispatch(engine::SendTask& st);
  void handle(const Event& e);
  // Client k drops out now: it says goodbye and comes back sim.rejoin_s later.
  void goOffline(uint64_t k);
  void onTrainDone(uint64_t token, InFlight& f);
  // Virtual clients: each runs a client::ClientSession (created when first sampled), fed on
  // the loop thread; runSession carries out what it asks for.
  client::ClientSession& sessionOf(uint64_t k);
  void runSession(uint64_t k);
  void carryOut(uint64_t k, client::ClientAction& action);
  void submitTraining(uint64_t token, InFlight& f, const client::TrainingRequest& request);
  // sim.batch_clients: the training jobs submitted since the last call, split into one batch
  // per worker (in submission order) and run there with runTrainJobs. Called after every
  // carryOut(), so a round's dispatched tasks batch together, and before any wait on a result.
  void flushTraining();
  // The engine's answers to a virtual client, through its session (tell: when it has one).
  void tell(const engine::ClientId& id, const std::function<void(client::ClientSession&)>& event);
  void grant(const engine::SendGrant& g);
  // Secure aggregation: the coordinator's message to a client, and a client's to the
  // coordinator, delivered over the client's link after its cryptographic work.
  void secAggDown(const engine::SendSecAgg& a);
  void secAggUp(uint64_t k, wire::SecAgg message);
  // Masks the update of `token` (SendUploadRequest with a masker) into encoded chunks.
  Status maskUpload(InFlight& f, const client::SendUploadRequest& ask);
  void cancel(const engine::SendCancel& c);
  void rejected(const engine::SendError& e);
  void submitEvaluation(const engine::Evaluate& ev);
  // Feeds finished evaluations to the engine in round order; `block` waits for the oldest.
  void collectEvaluations(bool block);
  wire::SimModelRecipe modelRecipe() const {
    const model::InputShape shape = data_->inputShape();
    return {config_.model.name, config_.model.path,
            config_.run.seed,   shape.sample,
            shape.classes,      wire::parseLoss(config_.train.loss).value(),  // validated
            config_.sim.device};
  }

  // Opens the history and begins a new run (its model described as `model_json`); with
  // coordinator.resume, the interrupted run's file behind a ReplayHistory
  // (sim/replay_history.h).
  Status openHistory(const std::string& model_json);

  config::Config config_;
  std::unique_ptr<history::HistoryStore> file_;  // --resume: the file history_ replays
  std::unique_ptr<history::HistoryStore> history_;
  ReplayHistory* replay_ = nullptr;               // history_ when resuming, else null
  std::string already_finished_;                  // --resume of a run that has nothing left to do
  std::unique_ptr<driver::EngineDriver> driver_;  // over history_ and this
  std::unique_ptr<FleetData> data_;
  std::optional<Fleet> fleet_;
  std::unique_ptr<WorkerPool> pool_;
  // The MPI ranks that train and evaluate (sim/remote_workers.h); null: pool_ does it all.
  std::shared_ptr<RemoteWorkers> remote_;
  std::shared_ptr<const model::Layout> layout_;  // the run's model's
  std::unique_ptr<Residuals> residuals_;
  model::LocalPart local_part_;                                 // model.local
  std::unique_ptr<PerClient<model::LocalState>> local_states_;  // each client's values of it
  compress::ResidualStorage residual_storage_ = compress::ResidualStorage::kBf16;
  wire::Precision precision_ = wire::Precision::kFp32;  // sim.precision: every training job's
  // The virtual clients' sessions (their protocol state: c_k, the served model, uploads), and
  // the server c of the latest SCAFFOLD task, shared by every task of that model version.
  std::unordered_map<uint64_t, client::ClientSession> sessions_;
  std::shared_ptr<const std::string> control_cache_;
  uint64_t control_version_ = UINT64_MAX;
  ReceiveFilter receive_filter_;
  // Secure aggregation messages on their way, by mail id (the event's token), with their
  // recipient; clients offline since they dropped (their mail is lost).
  std::map<uint64_t, std::pair<uint64_t, wire::SecAgg>> secagg_mail_;
  // Tasks whose client goes when the unmasking request reaches it (SecAggDrop::kAtUnmasking).
  std::set<uint64_t> unmask_drops_;
  uint64_t next_mail_ = 1;
  std::set<uint64_t> offline_;
  // Ticks at one wakeup time that changed nothing (no event scheduled, the round the same):
  // past kMaxIdleTicks the run ends instead of spinning (run()).
  static constexpr uint32_t kMaxIdleTicks = 1000;
  uint32_t idle_ticks_ = 0;
  double last_tick_at_ = -1;
  uint64_t seq_at_last_tick_ = 0;
  uint32_t round_at_last_tick_ = 0;
  // What a run that could not go on should know of the fleet: clients away (dropped out and
  // when the first is back, offline by availability) and the keys that change it; "" when
  // every client is there.
  std::string fleetStateNote() const;
  double ingress_bytes_per_s_ = 0;  // sim.coordinator_ingress_mbps (0: unlimited)
  // Testing and benchmarks (sim.attackers, sim.attack; sim/attack.h): clients 0 .. attackers_-1
  // upload attack_'s update instead of their own.
  std::optional<Attack> attack_;
  uint64_t attackers_ = 0;
  // The rate at which an upload of a client with profile p arrives.
  double uploadRate(const ClientProfile& p) const {
    return ingress_bytes_per_s_ > 0 ? std::min(p.up_bytes_per_s, ingress_bytes_per_s_)
                                    : p.up_bytes_per_s;
  }
  std::unique_ptr<engine::RoundEngine> engine_;
  std::unique_ptr<ProgressDisplay> progress_;
  int64_t run_id_ = 0;
  size_t id_width_ = 1;
  double ref_samples_per_s_ = 1;
  uint64_t num_params_ = 0;
  std::atomic<bool> stop_{false};

  double now_ = 0;  // virtual seconds
  uint64_t next_seq_ = 0;
  uint64_t next_session_ = 2;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  std::unordered_map<uint64_t, InFlight> in_flight_;
  // sim.batch_clients: jobs waiting for flushTraining, each with the promise its task's
  // InFlight::result waits on and what its client does with the result.
  struct PendingTraining {
    std::shared_ptr<const wire::SimTrainJob> job;
    std::shared_ptr<std::atomic<bool>> stop;
    std::function<Result<TrainOutcome>(wire::SimTrainResult)> finish;
    std::shared_ptr<std::promise<Result<TrainOutcome>>> promise;
  };
  std::vector<PendingTraining> pending_training_;
  std::deque<PendingEval> evals_;
  std::set<uint64_t> recorded_clients_;
  std::set<uint64_t> participants_;
  std::map<uint32_t, double> wall_start_, wall_end_;
  std::map<std::pair<uint32_t, engine::ClientId>, double> wall_compute_;
  std::map<std::pair<uint32_t, engine::ClientId>, double> decode_wall_;

  wire::HyperParams hparams_;  // the configured local work (selector speed hints)
  SimSummary summary_;
  std::vector<double> round_virtual_s_, round_wall_s_;
};

wire::Hello Simulator::helloFor(uint64_t k, const ClientProfile& p, uint64_t session) const {
  wire::Hello h;
  h.client_id = idOf(k);
  h.device_kind = p.gpu ? wire::DeviceKind::kCuda : wire::DeviceKind::kCpu;
  h.device_name = fleet_->tiers()[p.tier].name;
  h.cores = 1;
  h.memory_bytes = static_cast<uint64_t>(p.memory_mib * 1024 * 1024);
  h.data_size = data_->shardSize(k);
  h.requested_partition = static_cast<int32_t>(std::min<uint64_t>(k, INT32_MAX));
  h.session = session;
  return h;
}

Status Simulator::init(const config::Config& config, std::shared_ptr<RemoteWorkers> remote) {
  config_ = config;
  remote_ = std::move(remote);
  FEDFLEET_RETURN_IF_ERROR(config_.validate());
  // A device this process cannot use fails here, once (the MPI ranks check their own).
  FEDFLEET_RETURN_IF_ERROR(deviceOf(config_.sim.device).status());
  const auto& sc = config_.sim;
  if (config_.data.partition == "none") {
    return invalidArgument(
        "data.partition = \"none\" means each client trains the files it holds (a client process "
        "with its own data.path); the simulator splits one data set over its virtual clients: "
        "choose iid, dirichlet, labels, shards or quantity");
  }
  if (sc.clients > static_cast<uint64_t>(INT32_MAX)) {
    return invalidArgument("sim.clients must be at most " + std::to_string(INT32_MAX));
  }
  AvailabilityOptions avail;
  avail.mode = sc.availability;
  avail.online_hours = sc.online_hours;
  avail.dropout = sc.dropout;
  FEDFLEET_ASSIGN_OR_RETURN(Fleet fleet,
                            Fleet::create(sc.fleet, sc.clients, config_.run.seed, avail));
  fleet_.emplace(std::move(fleet));
  FEDFLEET_ASSIGN_OR_RETURN(data_, FleetData::create(config_, sc.clients));

  // The initial model (the same seed gives the same weights as a real coordinator's).
  // Start-up check: a model that does not fit the data fails here, once, not in every round.
  FEDFLEET_ASSIGN_OR_RETURN(const ClientShard first, data_->shard(0));
  FEDFLEET_ASSIGN_OR_RETURN(auto model,
                            driver::createRunModel(config_, data_->inputShape(),
                                                   {first.data.get(), data_->testSet().get()}));
  FEDFLEET_ASSIGN_OR_RETURN(model::LocalPart local_part,
                            model::LocalPart::of(model->layout(), config_.model.local));
  local_part_ = std::move(local_part);
  local_states_ = std::make_unique<PerClient<model::LocalState>>([part = local_part_] {
    return model::LocalState{part, {}, ""};
  });
  std::vector<float> params = model->flatParameters();
  num_params_ = params.size();
  layout_ = std::make_shared<const model::Layout>(model->layout());
  ref_samples_per_s_ =
      sc.reference_gflops * 1e9 / trainFlopsPerSample(config_.model.name, num_params_);

  FEDFLEET_RETURN_IF_ERROR(
      openHistory(model::describeModel(*model, data_->inputShape(), config_.model.path)));
  driver_ = std::make_unique<driver::EngineDriver>(
      *history_, static_cast<driver::DriverPort&>(*this), driver::checkpointKeepFromConfig(config_),
      "s virtual");

  engine::EngineOptions eo = driver::engineOptionsFromConfig(config_, run_id_);
  eo.server_eval = true;  // the simulator always holds a test set (a file or a hold-out)
  eo.liveness_s = 0;      // virtual clients send no heartbeats; losses are reported as goodbyes
  eo.sample_partitions = false;
  eo.num_partitions = static_cast<uint32_t>(sc.clients);
  eo.min_clients = static_cast<uint32_t>(std::min<uint64_t>(config_.minClients(), sc.clients));
  eo.bye_on_finish = false;
  // Upload credits (coordinator.max_concurrent_uploads) run as configured: each virtual
  // client's session asks for its grant and waits for it, in virtual time.
  ingress_bytes_per_s_ = sc.coordinator_ingress_mbps * 1e6 / 8;
  if (sc.attackers > 0) {
    FEDFLEET_ASSIGN_OR_RETURN(Attack attack, parseAttack(sc.attack));
    attack_ = attack;
    attackers_ =
        static_cast<uint64_t>(std::llround(sc.attackers * static_cast<double>(sc.clients)));
  }
  // Client k trains partition k: its shard's size bounds the samples its updates may claim.
  eo.partition_sizes.resize(sc.clients);
  for (uint64_t k = 0; k < sc.clients; ++k) eo.partition_sizes[k] = data_->shardSize(k);
  FEDFLEET_RETURN_IF_ERROR(engine::checkEngineOptions(eo));
  hparams_ = eo.hparams;
  engine_ = std::make_unique<engine::RoundEngine>(eo, std::move(params));
  engine_->setEligibility([this](const engine::ClientId& id, double t) {
    return fleet_->online(fleet_->profile(indexOf(id)), t);
  });
  // What a deployment learns by asking devices (or from history), the simulator knows from
  // the profile: the expected task duration at the configured work, and how long a client
  // stays online.
  engine_->setSelectorHints(
      [this](const std::string& id) {
        const uint64_t k = indexOf(id);
        const ClientProfile p = fleet_->profile(k);
        const double bytes = static_cast<double>(num_params_ * sizeof(float));
        const double samples = static_cast<double>(plannedSamples(data_->shardSize(k), hparams_));
        return 2 * p.latency_s + bytes / p.down_bytes_per_s + bytes / p.up_bytes_per_s +
               samples / (p.speed * ref_samples_per_s_);
      },
      [this](const std::string& id, double t) {
        return fleet_->onlineUntil(fleet_->profile(indexOf(id)), t) - t;
      });

  id_width_ = std::to_string(sc.clients - 1).size();
  for (uint64_t k = 0; k < sc.clients; ++k) {
    engine_->registerClient(idOf(k), helloFor(k, fleet_->profile(k), 1), 0.0);
  }
  FEDFLEET_ASSIGN_OR_RETURN(auto storage, compress::parseResidualStorage(sc.residual_storage));
  residuals_ = std::make_unique<Residuals>(
      [n = num_params_, storage] { return compress::ErrorFeedback(n, storage); });
  residual_storage_ = storage;
  FEDFLEET_ASSIGN_OR_RETURN(precision_, wire::parsePrecision(sc.precision));
  if (precision_ == wire::Precision::kBf16 && sc.device == "cpu" && !cpuHasFastBf16()) {
    spdlog::warn(
        "sim.precision = \"bf16\" on a CPU without avx512_bf16 or amx_bf16: LibTorch emulates "
        "bf16 here, slower than fp32 and, in its fallback matrix product, summing in bf16");
  }
  pool_ = std::make_unique<WorkerPool>(sc.workers);
  progress_ = std::make_unique<ProgressDisplay>(sc.progress, config_.run.rounds);
  const std::string workers =
      remote_ ? remote_->describe() : std::to_string(pool_->size()) + " workers";
  spdlog::info(
      "sim: run {}: {} clients ({} fleet, {} availability), {} a round, {} rounds, model {} "
      "({} parameters), {} on {}; reference device {:.0f} samples/s",
      run_id_, sc.clients, sc.fleet, sc.availability, config_.coordinator.clients_per_round,
      config_.run.rounds, config_.model.name, num_params_, workers, config_.sim.device,
      ref_samples_per_s_);
  return Status::ok();
}

Status Simulator::openHistory(const std::string& model_json) {
  const std::string& db = config_.history.db;
  if (!config_.coordinator.resume) {
    if (db == ":memory:") {
      history_ = history::createMemoryHistory();
    } else {
      FEDFLEET_ASSIGN_OR_RETURN(history_, history::openSqliteHistory(db));
    }
    history::RunRecord run;
    run.name = config_.run.name;
    // data.normalize = "computed": the statistics used, recorded with the run's config.
    config::Config recorded = config_;
    if (config_.data.normalize == "computed") {
      recorded.data.mean = data_->normalization().mean;
      recorded.data.stddev = data_->normalization().stddev;
    }
    run.config_json = recorded.toJson().dump();
    run.started_at = unixNow();
    run.seed = config_.run.seed;
    run.clock = "virtual";
    run.model_json = model_json;
    FEDFLEET_ASSIGN_OR_RETURN(run_id_, history_->beginRun(run));
    return Status::ok();
  }
  if (db == ":memory:") {
    return invalidArgument(
        "--resume continues the run recorded in a history file: give it with --db (history.db "
        "is :memory:, which keeps nothing)");
  }
  FEDFLEET_ASSIGN_OR_RETURN(file_, history::openSqliteHistory(db));
  // Changes are never accepted here (a replay needs the recorded config), so they are listed
  // to be refused with that reason.
  config::Config listing = config_;
  listing.coordinator.resume_changes = true;
  FEDFLEET_ASSIGN_OR_RETURN(driver::ResumePoint point, driver::findResumableRun(*file_, listing));
  if (!point.changes.empty()) {
    return failedPrecondition(
        "--resume: this config changes " + point.label + ": " +
        driver::describeChanges(point.changes) +
        ". A simulation continues by replaying its recorded rounds, so it resumes only with the "
        "run's own config; to run with these changes, give the run another run.name");
  }
  run_id_ = point.run_id;
  if (!point.already_finished.empty()) {
    already_finished_ = point.label + " already finished (its last round is " +
                        std::to_string(point.last_round) +
                        " of run.rounds = " + std::to_string(config_.run.rounds) + " in " + db +
                        "); nothing to resume. To simulate it again, give the run another "
                        "run.name";
  }
  FEDFLEET_ASSIGN_OR_RETURN(auto replay, ReplayHistory::create(*file_, run_id_));
  replay_ = replay.get();
  history_ = std::move(replay);
  spdlog::info("sim: resuming {} of {}: replaying its {} recorded round(s), then continuing",
               point.label, db, point.last_round);
  return Status::ok();
}

client::ClientSession& Simulator::sessionOf(uint64_t k) {
  auto it = sessions_.find(k);
  if (it != sessions_.end()) return it->second;
  client::ClientSessionOptions o;
  o.client_id = idOf(k);
  o.control_storage = residual_storage_;
  o.served_evaluation = client::ClientSessionOptions::ServedEvaluationPolicy::kWhenBytesArrive;
  o.progress_level = spdlog::level::debug;  // one line per virtual client's task: debug only
  // Secure aggregation's secrets from the seed, the round and the client (never the token,
  // which is random): the same seed gives the same history.
  o.secagg_key = [this, k](uint64_t token) {
    auto it = in_flight_.find(token);
    const uint32_t round = it == in_flight_.end() ? 0 : it->second.round;
    return crypto::streamKeyFromSeed("fedfleet sim secagg", mix(config_.run.seed, round, k));
  };
  return sessions_.try_emplace(k, std::move(o)).first->second;
}

void Simulator::dispatch(engine::SendTask& st) {
  const wire::Task& task = st.task;
  const uint64_t k = indexOf(st.client);
  const ClientProfile p = fleet_->profile(k);
  wall_start_.emplace(task.round, unixNow());
  participants_.insert(k);
  if (recorded_clients_.insert(k).second) {
    const wire::Hello h = helloFor(k, p, 1);
    history::ClientRecord rec;
    rec.client_id = st.client;
    rec.device_kind = wire::deviceKindName(h.device_kind);
    rec.device_name = h.device_name;
    rec.cores = h.cores;
    rec.memory_bytes = h.memory_bytes;
    rec.data_size = h.data_size;
    rec.first_seen = now_;
    rec.last_seen = now_;
    driver_->upsertClient(rec);
  }

  InFlight f;
  f.client = k;
  f.id = st.client;
  f.round = task.round;
  f.sent_at = now_;
  const uint64_t down_bytes =
      st.model_bytes->size() + (st.served_bytes ? st.served_bytes->size() : 0);
  f.download_s = p.latency_s + static_cast<double>(down_bytes) / p.down_bytes_per_s;
  wire::HyperParams hp = task.hparams;
  const double samples_per_s = p.speed * ref_samples_per_s_;
  const auto& sc = config_.sim;
  const uint64_t token = task.task_token;
  bool reports = true;
  if (sc.stragglers > 0 && hp.epochs > 1 && hp.max_steps == 0) {
    // A straggler this round: only 1..E-1 epochs (uniform), drawn from (seed, round, client).
    const uint64_t h = mix(config_.run.seed ^ 0x73747267ull, task.round, k);
    if (unitInterval(h) < sc.stragglers) {
      if (sc.straggler_mode == "drop") {
        reports = false;  // it gets the task but never reports: late at the deadline
      } else {
        hp.epochs = 1 + static_cast<uint32_t>(unitInterval(mix(h, 7, 0)) * (hp.epochs - 1));
      }
    }
  }
  if (reports) {
    f.compute_s = static_cast<double>(plannedSamples(data_->shardSize(k), hp)) / samples_per_s;
    if (hp.stop_after_s > 0 && f.compute_s > hp.stop_after_s) {
      // Partial work: the client is stopped stop_after_s after receipt and sends the steps it
      // finished by then (at least one), as a real client's stop flag would.
      const double steps_fit =
          std::floor(hp.stop_after_s * samples_per_s / std::max<uint32_t>(hp.batch_size, 1));
      hp.max_steps = static_cast<uint32_t>(std::clamp(steps_fit, 1.0, 1e9));
      f.compute_s = static_cast<double>(plannedSamples(data_->shardSize(k), hp)) / samples_per_s;
    }
    if (task.fed_eval) {
      // Federated evaluation first: a forward pass over its held-out samples, a third of a
      // training step's work per sample (forward, backward, update).
      f.compute_s += static_cast<double>(data_->heldOutSize(k)) / (3 * samples_per_s);
    }
    f.done_at = now_ + f.download_s + f.compute_s;
    const double upload_guess =
        p.latency_s + static_cast<double>(num_params_ * sizeof(float)) / p.up_bytes_per_s;

    // Dropping out: the per-round draw, or the end of the client's online window. The task is
    // lost with the client: its session never takes it.
    double drop_at = std::numeric_limits<double>::infinity();
    double fraction = 0;
    if (fleet_->dropsOut(p, k, task.round, &fraction)) {
      drop_at = now_ + f.download_s + fraction * f.compute_s;
      if (task.secagg.on()) {
        // Under secure aggregation the drop falls in one of its stages, each as likely: the key
        // stages (while it trains, as above), its masked upload (after part of it, or before
        // the first chunk when it is one chunk), or the unmasking (after its whole upload).
        const double stage = unitInterval(mix(config_.run.seed ^ 0x5ec466c1ull, task.round, k));
        if (stage >= 1.0 / 3) {
          f.secagg_drop = stage < 2.0 / 3 ? SecAggDrop::kDuringUpload : SecAggDrop::kAtUnmasking;
          drop_at = std::numeric_limits<double>::infinity();
        }
      }
    }
    const double offline_at = fleet_->onlineUntil(p, now_);
    if (offline_at < f.done_at + upload_guess) {
      drop_at = std::min(drop_at, offline_at);
      f.secagg_drop = SecAggDrop::kNone;  // its window closes first
    }
    if (f.secagg_drop == SecAggDrop::kAtUnmasking) unmask_drops_.insert(token);
    if (std::isfinite(drop_at)) {
      push(drop_at, EventKind::kDropOut, token, k);
      if (!task.secagg.on()) {
        in_flight_.emplace(token, std::move(f));
        return;
      }
      // Secure aggregation: it takes part in the key stages until it goes, never reporting.
      f.drop_at = drop_at;
      f.compute_s = std::numeric_limits<double>::infinity();
      f.done_at = f.compute_s;
    }
    f.options = client::trainOptionsFrom(hp);
    f.options.precision = precision_;
  } else {
    f.compute_s = std::numeric_limits<double>::infinity();
    f.done_at = f.compute_s;
  }
  in_flight_.emplace(token, std::move(f));

  // The client receives the task: its session checks it and asks for its training.
  client::ReceivedTask received;
  received.model_bytes = st.model_bytes;
  received.served_bytes = st.served_bytes;
  if (task.hparams.scaffold) {
    if (task.model_version != control_version_ || !control_cache_) {
      control_cache_ = std::make_shared<const std::string>(std::move(st.task.control_bytes));
      control_version_ = task.model_version;
    }
    received.control_bytes = control_cache_;
  }
  received.task = std::move(st.task);
  received.task.control_bytes.clear();
  if (receive_filter_) receive_filter_(k, received);
  sessionOf(k).onTask(std::move(received), now_);
  runSession(k);
}

// Waits for a remote worker's answer to `what` and decodes it as a result of kind T (an
// answer of another kind is kInternal: the ranks disagree about the protocol).
template <typename T>
Result<T> awaitRemote(std::future<Result<std::string>>& reply, const char* what) {
  FEDFLEET_ASSIGN_OR_RETURN(std::string bytes, reply.get());
  FEDFLEET_ASSIGN_OR_RETURN(wire::SimJobResult got, wire::decodeSimJobResult(bytes));
  T* r = std::get_if<T>(&got);
  if (r == nullptr)
    return internalError(std::string("an MPI worker answered ") + what +
                         " with the result of another kind of job");
  return std::move(*r);
}

// A client-side evaluation as a worker job reports it, as the client's session takes it.
Result<client::ServedEvaluation> servedEvaluationOf(const wire::SimEvaluation& e) {
  if (!e.status.isOk()) return e.status;
  return client::ServedEvaluation{e.n, e.loss, e.accuracy, e.metrics};
}

void Simulator::submitTraining(uint64_t token, InFlight& f, const client::TrainingRequest& r) {
  f.task_seed = r.task.hparams.seed;
  if (!std::isfinite(f.done_at)) return;  // a dropping straggler: it never reports
  f.stop = std::make_shared<std::atomic<bool>>(false);
  const uint64_t k = f.client;
  compress::ErrorFeedback* residual =
      compress::usesErrorFeedback(r.codec->spec()) ? &residuals_->of(k) : nullptr;
  model::LocalState* local = local_part_.empty() ? nullptr : &local_states_->of(k);
  auto request = std::make_shared<const client::TrainingRequest>(r);

  // The job: what a worker needs, by value (sim/sim_jobs.h), here or on an MPI rank.
  auto job = std::make_shared<wire::SimTrainJob>();
  job->client = k;
  job->recipe = modelRecipe();
  const client::TrainOptions& o = f.options;
  job->epochs = o.epochs;
  job->max_steps = o.max_steps;
  job->batch_size = o.batch_size;
  job->lr = o.lr;
  job->momentum = o.momentum;
  job->weight_decay = o.weight_decay;
  job->prox_mu = o.prox_mu;
  job->optimizer = o.optimizer;
  job->precision = o.precision;
  job->seed = o.seed;
  if (local != nullptr) {  // the task's model with the client's own local part
    std::vector<float> start = client::floatsOf(*r.model_bytes);
    local->applyTo(start);
    job->start = std::make_shared<const std::string>(reinterpret_cast<const char*>(start.data()),
                                                     start.size() * sizeof(float));
  } else {
    job->start = r.model_bytes;
  }
  if (r.task.hparams.scaffold) {
    job->scaffold = true;
    job->control_c = r.control_c;
    job->control_ck = r.control_ck;
  }
  job->fed_eval = r.task.fed_eval;
  job->served = r.served_to_evaluate;

  // What the client does with its trained delta, on this process: its model.local part, then
  // compressing as a client's encoder does (the same chunks and per-chunk seeds,
  // client/upload_pipeline.h) through its error-feedback residual, which never leaves here.
  const uint64_t run_seed = config_.run.seed;
  // An attacking client (sim.attack): the bound it aims inside is the one known now.
  std::optional<Attack> attack;
  std::optional<double> bound;
  if (attack_ && k < attackers_) {
    attack = attack_;
    bound = engine_->normBound();
  }
  auto finish = [job, request, residual, local, run_seed, k, attack, bound,
                 layout = layout_](wire::SimTrainResult t) -> Result<TrainOutcome> {
    FEDFLEET_RETURN_IF_ERROR(t.status);
    const client::TrainingRequest& req = *request;
    const bool scaffold = req.task.hparams.scaffold;
    if (local != nullptr) {
      FEDFLEET_RETURN_IF_ERROR(local->absorb(client::floatsOf(*job->start), t.delta));
    }
    TrainOutcome out;
    if (t.fed_evaluation) out.session.fed_evaluation = servedEvaluationOf(*t.fed_evaluation);
    if (t.served_evaluation) {
      out.session.served_evaluation = servedEvaluationOf(*t.served_evaluation);
    }
    out.session.steps = t.steps;
    out.session.stopped_early = t.stopped_early;
    out.session.mean_loss = t.mean_loss;
    out.session.sum_sq_loss = t.sum_sq_loss;
    out.session.control_delta = t.control_delta;
    out.wall_seconds = t.wall_seconds;
    const auto t1 = std::chrono::steady_clock::now();
    client::TrainResult trained;
    trained.delta = std::move(t.delta);
    trained.control_delta = std::move(t.control_delta);
    std::vector<float> delta = client::takeUpload(trained);
    if (req.task.local_dp.on()) {  // the client's own noise, seeded by (seed, round, client)
      client::applyLocalDp(
          req.task.local_dp, delta.data(), delta.size(),
          crypto::KeyedStream(
              crypto::streamKeyFromSeed("fedfleet sim local dp", mix(run_seed, req.task.round, k)),
              0, 0));
    }
    if (attack) applyAttack(*attack, bound, delta.data(), delta.size());
    const auto plan =
        client::planUploadChunks(*layout, req.task.chunk_bytes, scaffold, req.codec->spec());
    if (req.task.secagg.on()) {  // masked once the key stages let it (Simulator::maskUpload)
      out.delta = std::move(delta);
      out.plan = plan;
    }
    for (size_t j = 0; j < plan.size() && !req.task.secagg.on(); ++j) {
      client::EncodedChunk c;
      c.index = j;
      c.range = plan[j];
      c.last = j + 1 == plan.size();
      const uint64_t seed = client::chunkSeed(req.task.hparams.seed, j);
      FEDFLEET_RETURN_IF_ERROR(client::encodeUploadChunk(
          *req.codec, plan[j], delta.data() + plan[j].offset, residual, seed, &c.payload));
      out.chunks.push_back(std::move(c));
    }
    out.encode_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    return out;  // the delta is gone: only the payloads travel on
  };

  if (remote_) {
    auto reply = std::make_shared<std::future<Result<std::string>>>(
        remote_->submit(wire::encodeSimJob(*job)));
    f.result = pool_->submit([reply, finish]() -> Result<TrainOutcome> {
      FEDFLEET_ASSIGN_OR_RETURN(wire::SimTrainResult t,
                                awaitRemote<wire::SimTrainResult>(*reply, "a training job"));
      return finish(std::move(t));
    });
  } else if (config_.sim.batch_clients) {
    auto promise = std::make_shared<std::promise<Result<TrainOutcome>>>();
    f.result = promise->get_future();
    pending_training_.push_back({job, f.stop, finish, std::move(promise)});
  } else {
    const FleetData* data = data_.get();
    f.result = pool_->submit([job, data, stop = f.stop, finish]() -> Result<TrainOutcome> {
      return finish(runTrainJob(*job, *data, stop.get()));
    });
  }
  push(f.done_at, EventKind::kTrainDone, token, k);
}

void Simulator::flushTraining() {
  if (pending_training_.empty()) return;
  std::vector<PendingTraining> pending = std::move(pending_training_);
  pending_training_.clear();
  // Contiguous groups of near-equal size, one per worker, so that every worker has work.
  const size_t groups = std::min(pool_->size(), pending.size());
  const FleetData* data = data_.get();
  size_t begin = 0;
  for (size_t g = 0; g < groups; ++g) {
    const size_t end = begin + (pending.size() - begin) / (groups - g);
    auto group = std::make_shared<std::vector<PendingTraining>>(
        std::make_move_iterator(pending.begin() + static_cast<std::ptrdiff_t>(begin)),
        std::make_move_iterator(pending.begin() + static_cast<std::ptrdiff_t>(end)));
    pool_->submit([group, data] {
      std::vector<const wire::SimTrainJob*> jobs;
      std::vector<const std::atomic<bool>*> stops;
      for (const auto& p : *group) {
        jobs.push_back(p.job.get());
        stops.push_back(p.stop.get());
      }
      size_t done = 0;
      try {
        std::vector<wire::SimTrainResult> results = runTrainJobs(jobs, *data, stops);
        for (; done < group->size(); ++done) {
          PendingTraining& p = (*group)[done];
          p.promise->set_value(p.finish(std::move(results[done])));
        }
      } catch (const std::exception& e) {  // no exception leaves a worker: the loop waits on these
        for (; done < group->size(); ++done) {
          (*group)[done].promise->set_value(
              internalError(std::string("batched training: ") + e.what()));
        }
      }
    });
    begin = end;
  }
}

void Simulator::onTrainDone(uint64_t token, InFlight& f) {
  flushTraining();  // (a no-op unless sim.batch_clients left jobs waiting)
  Result<TrainOutcome> got = f.result.get();
  const uint64_t k = f.client;
  if (!got.isOk()) {
    spdlog::warn("sim: client {} round {}: training failed: {}", f.id, f.round,
                 got.status().toString());
    client::TrainingOutcome failed;
    failed.status = got.status().withContext("training failed");
    sessionOf(k).onTrainingDone(token, std::move(failed), now_);
    runSession(k);
    return;
  }
  TrainOutcome& out = *got;
  wall_compute_[{f.round, f.id}] = out.wall_seconds;
  f.encoded = std::move(out.chunks);
  f.encode_seconds = out.encode_seconds;
  f.delta = std::move(out.delta);
  f.plan = std::move(out.plan);
  // What the profile says, not the host: the virtual compute time, the data the client holds.
  out.session.compute_seconds = f.compute_s;
  out.session.partition_size = data_->shardSize(k);
  sessionOf(k).onTrainingDone(token, std::move(out.session), now_);
  runSession(k);
}

void Simulator::runSession(uint64_t k) {
  client::ClientSession& session = sessionOf(k);
  std::vector<client::ClientAction> actions;
  while (!(actions = session.takeActions()).empty()) {
    for (auto& a : actions) carryOut(k, a);
  }
}

// A virtual client's actions. Only time is simulated: the upload request and its grant cost
// none (they are small); every chunk frame and then the Summary go over the client's uplink
// one after the other from the grant on, arriving latency + bytes so far / rate later (the
// uplink, or sim.coordinator_ingress_mbps where that is lower).
void Simulator::carryOut(uint64_t k, client::ClientAction& action) {
  std::visit(
      [&](auto& a) {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<T, client::StartTraining>) {
          auto it = in_flight_.find(a.request->task.task_token);
          if (it != in_flight_.end()) submitTraining(it->first, it->second, *a.request);
        } else if constexpr (std::is_same_v<T, client::AbandonTraining>) {
          auto it = in_flight_.find(a.token);
          if (it != in_flight_.end() && it->second.stop) it->second.stop->store(true);
        } else if constexpr (std::is_same_v<T, client::SendSecAgg>) {
          secAggUp(k, std::move(a.message));
        } else if constexpr (std::is_same_v<T, client::SendUploadRequest>) {
          const uint64_t token = a.request.task_token;
          InFlight& f = in_flight_.at(token);
          if (a.masker && f.encoded.empty()) {
            Status masked = maskUpload(f, a);
            if (!masked.isOk()) {
              sessionOf(k).onEncodingFailed(token, masked);
              return;
            }
          }
          for (auto& c : f.encoded) sessionOf(k).onChunkEncoded(token, std::move(c));
          f.encoded.clear();
          engine_->onUploadRequest(f.id, token, now_);
        } else if constexpr (std::is_same_v<T, client::SendChunk>) {
          const uint64_t token = a.chunk.task_token;
          InFlight& f = in_flight_.at(token);
          const ClientProfile p = fleet_->profile(k);
          const uint64_t bytes = wire::encode(wire::Message(a.chunk)).size();
          f.upload_sent += static_cast<double>(bytes);
          const double t = f.upload_base + f.mask_s + p.latency_s + f.upload_sent / uploadRate(p);
          f.frame_bytes.push_back(bytes);
          f.chunks.push_back(std::move(a.chunk));
          if (f.secagg_drop == SecAggDrop::kDuringUpload && f.chunks.size() > f.plan.size() / 2) {
            // It goes with half its masked chunks sent (none of a one-chunk upload).
            f.secagg_drop = SecAggDrop::kNone;
            spdlog::debug(
                "sim: client {} round {}: drops out during its masked upload ({} of {} "
                "chunks sent)",
                f.id, f.round, f.chunks.size() - 1, f.plan.size());
            push(t, EventKind::kDropOut, token, k);
          }
          push(t, EventKind::kChunk, token, k, static_cast<uint32_t>(f.chunks.size() - 1));
          sessionOf(k).onChunkSent(token, t);
        } else if constexpr (std::is_same_v<T, client::SendSummary>) {
          const uint64_t token = a.summary.task_token;
          InFlight& f = in_flight_.at(token);
          const ClientProfile p = fleet_->profile(k);
          f.summary = a.summary;
          f.summary.upload_seconds = 0;
          f.summary.encode_seconds = f.encode_seconds;
          f.summary_bytes = wire::encode(wire::Message(f.summary)).size();
          f.upload_sent += static_cast<double>(f.summary_bytes);
          const double t = f.upload_base + f.mask_s + p.latency_s + f.upload_sent / uploadRate(p);
          f.summary.upload_seconds = t - f.upload_base;
          push(t, EventKind::kSummary, token, k);
        } else if constexpr (std::is_same_v<T, client::SendError>) {
          auto it = in_flight_.find(a.error.task_token);
          if (it == in_flight_.end()) return;
          InFlight& f = it->second;
          f.error = a.error;
          // A refused task is answered once it has arrived; a failed one at once.
          push(std::max(now_, f.sent_at + f.download_s), EventKind::kClientError,
               a.error.task_token, k);
        }
        // StopTraining: partial work is simulated as the steps that fit (dispatch).
        // AbandonUpload: frames already on their way arrive to nothing (the task is gone from
        // in_flight_); the client's residual is kept as it is.
        // PublishServedModel, ControlVariateCommitted: virtual clients keep them in memory.
      },
      action);
}

void Simulator::tell(const engine::ClientId& id,
                     const std::function<void(client::ClientSession&)>& event) {
  const uint64_t k = indexOf(id);
  if (!sessions_.count(k)) return;  // never sampled: nothing of its own to hear about
  event(sessionOf(k));
  runSession(k);
}

void Simulator::secAggDown(const engine::SendSecAgg& a) {
  const uint64_t k = indexOf(a.client);
  if (offline_.count(k)) return;
  const ClientProfile p = fleet_->profile(k);
  const double bytes = static_cast<double>(wire::encode(wire::Message(a.message)).size());
  const uint64_t mail = next_mail_++;
  secagg_mail_.emplace(mail, std::make_pair(k, a.message));
  push(now_ + p.latency_s + bytes / p.down_bytes_per_s, EventKind::kSecAggDown, mail, k);
}

void Simulator::secAggUp(uint64_t k, wire::SecAgg m) {
  if (offline_.count(k)) return;
  const ClientProfile p = fleet_->profile(k);
  // The client's cryptographic work for this step, on its device (sim/secagg_cost.h).
  const double work = secAggStepSeconds(m) / p.speed;
  auto f = in_flight_.find(m.task_token);
  if (f != in_flight_.end() && f->second.drop_at <= now_ + work) return;  // gone first
  const double bytes = static_cast<double>(wire::encode(wire::Message(m)).size());
  const uint64_t mail = next_mail_++;
  secagg_mail_.emplace(mail, std::make_pair(k, std::move(m)));
  push(now_ + work + p.latency_s + bytes / uploadRate(p), EventKind::kSecAggUp, mail, k);
}

Status Simulator::maskUpload(InFlight& f, const client::SendUploadRequest& ask) {
  const ClientProfile p = fleet_->profile(f.client);
  const double weight =
      client::maskedUploadWeight(ask.secagg, ask.secagg_weight, f.delta.data(), f.delta.size());
  for (size_t j = 0; j < f.plan.size(); ++j) {
    client::EncodedChunk c;
    c.index = j;
    c.range = f.plan[j];
    c.last = j + 1 == f.plan.size();
    FEDFLEET_RETURN_IF_ERROR(client::encodeMaskedChunk(
        *ask.masker, ask.secagg, weight, client::chunkSeed(f.task_seed, j), f.plan[j],
        f.delta.data() + f.plan[j].offset, &c.payload));
    f.encoded.push_back(std::move(c));
  }
  // Opening the neighbours' shares, then quantising and masking (one stream per partner and
  // the self mask), on the client's device.
  const size_t partners = ask.masker->maskPartners().size();
  f.mask_s = (secAggOpenSeconds(partners) + secAggMaskSeconds(f.delta.size(), partners)) / p.speed;
  f.delta.clear();
  f.delta.shrink_to_fit();
  return Status::ok();
}

void Simulator::grant(const engine::SendGrant& g) {
  auto it = in_flight_.find(g.grant.task_token);
  if (it == in_flight_.end()) return;
  it->second.upload_base = now_;
  tell(g.client, [&](client::ClientSession& s) { s.onUploadGrant(g.grant.task_token, now_); });
}

void Simulator::cancel(const engine::SendCancel& c) {
  tell(c.client, [&](client::ClientSession& s) { s.onCancel(c.cancel, now_); });
  in_flight_.erase(c.cancel.task_token);
  unmask_drops_.erase(c.cancel.task_token);
}

void Simulator::rejected(const engine::SendError& e) {
  // A rejected update: the client stops sending.
  tell(e.client, [&](client::ClientSession& s) { s.onCoordinatorError(e.error, now_); });
  in_flight_.erase(e.error.task_token);
  unmask_drops_.erase(e.error.task_token);
}

std::string Simulator::fleetStateNote() const {
  const auto w = engine_->waitingStatus(now_);
  if (w.available >= w.needed) return "";  // not a run that waited for its cohort
  const uint64_t away = offline_.size();
  uint64_t unavailable = 0;  // connected, but offline by the availability model now
  if (config_.sim.availability != "always") {
    for (uint64_t k = 0; k < config_.sim.clients && k < 100000; ++k) {
      if (!offline_.count(k) && !fleet_->online(fleet_->profile(k), now_)) ++unavailable;
    }
  }
  std::string note = ". The cohort needs " + std::to_string(w.needed) +
                     " idle clients (coordinator.min_clients, default clients_per_round); " +
                     std::to_string(w.available) +
                     " are idle and online at t=" + fmt::format("{:.1f}", now_) + " s of " +
                     std::to_string(config_.sim.clients) + " (sim.clients)";
  if (away > 0) {
    note += "; " + std::to_string(away) + " dropped out (sim.dropout) and come back " +
            fmt::format("{:g}", config_.sim.rejoin_s) + " s after they left (sim.rejoin_s)";
  }
  if (unavailable > 0) {
    note += "; " + std::to_string(unavailable) + " are offline now (sim.availability)";
  }
  note += ". Lower coordinator.min_clients, register more clients (sim.clients), ";
  note += away > 0 ? "lower sim.rejoin_s below coordinator.wait_clients_s or raise "
                     "coordinator.wait_clients_s"
                   : "or raise coordinator.wait_clients_s";
  return note;
}

void Simulator::goOffline(uint64_t k) {
  offline_.insert(k);  // what was on its way to or from it is lost
  engine_->onBye(idOf(k), now_);
  push(now_ + config_.sim.rejoin_s, EventKind::kRejoin, 0, k);
}

void Simulator::handle(const Event& e) {
  if (e.kind == EventKind::kSecAggUp || e.kind == EventKind::kSecAggDown) {
    auto mail = secagg_mail_.find(e.token);
    if (mail == secagg_mail_.end()) return;
    const wire::SecAgg m = std::move(mail->second.second);
    secagg_mail_.erase(mail);
    if (offline_.count(e.client)) return;
    if (e.kind == EventKind::kSecAggDown && m.step == wire::SecAggStep::kUnmask &&
        unmask_drops_.erase(m.task_token)) {
      spdlog::debug("sim: client {}: drops out at the unmasking, after its masked upload",
                    idOf(e.client));
      goOffline(e.client);  // its update is in the sum; its self mask must be rebuilt
      return;
    }
    if (e.kind == EventKind::kSecAggUp) {
      engine_->onSecAgg(idOf(e.client), m, wire::encode(wire::Message(m)).size(), now_);
    } else {
      tell(idOf(e.client), [&](client::ClientSession& s) { s.onSecAgg(m, now_); });
    }
    return;
  }
  if (e.kind == EventKind::kRejoin) {
    const ClientProfile p = fleet_->profile(e.client);
    const double back = fleet_->nextOnline(p, now_);
    if (back > now_) {
      push(back, EventKind::kRejoin, 0, e.client);
      return;
    }
    offline_.erase(e.client);
    engine_->onHello(idOf(e.client), helloFor(e.client, p, next_session_++), now_);
    return;
  }
  auto it = in_flight_.find(e.token);
  if (it == in_flight_.end()) return;  // cancelled or rejected: nothing more arrives
  InFlight& f = it->second;
  switch (e.kind) {
    case EventKind::kTrainDone:
      onTrainDone(e.token, f);
      break;
    case EventKind::kChunk: {
      wire::Chunk c = std::move(f.chunks[e.chunk]);
      f.chunks[e.chunk] = wire::Chunk();
      const auto t0 = std::chrono::steady_clock::now();
      const std::pair<uint32_t, engine::ClientId> key{f.round, f.id};
      engine_->onChunk(f.id, c, f.frame_bytes[e.chunk], now_);  // may erase f (rejected)
      decode_wall_[key] +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      break;
    }
    case EventKind::kSummary: {
      const wire::Summary s = f.summary;
      const uint64_t bytes = f.summary_bytes;
      const engine::ClientId id = f.id;
      const uint64_t k = f.client;
      in_flight_.erase(it);
      sessionOf(k).onSummaryDelivered(e.token);  // SCAFFOLD: c_k += Dc_k
      runSession(k);
      engine_->onSummary(id, s, bytes, now_);
      break;
    }
    case EventKind::kClientError: {
      const wire::Error error = f.error;
      const engine::ClientId id = f.id;
      in_flight_.erase(it);
      engine_->onClientError(id, error, now_);
      break;
    }
    case EventKind::kDropOut: {
      const uint64_t k = f.client;
      unmask_drops_.erase(e.token);
      in_flight_.erase(it);
      goOffline(k);
      break;
    }
    case EventKind::kRejoin:
    case EventKind::kSecAggUp:
    case EventKind::kSecAggDown:
      break;  // handled above
  }
}

// The server's evaluation in 250-sample pieces summed in order (collectEvaluations), so the
// numbers are the same on any worker: one job a piece on this process's pool, a few pieces a
// job on MPI ranks (each job carries the model).
void Simulator::submitEvaluation(const engine::Evaluate& ev) {
  PendingEval pe;
  pe.round = ev.round;
  pe.at = now_;
  const auto test = data_->testSet();
  constexpr uint32_t kPiece = 250;
  constexpr uint64_t kPiecesPerRemoteJob = 8;
  const wire::SimModelRecipe recipe = modelRecipe();
  const uint64_t stretch = remote_ ? kPiece * kPiecesPerRemoteJob : kPiece;
  std::shared_ptr<const std::string> bytes;
  if (remote_) {
    bytes = std::make_shared<const std::string>(reinterpret_cast<const char*>(ev.params->data()),
                                                ev.params->size() * sizeof(float));
  }
  for (uint64_t begin = 0; begin < test->size(); begin += stretch) {
    const uint64_t end = std::min<uint64_t>(test->size(), begin + stretch);
    if (remote_) {
      wire::SimEvalJob job{recipe, bytes, begin, end, kPiece};
      auto reply = std::make_shared<std::future<Result<std::string>>>(
          remote_->submit(wire::encodeSimJob(job)));
      pe.pieces.push_back(pool_->submit([reply]() -> Result<std::vector<wire::SimEvalPiece>> {
        FEDFLEET_ASSIGN_OR_RETURN(wire::SimEvalResult e,
                                  awaitRemote<wire::SimEvalResult>(*reply, "an evaluation job"));
        FEDFLEET_RETURN_IF_ERROR(e.status);
        return std::move(e.pieces);
      }));
    } else {
      auto params = ev.params;
      pe.pieces.push_back(pool_->submit([=]() -> Result<std::vector<wire::SimEvalPiece>> {
        return evaluateTestPieces(recipe, *params, *test, begin, end, kPiece);
      }));
    }
  }
  evals_.push_back(std::move(pe));
}

// Sums of loss and correct predictions over `idx`, in 250-sample pieces summed in order (the
// same numbers on any worker).
Result<EvalPiece> evaluatePieces(model::Model& model, const data::Dataset& data,
                                 const std::vector<uint32_t>& idx) {
  constexpr size_t kPiece = 250;
  EvalPiece total;
  for (size_t begin = 0; begin < idx.size(); begin += kPiece) {
    const std::vector<uint32_t> part(idx.begin() + begin,
                                     idx.begin() + std::min(idx.size(), begin + kPiece));
    FEDFLEET_ASSIGN_OR_RETURN(model::EvalResult r,
                              model::evaluateIndices(model, data, part, part.size()));
    total.add(r);
  }
  return total;
}

// Evaluates the block models on their blocks' sets (on the pool, waiting for all of it: a few
// thousand samples a model) and reports to the engine.
void Simulator::evaluateBlocks(const engine::EvaluateBlocks& ev) {
  const auto& sets = data_->blockSets();
  const wire::SimModelRecipe recipe = modelRecipe();
  struct Job {
    engine::BlockModelToEvaluate what;
    std::future<Result<std::pair<EvalPiece, EvalPiece>>> result;  // validation, test
  };
  std::vector<Job> jobs;
  for (const auto& m : ev.models) {
    if (m.block >= sets.size()) continue;
    const FleetData::BlockEvalSet* set = &sets[m.block];
    auto params = m.params;
    jobs.push_back({m, pool_->submit([=]() -> Result<std::pair<EvalPiece, EvalPiece>> {
                      FEDFLEET_ASSIGN_OR_RETURN(model::Model * model, workerModel(recipe));
                      FEDFLEET_RETURN_IF_ERROR(model->setFlatParameters(*params));
                      FEDFLEET_ASSIGN_OR_RETURN(
                          EvalPiece v, evaluatePieces(*model, *set->data, set->validation));
                      FEDFLEET_ASSIGN_OR_RETURN(EvalPiece t,
                                                evaluatePieces(*model, *set->data, set->test));
                      return std::make_pair(v, t);
                    })});
  }
  std::vector<engine::BlockEvalOutcome> outcomes;
  for (auto& job : jobs) {
    auto r = job.result.get();
    if (!r.isOk()) {
      spdlog::warn("sim: evaluating block {} model {} after round {}: {}", job.what.block,
                   job.what.model, ev.round, r.status().toString());
      continue;
    }
    const auto& [v, t] = *r;
    if (t.n == 0) continue;
    engine::BlockEvalOutcome o;
    o.block = job.what.block;
    o.model = job.what.model;
    if (v.n > 0) o.validation_loss = v.loss_sum / static_cast<double>(v.n);
    o.loss = t.loss_sum / static_cast<double>(t.n);
    o.accuracy = t.accuracy().value_or(0);  // block-cyclic runs classify
    outcomes.push_back(std::move(o));
  }
  engine_->onBlocksEvaluated(ev.round, outcomes, now_);
}

void Simulator::collectEvaluations(bool block) {
  while (!evals_.empty()) {
    PendingEval& pe = evals_.front();
    bool ready = true;
    for (auto& f : pe.pieces) {
      if (block) f.wait();
      ready = ready && f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    }
    if (!ready) return;
    std::optional<engine::EvalOutcome> outcome;
    EvalPiece total;
    bool ok = true;
    for (auto& f : pe.pieces) {
      Result<std::vector<wire::SimEvalPiece>> r = f.get();
      if (!r.isOk()) {
        spdlog::warn("sim: evaluating round {}: {}", pe.round, r.status().toString());
        ok = false;
        continue;
      }
      for (const wire::SimEvalPiece& piece : *r) total.add(EvalPiece::from(piece));
    }
    if (ok && total.n > 0) {
      const auto n = static_cast<double>(total.n);
      outcome = engine::EvalOutcome{total.loss_sum / n, total.accuracy(), {}};
      for (const auto& [name, sum] : total.metric_sums)
        outcome->metrics.emplace_back(name, sum / n);
    }
    const uint32_t round = pe.round;
    const double at = pe.at;
    evals_.pop_front();
    engine_->onEvaluated(round, outcome, at);
    block = false;  // one blocking wait per call is enough to make progress
  }
}

void Simulator::evaluate(const engine::Evaluate& ev) {
  wall_end_.emplace(ev.round, unixNow());
  submitEvaluation(ev);
}

void Simulator::stampRound(engine::CommitRound& commit) {
  auto& r = commit.round;
  wall_end_.emplace(r.round, unixNow());
  auto ws = wall_start_.find(r.round);
  r.wall_start = ws != wall_start_.end() ? ws->second : wall_end_[r.round];
  r.wall_end = wall_end_[r.round];
  for (auto& u : commit.updates) {
    auto wc = wall_compute_.find({u.round, u.client_id});
    if (wc != wall_compute_.end()) {
      u.wall_compute_s = wc->second;
      wall_compute_.erase(wc);
    }
    auto dw = decode_wall_.find({u.round, u.client_id});
    if (dw != decode_wall_.end()) {
      u.decode_s = dw->second;
      decode_wall_.erase(dw);
    }
  }
  wall_start_.erase(r.round);
  wall_end_.erase(r.round);
}

void Simulator::roundCommitted(const engine::CommitRound& commit) {
  const auto& r = commit.round;
  if (r.round > 0) {
    ++summary_.rounds;
    if (r.status == "failed") ++summary_.failed_rounds;
    summary_.completed += r.completed;
    summary_.late += r.late;
    summary_.dropped += r.dropped;
    summary_.rejected += r.rejected;
    summary_.bytes_up += r.bytes_up;
    summary_.bytes_down += r.bytes_down;
    round_virtual_s_.push_back(r.end_time - r.start_time);
    round_wall_s_.push_back(r.wall_end - r.wall_start);
  }
  // The run's virtual time ends where its last recorded round ends (events after it, such as
  // a dropped client's rejoin, are not part of the run).
  summary_.virtual_seconds = std::max(summary_.virtual_seconds, r.end_time);
  if (r.test_accuracy) {
    summary_.final_accuracy = r.test_accuracy;
    summary_.best_accuracy = std::max(summary_.best_accuracy.value_or(0), *r.test_accuracy);
  }
  if (std::string metrics = history::roundMetricsText(r); !metrics.empty()) {
    summary_.last_metrics = std::move(metrics);
    summary_.last_metrics_round = r.round;
  }
  progress_->update(r.round, r.test_accuracy, r.end_time);
}

void Simulator::blockMetricsRecorded(const std::vector<history::BlockMetricRecord>& rows) {
  if (rows.empty()) return;
  // One log line per block evaluation: the served models' mean accuracy.
  double sum = 0;
  int n = 0;
  for (const auto& row : rows) {
    if (row.model == "served" && row.accuracy) sum += *row.accuracy, ++n;
  }
  if (n > 0) {
    spdlog::info("round {:>3} blocks  served mean acc {:.2f}% over {} blocks", rows.front().round,
                 100 * sum / n, n);
  }
}

Result<SimSummary> Simulator::run() {
  if (!already_finished_.empty()) return failedPrecondition(already_finished_);
  const auto wall0 = std::chrono::steady_clock::now();
  if (progress_->active()) spdlog::set_level(spdlog::level::warn);  // the bar says it
  engine_->start(now_);
  FEDFLEET_RETURN_IF_ERROR(carryOut());
  while (!driver_->finished()) {
    if (stop_.load()) {
      progress_->finish();
      return unavailable("interrupted in round " + std::to_string(engine_->currentRound()) +
                         "; the history holds every row written so far. Continue the run with "
                         "`fedfleet sim --resume --db " +
                         config_.history.db +
                         "` (it reads the run's stored config; flags given are checked "
                         "changes)");
    }
    collectEvaluations(/*block=*/false);
    FEDFLEET_RETURN_IF_ERROR(carryOut());
    if (driver_->finished()) break;
    if (in_flight_.empty() && !evals_.empty()) {
      // No task is in flight, so what the engine does next waits on these evaluations, which
      // take no virtual time: finish them before the clock moves on. After the last round this
      // ends the run at that round's end, not at a dropped client's rejoin long after it.
      collectEvaluations(/*block=*/true);
      FEDFLEET_RETURN_IF_ERROR(carryOut());
      continue;
    }
    const double t_event = events_.empty() ? INFINITY : events_.top().time;
    const auto wake = engine_->nextWakeup();
    const double t_wake = wake ? *wake : INFINITY;
    if (!std::isfinite(t_event) && !std::isfinite(t_wake)) {
      if (evals_.empty()) {
        progress_->finish();
        const auto w = engine_->waitingStatus(now_);
        return failedPrecondition(
            "simulation stopped in round " + std::to_string(engine_->currentRound()) +
            ": nothing scheduled can change its state (" +
            (w.waiting ? std::to_string(w.available) + " of the " + std::to_string(w.needed) +
                             " idle clients a round needs (coordinator.min_clients)"
                       : std::string("no task in flight, no deadline")) +
            ")" + fleetStateNote());
      }
      collectEvaluations(/*block=*/true);
    } else if (t_event <= t_wake) {
      const Event e = events_.top();
      events_.pop();
      now_ = std::max(now_, e.time);
      handle(e);
    } else {
      // The engine asked to be woken at t_wake: a tick there must change something, or the
      // loop would wake it at the same time for ever. (A wakeup that is never acted on is an
      // engine defect; it ends the run with its cause rather than spinning.)
      idle_ticks_ = (t_wake == last_tick_at_ && next_seq_ == seq_at_last_tick_ &&
                     engine_->currentRound() == round_at_last_tick_)
                        ? idle_ticks_ + 1
                        : 0;
      last_tick_at_ = t_wake;
      seq_at_last_tick_ = next_seq_;
      round_at_last_tick_ = engine_->currentRound();
      if (idle_ticks_ > kMaxIdleTicks) {
        progress_->finish();
        return internalError(
            "simulation stalled in round " + std::to_string(engine_->currentRound()) +
            ": the engine asked to "
            "be woken at t=" +
            std::to_string(t_wake) + " s and did nothing there " + std::to_string(kMaxIdleTicks) +
            " times; please report this with the config");
      }
      now_ = std::max(now_, t_wake);
      engine_->onTick(now_);
    }
    FEDFLEET_RETURN_IF_ERROR(carryOut());
  }
  progress_->finish();
  spdlog::set_level(spdlog::level::info);
  summary_.run_id = run_id_;
  summary_.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  summary_.median_round_virtual_s = median(round_virtual_s_);
  summary_.median_round_wall_s = median(round_wall_s_);
  summary_.registered_clients = config_.sim.clients;
  summary_.distinct_participants = participants_.size();
  summary_.db_path = config_.history.db;
  if (replay_ && replay_->rowsToMatch() > 0) {
    return failedPrecondition("--resume: the replayed run ended with " +
                              std::to_string(replay_->rowsToMatch()) +
                              " recorded rows it never wrote: the file is not this simulation's");
  }
  if (!driver_->runOk()) {
    return failedPrecondition("run failed: " + driver_->finishMessage() + fleetStateNote());
  }
  if (driver_->everyRoundFailed()) return driver_->everyRoundFailedError(config_.history.db);
  return summary_;
}

}  // namespace

Result<std::unique_ptr<FleetSimulator>> FleetSimulator::create(
    const config::Config& config, std::shared_ptr<RemoteWorkers> remote) {
  auto sim = std::make_unique<Simulator>();
  FEDFLEET_RETURN_IF_ERROR(sim->init(config, std::move(remote)));
  return std::unique_ptr<FleetSimulator>(std::move(sim));
}

std::string formatSummary(const SimSummary& s) {
  auto pct = [](std::optional<double> v) {
    char buf[32];
    if (!v) return std::string("-");
    std::snprintf(buf, sizeof(buf), "%.2f%%", 100 * *v);
    return std::string(buf);
  };
  // A run with a test accuracy says it and its best; others (a regression, federated
  // evaluation alone) their latest metrics.
  std::string evaluation =
      "test accuracy " + pct(s.final_accuracy) + " (best " + pct(s.best_accuracy) + ")";
  if (!s.final_accuracy) {
    evaluation = s.last_metrics.empty()
                     ? std::string("no evaluation")
                     : "round " + std::to_string(s.last_metrics_round) + ": " + s.last_metrics;
  }
  char buf[1024];
  std::snprintf(
      buf, sizeof(buf),
      "run %lld: %u rounds (%u failed), %s\n"
      "time: %s virtual (median round %s), %s wall (median round %.3f s)\n"
      "updates: %llu completed, %llu late, %llu dropped, %llu rejected; %llu of %llu clients "
      "took part\n"
      "bytes: %.1f MiB up, %.1f MiB down\n",
      static_cast<long long>(s.run_id), s.rounds, s.failed_rounds, evaluation.c_str(),
      ProgressDisplay::duration(s.virtual_seconds).c_str(),
      ProgressDisplay::duration(s.median_round_virtual_s).c_str(),
      ProgressDisplay::duration(s.wall_seconds).c_str(), s.median_round_wall_s,
      static_cast<unsigned long long>(s.completed), static_cast<unsigned long long>(s.late),
      static_cast<unsigned long long>(s.dropped), static_cast<unsigned long long>(s.rejected),
      static_cast<unsigned long long>(s.distinct_participants),
      static_cast<unsigned long long>(s.registered_clients), s.bytes_up / 1048576.0,
      s.bytes_down / 1048576.0);
  return buf;
}

}  // namespace fedfleet::sim
