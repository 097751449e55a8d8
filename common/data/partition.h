// Partitioners: how a labelled data set is split among clients (IID, the NIID-Bench label and
// quantity skews, Li et al., ICDE 2022, and FedAvg's pathological shards, McMahan et al., AISTATS
// 2017).
//
// Every partitioner works on the label vector alone and returns sample indices, so the same code
// splits Fashion-MNIST, a synthetic set, or a test's hand-made labels. Every random choice comes
// from a std::mt19937_64 seeded with spec.seed, so the same spec gives the same split.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/data/dataset.h"
#include "common/status.h"

namespace fedfleet::data {

struct PartitionSpec {
  std::string scheme = "iid";  // "iid", "dirichlet", "labels", "shards", "quantity"
  double alpha =
      0.5;  // dirichlet: Dir(alpha) per class over clients; quantity: Dir(alpha) of sizes
  uint32_t labels_per_client = 2;  // labels: the "#C=c" of NIID-Bench
  uint32_t shards_per_client = 2;  // shards: shards per partition (FedAvg: 2)
  uint32_t num_partitions = 1;
  uint64_t seed = 0;
  uint32_t min_samples = 10;  // dirichlet, quantity: resample until every partition has this many
  // dirichlet: NIID-Bench's code also gives no share of later classes to a partition that already
  // holds more than n / num_partitions samples. Off by default (the plain rule, as
  // bench/baselines/fedavg_pytorch.py splits); on reproduces NIID-Bench exactly.
  bool balance = false;
};

// The scheme names partitionIndices accepts.
std::vector<std::string> partitionSchemeNames();

// Splits sample indices 0..labels.size()-1 into spec.num_partitions disjoint lists, each sorted
// ascending. Deterministic for a given spec (seed included).
//  - "iid": a seeded shuffle cut into near-equal parts (sizes differ by at most 1); covers all.
//  - "dirichlet": for each class k, p ~ Dir(alpha) over partitions; the class's shuffled
//    indices are cut at the cumulative proportions (with spec.balance, a partition already above
//    n / num_partitions samples gets no share of later classes). The whole draw is repeated until
//    every partition holds >= min_samples; covers all.
//  - "labels" (#C=c): partition i holds label i % K and c-1 further distinct labels drawn at
//    random (labels not yet held by any partition are drawn first, so every class is held when
//    num_partitions * c >= K); each class's shuffled samples are split evenly among the
//    partitions holding it. Samples of a class held by nobody (only when
//    num_partitions * c < K) are left out. A partition has exactly c distinct labels whenever
//    every class has at least as many samples as partitions holding it.
//  - "shards" (FedAvg's pathological non-IID, s = shards_per_client): the indices sorted by
//    label (stable: ascending index within a label) are cut into num_partitions * s shards of
//    floor(n / (num_partitions * s)) consecutive samples; a seeded shuffle of the shard numbers
//    deals s shards to each partition. Every partition holds exactly s * shard size samples; the
//    last n mod (num_partitions * s) samples of the sorted order (of the highest labels) are left
//    out. 100 partitions of 60000 samples: McMahan's 200 shards of 300, 2 a client. A partition
//    holds at most s distinct labels when every class's count is a multiple of the shard size
//    (each shard can straddle one label boundary otherwise).
//  - "quantity" (quantity skew): one seeded shuffle of all indices, then q ~ Dir(alpha) over
//    partitions, redrawn until cutting the shuffled indices at the cumulative proportions gives
//    every partition >= min_samples (as NIID-Bench); sizes are ~ q * n, labels IID; covers all.
//    Small alpha gives very unequal sizes, large alpha near-equal ones; many partitions at small
//    alpha need a small min_samples (each draw must give every partition its minimum).
// Failures (kInvalidArgument, message says which): unknown scheme; num_partitions == 0 or more
// than the number of samples; a label >= num_classes; num_classes == 0; alpha <= 0 or not
// finite (dirichlet, quantity); labels_per_client == 0 or > num_classes; shards_per_client == 0
// or num_partitions * shards_per_client > samples; dirichlet or quantity unable to give every
// partition min_samples after 1000 draws (or num_partitions * min_samples > samples).
Result<std::vector<std::vector<uint32_t>>> partitionIndices(const std::vector<Label>& labels,
                                                            uint32_t num_classes,
                                                            const PartitionSpec& spec);

// The schemes that ignore labels ("iid", "quantity") over samples 0..n-1 of a set without class
// labels (regression targets): the same partitions partitionIndices gives n labelled samples
// with the same spec. kInvalidArgument for a scheme that splits by label, and as above.
Result<std::vector<std::vector<uint32_t>>> partitionUnlabelled(size_t n, const PartitionSpec& spec);

}  // namespace fedfleet::data
