#include "driver/resume.h"

#include <algorithm>
#include <array>

namespace fedfleet::driver {

bool isOperationalConfigKey(std::string_view key) {
  // Whole sections: the client's own settings, the simulator's, where the history lives and
  // the metrics endpoint.
  for (std::string_view section : {"client.", "sim.", "history.", "metrics."}) {
    if (key.starts_with(section)) return true;
  }
  static constexpr std::array<std::string_view, 24> kKeys = {
      "run.name",
      "coordinator.bind",
      "coordinator.insecure",
      "coordinator.keys_dir",
      "coordinator.allow_dir",
      "coordinator.resume",
      "coordinator.resume_changes",
      "coordinator.threads",
      "coordinator.wait_clients_s",
      "coordinator.max_failed_rounds",
      "coordinator.liveness_s",
      "coordinator.checkpoint_every",
      "coordinator.keep_checkpoints",
      "coordinator.keep_best",
      "coordinator.partial_buffer_mib",
      "coordinator.max_message_mib",
      "coordinator.max_unauthenticated",
      "coordinator.max_unauthenticated_per_host",
      "coordinator.handshake_timeout_s",
      "coordinator.max_connections_per_key",
      "aggregation.buffer_mib",
      "limits.events_per_client_round",
      "limits.events_burst",
      "limits.events_every_s",
  };
  for (std::string_view k : kKeys) {
    if (key == k) return true;
  }
  return key == "data.dir";  // where the same data lives on this machine
}

std::vector<ConfigChange> configChanges(const nlohmann::json& stored, const nlohmann::json& now) {
  std::vector<ConfigChange> out;
  if (!now.is_object()) return out;
  for (const auto& [section, keys] : now.items()) {
    if (!keys.is_object()) continue;
    auto s = stored.find(section);
    if (s == stored.end() || !s->is_object()) continue;
    for (const auto& [name, value] : keys.items()) {
      const std::string key = section + "." + name;
      if (isOperationalConfigKey(key)) continue;
      // data.normalize = "computed" records the statistics it computed: outputs, not settings.
      if ((key == "data.mean" || key == "data.std") && section == "data" &&
          config::Choice<config::Normalization>::parse(keys.value("normalize", std::string())) ==
              config::Normalization::kComputed) {
        continue;
      }
      auto old = s->find(name);
      if (old == s->end()) continue;
      // Numbers compare by value: a stored 5 and a new 5.0 are the same setting.
      const bool same = (old->is_number() && value.is_number())
                            ? old->get<double>() == value.get<double>()
                            : *old == value;
      if (!same) out.push_back(ConfigChange{key, *old, value});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const ConfigChange& a, const ConfigChange& b) { return a.key < b.key; });
  return out;
}

Result<nlohmann::json> effectiveRunConfig(const history::RunRecord& run,
                                          const std::vector<history::EventRecord>& events) {
  nlohmann::json config =
      nlohmann::json::parse(run.config_json, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) {
    return corrupt("run " + std::to_string(run.run_id) +
                   ": its stored configuration is not a JSON object");
  }
  for (const auto& e : events) {
    if (e.kind != "resume_changes") continue;
    nlohmann::json changes = nlohmann::json::parse(e.detail, nullptr, false);
    if (!changes.is_object()) {
      return corrupt("run " + std::to_string(run.run_id) +
                     ": a resume_changes event's detail is not a JSON object");
    }
    for (const auto& [key, change] : changes.items()) {
      const size_t dot = key.find('.');
      if (dot == std::string::npos || !change.is_object() || !change.contains("to")) {
        return corrupt("run " + std::to_string(run.run_id) + ": resume_changes entry '" + key +
                       "' is not {\"from\": ..., \"to\": ...}");
      }
      config[key.substr(0, dot)][key.substr(dot + 1)] = change["to"];
    }
  }
  return config;
}

Result<nlohmann::json> latestRunConfig(history::HistoryStore& history, const std::string& name) {
  FEDFLEET_ASSIGN_OR_RETURN(auto runs, history.runs());
  const history::RunRecord* found = nullptr;
  for (const auto& r : runs) {
    if (name.empty() || r.name == name) found = &r;
  }
  if (!found) return notFound(name.empty() ? "no run" : "no run named '" + name + "'");
  FEDFLEET_ASSIGN_OR_RETURN(auto events, history.events(found->run_id));
  return effectiveRunConfig(*found, events);
}

std::string changesDetail(const std::vector<ConfigChange>& changes) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& c : changes) j[c.key] = {{"from", c.from}, {"to", c.to}};
  return j.dump();
}

std::string describeChanges(const std::vector<ConfigChange>& changes) {
  std::string out;
  for (const auto& c : changes) {
    if (!out.empty()) out += ", ";
    out += c.key + " " + c.from.dump() + " -> " + c.to.dump();
  }
  return out;
}

Result<ResumePoint> findResumableRun(history::HistoryStore& history, const config::Config& config) {
  const std::string& db = config.history.db;
  FEDFLEET_ASSIGN_OR_RETURN(auto runs, history.runs());
  const history::RunRecord* found = nullptr;
  for (const auto& r : runs) {
    if (r.name == config.run.name) found = &r;
  }
  if (!found) return notFound("--resume: no run named '" + config.run.name + "' in " + db);
  ResumePoint point;
  point.run_id = found->run_id;
  point.label = "run " + std::to_string(point.run_id) + " '" + found->name + "'";

  // The same run? Its stored config (with changes accepted before) against this one.
  FEDFLEET_ASSIGN_OR_RETURN(auto events, history.events(point.run_id));
  auto stored = effectiveRunConfig(*found, events);
  if (!stored.isOk()) return stored.status().withContext("--resume");
  point.changes = configChanges(*stored, config.toJson());
  if (!point.changes.empty() && !config.coordinator.resume_changes) {
    return failedPrecondition(
        "--resume: this config changes " + point.label + ": " + describeChanges(point.changes) +
        ". Resume with the run's own config, or add --resume-changes to continue it with "
        "these changes (they are recorded in the history as a resume_changes event)");
  }

  // A finished run has nothing to resume (unless the changes give it more rounds).
  FEDFLEET_ASSIGN_OR_RETURN(auto done, history.rounds(point.run_id));
  for (const auto& r : done) point.last_round = std::max(point.last_round, r.round);
  const bool finished_event = std::any_of(events.begin(), events.end(),
                                          [](const auto& e) { return e.kind == "run_finished"; });
  if (point.last_round >= config.run.rounds || (finished_event && point.changes.empty())) {
    point.already_finished = point.label + " already finished: its last round is " +
                             std::to_string(point.last_round) +
                             " of run.rounds = " + std::to_string(config.run.rounds) + " in " + db +
                             "; nothing to resume. To train it further, raise run.rounds and add "
                             "--resume-changes; to start over, give the run another run.name";
  }
  return point;
}

Result<ResumePoint> findResumePoint(history::HistoryStore& history, const config::Config& config,
                                    size_t num_params) {
  FEDFLEET_ASSIGN_OR_RETURN(ResumePoint point, findResumableRun(history, config));
  if (!point.already_finished.empty()) return point;
  FEDFLEET_ASSIGN_OR_RETURN(auto done, history.rounds(point.run_id));
  auto cp = history.latestCheckpoint(point.run_id);
  if (cp.isOk()) {
    if (cp->blob.size() != num_params * sizeof(float)) {
      return invalidArgument("--resume: checkpoint of run " + std::to_string(point.run_id) +
                             " holds " + std::to_string(cp->blob.size() / 4) +
                             " values but model '" + config.model.name + "' has " +
                             std::to_string(num_params));
    }
    // Rounds recorded after the checkpoint (failed ones, which left the model as it was, or ok
    // ones between checkpoints) are never run again: numbering continues after the last.
    point.first_round = point.last_round + 1;
    for (const auto& r : done) point.lost_rounds += r.round > cp->round && r.status == "ok";
    point.checkpoint = std::move(*cp);
    return point;
  }
  if (cp.status().code() != StatusCode::kNotFound) return cp.status();
  // No checkpoint: no round changed the model yet (only round 0 and failed rounds are
  // recorded), so it is still the initial one. Continue after the last recorded round; do not
  // record round 0 twice.
  for (const auto& r : done) {
    if (r.status == "ok") {
      return failedPrecondition("--resume: run " + std::to_string(point.run_id) + " has round " +
                                std::to_string(r.round) +
                                " but no checkpoint to resume from "
                                "(coordinator.checkpoint_every = 0?)");
    }
    point.first_round = std::max(point.first_round, r.round + 1);
  }
  if (!done.empty()) point.evaluate_initial = false;
  return point;
}

}  // namespace fedfleet::driver
