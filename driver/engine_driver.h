// EngineDriver: what every driver of the RoundEngine does with its actions, once.
//
// The engine emits actions; a driver carries them out. Two drivers exist (the ZeroMQ
// coordinator in real time, the fleet simulator in virtual time) and they differ only in how a
// message reaches a client, how a model is evaluated and which clock fills the wall-time
// columns. Everything else lives here: the loop that takes actions until the engine has none
// (carrying one out can produce more: an evaluation leads to a commit), the history writes
// (clients, events, rounds with their updates and checkpoint, block metrics), the run's end,
// and the sticky fatal error: the first history write that fails stops the run, and no action
// after it is carried out (what was committed before stays consistent).
//
// The driver's own part is a DriverPort. Its calls happen on the thread that calls carryOut().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/history/history.h"
#include "common/status.h"
#include "driver/run_setup.h"
#include "engine/round_engine.h"

namespace fedfleet::driver {

class DriverPort {
 public:
  virtual ~DriverPort() = default;

  // Messages to clients. A client the driver cannot reach is the engine's to notice (its
  // liveness timeout, or a goodbye).
  virtual void sendTask(engine::SendTask& send) = 0;
  virtual void sendCancel(const engine::SendCancel& cancel) = 0;
  virtual void sendGrant(const engine::SendGrant& grant) = 0;
  virtual void sendSecAgg(const engine::SendSecAgg& step) = 0;
  virtual void sendError(const engine::SendError& error) = 0;
  virtual void sendBye(const engine::SendBye& bye) = 0;

  // Evaluations (LibTorch work, the driver's): report with RoundEngine::onEvaluated and
  // onBlocksEvaluated, now or later.
  virtual void evaluate(const engine::Evaluate& evaluate) = 0;
  virtual void evaluateBlocks(const engine::EvaluateBlocks& evaluate) = 0;

  // Fills the driver's clock columns of a round about to be written (RoundRecord::wall_start
  // and wall_end, UpdateRecord::wall_compute_s and decode_s).
  virtual void stampRound(engine::CommitRound& commit) = 0;

  // After rows were written (only then): for metrics, summaries and log lines.
  virtual void roundCommitted(const engine::CommitRound& commit) { (void)commit; }
  virtual void eventRecorded(const history::EventRecord& event) { (void)event; }
  virtual void blockMetricsRecorded(const std::vector<history::BlockMetricRecord>& rows) {
    (void)rows;
  }
};

class EngineDriver {
 public:
  // `clock_unit` labels round durations in the log ("s", or "s virtual"); old checkpoints are
  // pruned down to what `keep` says after each commit (commitRoundToHistory).
  EngineDriver(history::HistoryStore& history, DriverPort& port, CheckpointKeep keep,
               const char* clock_unit);

  // Carries out the engine's actions until it has none. Returns the fatal error, once there is
  // one (and from then on carries out nothing).
  Status carryOut(engine::RoundEngine& engine);

  // Rows of the driver's own (not engine actions), under the same fatal-error rule.
  void recordEvent(const history::EventRecord& event);
  void upsertClient(const history::ClientRecord& client);

  // The first failed history write, with context; ok while there is none.
  const Status& fatal() const { return fatal_; }
  // RunFinished: whether the engine has ended the run, how, and what it said.
  bool finished() const { return finished_; }
  bool runOk() const { return run_ok_; }
  const std::string& finishMessage() const { return finish_message_; }
  // Training rounds (round > 0) committed through this driver, and how many of them failed.
  // everyRoundFailed(): at least one committed and none succeeded: a run that ends so exits
  // non-zero; lastRoundFailure() is the last round_failed event's detail ("" if none).
  // everyRoundFailedError() also names the last refused update (client and reason).
  uint32_t committedRounds() const { return committed_rounds_; }
  uint32_t failedRounds() const { return failed_rounds_; }
  bool everyRoundFailed() const {
    return committed_rounds_ > 0 && failed_rounds_ == committed_rounds_;
  }
  const std::string& lastRoundFailure() const { return last_round_failure_; }
  // The error a run that ended with everyRoundFailed() returns: how many rounds, the last
  // reason, and where to look. `history_db` is the history file.
  Status everyRoundFailedError(const std::string& history_db) const;

 private:
  void carryOut(engine::Action& action);
  // Keeps the first failure only: it is the cause, later ones follow from it.
  void fail(const Status& st, const char* context);

  history::HistoryStore& history_;
  DriverPort& port_;
  CheckpointKeep keep_;
  const char* clock_unit_;
  Status fatal_;
  bool finished_ = false;
  bool run_ok_ = false;
  std::string finish_message_;
  uint32_t committed_rounds_ = 0;
  uint32_t failed_rounds_ = 0;
  std::string last_round_failure_;
  std::string last_update_failure_;  // the last update_rejected or client_error event
};

}  // namespace fedfleet::driver
