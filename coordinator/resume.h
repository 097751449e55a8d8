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
#include <string>
#include <string_view>
#include <vector>

#include "common/history/history.h"
#include "common/status.h"

namespace fedfleet::coordinator {

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

// The detail of a resume_changes event: {"key": {"from": ..., "to": ...}, ...}.
std::string changesDetail(const std::vector<ConfigChange>& changes);
// "run.rounds 5 -> 8, coordinator.clients_per_round 2 -> 3" for messages.
std::string describeChanges(const std::vector<ConfigChange>& changes);

}  // namespace fedfleet::coordinator
