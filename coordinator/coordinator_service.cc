#include "coordinator/coordinator_service.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include "common/clock.h"
#include "common/crypto/keyed_stream.h"
#include "common/crypto/random.h"
#include "common/data/block_cyclic.h"
#include "common/data/dataset.h"
#include "common/format.h"
#include "common/history/history.h"
#include "common/model/evaluate.h"
#include "common/model/export.h"
#include "common/model/local_part.h"
#include "common/model/model.h"
#include "common/transport/descriptor_limit.h"
#include "common/transport/transport.h"
#include "common/wire/limits.h"
#include "common/wire/messages.h"
#include "coordinator/background_evaluator.h"
#include "coordinator/connection_limits.h"
#include "coordinator/metrics_server.h"
#include "coordinator/refusal_log.h"
#include "driver/data_files.h"
#include "driver/engine_driver.h"
#include "driver/resume.h"
#include "driver/run_setup.h"
#include "engine/round_engine.h"

namespace fedfleet::coordinator {
namespace {

// ZMQ_RCVHWM of the ROUTER socket when upload credits are on: messages queued per peer before
// ZeroMQ stops reading that peer's connection. A granted uploader's chunks (1 MiB by default)
// wait here; other peers send small messages only.
constexpr int kCreditedReceiveHwm = 4;

// Rounds before the one just ended that may still await their evaluation when the next round
// starts (EngineOptions::max_evaluations_behind). Each holds its commit, checkpoint and model
// snapshot: unbounded, rounds faster than the evaluator grew the coordinator by about 100 KB a
// round of a 7,850-parameter model (bench/memory_soak.sh).
constexpr uint32_t kMaxEvaluationsBehind = 2;
// Messages a connection may send before its Hello before that is recorded as an event (a
// restarted coordinator's clients send a few of their old session's on reconnecting).
constexpr uint32_t kMessagesBeforeHelloRecorded = 50;
// A keyed connection that has not said Hello and has sent nothing for this long is closed
// (honest clients say Hello at once and send a heartbeat every client.heartbeat_s).
constexpr double kSilentWithoutHelloS = 30;
// How long after its close was reported a retired connection's queued frames are still dropped.
constexpr double kRetiredGraceS = 5;
// The event kind of connections closed by a connection limit (one aggregated row per interval
// across all hosts: coordinator/refusal_log.h), and its cause.
constexpr const char* kLimitEventKind = "connection_refused";
constexpr const char* kLimitCause = "closed by a connection limit";

class ZmqCoordinator final : public CoordinatorService, private driver::DriverPort {
 public:
  Status init(const config::Config& config);
  Status run() override;
  void stop() override { stop_.store(true); }
  void reloadAllowList() override { reload_.store(true); }
  std::string boundEndpoint() const override {
    return server_ ? server_->boundEndpoint() : std::string();
  }
  int64_t runId() const override { return run_id_; }

 private:
  void handleEnvelope(const transport::Envelope& env, double now);
  // The client a message of `env` is from, after the connection checks (Hello, key, rates);
  // empty when the message is refused or answered here.
  void handleMessage(const transport::Envelope& env, wire::Message& msg,
                     const engine::ClientId& who, double now);
  void handleHello(const transport::Envelope& env, const wire::Hello& hello, double now);
  // Refuses what a connection sent beyond its rate: answers once, closes it, records one row.
  bool admit(const transport::Envelope& env, ConnectionLimits::Kind kind, double now);
  // Connections ended, keys revoked: the transport's reports since the last call.
  void takeTransportReports(double now);
  // Closes `peer` and forgets it; its queued messages are dropped from now on.
  void retire(const std::string& peer, double now);
  // Closes keyed connections that never said Hello and went silent (kSilentWithoutHelloS).
  void closeSilentWithoutHello(double now);
  // The connection-limit refusals one report of the RefusalLog stands for, as an event row.
  void noteLimitRefusals(const std::string& host, transport::RefusalCause cause, uint64_t count,
                         double now);
  // What closed a connection, naming the config key that sets the limit.
  std::string limitDetail(transport::RefusalCause cause) const;
  // Writes the refusals the RefusalLog still counts (the coordinator is stopping).
  void flushRefusals(double now);
  // recordEvent, within the client's EventBudget (the driver's own rows).
  void recordClientEvent(const std::string& kind, const std::string& client,
                         const std::string& detail, double now);
  // Writes the count of rows `budget` left out, when it allows a row.
  void flushLeftOut(const std::string& client, EventBudget& budget, double now);
  Status carryOut() { return driver_->carryOut(*engine_); }
  // DriverPort: the engine's actions that need the network, the evaluator or the clock.
  void sendTask(engine::SendTask& send) override;
  void sendCancel(const engine::SendCancel& a) override { sendTo(a.client, a.cancel); }
  void sendGrant(const engine::SendGrant& a) override { sendTo(a.client, a.grant); }
  void sendSecAgg(const engine::SendSecAgg& a) override { sendTo(a.client, a.message); }
  void sendError(const engine::SendError& a) override { sendTo(a.client, a.error); }
  void sendBye(const engine::SendBye& a) override { sendTo(a.client, wire::Bye{a.reason}); }
  void evaluate(const engine::Evaluate& a) override {
    // Runs beside the loop; the next round's tasks went out before (they come first in the
    // action list). The result comes back through takeResults() in run().
    evaluator_->submit(a.round, a.params);
  }
  void evaluateBlocks(const engine::EvaluateBlocks& ev) override;
  void stampRound(engine::CommitRound& commit) override;
  void roundCommitted(const engine::CommitRound& commit) override;
  void eventRecorded(const history::EventRecord& e) override {
    ++metrics_snapshot_.events_by_kind[e.kind];
  }
  void sendTo(const engine::ClientId& id, const wire::Message& message);
  void recordEvent(const std::string& kind, const std::string& client, const std::string& detail,
                   double now);
  // Live metrics (no-ops when metrics.port = 0): hand the snapshot to the server (at most every
  // 100 ms unless `force`).
  void publishMetrics(double now, bool force);
  // While the engine waits for clients: one line every few seconds saying who is there.
  void reportWaiting(double now);
  // stop(): lets a round whose evaluation is running commit, abandons the round in flight
  // (nothing of it is written; its clients drop it when they see the next session) and
  // records where the run stopped.
  Status stopCleanly();

  config::Config config_;
  std::unique_ptr<transport::ServerTransport> server_;
  std::unique_ptr<history::HistoryStore> history_;
  std::unique_ptr<driver::EngineDriver> driver_;  // over history_ and this
  std::unique_ptr<BackgroundEvaluator> evaluator_;
  std::unique_ptr<engine::RoundEngine> engine_;
  std::unique_ptr<model::Model> block_model_;  // block-cyclic runs only
  data::Dataset block_data_;                   // the test split the block sets index
  std::vector<data::BlockEvalSplit> block_sets_;
  int64_t run_id_ = 0;
  std::atomic<bool> stop_{false};

  // Connections by routing id. A routing id is only an address: the client of a connection is
  // the client id its authenticated key has in the allow-list (CURVE), or what its Hello
  // claimed (--insecure).
  struct Peer {
    engine::ClientId client;  // CURVE: from the key; insecure: from its Hello (empty before)
    bool warned_unknown = false;
    uint32_t before_hello = 0;  // messages before its Hello (or since it was last known)
    double unknown_reply_at = -1;
    ConnectionLimits limits;
    bool limit_recorded = false;
    bool said_hello = false;  // a Hello of this connection was accepted
    double last_message = 0;  // when its latest message came
  };
  std::map<std::string, Peer> peers_;
  // Connections the coordinator closed (replaced, revoked or rate-limited): their messages are
  // dropped until kRetiredGraceS after the transport reported the close, since ZeroMQ may still
  // hand over frames it had queued before (the value: when the close was reported; infinity
  // until then).
  std::map<std::string, double> retired_peers_;
  std::map<engine::ClientId, std::string> peer_of_client_;  // its current connection
  // Key -> client binding: public key of each client id. From the history when resuming (the
  // binding survives a restart), else from the first Hello of this run.
  std::map<engine::ClientId, std::string> key_of_client_;
  std::map<engine::ClientId, EventBudget> event_budget_;
  RefusalLog refusals_;  // connections refused before they became clients, aggregated
  double hello_swept_at_ = 0;
  uint64_t descriptor_limit_ = 0;  // the soft RLIMIT_NOFILE after raising it (0: unlimited)
  double budgets_flushed_at_ = 0;
  std::atomic<bool> reload_{false};
  // This process's session id, in every task: a client that sees a new one drops the old
  // session's work at once (its uploads would only be refused as stale).
  const uint64_t session_ = crypto::randomToken();
  // Decode time per update: the engine reads no clock, so the driver times its onChunk calls.
  std::map<uint64_t, uint32_t> round_of_token_;
  std::map<std::pair<uint32_t, engine::ClientId>, double> decode_seconds_;
  std::string already_finished_;  // --resume of a finished run: what to say instead of running
  double waiting_reported_at_ = 0;
  std::unique_ptr<MetricsServer> metrics_;  // null when metrics.port = 0
  MetricsSnapshot metrics_snapshot_;        // the loop's copy; the server gets copies
  double metrics_published_at_ = 0;
};

Status ZmqCoordinator::init(const config::Config& config) {
  config_ = config;
  FEDFLEET_RETURN_IF_ERROR(config_.validate());
  if (config_.dataFormat() == "synthetic") {
    return invalidArgument(
        "data.format = \"synthetic\" is generated per device by the simulator "
        "(fedfleet sim); a coordinator serves fashion-mnist or its clients' own files "
        "(data.partition = \"none\")");
  }
  const bool own_files = config_.readsDataFiles();
  if (own_files && config_.data.partition != "none") {
    return invalidArgument("data.format = \"" + config_.dataFormat() +
                           "\": the clients of a coordinator train the files each holds, so "
                           "set data.partition = \"none\" (the simulator splits one data set "
                           "over virtual clients: fedfleet sim)");
  }
  const auto& cc = config_.coordinator;

  // Test set (server-side evaluation), and the model built for its samples.
  at::set_num_threads(static_cast<int>(cc.threads));
  data::Dataset test_set;
  model::InputShape shape;  // Fashion-MNIST's
  // No test file of its own: federated evaluation alone (the engine's server_eval is off).
  const bool no_test_data = own_files && config_.data.test_path.empty();
  if (no_test_data) {
    FEDFLEET_ASSIGN_OR_RETURN(shape, driver::declaredInputShape(config_));
    spdlog::info(
        "no test data of its own (data.test_path): the model is evaluated by the "
        "clients on their held-out data every {} round(s)",
        cc.fed_eval_every);
  } else if (own_files) {
    FEDFLEET_ASSIGN_OR_RETURN(test_set, driver::loadTestFile(config_));
    shape = model::inputShapeOf(test_set);
  } else {
    const std::string data_dir =
        config_.data.dir.empty() ? data::defaultFashionMnistDir() : config_.data.dir;
    FEDFLEET_ASSIGN_OR_RETURN(
        test_set, data::loadFashionMnist(data_dir, /*train=*/false, config_.data.test_subset));
  }
  FEDFLEET_ASSIGN_OR_RETURN(
      auto model,
      driver::createRunModel(config_, shape, {nullptr, no_test_data ? nullptr : &test_set}));
  // model.local names tensors of this model (each client keeps them; a typo stops here).
  FEDFLEET_RETURN_IF_ERROR(model::LocalPart::of(model->layout(), config_.model.local).status());
  std::vector<float> params = model->flatParameters();
  if (const auto& bc = config_.blocks; bc.count > 0) {
    // Per-block validation and test sets from the test split (common/data/block_cyclic.h).
    FEDFLEET_ASSIGN_OR_RETURN(
        block_sets_,
        data::blockEvalIndices(test_set.labels, 10, bc.count, bc.skew, bc.validation_samples,
                               bc.test_samples, config_.run.seed));
    block_data_ = test_set;
    FEDFLEET_ASSIGN_OR_RETURN(
        block_model_, model::createModel(config_.model.name, config_.run.seed, config_.model.path));
    block_model_->setLoss(model->loss());
  }

  // Transport. Every connection costs two descriptors (libzmq's and the transport's duplicate):
  // take what the hard limit allows, and say what that is.
  const transport::DescriptorLimit before = transport::descriptorLimit();
  auto raised = transport::raiseDescriptorLimit();
  const transport::DescriptorLimit limit = raised.isOk() ? raised->after : before;
  descriptor_limit_ = limit.soft == UINT64_MAX ? 0 : limit.soft;
  auto limitText = [](uint64_t v) {
    return v == UINT64_MAX ? std::string("unlimited") : std::to_string(v);
  };
  if (!raised.isOk()) {
    spdlog::warn("coordinator: could not raise the descriptor limit: {}",
                 raised.status().toString());
  }
  transport::ServerOptions so;
  so.endpoint = cc.bind;
  so.insecure = cc.insecure;
  // One frame limit end to end: the transport refuses at its header what the decoder would.
  so.max_message_bytes = config_.clientFrameLimitBytes();
  so.admission.max_unauthenticated = cc.max_unauthenticated;
  so.admission.max_unauthenticated_per_host = cc.max_unauthenticated_per_host;
  so.admission.max_connections_per_key = cc.max_connections_per_key;
  so.handshake_timeout_ms = static_cast<int>(std::lround(cc.handshake_timeout_s * 1000));
  so.admission_seed = crypto::randomToken() | 1;
  const transport::ConnectionAdmission admission(so.admission, 1);
  spdlog::info(
      "coordinator: descriptor limit {} (soft; was {}, hard {}), {} kept for authenticated "
      "connections; before authentication at most {} connections (early drop from {}), {} per "
      "address, {:g} s for the handshake; {} connections per key; frames up to {} bytes",
      limitText(limit.soft), limitText(before.soft), limitText(limit.hard),
      descriptor_limit_ > 0 ? std::to_string(admission.reserveFor(descriptor_limit_)) : "none",
      cc.max_unauthenticated, admission.earlyDropStart(), cc.max_unauthenticated_per_host,
      cc.handshake_timeout_s, cc.max_connections_per_key, so.max_message_bytes);
  refusals_.groupAcrossHosts(kLimitEventKind);
  if (cc.max_concurrent_uploads > 0) {
    // Upload credits: only granted clients send chunks, so a short receive queue per peer
    // bounds what ZeroMQ holds for the loop (docs/ARCHITECTURE.md, Memory).
    so.receive_hwm = kCreditedReceiveHwm;
    // A full queue stops ZeroMQ reading the peer's ZMTP heartbeats too, so a loop stalled
    // longer than the heartbeat timeout (a loaded machine) would drop an uploader's connection.
    // Dead peers are found by the engine's liveness_s; the transport's timeout only needs to
    // outlast a stall.
    const double stall_ms = std::min(2 * cc.liveness_s, 3600.0) * 1000;
    so.heartbeat_timeout_ms = std::max(so.heartbeat_timeout_ms, static_cast<int>(stall_ms));
  }
  if (!cc.insecure) {
    const std::string secret = cc.keys_dir + "/coordinator.key_secret";
    Status file_ok = transport::checkSecretKeyFile(secret);
    if (file_ok.code() == StatusCode::kNotFound) {
      return notFound("no coordinator key pair in " + cc.keys_dir +
                      " (create one with `fedfleet keygen --dir " + cc.keys_dir +
                      " --coordinator --clients N`)");
    }
    FEDFLEET_RETURN_IF_ERROR(file_ok);
    FEDFLEET_RETURN_IF_ERROR(transport::checkAllowListDir(config_.allowDir()));
    FEDFLEET_ASSIGN_OR_RETURN(so.server_keys, transport::readKeyPair(cc.keys_dir, "coordinator"));
    so.allow_dir = config_.allowDir();
  } else {
    spdlog::warn(
        "--insecure: clients are who their Hello says they are; any peer can take any client "
        "id, and its claims cannot be tied to a key");
  }
  FEDFLEET_ASSIGN_OR_RETURN(server_, transport::createServer(so));

  if (config_.metrics.port > 0) {
    FEDFLEET_ASSIGN_OR_RETURN(
        metrics_,
        MetricsServer::start(config_.metrics.bind, static_cast<uint16_t>(config_.metrics.port)));
  }
  // The engine's options, checked before anything is written: a coordinator that cannot start
  // leaves no run behind (the history file is not even created).
  engine::EngineOptions eo = driver::engineOptionsFromConfig(config_, /*run_id=*/0);
  eo.max_evaluations_behind = kMaxEvaluationsBehind;
  // Differential-privacy noise no client can predict (the config's seed may be known to them).
  eo.dp.noise_key = crypto::randomStreamKey();
  // What each partition holds bounds what an update may claim (the clients cut the same split).
  FEDFLEET_ASSIGN_OR_RETURN(eo.partition_sizes, driver::partitionSizes(config_, eo));
  FEDFLEET_RETURN_IF_ERROR(driver::emptyPartitionCheck(eo.partition_sizes));
  FEDFLEET_RETURN_IF_ERROR(engine::checkEngineOptions(eo));

  // History: a new run, or the latest run of this name resumed from its checkpoint.
  FEDFLEET_ASSIGN_OR_RETURN(history_, history::openSqliteHistory(config_.history.db));
  driver_ =
      std::make_unique<driver::EngineDriver>(*history_, static_cast<driver::DriverPort&>(*this),
                                             driver::checkpointKeepFromConfig(config_), "s");
  std::string engine_state;  // from the checkpoint resumed from
  if (cc.resume) {
    FEDFLEET_ASSIGN_OR_RETURN(driver::ResumePoint point,
                              driver::findResumePoint(*history_, config_, params.size()));
    run_id_ = point.run_id;
    if (!point.already_finished.empty()) {
      already_finished_ = point.already_finished;
      return Status::ok();
    }
    if (!point.changes.empty()) {
      recordEvent("resume_changes", "", driver::changesDetail(point.changes), unixNow());
      FEDFLEET_RETURN_IF_ERROR(driver_->fatal());
      spdlog::warn("--resume-changes: {} continues with {}", point.label,
                   driver::describeChanges(point.changes));
    }
    eo.first_round = point.first_round;
    eo.evaluate_initial = point.evaluate_initial;
    if (const auto& cp = point.checkpoint) {
      std::memcpy(params.data(), cp->blob.data(), cp->blob.size());
      eo.model_version = cp->model_version;
      engine_state = cp->engine_state;
      if (point.lost_rounds > 0) {
        spdlog::warn(
            "--resume: {} round(s) after round {} changed the model but have no checkpoint "
            "(coordinator.checkpoint_every = {}); their training is lost, the run continues "
            "from round {}'s model",
            point.lost_rounds, cp->round, cc.checkpoint_every, cp->round);
      }
      spdlog::info("resuming run {} after round {} (model version {} of round {})", run_id_,
                   point.last_round, cp->model_version, cp->round);
    } else {
      spdlog::info("resuming run {} from its initial model", run_id_);
    }
  } else {
    history::RunRecord run;
    run.name = config_.run.name;
    run.config_json = config_.toJson().dump();
    run.started_at = unixNow();
    run.seed = config_.run.seed;
    run.model_json = model::describeModel(*model, shape, config_.model.path);
    FEDFLEET_ASSIGN_OR_RETURN(run_id_, history_->beginRun(run));
  }

  if (cc.resume && !cc.insecure) {
    // The key each client id had in this history stays its key.
    FEDFLEET_ASSIGN_OR_RETURN(auto known, history_->clients());
    for (const auto& c : known) {
      if (!c.public_key.empty()) key_of_client_[c.client_id] = c.public_key;
    }
  }

  // Engine.
  eo.run_id = run_id_;
  FEDFLEET_RETURN_IF_ERROR(engine::checkEngineOptions(eo));  // with where a resume continues
  engine_ = std::make_unique<engine::RoundEngine>(eo, std::move(params));
  if (!engine_state.empty()) {
    // Selection continues where it stopped (generator and selector state).
    Status st = engine_->loadState(engine_state);
    if (!st.isOk()) return st.withContext("--resume: checkpoint of run " + std::to_string(run_id_));
    spdlog::info("restored the engine state (selector {}, server optimiser {})",
                 engine::selectorName(eo.selector.kind),
                 engine::serverOptimizerName(eo.server_optimizer));
  }
  evaluator_ = std::make_unique<BackgroundEvaluator>(std::move(model), std::move(test_set));
  metrics_snapshot_.run_id = run_id_;
  metrics_snapshot_.run_name = config_.run.name;
  metrics_snapshot_.rounds_target = config_.run.rounds;
  if (metrics_) {
    metrics_->publish(metrics_snapshot_);
    spdlog::info("coordinator: metrics on {}/metrics and {}/status", metrics_->url(),
                 metrics_->url());
  }
  spdlog::info("coordinator: run {} listening on {} ({}), {} rounds, {} clients a round", run_id_,
               server_->boundEndpoint(), cc.insecure ? "PLAIN TEXT" : "CURVE", config_.run.rounds,
               cc.clients_per_round);
  return Status::ok();
}

void ZmqCoordinator::recordEvent(const std::string& kind, const std::string& client,
                                 const std::string& detail, double now) {
  history::EventRecord e;
  e.run_id = run_id_;
  e.time = now;
  e.kind = kind;
  e.client_id = client;
  e.detail = detail;
  spdlog::warn("event {}: {}{}{}", kind, client, client.empty() ? "" : " ", detail);
  driver_->recordEvent(e);
}

void ZmqCoordinator::sendTo(const engine::ClientId& id, const wire::Message& message) {
  auto it = peer_of_client_.find(id);
  if (it == peer_of_client_.end()) return;
  Status st = server_->send(it->second, wire::encode(message));
  if (!st.isOk()) {
    spdlog::warn("send {} to {}: {}", wire::messageName(message), id, st.toString());
    // The connection is gone; the engine treats the client as lost after liveness_s.
  }
}

// Sends the Task frame and, as its model frame, the shared model buffer (and the served model's
// after it, when the task carries one): ZeroMQ references those buffers rather than copying
// them for each client (protocols 4 and 5, wire/messages.h).
void ZmqCoordinator::sendTask(engine::SendTask& send) {
  round_of_token_[send.task.task_token] = send.task.round;
  send.task.coordinator_session = session_;
  auto it = peer_of_client_.find(send.client);
  if (it == peer_of_client_.end()) return;
  // A served model to attach follows the training model in the same model frame.
  Status st = send.served_bytes
                  ? server_->send(it->second, wire::encode(send.task),
                                  std::vector<std::shared_ptr<const std::string>>{
                                      send.model_bytes, send.served_bytes})
                  : server_->send(it->second, wire::encode(send.task), send.model_bytes);
  if (!st.isOk()) {
    spdlog::warn("send Task to {}: {}", send.client, st.toString());
    // As sendTo: the engine treats the client as lost after liveness_s.
  }
}

void ZmqCoordinator::recordClientEvent(const std::string& kind, const std::string& client,
                                       const std::string& detail, double now) {
  const auto& limits = config_.limits;
  const bool timed = limits.events_burst > 0 && limits.events_every_s > 0;  // else: unbounded
  EventBudget& budget =
      event_budget_
          .try_emplace(client,
                       timed ? limits.events_burst : std::numeric_limits<double>::infinity(),
                       limits.events_every_s)
          .first->second;
  flushLeftOut(client, budget, now);
  if (budget.take(now)) recordEvent(kind, client, detail, now);
}

void ZmqCoordinator::flushLeftOut(const std::string& client, EventBudget& budget, double now) {
  if (budget.leftOut() == 0) return;
  const uint64_t left = budget.leftOut();
  if (!budget.takeQuietly(now)) return;
  budget.takeLeftOut();
  recordEvent("events_left_out", client,
              std::to_string(left) +
                  " event rows about this client left out (over its budget of the coordinator's "
                  "own rows: limits.events_burst = " +
                  fmt::format("{:g}", config_.limits.events_burst) +
                  " at once, then one every limits.events_every_s = " +
                  fmt::format("{:g}", config_.limits.events_every_s) + " s)",
              now);
}

void ZmqCoordinator::retire(const std::string& peer, double now) {
  (void)now;
  retired_peers_[peer] = std::numeric_limits<double>::infinity();
  auto p = peers_.find(peer);
  if (p != peers_.end()) {
    auto c = peer_of_client_.find(p->second.client);
    if (c != peer_of_client_.end() && c->second == peer) peer_of_client_.erase(c);
    peers_.erase(p);
  }
  Status st = server_->disconnect(peer);
  if (!st.isOk())
    spdlog::debug("disconnect {}: {}", transport::printableRoutingId(peer), st.toString());
}

bool ZmqCoordinator::admit(const transport::Envelope& env, ConnectionLimits::Kind kind,
                           double now) {
  Peer& peer = peers_[env.peer];
  if (peer.limits.admit(kind, now)) return true;
  if (!peer.limit_recorded) {
    peer.limit_recorded = true;
    const std::string who = peer.client.empty() ? env.client_id : peer.client;
    server_
        ->send(env.peer,
               wire::encode(wire::Error{wire::ErrorCode::kRejected,
                                        "rate limit exceeded; closing the connection", 0}))
        .isOk();
    recordClientEvent("rate_limited", who,
                      "peer " + transport::printableRoutingId(env.peer) + ": " +
                          peer.limits.refusedSummary() + "; connection closed",
                      now);
    retire(env.peer, now);
  }
  return false;
}

void ZmqCoordinator::takeTransportReports(double now) {
  // Refused before they became clients: one warning and one event per cause and host, the
  // repeats counted and reported once a minute (coordinator/refusal_log.h).
  auto report = [&](const RefusalLog::Report& r) { recordEvent(r.kind, "", r.text(), now); };
  for (auto& auth : server_->takeAuthEvents()) {
    if (auth.kind == transport::AuthEvent::kRefused ||
        auth.kind == transport::AuthEvent::kHandshakeFailed) {
      const bool key = auth.kind == transport::AuthEvent::kRefused;
      const std::string cause =
          key ? (auth.public_key.empty() ? "" : "key " + auth.public_key + ": ") + auth.reason
              : auth.reason;
      ++metrics_snapshot_.refused_connections_by_cause[key ? "key_refused" : "handshake_failed"];
      if (auto r = refusals_.note(key ? "auth_rejected" : "handshake_refused", auth.peer_address,
                                  cause, now)) {
        report(*r);
      }
      continue;
    }
    if (const char* kind = transport::allowListEventName(auth.kind)) {
      recordEvent(kind, "", auth.reason, now);  // the allow-list directory itself
      continue;
    }
    // Revoked: close its connection now (ZAP is asked only at the handshake) and end its task.
    recordEvent("key_revoked", auth.client_id, "key " + auth.public_key + ": " + auth.reason, now);
    std::vector<std::string> doomed;
    for (const auto& [routing_id, peer] : peers_) {
      if (peer.client == auth.client_id) doomed.push_back(routing_id);
    }
    if (auto c = peer_of_client_.find(auth.client_id); c != peer_of_client_.end()) {
      server_->send(c->second, wire::encode(wire::Bye{"key revoked: " + auth.reason})).isOk();
    }
    for (const auto& routing_id : doomed) retire(routing_id, now);
    if (engine_->isKnown(auth.client_id)) engine_->onBye(auth.client_id, now);
  }
  // Closed by a connection limit: counted by the transport per host and cause, one row for all
  // hosts a minute.
  for (const auto& refused : server_->takeRefusals()) {
    noteLimitRefusals(refused.host, refused.cause, refused.count, now);
  }
  if (now - hello_swept_at_ >= 1.0) {
    hello_swept_at_ = now;
    closeSilentWithoutHello(now);
  }
  for (const auto& r : refusals_.flush(now)) report(r);
  std::erase_if(retired_peers_, [now](const auto& r) { return now - r.second > kRetiredGraceS; });
  for (const auto& closed : server_->takeClosedConnections()) {
    if (closed.peer.empty()) continue;
    if (auto r = retired_peers_.find(closed.peer); r != retired_peers_.end()) r->second = now;
    auto p = peers_.find(closed.peer);
    if (p == peers_.end()) continue;
    auto c = peer_of_client_.find(p->second.client);
    if (c != peer_of_client_.end() && c->second == closed.peer) peer_of_client_.erase(c);
    peers_.erase(p);
  }
}

void ZmqCoordinator::noteLimitRefusals(const std::string& host, transport::RefusalCause cause,
                                       uint64_t count, double now) {
  metrics_snapshot_.refused_connections_by_cause[transport::refusalCauseName(cause)] += count;
  if (auto r = refusals_.note(kLimitEventKind, host, kLimitCause, now, count, limitDetail(cause))) {
    recordEvent(r->kind, "", r->text(), now);
  }
}

std::string ZmqCoordinator::limitDetail(transport::RefusalCause cause) const {
  const auto& cc = config_.coordinator;
  switch (cause) {
    case transport::RefusalCause::kUnauthenticatedLimit:
      return "coordinator.max_unauthenticated (" + std::to_string(cc.max_unauthenticated) +
             ") connections were waiting to authenticate";
    case transport::RefusalCause::kEarlyDrop:
      return "random early drop, over half of coordinator.max_unauthenticated (" +
             std::to_string(cc.max_unauthenticated) + ") waiting to authenticate";
    case transport::RefusalCause::kPerHostLimit:
      return "coordinator.max_unauthenticated_per_host (" +
             std::to_string(cc.max_unauthenticated_per_host) +
             ") from its address were waiting to authenticate";
    case transport::RefusalCause::kDescriptorReserve:
      return "the coordinator was within its reserve of the descriptor limit (" +
             std::to_string(descriptor_limit_) + ", ulimit -n)";
    case transport::RefusalCause::kHandshakeTimeout:
      return "no handshake within coordinator.handshake_timeout_s (" +
             formatDuration(cc.handshake_timeout_s) + ")";
    case transport::RefusalCause::kSilentAfterHandshake:
      return "no message within twice coordinator.handshake_timeout_s (" +
             formatDuration(2 * cc.handshake_timeout_s) + ")";
    case transport::RefusalCause::kPerKeyLimit:
      return "more than coordinator.max_connections_per_key (" +
             std::to_string(cc.max_connections_per_key) + ") connections of one key";
    case transport::RefusalCause::kSilentWithoutHello:
      return "no Hello and nothing sent for " + formatDuration(kSilentWithoutHelloS);
  }
  return transport::refusalCauseName(cause);
}

void ZmqCoordinator::closeSilentWithoutHello(double now) {
  std::vector<std::pair<std::string, std::string>> silent;  // routing id, client
  for (const auto& [routing_id, peer] : peers_) {
    if (!peer.said_hello && peer.last_message > 0 &&
        now - peer.last_message >= kSilentWithoutHelloS) {
      silent.push_back({routing_id, peer.client});
    }
  }
  for (const auto& [routing_id, client] : silent) {
    // Its host is not known here: the client's id (or "unknown") stands for it.
    noteLimitRefusals(client.empty() ? "a client without a Hello" : "client " + client,
                      transport::RefusalCause::kSilentWithoutHello, 1, now);
    retire(routing_id, now);
  }
}

void ZmqCoordinator::flushRefusals(double now) {
  // The refusals of this takeTransportReports() call count too.
  for (const auto& refused : server_->takeRefusals()) {
    noteLimitRefusals(refused.host, refused.cause, refused.count, now);
  }
  for (const auto& r : refusals_.flushAll()) recordEvent(r.kind, "", r.text(), now);
}

void ZmqCoordinator::handleEnvelope(const transport::Envelope& env, double now) {
  if (retired_peers_.count(env.peer)) return;  // closing: replaced, revoked or rate-limited
  const bool secure = !config_.coordinator.insecure;
  Peer& peer = peers_[env.peer];
  // CURVE: the connection is the client its key belongs to, whatever it says.
  if (secure) peer.client = env.client_id;
  const engine::ClientId who = peer.client;

  peer.last_message = now;
  wire::DecodeLimits limits;
  limits.max_bytes = config_.clientFrameLimitBytes();
  auto decoded = wire::decode(env.payload, limits);
  Status bad = decoded.isOk() ? wire::checkClientMessage(*decoded) : decoded.status();
  if (!bad.isOk()) {
    if (!admit(env, ConnectionLimits::kBadFrame, now)) return;
    recordClientEvent("malformed_frame", who,
                      "peer " + transport::printableRoutingId(env.peer) + ", " +
                          std::to_string(env.payload.size()) + " bytes: " + bad.message(),
                      now);
    server_
        ->send(env.peer, wire::encode(wire::Error{wire::ErrorCode::kMalformed, bad.message(), 0}))
        .isOk();
    if (!who.empty() && peer_of_client_.count(who) && peer_of_client_[who] == env.peer) {
      engine_->onHeartbeat(who, now);
    }
    return;
  }
  wire::Message& msg = decoded.value();
  if (auto* hello = std::get_if<wire::Hello>(&msg)) {
    if (!admit(env, ConnectionLimits::kHello, now)) return;
    handleHello(env, *hello, now);
    return;
  }
  if (std::holds_alternative<wire::Heartbeat>(msg) &&
      !admit(env, ConnectionLimits::kHeartbeat, now)) {
    return;
  }

  auto current = who.empty() ? peer_of_client_.end() : peer_of_client_.find(who);
  if (secure && current != peer_of_client_.end() && current->second != env.peer &&
      engine_->isKnown(who)) {
    // The same key on a new connection (the client reconnected): it is the same client, so
    // the new connection carries on and the old one is closed.
    const std::string old = current->second;
    recordClientEvent("connection_replaced", who,
                      "peer " + transport::printableRoutingId(env.peer) + " replaces " +
                          transport::printableRoutingId(old),
                      now);
    retire(old, now);
    peer_of_client_[who] = env.peer;
    current = peer_of_client_.find(who);
  }
  if (current == peer_of_client_.end() || current->second != env.peer || !engine_->isKnown(who)) {
    // No Hello from this client yet: ask for one. After a coordinator restart every client's
    // first messages are its old session's (an upload on its way); that is expected and only
    // logged at debug. A connection that keeps talking without ever saying Hello is recorded
    // once.
    Peer& p = peers_[env.peer];
    ++p.before_hello;
    spdlog::debug("{} from peer {} ({}) before Hello: asking for one", wire::messageName(msg),
                  transport::printableRoutingId(env.peer), who);
    if (!p.warned_unknown && p.before_hello >= kMessagesBeforeHelloRecorded) {
      p.warned_unknown = true;
      recordClientEvent("unknown_client", who,
                        std::to_string(p.before_hello) + " messages (the latest " +
                            wire::messageName(msg) + ") from peer " +
                            transport::printableRoutingId(env.peer) +
                            " without a Hello, though asked for one",
                        now);
    }
    // One reply a second per connection is enough for the client to say Hello again.
    if (p.unknown_reply_at < 0 || now - p.unknown_reply_at >= 1.0) {
      p.unknown_reply_at = now;
      server_
          ->send(env.peer,
                 wire::encode(wire::Error{wire::ErrorCode::kUnknownClient, "send Hello first", 0}))
          .isOk();
    }
    return;
  }
  handleMessage(env, msg, who, now);
}

void ZmqCoordinator::handleHello(const transport::Envelope& env, const wire::Hello& hello,
                                 double now) {
  const bool secure = !config_.coordinator.insecure;
  const engine::ClientId id = secure ? env.client_id : hello.client_id;
  std::string problem;
  if (!transport::isValidClientId(hello.client_id)) {
    problem = "client id must be 1-128 characters of [A-Za-z0-9._@-]";
  } else if (secure && hello.client_id != env.client_id) {
    problem = "this connection's key is client '" + env.client_id + "' (its allow-list file is " +
              env.client_id + ".key), not '" + hello.client_id + "'";
  } else if (secure && hello.public_key != env.user_id) {
    problem = "Hello names a public key other than the one the connection authenticated with";
  } else if (auto k = key_of_client_.find(id);
             secure && k != key_of_client_.end() && k->second != env.user_id) {
    problem = "client id '" + id + "' is bound to key " + k->second +
              " in this run's history; a new key needs a new client id";
  } else if (hello.requested_partition >= 0 &&
             static_cast<uint32_t>(hello.requested_partition) >= config_.partitions()) {
    problem = "Hello asks for partition " + std::to_string(hello.requested_partition) +
              ", and the run has " + std::to_string(config_.partitions()) +
              " (data.partitions): ask for one of 0.." + std::to_string(config_.partitions() - 1) +
              " or for none (client.partition = -1)";
  }
  if (!problem.empty()) {
    recordClientEvent("hello_refused", id, problem, now);
    server_->send(env.peer, wire::encode(wire::Error{wire::ErrorCode::kRejected, problem, 0}))
        .isOk();
    return;
  }
  if (auto old = peer_of_client_.find(id);
      old != peer_of_client_.end() && old->second != env.peer) {
    const std::string old_peer = old->second;
    recordClientEvent("connection_replaced", id,
                      "peer " + transport::printableRoutingId(env.peer) + " replaces " +
                          transport::printableRoutingId(old_peer),
                      now);
    if (secure) {
      retire(old_peer, now);
    } else {
      peers_.erase(old_peer);  // no identity to go by: the newest Hello wins
    }
  }
  peers_[env.peer].client = id;
  peers_[env.peer].said_hello = true;
  peer_of_client_[id] = env.peer;
  if (secure) key_of_client_.emplace(id, env.user_id);
  engine_->onHello(id, hello, now);
}

void ZmqCoordinator::handleMessage(const transport::Envelope& env, wire::Message& msg,
                                   const engine::ClientId& who, double now) {
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, wire::Chunk>) {
          const auto t0 = std::chrono::steady_clock::now();
          engine_->onChunk(who, m, env.payload.size(), now);
          auto task = round_of_token_.find(m.task_token);
          if (task != round_of_token_.end()) {
            decode_seconds_[{task->second, who}] +=
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          }
        } else if constexpr (std::is_same_v<T, wire::Summary>) {
          engine_->onSummary(who, m, env.payload.size(), now);
        } else if constexpr (std::is_same_v<T, wire::UploadRequest>) {
          engine_->onUploadRequest(who, m.task_token, now);
        } else if constexpr (std::is_same_v<T, wire::SecAgg>) {
          engine_->onSecAgg(who, m, env.payload.size(), now);
        } else if constexpr (std::is_same_v<T, wire::Heartbeat>) {
          engine_->onHeartbeat(who, now);
          sendTo(who, wire::Heartbeat{m.seq});
        } else if constexpr (std::is_same_v<T, wire::Bye>) {
          engine_->onBye(who, now);
        } else if constexpr (std::is_same_v<T, wire::Error>) {
          engine_->onClientError(who, m, now);
        } else {
          if (!admit(env, ConnectionLimits::kBadFrame, now)) return;
          recordClientEvent("unexpected_message", who,
                            std::string(wire::messageName(msg)) + " is not a client message", now);
          sendTo(who,
                 wire::Error{wire::ErrorCode::kMalformed,
                             std::string(wire::messageName(msg)) + " is not a client message", 0});
        }
      },
      msg);
}

void ZmqCoordinator::stampRound(engine::CommitRound& commit) {
  // Real time is the run's clock here.
  commit.round.wall_start = commit.round.start_time;
  commit.round.wall_end = commit.round.end_time;
  for (auto& u : commit.updates) {
    u.wall_compute_s = u.compute_s;
    auto d = decode_seconds_.find({u.round, u.client_id});
    if (d != decode_seconds_.end()) {
      u.decode_s = d->second;
      decode_seconds_.erase(d);
    }
  }
  std::erase_if(round_of_token_, [&](const auto& kv) { return kv.second <= commit.round.round; });
}

// Block-cyclic runs: evaluates the block models on their blocks' sets, on the event loop (a few
// thousand samples a model, at the end of each block), and reports to the engine.
void ZmqCoordinator::evaluateBlocks(const engine::EvaluateBlocks& ev) {
  std::vector<engine::BlockEvalOutcome> outcomes;
  for (const auto& m : ev.models) {
    if (!block_model_ || m.block >= block_sets_.size()) continue;
    const auto& set = block_sets_[m.block];
    Status st = block_model_->setFlatParameters(*m.params);
    if (!st.isOk()) {
      spdlog::warn("block {} model {}: {}", m.block, m.model, st.toString());
      continue;
    }
    auto test = model::evaluateIndices(*block_model_, block_data_, set.test);
    if (!test.isOk()) {
      spdlog::warn("block {} model {}: {}", m.block, m.model, test.status().toString());
      continue;
    }
    engine::BlockEvalOutcome o;
    o.block = m.block;
    o.model = m.model;
    o.loss = test->loss;
    o.accuracy = test->accuracy.value_or(0);  // block-cyclic runs classify
    if (!set.validation.empty()) {
      auto val = model::evaluateIndices(*block_model_, block_data_, set.validation);
      if (val.isOk()) o.validation_loss = val->loss;
    }
    outcomes.push_back(std::move(o));
  }
  engine_->onBlocksEvaluated(ev.round, outcomes, unixNow());
}

// Folds a committed round into the live metrics.
void ZmqCoordinator::roundCommitted(const engine::CommitRound& commit) {
  MetricsSnapshot& m = metrics_snapshot_;
  const history::RoundRecord& r = commit.round;
  ++m.rounds_committed;
  m.last_committed_round = r.round;
  m.bytes_up += r.bytes_up;
  m.bytes_down += r.bytes_down;
  if (r.test_accuracy) m.test_accuracy = r.test_accuracy;
  if (r.test_loss) m.test_loss = r.test_loss;
  for (const auto& u : commit.updates) ++m.updates_by_status[u.status];
  if (r.status != "initial") m.round_duration.observe(r.end_time - r.start_time);
}

void ZmqCoordinator::publishMetrics(double now, bool force) {
  if (!metrics_ || (!force && now - metrics_published_at_ < 0.1)) return;
  metrics_snapshot_.round = engine_->currentRound();
  metrics_snapshot_.model_version = engine_->modelVersion();
  metrics_snapshot_.connected_clients = engine_->connectedClients();
  metrics_->publish(metrics_snapshot_);
  metrics_published_at_ = now;
}

void ZmqCoordinator::reportWaiting(double now) {
  const engine::RoundEngine::WaitingStatus w = engine_->waitingStatus();
  // Between rounds the wait is short: say nothing unless it lasts.
  if (!w.waiting || w.idle >= w.needed || now - w.since < 3.0) return;
  if (now - waiting_reported_at_ < 5.0) return;
  waiting_reported_at_ = now;
  constexpr size_t kNamed = 10;
  std::string names;
  for (size_t i = 0; i < w.connected.size() && i < kNamed; ++i) {
    names += (i ? ", " : "") + w.connected[i];
  }
  if (w.connected.size() > kNamed) {
    names += " and " + std::to_string(w.connected.size() - kNamed) + " more";
  }
  spdlog::info("waiting for clients: {} of {} connected ({}); {} of {} waited", w.connected.size(),
               w.needed, names.empty() ? "none yet" : names, formatDuration(now - w.since),
               formatDuration(config_.coordinator.wait_clients_s));
}

Status ZmqCoordinator::stopCleanly() {
  // A round whose evaluation is running is complete: let it commit (bounded; an evaluation
  // takes seconds).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    auto results = evaluator_->takeResults();
    for (auto& result : results) engine_->onEvaluated(result.round, result.outcome, unixNow());
    FEDFLEET_RETURN_IF_ERROR(carryOut());
    if (!evaluator_->busy() && results.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double now = unixNow();
  // No Bye: clients keep waiting and rejoin when the coordinator comes back (--resume).
  const uint32_t round = engine_->currentRound();
  const std::string detail = driver_->finished() ? "stopped after the run finished"
                             : engine_->waitingStatus().waiting
                                 ? "stopped between rounds, after round " + std::to_string(round)
                                 : "stopped during round " + std::to_string(round) +
                                       " (not committed: it runs again after --resume)";
  flushRefusals(now);
  recordEvent("run_interrupted", "", detail, now);
  FEDFLEET_RETURN_IF_ERROR(driver_->fatal());
  metrics_snapshot_.state = "interrupted";
  publishMetrics(now, true);
  spdlog::info("coordinator: {}; the history is consistent, continue with --resume", detail);
  return Status::ok();
}

Status ZmqCoordinator::run() {
  if (!already_finished_.empty()) {
    spdlog::info("{}", already_finished_);
    return Status::ok();
  }
  engine_->start(unixNow());
  metrics_snapshot_.state = "running";
  FEDFLEET_RETURN_IF_ERROR(carryOut());
  while (!driver_->finished()) {
    if (stop_.load()) return stopCleanly();
    double now = unixNow();
    // Poll briefly while an evaluation runs, so its result is committed promptly.
    const double max_wait_ms = evaluator_->busy() ? 5.0 : 200.0;
    int timeout_ms = static_cast<int>(max_wait_ms);
    if (auto wake = engine_->nextWakeup()) {
      timeout_ms = static_cast<int>(std::clamp((*wake - now) * 1000.0 + 1, 0.0, max_wait_ms));
    }
    auto got = server_->receive(timeout_ms);
    if (!got.isOk()) return got.status().withContext("coordinator socket");
    now = unixNow();
    if (reload_.exchange(false)) {
      spdlog::info("re-reading the allow-list {} (SIGHUP)", config_.allowDir());
      server_->reloadAllowList();
    }
    takeTransportReports(now);
    if (now - budgets_flushed_at_ >= 1.0) {
      budgets_flushed_at_ = now;
      for (auto& [client, budget] : event_budget_) flushLeftOut(client, budget, now);
    }
    if (got->has_value()) handleEnvelope(**got, now);
    // Drain what else is queued before ticking, so a burst of chunks is handled in one go.
    for (int i = 0; i < 256; ++i) {
      auto more = server_->receive(0);
      if (!more.isOk()) return more.status().withContext("coordinator socket");
      if (!more->has_value()) break;
      handleEnvelope(**more, unixNow());
    }
    now = unixNow();
    for (auto& result : evaluator_->takeResults()) {
      engine_->onEvaluated(result.round, result.outcome, now);
    }
    engine_->onTick(now);
    FEDFLEET_RETURN_IF_ERROR(carryOut());
    publishMetrics(now, false);
    reportWaiting(now);
  }
  flushRefusals(unixNow());
  metrics_snapshot_.state = driver_->runOk() ? "finished" : "failed";
  publishMetrics(unixNow(), true);
  if (!driver_->runOk()) return timeoutError(driver_->finishMessage());
  if (driver_->everyRoundFailed()) return driver_->everyRoundFailedError(config_.history.db);
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<CoordinatorService>> CoordinatorService::create(
    const config::Config& config) {
  auto service = std::make_unique<ZmqCoordinator>();
  FEDFLEET_RETURN_IF_ERROR(service->init(config));
  return std::unique_ptr<CoordinatorService>(std::move(service));
}

}  // namespace fedfleet::coordinator
