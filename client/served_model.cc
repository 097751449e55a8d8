#include "client/served_model.h"

#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/crypto/sha256.h"

namespace fedfleet::client {

Result<bool> ServedModelStore::take(const wire::Task& task,
                                    std::shared_ptr<const std::string> model_bytes,
                                    std::shared_ptr<const std::string> served_bytes) {
  const wire::ServedModel& s = task.served;
  std::shared_ptr<const std::string> bytes;
  const size_t model_size = model_bytes ? model_bytes->size() : 0;
  switch (s.source) {
    case wire::ServedSource::kNone:
    case wire::ServedSource::kUnchanged:
      return false;
    case wire::ServedSource::kTaskModel:
      if (s.sha256 != task.model_sha256) {
        return corrupt("served model: the task's model is not the served model it names");
      }
      bytes = std::move(model_bytes);
      break;
    case wire::ServedSource::kAttached: {
      const size_t size = served_bytes ? served_bytes->size() : 0;
      if (size != model_size || !served_bytes || crypto::sha256(*served_bytes) != s.sha256) {
        return corrupt("served model bytes (" + std::to_string(size) +
                       ") do not match their SHA-256 or the model's size (" +
                       std::to_string(model_size) + ")");
      }
      bytes = std::move(served_bytes);
      break;
    }
  }
  if (holds(s.sha256)) {
    info_ = s;  // the same parameters, perhaps under a newer name (block, version)
    info_.bytes.clear();
    return false;
  }
  bytes_ = std::move(bytes);
  info_ = s;
  info_.bytes.clear();
  model_name_ = task.model_name;
  return true;
}

Status ServedModelStore::save() const {
  if (path_.empty() || empty()) return Status::ok();
  FEDFLEET_RETURN_IF_ERROR(writeFileAtomically(path_, *bytes_));
  nlohmann::ordered_json j;
  j["block"] = info_.block;
  j["model"] = info_.model;
  j["version"] = info_.version;
  j["sha256"] = crypto::toHex(info_.sha256);
  j["architecture"] = model_name_;
  j["parameters"] = bytes_->size() / sizeof(float);
  return writeFileAtomically(path_ + ".json", j.dump(2) + "\n");
}

}  // namespace fedfleet::client
