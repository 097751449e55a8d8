// Block-cyclic training: the block schedule and the
// per-block models the round engine keeps besides its shared chain.
//
// Time is a cycle of M blocks. BlockSchedule says which block a round belongs to (from the
// round number, or from the engine's clock) and which clients may train in it (a client's data
// partition p lives in block p mod M). BlockModels holds the math of the modes:
//   single       one global model x (the baseline); every block is served x.
//   pluralistic  x as usual, plus for each block m the running average z_m of the values x had
//                at the end of each visit to block m (MM-PSGD's pluralistic averaging); block m
//                is served z_m.
//   multichain   additionally a chain y_m per block, trained only in block m; block m is served
//                whichever of z_m and y_m had the lower loss on block m's validation set at the
//                last evaluation (MC-PSGD).
// No I/O, no clock: the engine (engine/round_engine.h) calls these at round starts, block
// ends and evaluation reports.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace fedfleet::engine {

enum class BlockMode { kSingle, kPluralistic, kMultichain };

// "single", "pluralistic", "multichain"; anything else is kInvalidArgument.
Result<BlockMode> parseBlockMode(std::string_view name);
const char* blockModeName(BlockMode mode);

struct BlockScheduleOptions {
  uint32_t count = 0;             // M; 0: no blocks (the engine runs as before)
  uint32_t rounds_per_block = 0;  // > 0: round r (1-based) is in block ((r - 1) / R) mod M
  double block_s = 0;             // else: a clock schedule, block floor((t - anchor_s) / block_s)
  double anchor_s = 0;            // mod M, t the engine's `now` (virtual or unix seconds)
  double overlap = 0;             // probability that a partition is also available in the block
                                  // after its own (fixed per partition, from the seed)
  uint64_t seed = 0;
};

class BlockSchedule {
 public:
  // Precondition (checked): count >= 1 and exactly one of rounds_per_block, block_s set.
  explicit BlockSchedule(BlockScheduleOptions options);

  uint32_t count() const { return options_.count; }
  bool byRounds() const { return options_.rounds_per_block > 0; }
  const BlockScheduleOptions& options() const { return options_; }

  // The block of round `round` (1-based) when it starts at `now`.
  uint32_t blockAt(uint32_t round, double now) const;
  // The ordinal of the visit that round `round` starting at `now` belongs to: (round - 1) / R
  // by rounds, floor((now - anchor_s) / block_s) by clock. Consecutive visits differ even when
  // they are to the same block (M = 1), which the block number alone cannot tell.
  int64_t visitAt(uint32_t round, double now) const;
  // Whether visit `visit` (from visitAt), in which round `round` trained, is over once that
  // round has ended at `now`: by rounds, after the R-th round of the visit; by clock, when `now`
  // is past the visit's window.
  bool endsAfter(uint32_t round, int64_t visit, double now) const;
  // Clock schedule: the first block boundary after `now`; std::nullopt when scheduled by rounds.
  std::optional<double> nextBoundary(double now) const;
  // Whether data partition `partition` is available in `block`: its home block (partition mod M)
  // always; the next block too for a fraction `overlap` of the partitions.
  bool available(uint32_t partition, uint32_t block) const;

 private:
  BlockScheduleOptions options_;
};

class BlockModels {
 public:
  enum class Served { kShared, kPluralistic, kChain };
  static const char* servedName(Served s);

  BlockModels(BlockMode mode, uint32_t blocks);

  BlockMode mode() const { return mode_; }
  uint32_t blocks() const { return static_cast<uint32_t>(slots_.size()); }

  // End of a visit to block m with shared model x (pluralistic and multichain; a no-op in single
  // mode): z_m <- r/(r+1) z_m + 1/(r+1) x, r the visits before this one (the first copies x). After
  // r visits z_m is the mean of the r end-of-visit models (computed in double per element).
  void endVisit(uint32_t m, const std::vector<float>& x);
  uint32_t visits(uint32_t m) const { return slots_.at(m).visits; }
  // z_m; empty before the first visit.
  const std::vector<float>& average(uint32_t m) const { return slots_.at(m).average; }

  // Multichain: block m's chain y_m, started as a copy of `start` when it does not exist yet.
  std::vector<float>& chain(uint32_t m, const std::vector<float>& start);
  // y_m; empty before it was started.
  const std::vector<float>& chain(uint32_t m) const { return slots_.at(m).chain; }

  // Multichain: records the choice for block m from the validation losses of z_m and y_m (either
  // absent when that model does not exist or was not evaluated). The lower loss wins, a tie goes
  // to z_m; with neither loss the choice stays. Returns what block m is now served.
  Served choose(uint32_t m, std::optional<double> average_loss, std::optional<double> chain_loss);
  // What block m is served: single: x; pluralistic: z_m once block m was visited, else x;
  // multichain: the last choice, or until there is one, as pluralistic.
  Served served(uint32_t m) const;
  // The parameters of served(m) (`shared` is x).
  const std::vector<float>& servedParams(uint32_t m, const std::vector<float>& shared) const;

  // All of it as bytes (for the engine's checkpointed state) and back. load() checks the mode,
  // the block count and that every model has `n_params` values; on error nothing changes.
  std::string save() const;
  Status load(std::string_view blob, size_t n_params);

 private:
  struct Slot {
    uint32_t visits = 0;
    std::vector<float> average;  // z_m
    std::vector<float> chain;    // y_m
    std::optional<Served> choice;
  };
  BlockMode mode_;
  std::vector<Slot> slots_;
};

}  // namespace fedfleet::engine
