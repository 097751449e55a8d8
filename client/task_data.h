// The samples a networked client's tasks name: its own files (the coordinator runs with
// data.partition = "none"), or its partition of Fashion-MNIST's training split cut as the task's
// DataSpec says (loaded on first use and shared between the client processes of one host
// through a mapped file; each split computed once). And the held-out samples a federated
// evaluation runs on. One thread uses it (the client's worker); trainingSize() is safe from any.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/data/dataset.h"
#include "common/status.h"
#include "common/wire/messages.h"

namespace fedfleet::client {

struct TaskDataOptions {
  std::string client_id;  // names the client in log lines
  // The client's own training files (null: it trains its Fashion-MNIST partition), their
  // data.format, and its own held-out data (null or empty: none).
  std::shared_ptr<const data::Dataset> own_data;
  std::string own_format;
  std::shared_ptr<const data::Dataset> own_test;
  std::string data_dir;  // Fashion-MNIST's IDX files ("": the default directory)
};

class TaskData {
 public:
  explicit TaskData(TaskDataOptions options);

  // The indices into trainingSet() that a task with `spec` trains. Errors: the task and this
  // client's data disagree (own files against a split, another format or data set), the data
  // cannot be read, or the split has no partition spec.index.
  Result<const std::vector<uint32_t>*> indicesFor(const wire::DataSpec& spec);
  // The data set indicesFor's indices point into (after a successful indicesFor).
  const data::Dataset& trainingSet() const;

  // Samples of a data set (data null: none).
  struct HeldOut {
    const data::Dataset* data = nullptr;
    const std::vector<uint32_t>* indices = nullptr;
  };
  // What a federated evaluation runs on: the client's own held-out data (spec.scheme "none";
  // none held: an empty HeldOut, warned about once), else testPartition(spec).
  Result<HeldOut> heldOut(const wire::DataSpec& spec);
  // Partition spec.index of Fashion-MNIST's test split, cut as the training split is.
  Result<HeldOut> testPartition(const wire::DataSpec& spec);

  // Training samples this client holds so far (its own files: all; a split: the loaded
  // training set's, 0 before the first task), for its Hello.
  uint64_t trainingSize() const { return training_size_.load(); }

 private:
  TaskDataOptions options_;
  std::optional<data::Dataset> train_set_;
  uint32_t train_set_limit_ = 0;
  std::vector<uint32_t> all_own_;       // 0..n-1 over options_.own_data
  std::vector<uint32_t> all_own_test_;  // 0..n-1 over options_.own_test
  bool warned_no_held_out_ = false;
  std::map<std::string, std::vector<std::vector<uint32_t>>> partitions_;
  std::optional<data::Dataset> test_set_;
  std::map<std::string, std::vector<std::vector<uint32_t>>> held_out_;
  std::atomic<uint64_t> training_size_{0};
};

}  // namespace fedfleet::client
