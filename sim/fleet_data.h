// FleetData: the training data of every virtual client and the server's test set.
//
// Fashion-MNIST is loaded once and split among the clients with a partitioner (the pixels are
// shared; a client's shard is a list of indices). FedProx's Synthetic(alpha, beta) is generated
// per client, on demand, from (seed, client): a fleet of a million registered clients holds no
// data until a client is sampled, and then only that client's, for the length of its task.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/config/config.h"
#include "common/data/dataset.h"
#include "common/data/source.h"
#include "common/data/synthetic.h"
#include "common/model/model.h"
#include "common/status.h"

namespace fedfleet::sim {

// One client's training data: samples `indices` of `data`.
struct ClientShard {
  std::shared_ptr<const data::Dataset> data;
  std::vector<uint32_t> indices;
};

class FleetData {
 public:
  // Reads config.data for `clients` virtual clients (seeded by config.run.seed).
  // Errors: unreadable data set, a partitioner that cannot split (too many clients for the
  // samples), bad synthetic parameters.
  static Result<std::unique_ptr<FleetData>> create(const config::Config& config, uint64_t clients);

  // Client `k`'s shard. Thread-safe; for synthetic data it generates the data (O(samples)).
  Result<ClientShard> shard(uint64_t k) const;
  // Samples client k trains on (cheap: no data generated).
  uint64_t shardSize(uint64_t k) const;

  // The server's test set (Fashion-MNIST: the 10k test images, or config.data.test_subset of
  // them; synthetic: the test splits of the first data.eval_devices clients).
  const std::shared_ptr<const data::Dataset>& testSet() const { return test_; }
  model::InputShape inputShape() const { return shape_; }

  // Block-cyclic runs (config.blocks.count > 0): block m's validation and test sets (samples
  // `validation` and `test` of `data`). Fashion-MNIST: drawn from the test split with block m's
  // class mix (common/data/block_cyclic.h); synthetic: the test splits of the first
  // data.eval_devices devices of block m, alternately to validation and test. Empty otherwise.
  struct BlockEvalSet {
    std::shared_ptr<const data::Dataset> data;
    std::vector<uint32_t> validation;
    std::vector<uint32_t> test;
  };
  const std::vector<BlockEvalSet>& blockSets() const { return blocks_; }

  // Block-cyclic runs: client k's held-out data, on which it evaluates the model it serves.
  // Fashion-MNIST: partition k of the whole test split cut as the training split is
  // (partitionBlockCyclic), as a real client cuts it (wire::splitBySpec); synthetic: device k's
  // test split. kFailedPrecondition without blocks, or when the test split has too few samples
  // for that many partitions (the message says why).
  // With federated evaluation (coordinator.fed_eval_every > 0) too: partition k of the test
  // split cut with the training split's scheme.
  Result<ClientShard> heldOut(uint64_t k) const;
  // The samples of heldOut(k) (0: none).
  uint64_t heldOutSize(uint64_t k) const;
  // The data.normalize statistics applied to the user's files (empty: none).
  const data::ChannelStats& normalization() const { return normalization_; }

 private:
  FleetData() = default;

  std::shared_ptr<const data::Dataset> train_;  // Fashion-MNIST
  std::vector<std::vector<uint32_t>> partitions_;
  std::optional<data::SyntheticFederation> synthetic_;
  std::shared_ptr<const data::Dataset> test_;
  model::InputShape shape_;
  std::vector<BlockEvalSet> blocks_;
  std::shared_ptr<const data::Dataset> held_out_data_;  // Fashion-MNIST with blocks
  std::vector<std::vector<uint32_t>> held_out_;
  Status held_out_status_ =
      failedPrecondition("no held-out data: the run has no blocks and no federated evaluation");
  bool fed_eval_ = false;
  data::ChannelStats normalization_;
};

}  // namespace fedfleet::sim
