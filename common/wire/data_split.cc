#include "common/wire/data_split.h"

#include "common/data/block_cyclic.h"
#include "common/data/partition.h"

namespace fedfleet::wire {

using data::BlockCyclicSpec;
using data::Dataset;
using data::Label;
using data::PartitionSpec;
using data::partitionBlockCyclic;
using data::partitionIndices;
using data::partitionUnlabelled;

Result<std::vector<std::vector<uint32_t>>> splitBySpec(const std::vector<Label>& labels,
                                                       uint32_t num_classes,
                                                       const DataSpec& spec) {
  if (spec.scheme == "block-cyclic") {
    BlockCyclicSpec bs;
    bs.blocks = spec.blocks;
    bs.skew = spec.skew;
    bs.num_partitions = spec.num_partitions;
    bs.seed = spec.seed;
    return partitionBlockCyclic(labels, num_classes, bs);
  }
  PartitionSpec ps;
  ps.scheme = spec.scheme;
  ps.alpha = spec.alpha;
  ps.labels_per_client = spec.labels_per_client;
  ps.shards_per_client = spec.shards_per_client;
  ps.num_partitions = spec.num_partitions;
  ps.seed = spec.seed;
  return partitionIndices(labels, num_classes, ps);
}

Result<std::vector<std::vector<uint32_t>>> splitBySpec(const Dataset& ds,
                                                       const DataSpec& spec) {
  if (!ds.hasTargets()) return splitBySpec(ds.labels, ds.num_classes, spec);
  if (spec.scheme == "block-cyclic") {
    return invalidArgument(
        "partition: block-cyclic splits by class label; regression targets "
        "have none");
  }
  PartitionSpec ps;
  ps.scheme = spec.scheme;
  ps.alpha = spec.alpha;
  ps.num_partitions = spec.num_partitions;
  ps.seed = spec.seed;
  return partitionUnlabelled(ds.size(), ps);
}

}  // namespace fedfleet::wire
