// The fleet simulator's own parts, shared by its source files and by nothing else: the virtual
// clients' tasks in flight, the event queue's events, evaluations on their way, and the
// Simulator class (sim/fleet_simulator.h's FleetSimulator) whose members those files define by
// concern:
//   fleet_simulator.cc  start-up, the history, the event loop (run, handle) and the fleet's state
//   virtual_clients.cc  a task's way to a virtual client and back: dispatch with its timing,
//                       the client's session, uploads, secure-aggregation messages, cancels
//   sim_training.cc     training jobs on the worker pool or the MPI ranks, batched or one by one
//   sim_evaluation.cc   the server's evaluations (and the blocks') on the pool, fed back in order
#pragma once

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
#include "sim/fleet_simulator.h"
#include "sim/hash.h"
#include "sim/model_cost.h"
#include "sim/progress.h"
#include "sim/remote_workers.h"
#include "sim/replay_history.h"
#include "sim/secagg_cost.h"
#include "sim/sim_jobs.h"
#include "sim/worker_pool.h"

namespace fedfleet::sim::internal {

using engine::Action;
using engine::ClientId;
using engine::RoundEngine;

// Samples a Trainer processes: every epoch is a full pass; with max_steps, passes repeat and the
// last batch of a pass may be short (client/trainer.h).
inline uint64_t plannedSamples(uint64_t n, const wire::HyperParams& hp) {
  if (n == 0) return 0;
  if (hp.max_steps == 0) return n * hp.epochs;
  const uint64_t b = std::max<uint32_t>(hp.batch_size, 1);
  const uint64_t per_pass = (n + b - 1) / b;
  const uint64_t passes = hp.max_steps / per_pass;
  const uint64_t rest = hp.max_steps % per_pass;
  return passes * n + std::min(rest * b, n);
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

// The running sums of one model's evaluation: the pieces a worker job reports
// (sim/sim_jobs.h), added up.
struct EvalPiece : wire::SimEvalPiece {
  // Adds one evaluation's figures (pieces of one model's evaluation: the same metrics).
  void add(const model::EvalResult& r) { add(pieceOf(r)); }
  void add(const wire::SimEvalPiece& o) {
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

class Simulator final : public FleetSimulator, private driver::DriverPort {
 public:
  // Jobs still queued (a cancelled task's training) use data_ and residuals_: finish them first.
  ~Simulator() override { pool_.reset(); }
  Status init(const config::Config& config, Extensions extensions);
  const std::string& alreadyFinished() const override { return already_finished_; }
  Result<SimSummary> run() override;
  void stop() override { stop_.store(true); }
  int64_t runId() const override { return run_id_; }
  const client::ClientSession* clientSession(uint64_t k) const override {
    auto it = sessions_.find(k);
    return it == sessions_.end() ? nullptr : &it->second;
  }
  void setReceiveFilter(ReceiveFilter filter) override { receive_filter_ = std::move(filter); }
  void setRoundObserver(RoundObserver observer) override { round_observer_ = std::move(observer); }

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
  wire::SimModelRecipe modelRecipe() const { return modelRecipeOf(config_, data_->inputShape()); }

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
  CustomTrainer custom_trainer_;  // Extensions::custom_trainer (null: client::Trainer)
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
  RoundObserver round_observer_;
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

}  // namespace fedfleet::sim::internal
