#include "driver/engine_driver.h"

#include <type_traits>
#include <variant>

#include "driver/run_setup.h"

namespace fedfleet::driver {

EngineDriver::EngineDriver(history::HistoryStore& history, DriverPort& port, CheckpointKeep keep,
                           const char* clock_unit)
    : history_(history), port_(port), keep_(keep), clock_unit_(clock_unit) {}

Status EngineDriver::carryOut(engine::RoundEngine& engine) {
  std::vector<engine::Action> actions;
  while (fatal_.isOk() && !(actions = engine.takeActions()).empty()) {
    for (auto& action : actions) {
      if (!fatal_.isOk()) break;
      carryOut(action);
    }
  }
  return fatal_;
}

void EngineDriver::recordEvent(const history::EventRecord& event) {
  if (!fatal_.isOk()) return;
  if (event.kind == "round_failed") last_round_failure_ = event.detail;
  if (event.kind == "update_rejected" || event.kind == "client_error") {
    last_update_failure_ = event.client_id + ": " + event.detail;
  }
  Status st = history_.recordEvent(event);
  if (!st.isOk()) return fail(st, "history: event");
  port_.eventRecorded(event);
}

Status EngineDriver::everyRoundFailedError(const std::string& history_db) const {
  std::string msg = "every one of the " + std::to_string(committed_rounds_) +
                    " training rounds failed, so the model never changed";
  if (!last_round_failure_.empty()) msg += " (the last: " + last_round_failure_ + ")";
  if (!last_update_failure_.empty()) msg += "; the last update refused: " + last_update_failure_;
  msg += "; the events say why: fedfleet history --db " + history_db + " events";
  return failedPrecondition(msg);
}

void EngineDriver::upsertClient(const history::ClientRecord& client) {
  if (!fatal_.isOk()) return;
  Status st = history_.upsertClient(client);
  if (!st.isOk()) fail(st, "history: client");
}

void EngineDriver::fail(const Status& st, const char* context) {
  if (fatal_.isOk()) fatal_ = context ? st.withContext(context) : st;
}

void EngineDriver::carryOut(engine::Action& action) {
  std::visit(
      [&](auto& a) {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<T, engine::SendTask>) {
          port_.sendTask(a);
        } else if constexpr (std::is_same_v<T, engine::SendCancel>) {
          port_.sendCancel(a);
        } else if constexpr (std::is_same_v<T, engine::SendGrant>) {
          port_.sendGrant(a);
        } else if constexpr (std::is_same_v<T, engine::SendSecAgg>) {
          port_.sendSecAgg(a);
        } else if constexpr (std::is_same_v<T, engine::SendError>) {
          port_.sendError(a);
        } else if constexpr (std::is_same_v<T, engine::SendBye>) {
          port_.sendBye(a);
        } else if constexpr (std::is_same_v<T, engine::UpsertClient>) {
          upsertClient(a.client);
        } else if constexpr (std::is_same_v<T, engine::RecordEvent>) {
          recordEvent(a.event);
        } else if constexpr (std::is_same_v<T, engine::CommitRound>) {
          port_.stampRound(a);
          Status st = commitRoundToHistory(history_, a, keep_, clock_unit_);
          if (!st.isOk()) return fail(st, nullptr);  // it says what failed
          if (a.round.round > 0) {
            ++committed_rounds_;
            if (a.outcome == engine::RoundOutcome::kFailed) ++failed_rounds_;
          }
          port_.roundCommitted(a);
        } else if constexpr (std::is_same_v<T, engine::Evaluate>) {
          port_.evaluate(a);
        } else if constexpr (std::is_same_v<T, engine::EvaluateBlocks>) {
          port_.evaluateBlocks(a);
        } else if constexpr (std::is_same_v<T, engine::RecordBlockMetrics>) {
          Status st = history_.recordBlockMetrics(a.rows);
          if (!st.isOk()) return fail(st, "history: block metrics");
          port_.blockMetricsRecorded(a.rows);
        } else if constexpr (std::is_same_v<T, engine::RunFinished>) {
          finished_ = true;
          run_ok_ = a.ok;
          finish_message_ = a.message;
        } else {
          static_assert(!sizeof(T), "an engine action EngineDriver does not carry out");
        }
      },
      action);
}

}  // namespace fedfleet::driver
