// ServedModelStore: the model a client of a block-cyclic run serves for evaluation and
// inference (wire::ServedModel; engine/round_engine.h, protocol step B6).
//
// Each task names the served model of the client's block; the bytes come only when they
// changed (attached to the task, or the task's own training model). The store keeps the
// current one in memory and, when a path is configured (client.served_model_path), publishes it
// as two files an inference process on the device can read: `<path>` holds the flat fp32
// parameters (little endian, the model's layout), `<path>.json` what they are (block, model,
// version, SHA-256, architecture). Each file is replaced atomically (temporary file + rename),
// the parameters first, so the JSON never names parameters that are not in place yet.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "common/wire/messages.h"

namespace fedfleet::client {

class ServedModelStore {
 public:
  explicit ServedModelStore(std::string path) : path_(std::move(path)) {}

  // Takes the served model `task` names. Returns true when the model held changed (save() it).
  //  kNone: nothing changes. kUnchanged: nothing changes either; holds() says whether the store
  //  has the named one. kTaskModel: the task's model_bytes, whose SHA-256 must be the named one.
  //  kAttached: served_bytes, which must be as long as model_bytes and match the named SHA-256.
  // kCorrupt when the bytes do not match (the store keeps what it held; refuse the task).
  // The task's model and the attached served bytes come apart (task.model_bytes and
  // task.served.bytes are not read): shared buffers the store keeps without copying, as the
  // simulator hands every virtual client the coordinator's own. `served_bytes` may be null
  // unless the source is kAttached (null then: kCorrupt).
  Result<bool> take(const wire::Task& task, std::shared_ptr<const std::string> model_bytes,
                    std::shared_ptr<const std::string> served_bytes);

  // Writes the held model to the configured path (no-op without a path or a model). kIoError
  // when a file cannot be written; the files then still hold the previous model.
  Status save() const;

  bool empty() const { return !bytes_ || bytes_->empty(); }
  // Whether the held model is the one with SHA-256 `sha`.
  bool holds(const wire::Sha256& sha) const { return !empty() && info_.sha256 == sha; }
  // The held model's SHA-256 (all zero when empty), its description (no bytes) and its bytes.
  const wire::Sha256& sha256() const { return info_.sha256; }
  const wire::ServedModel& info() const { return info_; }
  const std::string& bytes() const { return bytes_ ? *bytes_ : kNoBytes; }
  // The held bytes as a shared buffer (null when empty).
  const std::shared_ptr<const std::string>& sharedBytes() const { return bytes_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  wire::ServedModel info_;  // bytes empty; they live in bytes_
  std::string model_name_;  // the architecture (wire::Task::model_name)
  std::shared_ptr<const std::string> bytes_;
  static inline const std::string kNoBytes;
};

}  // namespace fedfleet::client
