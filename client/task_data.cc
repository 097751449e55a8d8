#include "client/task_data.h"

#include <spdlog/spdlog.h>

#include <functional>
#include <numeric>

#include "common/wire/data_split.h"

namespace fedfleet::client {
namespace {

std::string partitionKey(const wire::DataSpec& d) {
  return d.dataset + "|" + d.scheme + "|" + std::to_string(d.alpha) + "|" +
         std::to_string(d.labels_per_client) + "|" + std::to_string(d.shards_per_client) + "|" +
         std::to_string(d.num_partitions) + "|" + std::to_string(d.seed) + "|" +
         std::to_string(d.subset) + "|" + std::to_string(d.blocks) + "|" + std::to_string(d.skew);
}

// Partition spec.index of `ds` split as `spec` says, computed once per split into `cache`.
Result<const std::vector<uint32_t>*> partitionOf(
    const data::Dataset& ds, const wire::DataSpec& spec,
    std::map<std::string, std::vector<std::vector<uint32_t>>>* cache) {
  const std::string key = partitionKey(spec);
  auto it = cache->find(key);
  if (it == cache->end()) {
    FEDFLEET_ASSIGN_OR_RETURN(auto parts, wire::splitBySpec(ds, spec));
    it = cache->emplace(key, std::move(parts)).first;
  }
  if (spec.index >= it->second.size()) {
    return invalidArgument("partition " + std::to_string(spec.index) + " of " +
                           std::to_string(it->second.size()));
  }
  return &it->second[spec.index];
}

}  // namespace

TaskData::TaskData(TaskDataOptions options) : options_(std::move(options)) {
  if (options_.own_data) training_size_.store(options_.own_data->size());
}

const data::Dataset& TaskData::trainingSet() const {
  return options_.own_data ? *options_.own_data : *train_set_;
}

Result<const std::vector<uint32_t>*> TaskData::indicesFor(const wire::DataSpec& spec) {
  if (spec.scheme == "none") {  // train everything this client holds
    if (!options_.own_data) {
      return invalidArgument(
          "the coordinator's tasks say data.partition = \"none\" (train the "
          "data you hold), but this client has no files of its own: give it "
          "data.format and data.path");
    }
    if (spec.dataset != options_.own_format) {
      return invalidArgument("the coordinator trains '" + spec.dataset +
                             "' data, this client holds '" + options_.own_format + "' files");
    }
    if (all_own_.size() != options_.own_data->size()) {
      all_own_.resize(options_.own_data->size());
      std::iota(all_own_.begin(), all_own_.end(), 0u);
    }
    return &all_own_;
  }
  if (options_.own_data) {
    return invalidArgument("this client trains its own files (data.format = \"" +
                           options_.own_format +
                           "\"): the coordinator must run with data.partition = \"none\", not \"" +
                           spec.scheme + "\"");
  }
  if (spec.dataset != "fashion-mnist") {
    return invalidArgument("unsupported dataset '" + spec.dataset + "'");
  }
  if (!train_set_ || train_set_limit_ != spec.subset) {
    const std::string dir =
        options_.data_dir.empty() ? data::defaultFashionMnistDir() : options_.data_dir;
    FEDFLEET_ASSIGN_OR_RETURN(auto ds, data::loadFashionMnist(dir, /*train=*/true, spec.subset));
    // Client processes on one host share one copy of the pixels (a read-only mapped file).
    const std::string key = "fashion-mnist-train-" + std::to_string(ds.size()) + "-" +
                            std::to_string(std::hash<std::string>{}(dir));
    if (Status st = data::shareImages(ds, data::defaultCacheDir(), key); !st.isOk()) {
      spdlog::warn("client {}: keeping a private copy of the training images: {}",
                   options_.client_id, st.toString());
    }
    train_set_ = std::move(ds);
    train_set_limit_ = spec.subset;
    training_size_.store(train_set_->size());
    partitions_.clear();
  }
  return partitionOf(*train_set_, spec, &partitions_);
}

Result<TaskData::HeldOut> TaskData::heldOut(const wire::DataSpec& spec) {
  if (spec.scheme == "none") {  // its own held-out file or fraction
    if (!options_.own_test || options_.own_test->size() == 0) {
      if (!warned_no_held_out_) {
        spdlog::warn(
            "client {}: the coordinator asks for a federated evaluation, but this client "
            "holds no held-out data (give it data.test_path or data.holdout_fraction); it "
            "trains and reports none",
            options_.client_id);
        warned_no_held_out_ = true;
      }
      return HeldOut{};
    }
    if (all_own_test_.size() != options_.own_test->size()) {
      all_own_test_.resize(options_.own_test->size());
      std::iota(all_own_test_.begin(), all_own_test_.end(), 0u);
    }
    return HeldOut{options_.own_test.get(), &all_own_test_};
  }
  return testPartition(spec);
}

Result<TaskData::HeldOut> TaskData::testPartition(const wire::DataSpec& spec) {
  if (spec.dataset != "fashion-mnist") {
    return invalidArgument("unsupported dataset '" + spec.dataset + "'");
  }
  if (!test_set_) {
    const std::string dir =
        options_.data_dir.empty() ? data::defaultFashionMnistDir() : options_.data_dir;
    FEDFLEET_ASSIGN_OR_RETURN(test_set_, data::loadFashionMnist(dir, /*train=*/false, 0));
  }
  FEDFLEET_ASSIGN_OR_RETURN(const std::vector<uint32_t>* held,
                            partitionOf(*test_set_, spec, &held_out_));
  return HeldOut{&*test_set_, held};
}

}  // namespace fedfleet::client
