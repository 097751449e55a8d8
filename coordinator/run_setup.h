// What every driver of the RoundEngine does the same way: engine options from the run's
// configuration, and committing a round to the history (log line, transaction, checkpoint
// pruning). The ZeroMQ coordinator and the fleet simulator both use these, so a config means
// the same rounds in both.
#pragma once

#include <cstdint>

#include "common/config/config.h"
#include "common/history/history.h"
#include "common/status.h"
#include "coordinator/round_engine.h"

namespace fedfleet::coordinator {

// The engine options a validated config asks for (run_id and, when resuming, first_round and
// model_version are the caller's to set).
EngineOptions engineOptionsFromConfig(const config::Config& config, int64_t run_id);

// What the engine's constructor would otherwise abort on: selector and server optimiser
// options it cannot build (kInvalidArgument naming the config key).
Status checkEngineOptions(const EngineOptions& options);

// Logs one line for the round and writes it (round, updates, checkpoint) in one transaction,
// then prunes old checkpoints down to `keep_checkpoints` (a pruning failure is only logged: the
// round is safe). `clock_unit` labels the round's duration in the log ("s", or "s virtual").
// A failed write returns the Status with context; the round is then not in the database.
Status commitRoundToHistory(history::HistoryStore& store, const CommitRound& commit,
                            uint32_t keep_checkpoints, const char* clock_unit = "s");

}  // namespace fedfleet::coordinator
