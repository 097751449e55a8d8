// Block-cyclic data: a cycle of M blocks, each with
// its own data distribution. Block m favours its own group of classes: the classes 0..K-1 are
// cut into M contiguous groups (the first K mod M groups one class larger), and a fraction
// `skew` of every block-m sample set is drawn from group m, the rest from all K classes.
//
// Like the partitioners (common/data/partition.h) these work on the label vector alone and
// return sample indices; every random choice comes from a std::mt19937_64 seeded with
// spec.seed, so the same spec gives the same split.
#pragma once

#include <cstdint>
#include <vector>

#include "common/data/dataset.h"
#include "common/status.h"

namespace fedfleet::data {

struct BlockCyclicSpec {
  uint32_t blocks = 4;  // M
  double skew = 0.8;    // fraction of a block's samples from its own class group, in [0, 1]
  uint32_t num_partitions = 1;
  uint64_t seed = 0;
};

// The classes of block m's group: [first, first + size).
struct ClassGroup {
  uint32_t first = 0;
  uint32_t size = 0;
};
// Group m of K classes cut into M contiguous groups (M <= K; the first K mod M are one larger).
ClassGroup classGroup(uint32_t block, uint32_t blocks, uint32_t num_classes);

// The block whose data partition p holds: p mod M.
inline uint32_t homeBlock(uint32_t partition, uint32_t blocks) { return partition % blocks; }

// How many samples of each class a set of `n` samples of block m holds: round(skew n) spread
// evenly over the group (remainders to its first classes), the rest spread evenly over all
// classes (remainders to classes (offset + i) mod K, so that many sets rotate them).
std::vector<uint32_t> blockClassCounts(uint32_t block, uint32_t blocks, uint32_t num_classes,
                                       double skew, uint32_t n, uint32_t offset = 0);

// Splits the samples into spec.num_partitions disjoint shards, each sorted ascending; partition
// p holds block homeBlock(p) data (blockClassCounts with offset p). Every shard has the same
// size S: the largest for which every class has the samples all shards ask of it (at most
// n / num_partitions). Samples left over are not used.
// Failures (kInvalidArgument): blocks == 0 or > num_classes, skew outside [0, 1],
// num_partitions == 0, a label >= num_classes, or no S >= 1 fits.
Result<std::vector<std::vector<uint32_t>>> partitionBlockCyclic(const std::vector<Label>& labels,
                                                                uint32_t num_classes,
                                                                const BlockCyclicSpec& spec);

// Per-block evaluation sets drawn from a held-out (test) split: for each block m, a validation
// set of `validation` samples and a test set of `test` samples, disjoint, each with block m's
// class mix (blockClassCounts). Sets of different blocks are drawn independently (a sample may
// serve two blocks). Failures (kInvalidArgument): as partitionBlockCyclic, or a class with fewer
// samples than validation + test ask of it.
struct BlockEvalSplit {
  std::vector<uint32_t> validation;
  std::vector<uint32_t> test;
};
Result<std::vector<BlockEvalSplit>> blockEvalIndices(const std::vector<Label>& labels,
                                                     uint32_t num_classes, uint32_t blocks,
                                                     double skew, uint32_t validation,
                                                     uint32_t test, uint64_t seed);

}  // namespace fedfleet::data
