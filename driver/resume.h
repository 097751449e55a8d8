// Resuming a run (`fedfleet coordinator --resume`): what the history says the run is, and
// whether the configuration given now is the same run.
//
// A run's configuration is stored with it (RunRecord::config_json). A resume with a config
// that changes what the run means (its rounds, K, data, model, training, aggregation, ...) is
// refused unless coordinator.resume_changes is set; then the changes are recorded as a
// "resume_changes" event whose detail is a JSON object {"key": {"from": old, "to": new}, ...},
// and later resumes compare against the stored config with those changes applied. Keys that
// only say how this process runs (where it listens, its keys, threads, the history file,
// metrics, timeouts of the wait for clients, memory bounds) may differ freely.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/config/config.h"
#include "common/history/history.h"
#include "common/status.h"

namespace fedfleet::driver {

// One key whose value differs ("section.key", the stored value and the new one).
struct ConfigChange {
  std::string key;
  nlohmann::json from;
  nlohmann::json to;
};

// True for keys that may differ between a run and its resumption.
bool isOperationalConfigKey(std::string_view key);

// The keys of `now` that differ from `stored` (both Config::toJson() objects of sections),
// operational keys left out, ordered by key. A key that `stored` lacks (a config written by an
// older build) is not a change.
std::vector<ConfigChange> configChanges(const nlohmann::json& stored, const nlohmann::json& now);

// The configuration the run has now: its stored config_json with every resume_changes event
// of `events` (the run's events, in order) applied. Errors: kCorrupt when the stored config or
// an event's detail is not the JSON these functions write.
Result<nlohmann::json> effectiveRunConfig(const history::RunRecord& run,
                                          const std::vector<history::EventRecord>& events);

// The configuration of the latest run named `name` in `history` as it stands now: its stored
// config with the changes accepted since (effectiveRunConfig). An empty `name`: the latest run
// of any name. kNotFound: no such run.
Result<nlohmann::json> latestRunConfig(history::HistoryStore& history, const std::string& name);

// The detail of a resume_changes event: {"key": {"from": ..., "to": ...}, ...}.
std::string changesDetail(const std::vector<ConfigChange>& changes);
// "run.rounds 5 -> 8, coordinator.clients_per_round 2 -> 3" for messages.
std::string describeChanges(const std::vector<ConfigChange>& changes);

// Where a resumed run continues: what every driver needs to build its engine again.
struct ResumePoint {
  int64_t run_id = 0;
  std::string label;  // "run 3 'name'", for messages
  // Set when the run has nothing left to do (its last round is run.rounds, or it finished and
  // nothing changed): what to say instead of running.
  std::string already_finished;
  // Changes accepted with coordinator.resume_changes: the driver records them as a
  // resume_changes event (changesDetail) before it runs.
  std::vector<ConfigChange> changes;
  // The latest checkpoint (model, model version, engine state), or none when no round changed
  // the model yet: the initial model then, which the same seed builds again.
  std::optional<history::CheckpointRecord> checkpoint;
  uint32_t first_round = 0;      // the next round's number (after every recorded round)
  bool evaluate_initial = true;  // false when round 0 is already recorded
  uint32_t lost_rounds = 0;      // ok rounds after the checkpoint: their training is lost
  uint32_t last_round = 0;       // the last recorded round
};

// The latest run named config.run.name in `history`, checked against `config` (a config that
// changes the run is refused unless config.coordinator.resume_changes): run_id, label, changes,
// last_round and already_finished of the ResumePoint; the rest is left as it is. Errors as
// findResumePoint's.
Result<ResumePoint> findResumableRun(history::HistoryStore& history, const config::Config& config);

// findResumableRun, and where the model continues from: a checkpoint whose size
// is not `num_params` floats is refused. Errors say what to do (kNotFound: no such run;
// kFailedPrecondition: changes not accepted, or ok rounds without any checkpoint;
// kInvalidArgument: a checkpoint of another model; kCorrupt: unreadable stored config).
Result<ResumePoint> findResumePoint(history::HistoryStore& history, const config::Config& config,
                                    size_t num_params);

}  // namespace fedfleet::driver
