#include "sim/fleet_data.h"

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "common/data/block_cyclic.h"
#include "common/data/partition.h"
#include "common/data/source.h"
#include "driver/data_files.h"

namespace fedfleet::sim {

namespace {

// data.partition = "files": the clients' files in `dir`, sorted by name: its regular files not
// starting with '.' (csv, tensors), or its sub-directories (image-folder: one folder of class
// folders per client).
Result<std::vector<std::string>> clientFiles(const std::string& dir, data::DataFormat format) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return invalidArgument("data.path '" + dir +
                           "' is not a directory: data.partition = \"files\" reads one file "
                           "per client from a directory");
  }
  const bool folders = format == data::DataFormat::kImageFolder;
  std::vector<std::string> out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    if (folders ? it->is_directory(ec) : it->is_regular_file(ec)) out.push_back(it->path());
  }
  if (ec) return invalidArgument("data.path '" + dir + "': " + ec.message());
  std::sort(out.begin(), out.end());
  if (out.empty()) {
    return invalidArgument("data.path '" + dir + "' holds no client " +
                           (folders ? "folders" : "files"));
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<FleetData>> FleetData::create(const config::Config& config,
                                                     uint64_t clients) {
  std::unique_ptr<FleetData> fd(new FleetData());
  const auto& dc = config.data;
  fd->fed_eval_ = config.coordinator.fed_eval_every > 0;
  if (config.dataFormat() == data::DataFormat::kSynthetic) {
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
  if (dc.partition == config::PartitionScheme::kFiles) {
    // A natural partition: client k trains the k-th file (by name) of the directory data.path.
    FEDFLEET_ASSIGN_OR_RETURN(std::vector<std::string> files,
                              clientFiles(dc.path, config.dataFormat()));
    if (files.size() != clients) {
      return invalidArgument(
          "data.path '" + dc.path + "' holds " + std::to_string(files.size()) + " client " +
          (config.dataFormat() == data::DataFormat::kImageFolder ? "folders" : "files") +
          " (data.partition = \"files\": one per client), but sim.clients = " +
          std::to_string(clients) + ": set sim.clients = " + std::to_string(files.size()));
    }
    config::Config raw = config;  // normalised below, with the clients' files
    raw.data.normalize = "none";
    raw.data.mean.clear();
    raw.data.stddev.clear();
    FEDFLEET_ASSIGN_OR_RETURN(data::Dataset test, driver::loadTestFile(raw));
    data::Dataset train;
    for (size_t k = 0; k < files.size(); ++k) {
      FEDFLEET_ASSIGN_OR_RETURN(data::FileSource source, driver::fileSourceOf(config));
      source.path = files[k];
      source.test_path.clear();
      source.holdout_fraction = 0;
      FEDFLEET_ASSIGN_OR_RETURN(data::TrainTest one, data::loadTrainTest(source));
      FEDFLEET_RETURN_IF_ERROR(driver::applyClasses(one.train, config, files[k]));
      std::vector<uint32_t> part(one.train.size());
      std::iota(part.begin(), part.end(), static_cast<uint32_t>(train.size()));
      FEDFLEET_RETURN_IF_ERROR(data::appendSamples(train, one.train, files[k]));
      fd->partitions_.push_back(std::move(part));
    }
    train.num_classes = std::max(train.num_classes, test.num_classes);
    test.num_classes = train.num_classes;
    if (train.sample_shape != test.sample_shape || train.feature_dim != test.feature_dim) {
      return invalidArgument("the clients' files and the test file '" + dc.test_path +
                             "' hold samples of different shapes");
    }
    data::TrainTest both{std::move(train), std::move(test)};
    FEDFLEET_ASSIGN_OR_RETURN(fd->normalization_, driver::applyNormalization(config, both));
    fd->shape_ = model::inputShapeOf(both.train);
    fd->train_ = std::make_shared<const data::Dataset>(std::move(both.train));
    fd->test_ = std::make_shared<const data::Dataset>(std::move(both.test));
    if (fd->fed_eval_) {
      return invalidArgument(
          "coordinator.fed_eval_every with data.partition = \"files\": the clients' files hold "
          "no held-out data in the simulator; leave fed_eval_every 0 (the server evaluates on "
          "data.test_path)");
    }
    return fd;
  }
  if (config.readsDataFiles()) {
    // The user's files: one training set split over the clients, and the server's test set
    // (a test file, or a seeded hold-out of the training file).
    FEDFLEET_ASSIGN_OR_RETURN(const data::FileSource source, driver::fileSourceOf(config));
    FEDFLEET_ASSIGN_OR_RETURN(data::TrainTest both, data::loadTrainTest(source));
    FEDFLEET_RETURN_IF_ERROR(driver::applyClasses(both.train, config, dc.path));
    FEDFLEET_RETURN_IF_ERROR(
        driver::applyClasses(both.test, config, dc.test_path.empty() ? dc.path : dc.test_path));
    FEDFLEET_ASSIGN_OR_RETURN(fd->normalization_, driver::applyNormalization(config, both));
    train = std::move(both.train);
    test = std::move(both.test);
    source_name = "'" + dc.path + "'";
  } else {
    auto fashion = [&](bool train_split, uint32_t limit) -> Result<data::Dataset> {
      auto ds = data::loadFashionMnist(dir, train_split, limit);
      if (!ds.isOk()) return ds.status().withContext("data.dir");
      return ds;
    };
    FEDFLEET_ASSIGN_OR_RETURN(train, fashion(/*train=*/true, dc.train_subset));
    FEDFLEET_ASSIGN_OR_RETURN(test, fashion(/*train=*/false, dc.test_subset));
  }
  if (clients > train.size()) {
    return invalidArgument("sim.clients = " + std::to_string(clients) + " is more than the " +
                           std::to_string(train.size()) + " training samples of " + source_name);
  }
  data::PartitionSpec ps;
  ps.scheme = config::choiceName(dc.partition);
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
    auto parts = train.hasTargets() ? data::partitionUnlabelled(train.size(), ps)
                                    : data::partitionIndices(train.labels, train.num_classes, ps);
    if (!parts.isOk()) {
      // The partitioner names its own parameters; say which keys set them.
      return Status(parts.status().code(),
                    "data.partition = \"" + config::choiceName(dc.partition) +
                        "\" over sim.clients = " + std::to_string(clients) + " clients and " +
                        std::to_string(train.size()) + " samples: " + parts.status().message() +
                        " (the keys: data.alpha, sim.clients, data.train_subset)");
    }
    fd->partitions_ = std::move(*parts);
  }
  // A client without samples would fail every task it is given ("no sample indices"): refuse
  // at start-up, saying how many shards came out empty and what would fill them.
  const size_t empty =
      static_cast<size_t>(std::count_if(fd->partitions_.begin(), fd->partitions_.end(),
                                        [](const std::vector<uint32_t>& p) { return p.empty(); }));
  if (empty > 0) {
    return invalidArgument(
        "data.partition = \"" +
        (bc.count > 0 ? std::string("block-cyclic") : config::choiceName(dc.partition)) +
        "\" leaves " + std::to_string(empty) + " of the " + std::to_string(clients) +
        " clients (sim.clients) without a training sample: " + std::to_string(train.size()) +
        " samples of " + source_name + " do not go round. Lower sim.clients (at most " +
        std::to_string(std::max<size_t>(1, train.size() / 20)) +
        " gives each client about 20 samples), give more data (data.train_subset), or split "
        "with data.partition = \"iid\"");
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
  } else if (fd->fed_eval_) {
    // Federated evaluation: client k's held-out data is partition k of the test split, cut with
    // the training split's scheme and seed (as a real client cuts its part of the test split).
    data::PartitionSpec hs = ps;
    hs.min_samples =
        static_cast<uint32_t>(std::min<uint64_t>(ps.min_samples, fd->test_->size() / clients / 2));
    auto held = fd->test_->hasTargets()
                    ? data::partitionUnlabelled(fd->test_->size(), hs)
                    : data::partitionIndices(fd->test_->labels, fd->test_->num_classes, hs);
    if (held.isOk()) {
      fd->held_out_ = std::move(*held);
      fd->held_out_data_ = fd->test_;
      fd->held_out_status_ = Status::ok();
    } else {
      return invalidArgument("coordinator.fed_eval_every: the test split (" +
                             std::to_string(fd->test_->size()) +
                             " samples) cannot be cut into held-out data for " +
                             std::to_string(clients) + " clients: " + held.status().message() +
                             " (use fewer clients, more test data, or fed_eval_every = 0)");
    }
  }
  return fd;
}

uint64_t FleetData::shardSize(uint64_t k) const {
  if (synthetic_) return synthetic_->trainSamples(k);
  return partitions_.at(k).size();
}

uint64_t FleetData::heldOutSize(uint64_t k) const {
  if (synthetic_) return synthetic_->totalSamples(k) - synthetic_->trainSamples(k);
  return held_out_status_.isOk() && k < held_out_.size() ? held_out_[k].size() : 0;
}

Result<ClientShard> FleetData::heldOut(uint64_t k) const {
  if (synthetic_ && (!blocks_.empty() || fed_eval_)) {
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
