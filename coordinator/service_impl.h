// The ZeroMQ coordinator's own parts, shared by its source files and by nothing else: the
// ZmqCoordinator class (coordinator/coordinator_service.h's CoordinatorService) and its
// constants. Its members are defined by concern:
//   coordinator_service.cc  start-up (keys, data, the run's model, history, resume), the loop,
//                           metrics, a clean stop
//   service_messages.cc     what clients send and what the engine sends them
//   service_connections.cc  the transport's reports: connections admitted, closed, retired and
//                           refused, limits, events and the event budget's left-out rows
#pragma once

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
#include "coordinator/coordinator_service.h"
#include "coordinator/metrics_server.h"
#include "coordinator/refusal_log.h"
#include "driver/data_files.h"
#include "driver/engine_driver.h"
#include "driver/resume.h"
#include "driver/run_setup.h"
#include "engine/round_engine.h"

namespace fedfleet::coordinator::internal {

// ZMQ_RCVHWM of the ROUTER socket when upload credits are on: messages queued per peer before
// ZeroMQ stops reading that peer's connection. A granted uploader's chunks (1 MiB by default)
// wait here; other peers send small messages only.
inline constexpr int kCreditedReceiveHwm = 4;

// Rounds before the one just ended that may still await their evaluation when the next round
// starts (EngineOptions::max_evaluations_behind). Each holds its commit, checkpoint and model
// snapshot: unbounded, rounds faster than the evaluator grew the coordinator by about 100 KB a
// round of a 7,850-parameter model (bench/memory_soak.sh).
inline constexpr uint32_t kMaxEvaluationsBehind = 2;
// Messages a connection may send before its Hello before that is recorded as an event (a
// restarted coordinator's clients send a few of their old session's on reconnecting).
inline constexpr uint32_t kMessagesBeforeHelloRecorded = 50;
// A keyed connection that has not said Hello and has sent nothing for this long is closed
// (honest clients say Hello at once and send a heartbeat every client.heartbeat_s).
inline constexpr double kSilentWithoutHelloS = 30;
// How long after its close was reported a retired connection's queued frames are still dropped.
inline constexpr double kRetiredGraceS = 5;
// The event kind of connections closed by a connection limit (one aggregated row per interval
// across all hosts: coordinator/refusal_log.h), and its cause.
inline constexpr const char* kLimitEventKind = "connection_refused";
inline constexpr const char* kLimitCause = "closed by a connection limit";

class ZmqCoordinator final : public CoordinatorService, private driver::DriverPort {
 public:
  Status init(const config::Config& config, engine::AggregatorFactory custom_aggregator);
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
  void transmitTask(const engine::SendTask& send);
  // A connection of `id` replaced its earlier one, or it said Hello again (`why`): the task it
  // holds, when nothing of its upload has come yet, may have gone to a closed connection (or
  // been dropped after an UNKNOWN_CLIENT) and is sent again; the client ignores a task it
  // already holds. Logged, with a `task_resent` row.
  void resendUnstartedTask(const engine::ClientId& id, const std::string& why, double now);
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
  // The latest task sent to each client, for resendUnstartedTask; pruned at every commit to the
  // tasks whose upload has not started (so no old model buffer is held longer).
  struct SentTask {
    engine::SendTask send;
    int resent = 0;  // times sent again (at most kMaxTaskResends: a Hello is not a download)
  };
  static constexpr int kMaxTaskResends = 3;
  std::map<engine::ClientId, SentTask> sent_tasks_;
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

}  // namespace fedfleet::coordinator::internal
