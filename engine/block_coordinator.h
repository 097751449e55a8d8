// BlockCoordinator: block-cyclic training inside a run of the round engine (protocol steps
// B1-B6 in round_engine.h). It owns what the engine keeps only when EngineOptions::blocks.count
// is set: the schedule (which block a round belongs to, which partitions train in it), the
// block models (engine/block_models.h: z_m, y_m and multichain's choices), the current visit,
// the chain a multichain round trains, the block evaluations awaiting their report and the
// served models as sent. The engine keeps the clients, the shared model x and the actions: it
// calls in at its protocol steps and emits what comes back. One owner: not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/history/records.h"
#include "common/status.h"
#include "common/wire/messages.h"
#include "engine/block_models.h"

namespace fedfleet::engine {

// Block-cyclic runs, at the end of every block: evaluate each model on its block's validation
// and test sets (the driver's per-block evaluation sets) and report every outcome, in any order,
// with RoundEngine::onBlocksEvaluated(round, ...); a model that could not be evaluated is left
// out. The driver must report even when it evaluated nothing (the run ends only after the
// report).
struct BlockModelToEvaluate {
  uint32_t block = 0;
  std::string model;  // "shared" (x), "pluralistic" (z_m) or "chain" (y_m)
  std::shared_ptr<const std::vector<float>> params;
};
struct EvaluateBlocks {
  uint32_t round = 0;  // the last round of the block that ended
  uint32_t ended_block = 0;
  std::vector<BlockModelToEvaluate> models;
};
struct BlockEvalOutcome {
  uint32_t block = 0;
  std::string model;
  std::optional<double> validation_loss;  // on the block's validation set
  double loss = 0;                        // on the block's test set
  double accuracy = 0;
};
// Rows for the history's block_metrics table (HistoryStore::recordBlockMetrics).
struct RecordBlockMetrics {
  std::vector<history::BlockMetricRecord> rows;
};

// The shared model x as the engine holds it at a moment: its values, its bytes as sent in
// tasks (one shared buffer per version), their SHA-256 and the model version.
struct SharedModel {
  const std::vector<float>& params;
  const std::shared_ptr<const std::string>& bytes;
  const wire::Sha256& sha;
  uint64_t version = 0;
};

class BlockCoordinator {
 public:
  // Precondition (checkEngineOptions): schedule.count >= 1 and a valid schedule.
  BlockCoordinator(const BlockScheduleOptions& schedule, BlockMode mode);

  // The block of the current round (0 before the first).
  uint32_t currentBlock() const { return block_ == UINT32_MAX ? 0 : block_; }
  const BlockModels& models() const { return models_; }
  // The model block m is served (B6): single x; pluralistic z_m (x before m's first visit);
  // multichain the last choice.
  const std::vector<float>& servedModel(uint32_t block, const std::vector<float>& x) const {
    return models_.servedParams(block, x);
  }

  // The engine waits for clients at `now`: on a clock schedule the next block boundary may
  // bring the next block's clients (wakeup()).
  void noteWaiting(double now) { wakeup_ = schedule_.nextBoundary(now); }
  std::optional<double> wakeup() const { return wakeup_; }

  // B1, B3: before sampling round `round` at `now`, fixes its block and (multichain) the chain
  // it trains, y_m starting as a copy of x. Returns the "block_started" event's detail when a
  // new visit begins.
  std::optional<std::string> prepareRound(uint32_t round, double now, const std::vector<float>& x);
  // B2: whether a client of partition `partition` (-1: none) may train in the current block.
  bool available(int32_t partition) const;
  // B3: the chain this round trains (-1: x), and its bytes and SHA-256 as sent in tasks.
  int32_t roundChain() const { return round_chain_; }
  const std::shared_ptr<const std::string>& chainBytes() const { return chain_bytes_; }
  const wire::Sha256& chainSha() const { return chain_sha_; }
  // B3: runs `step` (the server step on `x`) on the chain the round trains: y_m takes x's place
  // for the step. Returns what `step` returns.
  template <typename Step>
  bool applyStep(std::vector<float>& x, Step step) {
    if (round_chain_ < 0) return step();
    std::vector<float>& y = models_.chain(static_cast<uint32_t>(round_chain_), x);
    std::swap(x, y);
    const bool ok = step();
    std::swap(x, y);
    return ok;
  }
  // B4: after round `round` ended at `now` (the run's last when `last`): at the end of a visit,
  // folds x into z_m and returns the EvaluateBlocks to emit (its report is awaited).
  std::optional<EvaluateBlocks> endRound(uint32_t round, bool last, double now,
                                         const std::vector<float>& x);
  // B5: the report on round `round`'s EvaluateBlocks: multichain chooses the served models; the
  // rows to record. Nothing when no report for that round is awaited.
  std::optional<RecordBlockMetrics> onEvaluated(uint32_t round,
                                                const std::vector<BlockEvalOutcome>& outcomes,
                                                int64_t run_id);
  // Whether a block evaluation awaits its report (the run ends only after it).
  bool pending() const { return !awaiting_.empty(); }

  // B6: x, a chain or z_m may have changed: served models are rebuilt when next sent.
  void modelsChanged() { ++served_epoch_; }
  // B6: names the current block's served model in `task` and returns its bytes to attach when
  // the client does not hold it (`client_has`: the SHA-256 of what it was last sent, updated)
  // and it is not the task's own model; else null.
  std::shared_ptr<const std::string> serve(std::optional<wire::Sha256>& client_has,
                                           wire::Task& task, const SharedModel& x);
  // B6: a summary echoing `held` for a task that named `named`: the "served_mismatch" event's
  // detail when the client does not hold it, else nothing.
  static std::optional<std::string> servedMismatch(const wire::ServedModel& named,
                                                   const wire::Sha256& held);

  // The block section of the engine state: the current visit (block, first round) and the block
  // models.
  std::string save() const;
  struct SavedState {
    uint32_t block = UINT32_MAX;
    uint32_t first_round = 0;
    BlockModels models;
  };
  // Checks a block section for a model of `n_params` values; changes nothing.
  Result<SavedState> parse(std::string_view blob, size_t n_params) const;
  void restore(SavedState state);

 private:
  const BlockSchedule schedule_;
  BlockModels models_;
  uint32_t block_ = UINT32_MAX;  // block of the current visit (UINT32_MAX: none yet)
  uint32_t first_round_ = 0;     // first round of the current visit
  int64_t visit_ = INT64_MIN;    // BlockSchedule::visitAt of the current visit (INT64_MIN:
                                 // unknown, after a restore on a clock schedule)
  int32_t round_chain_ = -1;     // multichain: the block chain this round trains (-1: x)
  std::shared_ptr<const std::string> chain_bytes_;  // that chain as sent in tasks (shared)
  wire::Sha256 chain_sha_{};
  std::set<uint32_t> awaiting_;   // rounds whose EvaluateBlocks has no report yet
  std::optional<double> wakeup_;  // clock schedule, waiting: the next block boundary
  // Served models as sent, per block, rebuilt when served_epoch_ moved on (a server step, a
  // block evaluation, a restored state): the bytes and SHA-256 (kept while they do not change),
  // the version when first sent, and the kind.
  struct ServedBuffer {
    uint64_t epoch = UINT64_MAX;
    std::shared_ptr<const std::string> bytes;
    wire::Sha256 sha{};
    uint64_t version = 0;
    std::string model;
  };
  std::vector<ServedBuffer> served_;
  uint64_t served_epoch_ = 0;
};

}  // namespace fedfleet::engine
