// ReplayHistory: how `fedfleet sim --resume` continues an interrupted simulation.
//
// A simulation is deterministic: the same config and seed give the same history, row for row.
// And it writes its rows in order, each committed as it is written, so whatever stopped it (a
// signal, a kill, a crash, a full disk) left every table of its run holding a prefix of the
// rows the whole run would have written. Resuming therefore runs the simulation again from its
// start over a ReplayHistory: a write whose row the file already holds is compared with it
// instead (every column but the row ids and the measured wall-clock columns: rounds.wall_start
// and wall_end, updates.wall_compute_s, encode_s and decode_s), and the first write past what
// the file holds goes to the file. The run id stays the interrupted run's; the final file is the
// one an uninterrupted run would have written.
//
// The recorded part is computed again (its training included): resuming costs what the
// recorded rounds cost, and in return proves them reproduced. A row that differs (another
// fedfleet build, another CPU's arithmetic, a data file that changed) stops the resume with the
// first column that differs, before anything is written.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/history/history.h"
#include "common/status.h"

namespace fedfleet::sim {

class ReplayHistory final : public history::HistoryStore {
 public:
  // Reads what `store` holds of run `run_id` (rounds, updates, events, block metrics).
  static Result<std::unique_ptr<ReplayHistory>> create(history::HistoryStore& store,
                                                       int64_t run_id);

  // Rows still to be matched: while any is, the replay has not reached the point where the
  // interrupted run stopped.
  uint64_t rowsToMatch() const;
  // How many rounds were matched (compared, not written) so far.
  uint32_t roundsMatched() const { return rounds_matched_; }

  // Writes: matched against the recorded rows while there are any, then written to the store.
  Result<int64_t> beginRun(const history::RunRecord& run) override;
  Status upsertClient(const history::ClientRecord& client) override;
  Status commitRound(const history::RoundRecord& round,
                     const std::vector<history::UpdateRecord>& updates,
                     const std::optional<history::CheckpointRecord>& checkpoint) override;
  Status recordEvent(const history::EventRecord& event) override;
  Status recordBlockMetrics(const std::vector<history::BlockMetricRecord>& rows) override;
  Status pruneCheckpoints(int64_t run_id, uint32_t keep_last, bool keep_best) override;

  // Reads go to the store.
  Result<std::vector<history::RunRecord>> runs() override { return store_.runs(); }
  Result<std::vector<history::RoundRecord>> rounds(int64_t run_id) override {
    return store_.rounds(run_id);
  }
  Result<std::vector<history::UpdateRecord>> updates(int64_t run_id,
                                                     std::optional<uint32_t> round) override {
    return store_.updates(run_id, round);
  }
  Result<std::vector<history::ClientRecord>> clients() override { return store_.clients(); }
  Result<std::vector<history::EventRecord>> events(std::optional<int64_t> run_id) override {
    return store_.events(run_id);
  }
  Result<history::CheckpointRecord> latestCheckpoint(int64_t run_id) override {
    return store_.latestCheckpoint(run_id);
  }
  Result<history::CheckpointRecord> checkpointAt(int64_t run_id, uint32_t round) override {
    return store_.checkpointAt(run_id, round);
  }
  Result<std::vector<history::BlockMetricRecord>> blockMetrics(int64_t run_id) override {
    return store_.blockMetrics(run_id);
  }
  Result<std::vector<uint32_t>> checkpointRounds(int64_t run_id) override {
    return store_.checkpointRounds(run_id);
  }

 private:
  ReplayHistory(history::HistoryStore& store, int64_t run_id) : store_(store), run_id_(run_id) {}

  history::HistoryStore& store_;
  int64_t run_id_;
  std::vector<history::RoundRecord> rounds_;
  std::vector<history::UpdateRecord> updates_;
  std::vector<history::EventRecord> events_;
  std::vector<history::BlockMetricRecord> blocks_;
  size_t next_round_ = 0, next_update_ = 0, next_event_ = 0, next_block_ = 0;
  uint32_t rounds_matched_ = 0;
};

}  // namespace fedfleet::sim
