#include "sim/fleet_data.h"

#include <numeric>

#include "common/data/block_cyclic.h"
#include "common/data/partition.h"
#include "common/data/source.h"
#include "common/model/data_files.h"

namespace fedfleet::sim {

Result<std::unique_ptr<FleetData>> FleetData::create(const config::Config& config,
                                                     uint64_t clients) {
  std::unique_ptr<FleetData> fd(new FleetData());
  const auto& dc = config.data;
  if (config.dataFormat() == "synthetic") {
    data::SyntheticSpec spec;
    spec.alpha = dc.synthetic_alpha;
    spec.beta = dc.synthetic_beta;
    spec.devices = clients;
    spec.dim = dc.synthetic_dim;
    spec.num_classes = 10;
    spec.seed = config.run.seed;
    spec.max_samples = dc.max_samples;
    spec.iid = dc.synthetic_iid;
    const uint32_t blocks = config.blocks.count;
    if (blocks > 0) {
      spec.blocks = blocks;
      spec.block_shift = config.blocks.synthetic_shift;
    }
    FEDFLEET_ASSIGN_OR_RETURN(auto fed, data::SyntheticFederation::create(spec));
    fd->synthetic_.emplace(std::move(fed));
    // The server's test set: the test splits of the first eval_devices devices, concatenated.
    auto test = std::make_shared<data::Dataset>();
    test->feature_dim = spec.dim;
    test->num_classes = spec.num_classes;
    const uint64_t n_eval = std::min<uint64_t>(dc.eval_devices, clients);
    for (uint64_t k = 0; k < n_eval; ++k) {
      FEDFLEET_ASSIGN_OR_RETURN(data::Dataset part, fd->synthetic_->generate(k, /*train=*/false));
      test->features.insert(test->features.end(), part.features.begin(), part.features.end());
      test->labels.insert(test->labels.end(), part.labels.begin(), part.labels.end());
    }
    if (dc.test_subset > 0 && test->labels.size() > dc.test_subset) {
      test->labels.resize(dc.test_subset);
      test->features.resize(static_cast<size_t>(dc.test_subset) * spec.dim);
    }
    if (blocks > 0) {
      // Block m: the test splits of its devices among the first eval_devices (k = m mod M),
      // the 1st, 3rd, ... to validation, the 2nd, 4th, ... to test.
      auto all = std::make_shared<data::Dataset>();
      all->feature_dim = spec.dim;
      all->num_classes = spec.num_classes;
      fd->blocks_.resize(blocks);
      for (auto& b : fd->blocks_) b.data = all;
      for (uint64_t k = 0; k < n_eval; ++k) {
        FEDFLEET_ASSIGN_OR_RETURN(data::Dataset part, fd->synthetic_->generate(k, false));
        auto& b = fd->blocks_[k % blocks];
        auto& into = (k / blocks) % 2 == 0 ? b.validation : b.test;
        for (size_t i = 0; i < part.size(); ++i) {
          into.push_back(static_cast<uint32_t>(all->labels.size() + i));
        }
        all->features.insert(all->features.end(), part.features.begin(), part.features.end());
        all->labels.insert(all->labels.end(), part.labels.begin(), part.labels.end());
      }
    }
    fd->shape_ = model::inputShapeOf(*test);
    fd->test_ = std::move(test);
    return fd;
  }

  const std::string dir = dc.dir.empty() ? data::defaultFashionMnistDir() : dc.dir;
  data::Dataset train, test;
  std::string source_name = "Fashion-MNIST";
  if (config.readsDataFiles()) {
    // The user's files: one training set split over the clients, and the server's test set
    // (a test file, or a seeded hold-out of the training file).
    FEDFLEET_ASSIGN_OR_RETURN(const data::FileSource source, model::fileSourceOf(config));
    FEDFLEET_ASSIGN_OR_RETURN(data::TrainTest both, data::loadTrainTest(source));
    train = std::move(both.train);
    test = std::move(both.test);
    source_name = "'" + dc.path + "'";
  } else {
    FEDFLEET_ASSIGN_OR_RETURN(train, data::loadFashionMnist(dir, /*train=*/true, dc.train_subset));
    FEDFLEET_ASSIGN_OR_RETURN(test, data::loadFashionMnist(dir, /*train=*/false, dc.test_subset));
  }
  if (clients > train.size()) {
    return invalidArgument("sim.clients = " + std::to_string(clients) + " is more than the " +
                           std::to_string(train.size()) + " training samples of " + source_name);
  }
  data::PartitionSpec ps;
  ps.scheme = dc.partition;
  ps.alpha = dc.alpha;
  ps.labels_per_client = dc.labels_per_client;
  ps.shards_per_client = dc.shards_per_client;
  ps.num_partitions = static_cast<uint32_t>(clients);
  ps.seed = config.run.seed;
  // NIID-Bench's floor of 10 samples a client cannot hold when the clients are many; keep it
  // where it can.
  ps.min_samples = static_cast<uint32_t>(std::min<uint64_t>(10, train.size() / clients / 2));
  const auto& bc = config.blocks;
  if (bc.count > 0) {
    // Block-cyclic: client k holds block (k mod M) data (its `skew` from the block's classes),
    // whatever data.partition says.
    data::BlockCyclicSpec bs;
    bs.blocks = bc.count;
    bs.skew = bc.skew;
    bs.num_partitions = static_cast<uint32_t>(clients);
    bs.seed = config.run.seed;
    FEDFLEET_ASSIGN_OR_RETURN(fd->partitions_, data::partitionBlockCyclic(train.labels, 10, bs));
  } else {
    FEDFLEET_ASSIGN_OR_RETURN(fd->partitions_,
                              data::partitionIndices(train.labels, train.num_classes, ps));
  }
  fd->shape_ = model::inputShapeOf(train);
  fd->train_ = std::make_shared<const data::Dataset>(std::move(train));
  fd->test_ = std::make_shared<const data::Dataset>(std::move(test));
  if (bc.count > 0) {
    FEDFLEET_ASSIGN_OR_RETURN(
        auto splits,
        data::blockEvalIndices(fd->test_->labels, 10, bc.count, bc.skew, bc.validation_samples,
                               bc.test_samples, config.run.seed));
    for (auto& sp : splits) {
      fd->blocks_.push_back({fd->test_, std::move(sp.validation), std::move(sp.test)});
    }
    // Held-out data of the clients: the whole test split, cut like the training split.
    std::shared_ptr<const data::Dataset> all_test = fd->test_;
    if (dc.test_subset > 0) {
      FEDFLEET_ASSIGN_OR_RETURN(data::Dataset full, data::loadFashionMnist(dir, false, 0));
      all_test = std::make_shared<const data::Dataset>(std::move(full));
    }
    data::BlockCyclicSpec hs;
    hs.blocks = bc.count;
    hs.skew = bc.skew;
    hs.num_partitions = static_cast<uint32_t>(clients);
    hs.seed = config.run.seed;
    auto held = data::partitionBlockCyclic(all_test->labels, 10, hs);
    if (held.isOk()) {
      fd->held_out_ = std::move(*held);
      fd->held_out_data_ = std::move(all_test);
      fd->held_out_status_ = Status::ok();
    } else {
      fd->held_out_status_ =
          failedPrecondition("no held-out data for the served models: " + held.status().message());
    }
  }
  return fd;
}

uint64_t FleetData::shardSize(uint64_t k) const {
  if (synthetic_) return synthetic_->trainSamples(k);
  return partitions_.at(k).size();
}

Result<ClientShard> FleetData::heldOut(uint64_t k) const {
  if (synthetic_ && !blocks_.empty()) {
    ClientShard s;
    FEDFLEET_ASSIGN_OR_RETURN(data::Dataset ds, synthetic_->generate(k, /*train=*/false));
    s.indices.resize(ds.size());
    std::iota(s.indices.begin(), s.indices.end(), 0u);
    s.data = std::make_shared<const data::Dataset>(std::move(ds));
    return s;
  }
  FEDFLEET_RETURN_IF_ERROR(held_out_status_);
  if (k >= held_out_.size()) {
    return invalidArgument("client " + std::to_string(k) + " has no held-out data");
  }
  return ClientShard{held_out_data_, held_out_[k]};
}

Result<ClientShard> FleetData::shard(uint64_t k) const {
  ClientShard s;
  if (synthetic_) {
    FEDFLEET_ASSIGN_OR_RETURN(data::Dataset ds, synthetic_->generate(k, /*train=*/true));
    s.indices.resize(ds.size());
    std::iota(s.indices.begin(), s.indices.end(), 0u);
    s.data = std::make_shared<const data::Dataset>(std::move(ds));
    return s;
  }
  if (k >= partitions_.size()) {
    return invalidArgument("client " + std::to_string(k) + " has no partition");
  }
  s.data = train_;
  s.indices = partitions_[k];
  return s;
}

}  // namespace fedfleet::sim
