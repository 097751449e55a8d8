// RobustAggregator: coordinate-wise median and trimmed mean over a round's complete updates
// (Yin et al., "Byzantine-Robust Distributed Learning", ICML 2018).
//
// Unlike the weighted sum, these statistics cannot be streamed: every coordinate needs the
// values of all updates. So the aggregator keeps each complete update (fp32): in memory while
// the total stays within a bound, beyond it in an unlinked temporary file in `spill_dir`. At
// aggregation it walks the coordinates in blocks: for each block it gathers that slice of every
// update (from memory, or with pread from the file) and computes the statistic per coordinate,
// so the extra memory is O(block x updates), not O(model x updates). Up to 64 updates a
// sorting network (Batcher's odd-even merge sort) orders all coordinates of the block at once
// with element-wise min/max over the updates' slices, which the compiler vectorises; with more,
// each coordinate's values are selected with std::nth_element. Both give the same bits.
//
// Robust aggregators are unweighted: each update counts once whatever its n_k, as in Yin et al.
// (a weight would let one client claim a large n_k and dominate). The result depends only on
// the multiset of updates, not on the order they were added, and is the same whether an update
// was kept in memory or spilled.
//
// Statistics per coordinate over the m values (m = updates added):
//   median        the middle value; for even m the mean of the two middle values
//   trimmed mean  drop t = floor(trim_fraction * m) values at each end, average the m - 2t left
//                 (trim_fraction = 0 or t = 0: the plain mean); if nothing would be left (cannot
//                 happen with trim_fraction < 0.5) the median
// Sums and the two-middle mean are computed in double and rounded once to fp32.
// One owner: not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace fedfleet::engine {

enum class RobustKind { kMedian, kTrimmedMean };

struct RobustAggregatorOptions {
  RobustKind kind = RobustKind::kMedian;
  double trim_fraction = 0.1;                // trimmed mean: beta in [0, 0.5)
  uint64_t n_params = 0;                     // elements in every update, > 0
  uint64_t memory_bound_bytes = 1ull << 30;  // updates kept in memory up to this many bytes
  std::string spill_dir;                     // where the spill file goes; empty: $TMPDIR or /tmp
  uint64_t block_elements = 1 << 16;         // coordinates per aggregation block, > 0
};

class RobustAggregator {
 public:
  // kInvalidArgument for n_params == 0, block_elements == 0 or trim_fraction outside [0, 0.5)
  // (or non-finite). The spill directory is not touched until the first update that spills.
  static Result<std::unique_ptr<RobustAggregator>> create(const RobustAggregatorOptions& options);
  ~RobustAggregator();
  RobustAggregator(const RobustAggregator&) = delete;
  RobustAggregator& operator=(const RobustAggregator&) = delete;

  // Keeps a copy of one complete update delta[0..n). All or nothing: on failure the update is
  // not kept and the aggregator is as before. kInvalidArgument when n != n_params or some value
  // is NaN or infinite; kIoError when the update must spill and the spill file cannot be
  // created in spill_dir or written (a full disk says "disk is full").
  Status add(const float* delta, size_t n);

  // out[i] = the statistic of coordinate i over every update added, for i < n_params.
  // kFailedPrecondition when no update was added; kIoError when a spilled update cannot be read
  // back (out is then partly written and must not be used).
  Status aggregate(float* out);

  // Forgets every update (the spill file is truncated and kept for the next round).
  void clear();

  uint64_t count() const { return updates_.size(); }
  uint64_t memoryBytes() const { return memory_bytes_; }
  uint64_t spilledBytes() const { return spilled_bytes_; }
  const RobustAggregatorOptions& options() const { return options_; }

 private:
  explicit RobustAggregator(RobustAggregatorOptions options) : options_(std::move(options)) {}
  Status openSpillFile();
  // floor(trim_fraction m) (0 for the median); whether m values take the median instead.
  size_t trimCount(size_t m) const;
  bool useMedian(size_t m) const;
  // The statistic of v[0..m) (reorders v).
  float statistic(float* v, size_t m) const;
  // Coordinates [begin, begin + len) of update u into dst.
  Status readBlock(size_t u, uint64_t begin, size_t len, float* dst) const;

  struct Stored {
    std::vector<float> values;  // in memory, or empty when spilled
    int64_t file_pos = -1;      // byte offset in the spill file when spilled
  };
  RobustAggregatorOptions options_;
  std::vector<Stored> updates_;
  uint64_t memory_bytes_ = 0;
  uint64_t spilled_bytes_ = 0;
  int fd_ = -1;  // the unlinked spill file, opened on first need
};

}  // namespace fedfleet::engine
