#include "sim/replay_history.h"

#include <algorithm>
#include <tuple>

#include "common/history/record_diff.h"

namespace fedfleet::sim {
namespace {

// Writing row `replayed` where the file holds `recorded`: ok when they are the same row.
template <typename Record>
Status match(const char* table, const Record& recorded, const Record& replayed,
             const std::string& which) {
  const std::string d = history::firstDifference(recorded, replayed);
  if (d.empty()) return Status::ok();
  return failedPrecondition(
      std::string("--resume: the replayed simulation differs from the recorded run in ") + table +
      " (" + which + "), " + d +
      ": this build, machine or data does not reproduce the run, so it cannot be continued; "
      "run it again under another run.name");
}

}  // namespace

Result<std::unique_ptr<ReplayHistory>> ReplayHistory::create(history::HistoryStore& store,
                                                             int64_t run_id) {
  std::unique_ptr<ReplayHistory> r(new ReplayHistory(store, run_id));
  FEDFLEET_ASSIGN_OR_RETURN(r->rounds_, store.rounds(run_id));
  FEDFLEET_ASSIGN_OR_RETURN(r->updates_, store.updates(run_id, std::nullopt));
  FEDFLEET_ASSIGN_OR_RETURN(r->events_, store.events(run_id));
  FEDFLEET_ASSIGN_OR_RETURN(r->blocks_, store.blockMetrics(run_id));
  return r;
}

uint64_t ReplayHistory::rowsToMatch() const {
  return (rounds_.size() - next_round_) + (updates_.size() - next_update_) +
         (events_.size() - next_event_) + (blocks_.size() - next_block_);
}

Result<int64_t> ReplayHistory::beginRun(const history::RunRecord&) {
  return failedPrecondition("--resume continues run " + std::to_string(run_id_) +
                            "; it begins no new run");
}

Status ReplayHistory::upsertClient(const history::ClientRecord& client) {
  // The replay upserts the same rows in the same order: the last one leaves each as it was.
  return store_.upsertClient(client);
}

Status ReplayHistory::commitRound(const history::RoundRecord& round,
                                  const std::vector<history::UpdateRecord>& updates,
                                  const std::optional<history::CheckpointRecord>& checkpoint) {
  if (next_round_ == rounds_.size()) return store_.commitRound(round, updates, checkpoint);
  // A recorded round was committed with all its updates (one transaction); its checkpoint is
  // in the file too, unless pruned since.
  const std::string which = "round " + std::to_string(round.round);
  FEDFLEET_RETURN_IF_ERROR(match("rounds", rounds_[next_round_], round, which));
  if (updates_.size() - next_update_ < updates.size()) {
    return failedPrecondition("--resume: round " + std::to_string(round.round) + " has " +
                              std::to_string(updates.size()) +
                              " updates replayed but fewer recorded: the file is not this "
                              "simulation's; run it again under another run.name");
  }
  for (const auto& u : updates) {
    FEDFLEET_RETURN_IF_ERROR(
        match("updates", updates_[next_update_], u, which + ", client " + u.client_id));
    ++next_update_;
  }
  ++next_round_;
  ++rounds_matched_;
  return Status::ok();
}

Status ReplayHistory::recordEvent(const history::EventRecord& event) {
  if (event.run_id != run_id_ || next_event_ == events_.size()) return store_.recordEvent(event);
  FEDFLEET_RETURN_IF_ERROR(match("events", events_[next_event_], event,
                                 "event " + std::to_string(next_event_ + 1) + ", " + event.kind));
  ++next_event_;
  return Status::ok();
}

Status ReplayHistory::recordBlockMetrics(const std::vector<history::BlockMetricRecord>& rows) {
  if (next_block_ == blocks_.size()) return store_.recordBlockMetrics(rows);
  // One write is all or none, and the file lists its rows by (round, block, model).
  std::vector<history::BlockMetricRecord> sorted = rows;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return std::tie(a.round, a.block, a.model) < std::tie(b.round, b.block, b.model);
  });
  if (blocks_.size() - next_block_ < sorted.size()) {
    return failedPrecondition(
        "--resume: more block metrics replayed than recorded in one write: the file is not "
        "this simulation's; run it again under another run.name");
  }
  for (const auto& row : sorted) {
    FEDFLEET_RETURN_IF_ERROR(match("block_metrics", blocks_[next_block_], row,
                                   "round " + std::to_string(row.round) + ", block " + row.block));
    ++next_block_;
  }
  return Status::ok();
}

Status ReplayHistory::pruneCheckpoints(int64_t run_id, uint32_t keep_last, bool keep_best) {
  // Keeping the latest `keep_last` (and the best) of a file that already kept them is a no-op,
  // so the file's checkpoints end as an uninterrupted run's.
  return store_.pruneCheckpoints(run_id, keep_last, keep_best);
}

}  // namespace fedfleet::sim
