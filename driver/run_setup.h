// What every driver of the RoundEngine does the same way: engine options from the run's
// configuration, and committing a round to the history (log line, transaction, checkpoint
// pruning). The ZeroMQ coordinator and the fleet simulator both use these, so a config means
// the same rounds in both.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/config/config.h"
#include "common/data/dataset.h"
#include "common/history/history.h"
#include "common/model/model.h"
#include "common/status.h"
#include "engine/round_engine.h"

namespace fedfleet::driver {

// The engine options a validated config asks for (run_id and, when resuming, first_round and
// model_version are the caller's to set).
engine::EngineOptions engineOptionsFromConfig(const config::Config& config, int64_t run_id);

// The size of every partition of the training split, cut as clients cut it for their tasks
// (common/wire/data_split.h with options.data and options.num_partitions): what the engine bounds
// an update's sample claim with (EngineOptions::partition_sizes). `train` is the training split
// with options.data.subset applied, as clients load it. Errors: the partitioner's.
Result<std::vector<uint64_t>> partitionSizes(const engine::EngineOptions& options,
                                             const data::Dataset& train);
// The same, loading the training split from config.data.dir (or the default directory) as a
// client does. A data set clients do not train from files (not "fashion-mnist") gives an empty
// vector: sizes unknown, coordinator.max_samples_per_update bounds the claims. Errors: the
// data set cannot be read, or the partitioner's.
//
// A driver calls it once it has the options it will run with (after engineOptionsFromConfig and
// its own changes to them, num_partitions and data in particular) and before
// checkEngineOptions:
//   FEDFLEET_ASSIGN_OR_RETURN(eo.partition_sizes, partitionSizes(config, eo));
// (or, to run on where the training data cannot be read, log the error and leave the sizes
// empty: checkEngineOptions then refuses max_samples_per_update = 0). The simulator sets them
// from its own shards instead.
Result<std::vector<uint64_t>> partitionSizes(const config::Config& config,
                                             const engine::EngineOptions& options);

// Refuses partition sizes with an empty partition: a client given it would fail every task
// ("no sample indices"). The message names the keys that fix it. OK for unknown sizes (empty).
Status emptyPartitionCheck(const std::vector<uint64_t>& sizes);

// Which checkpoints of a run the history keeps (coordinator.keep_checkpoints and keep_best).
struct CheckpointKeep {
  uint32_t last = 3;  // the latest `last`; 0: all
  bool best = true;   // and the one of the best test accuracy (HistoryStore::pruneCheckpoints)
};
CheckpointKeep checkpointKeepFromConfig(const config::Config& config);

// Logs one line for the round and writes it (round, updates, checkpoint) in one transaction,
// then prunes old checkpoints down to what `keep` says (a pruning failure is only logged: the
// round is safe). `clock_unit` labels the round's duration in the log ("s", or "s virtual").
// A failed write returns the Status with context; the round is then not in the database.
Status commitRoundToHistory(history::HistoryStore& store, const engine::CommitRound& commit,
                            CheckpointKeep keep, const char* clock_unit = "s");

// The start-up check before the first round: one batch of `ds` (the run's `role` data:
// "training" or "test") through `model` (model::checkModelFitsData), the error naming the
// config's model (its name, and the TorchScript file) and data (data.format and its file).
Status checkModelFitsConfigData(model::Model& model, const data::Dataset& ds,
                                const config::Config& config, const std::string& role);

// The run's model as the config makes it, the same in every driver: model.name (model.path for
// "torchscript") for inputs of `shape`, initialised from run.seed, with the loss train.loss and,
// when `load_init`, model.init's weights; then the start-up check (checkModelFitsConfigData)
// against each data set given. Errors: the model's, the weights file's, the check's.
struct RunModelChecks {
  const data::Dataset* training = nullptr;  // checked as the "training" set when not null
  const data::Dataset* test = nullptr;      // checked as the "test" set when not null
  bool load_init = true;  // false: model.init is the peers' to read (a peer coordinator)
};
Result<std::unique_ptr<model::Model>> createRunModel(const config::Config& config,
                                                     const model::InputShape& shape,
                                                     const RunModelChecks& checks = {});

// The history of `db`: a SQLite file, or ":memory:" (kept in memory: a simulation that records
// nothing) when `in_memory_ok`.
Result<std::unique_ptr<history::HistoryStore>> openRunHistory(const std::string& db,
                                                              bool in_memory_ok);

// The row that begins a run of `config` now: run.name, run.seed, the config itself as its
// recorded configuration (`recorded` when given: the config with values a driver filled in),
// `clock` ("wall": unix seconds; "virtual": a simulation's time) and the model's description.
history::RunRecord newRunRecord(const config::Config& config, const std::string& clock,
                                std::string model_json, const config::Config* recorded = nullptr);

}  // namespace fedfleet::driver
