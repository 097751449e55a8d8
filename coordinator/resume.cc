#include "coordinator/resume.h"

#include <algorithm>
#include <array>

namespace fedfleet::coordinator {

bool isOperationalConfigKey(std::string_view key) {
  // Whole sections: the client's own settings, the simulator's, where the history lives and
  // the metrics endpoint.
  for (std::string_view section : {"client.", "sim.", "history.", "metrics."}) {
    if (key.starts_with(section)) return true;
  }
  static constexpr std::array<std::string_view, 16> kKeys = {
      "run.name",
      "coordinator.bind",
      "coordinator.insecure",
      "coordinator.keys_dir",
      "coordinator.allow_dir",
      "coordinator.resume",
      "coordinator.resume_changes",
      "coordinator.threads",
      "coordinator.wait_clients_s",
      "coordinator.liveness_s",
      "coordinator.checkpoint_every",
      "coordinator.keep_checkpoints",
      "coordinator.partial_buffer_mib",
      "coordinator.max_message_mib",
      "aggregation.buffer_mib",
      "limits.events_per_client_round",
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

}  // namespace fedfleet::coordinator
