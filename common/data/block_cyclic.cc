#include "common/data/block_cyclic.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace fedfleet::data {
namespace {

Status checkBlocks(const std::vector<Label>& labels, uint32_t num_classes, uint32_t blocks,
                   double skew) {
  if (num_classes == 0) return invalidArgument("block-cyclic data: num_classes must be >= 1");
  if (blocks == 0 || blocks > num_classes) {
    return invalidArgument("block-cyclic data: blocks must be in [1, " +
                           std::to_string(num_classes) + "] (one class group each), got " +
                           std::to_string(blocks));
  }
  if (!(skew >= 0 && skew <= 1)) {
    return invalidArgument("block-cyclic data: skew must be in [0, 1], got " +
                           std::to_string(skew));
  }
  for (Label l : labels) {
    if (l >= num_classes) {
      return invalidArgument("block-cyclic data: label " + std::to_string(l) +
                             " >= " + std::to_string(num_classes) + " classes");
    }
  }
  return Status::ok();
}

// Each class's indices, shuffled with `rng`.
std::vector<std::vector<uint32_t>> shuffledByClass(const std::vector<Label>& labels,
                                                   uint32_t num_classes, std::mt19937_64& rng) {
  std::vector<std::vector<uint32_t>> by_class(num_classes);
  for (size_t i = 0; i < labels.size(); ++i)
    by_class[labels[i]].push_back(static_cast<uint32_t>(i));
  for (auto& c : by_class) std::shuffle(c.begin(), c.end(), rng);
  return by_class;
}

}  // namespace

ClassGroup classGroup(uint32_t block, uint32_t blocks, uint32_t num_classes) {
  const uint32_t base = num_classes / blocks, extra = num_classes % blocks;
  ClassGroup g;
  g.first = block * base + std::min(block, extra);
  g.size = base + (block < extra ? 1 : 0);
  return g;
}

std::vector<uint32_t> blockClassCounts(uint32_t block, uint32_t blocks, uint32_t num_classes,
                                       double skew, uint32_t n, uint32_t offset) {
  std::vector<uint32_t> counts(num_classes, 0);
  const ClassGroup g = classGroup(block, blocks, num_classes);
  const uint32_t own = static_cast<uint32_t>(std::llround(skew * n));
  for (uint32_t i = 0; i < g.size; ++i) counts[g.first + i] = own / g.size + (i < own % g.size);
  const uint32_t rest = n - own;
  for (uint32_t c = 0; c < num_classes; ++c) counts[c] += rest / num_classes;
  for (uint32_t i = 0; i < rest % num_classes; ++i) ++counts[(offset + i) % num_classes];
  return counts;
}

Result<std::vector<std::vector<uint32_t>>> partitionBlockCyclic(const std::vector<Label>& labels,
                                                                uint32_t num_classes,
                                                                const BlockCyclicSpec& spec) {
  FEDFLEET_RETURN_IF_ERROR(checkBlocks(labels, num_classes, spec.blocks, spec.skew));
  const uint32_t parts = spec.num_partitions;
  if (parts == 0 || parts > labels.size()) {
    return invalidArgument("block-cyclic partition: num_partitions must be in [1, " +
                           std::to_string(labels.size()) + "], got " + std::to_string(parts));
  }
  std::vector<uint64_t> have(num_classes, 0);
  for (Label l : labels) ++have[l];
  // The largest shard size S every class can serve: shrink S until no class is over-asked.
  uint32_t s = static_cast<uint32_t>(labels.size() / parts);
  std::vector<uint64_t> demand;
  while (s > 0) {
    demand.assign(num_classes, 0);
    for (uint32_t p = 0; p < parts; ++p) {
      const auto counts =
          blockClassCounts(homeBlock(p, spec.blocks), spec.blocks, num_classes, spec.skew, s, p);
      for (uint32_t c = 0; c < num_classes; ++c) demand[c] += counts[c];
    }
    double fit = 1;
    for (uint32_t c = 0; c < num_classes; ++c) {
      if (demand[c] > have[c]) fit = std::min(fit, static_cast<double>(have[c]) / demand[c]);
    }
    if (fit >= 1) break;
    s = std::min(s - 1, static_cast<uint32_t>(std::floor(s * fit + 1e-9)));
  }
  if (s == 0) {
    return invalidArgument("block-cyclic partition: the classes cannot give " +
                           std::to_string(parts) + " partitions of skew " +
                           std::to_string(spec.skew) + " even one sample each");
  }
  std::mt19937_64 rng(spec.seed);
  auto pools = shuffledByClass(labels, num_classes, rng);
  std::vector<size_t> next(num_classes, 0);
  std::vector<std::vector<uint32_t>> out(parts);
  for (uint32_t p = 0; p < parts; ++p) {
    const auto counts =
        blockClassCounts(homeBlock(p, spec.blocks), spec.blocks, num_classes, spec.skew, s, p);
    out[p].reserve(s);
    for (uint32_t c = 0; c < num_classes; ++c) {
      for (uint32_t i = 0; i < counts[c]; ++i) out[p].push_back(pools[c][next[c]++]);
    }
    std::sort(out[p].begin(), out[p].end());
  }
  return out;
}

Result<std::vector<BlockEvalSplit>> blockEvalIndices(const std::vector<Label>& labels,
                                                     uint32_t num_classes, uint32_t blocks,
                                                     double skew, uint32_t validation,
                                                     uint32_t test, uint64_t seed) {
  FEDFLEET_RETURN_IF_ERROR(checkBlocks(labels, num_classes, blocks, skew));
  std::vector<BlockEvalSplit> out(blocks);
  for (uint32_t m = 0; m < blocks; ++m) {
    std::mt19937_64 rng(seed ^ (0x626c6f636bull + m));  // "block" + m: one stream per block
    auto pools = shuffledByClass(labels, num_classes, rng);
    const auto v = blockClassCounts(m, blocks, num_classes, skew, validation, 0);
    const auto t = blockClassCounts(m, blocks, num_classes, skew, test, 0);
    for (uint32_t c = 0; c < num_classes; ++c) {
      if (v[c] + t[c] > pools[c].size()) {
        return invalidArgument("block-cyclic evaluation sets: block " + std::to_string(m) +
                               " needs " + std::to_string(v[c] + t[c]) + " samples of class " +
                               std::to_string(c) + ", the split has " +
                               std::to_string(pools[c].size()));
      }
      out[m].validation.insert(out[m].validation.end(), pools[c].begin(), pools[c].begin() + v[c]);
      out[m].test.insert(out[m].test.end(), pools[c].begin() + v[c],
                         pools[c].begin() + v[c] + t[c]);
    }
    std::sort(out[m].validation.begin(), out[m].validation.end());
    std::sort(out[m].test.begin(), out[m].test.end());
  }
  return out;
}

}  // namespace fedfleet::data
