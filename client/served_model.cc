#include "client/served_model.h"

#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/crypto/sha256.h"

namespace fedfleet::client {

Result<bool> ServedModelStore::take(const wire::Task& task) {
  const wire::ServedModel& s = task.served;
  const std::string* bytes = nullptr;
  switch (s.source) {
    case wire::ServedSource::kNone:
    case wire::ServedSource::kUnchanged:
      return false;
    case wire::ServedSource::kTaskModel:
      if (s.sha256 != task.model_sha256) {
        return corrupt("served model: the task's model is not the served model it names");
      }
      bytes = &task.model_bytes;
      break;
    case wire::ServedSource::kAttached:
      if (s.bytes.size() != task.model_bytes.size() || crypto::sha256(s.bytes) != s.sha256) {
        return corrupt("served model bytes (" + std::to_string(s.bytes.size()) +
                       ") do not match their SHA-256 or the model's size (" +
                       std::to_string(task.model_bytes.size()) + ")");
      }
      bytes = &s.bytes;
      break;
  }
  if (holds(s.sha256)) {
    info_ = s;  // the same parameters, perhaps under a newer name (block, version)
    info_.bytes.clear();
    return false;
  }
  bytes_ = *bytes;
  info_ = s;
  info_.bytes.clear();
  model_name_ = task.model_name;
  return true;
}

Status ServedModelStore::save() const {
  if (path_.empty() || empty()) return Status::ok();
  FEDFLEET_RETURN_IF_ERROR(writeFileAtomically(path_, bytes_));
  nlohmann::ordered_json j;
  j["block"] = info_.block;
  j["model"] = info_.model;
  j["version"] = info_.version;
  j["sha256"] = crypto::toHex(info_.sha256);
  j["architecture"] = model_name_;
  j["parameters"] = bytes_.size() / sizeof(float);
  return writeFileAtomically(path_ + ".json", j.dump(2) + "\n");
}

}  // namespace fedfleet::client
