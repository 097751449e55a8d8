// The actions RoundEngine emits for its driver to carry out (engine/round_engine.h), plain
// structs with no I/O: the driver sends the messages, writes the history rows and runs the
// evaluations they ask for.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/history/records.h"
#include "common/wire/messages.h"
#include "engine/block_coordinator.h"
#include "engine/participant.h"

namespace fedfleet::engine {

// Actions the driver must carry out, in the order given.
// The task's model_bytes is empty: `model_bytes` holds them, one immutable buffer shared by
// every task of the same model version, which the driver sends as the Task's model frame.
struct SendTask {
  ClientId client;
  wire::Task task;
  std::shared_ptr<const std::string> model_bytes;
  // task.served.source == kAttached: the served model's bytes (shared like model_bytes), sent
  // after model_bytes in the model frame; null otherwise.
  std::shared_ptr<const std::string> served_bytes;
};
struct SendCancel {
  ClientId client;
  wire::Cancel cancel;
};
struct SendGrant {
  ClientId client;
  wire::UploadGrant grant;
};
struct SendError {
  ClientId client;
  wire::Error error;
};
// A step of the round's secure aggregation (engine/secure_aggregation.h) for `client`.
struct SendSecAgg {
  ClientId client;
  wire::SecAgg message;
};
struct SendBye {
  ClientId client;
  std::string reason;
};
struct UpsertClient {
  history::ClientRecord client;
};
struct RecordEvent {
  history::EventRecord event;
};
// How a round ends: round 0's evaluation of the initial model, a step of the model, or a failed
// round (the model unchanged, or rolled back).
enum class RoundOutcome { kInitial, kOk, kFailed };
// How the history spells `outcome` (RoundRecord::status).
const char* outcomeName(RoundOutcome outcome);

// A round to record. The engine reads the typed outcome and states; the records spell them for
// the history (set through setOutcome and addUpdate, which keep the two the same).
struct CommitRound {
  history::RoundRecord round;
  std::vector<history::UpdateRecord> updates;
  std::vector<UpdateState> states;  // updates[i]'s state
  RoundOutcome outcome = RoundOutcome::kOk;
  std::optional<history::CheckpointRecord> checkpoint;

  void setOutcome(RoundOutcome o) {
    outcome = o;
    round.status = outcomeName(o);
  }
  // `row` as updateRecord() made it of a participant in `state`.
  void addUpdate(UpdateState state, history::UpdateRecord row) {
    states.push_back(state);
    updates.push_back(std::move(row));
  }
};
// Evaluate `params` (the model after `round`) on the server's test set and report the outcome
// with onEvaluated(round, ...); std::nullopt there when there is no test set or it failed.
struct Evaluate {
  uint32_t round = 0;
  std::shared_ptr<const std::vector<float>> params;
};
struct RunFinished {
  bool ok = true;
  std::string message;
};
// (The block-cyclic actions EvaluateBlocks and RecordBlockMetrics: engine/block_coordinator.h.)
using Action = std::variant<SendTask, SendCancel, SendError, SendBye, UpsertClient, RecordEvent,
                            Evaluate, CommitRound, RunFinished, EvaluateBlocks, RecordBlockMetrics,
                            SendGrant, SendSecAgg>;

}  // namespace fedfleet::engine
