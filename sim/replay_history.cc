#include "sim/replay_history.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <tuple>

namespace fedfleet::sim {
namespace {

std::string show(double v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}
std::string show(const std::optional<double>& v) { return v ? show(*v) : "null"; }
std::string show(const std::string& v) { return "'" + v + "'"; }
std::string show(const history::Metrics& m) {
  std::string out = "{";
  for (const auto& [name, v] : m) out += (out.size() > 1 ? ", " : "") + name + "=" + show(v);
  return out + "}";
}
template <typename T>
std::string show(const T& v) {
  return std::to_string(v);
}

// Bit for bit: a replay computes the same numbers, not nearly the same ones.
bool same(double a, double b) { return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b); }
bool same(const std::optional<double>& a, const std::optional<double>& b) {
  return a.has_value() == b.has_value() && (!a || same(*a, *b));
}
bool same(const history::Metrics& a, const history::Metrics& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || !same(a[i].second, b[i].second)) return false;
  }
  return true;
}
template <typename T>
bool same(const T& a, const T& b) {
  return a == b;
}

// Compares columns in order and keeps the first that differs.
class Diff {
 public:
  template <typename T>
  Diff& col(const char* name, const T& recorded, const T& replayed) {
    if (out_.empty() && !same(recorded, replayed)) {
      out_ =
          std::string(name) + ": " + show(recorded) + " recorded, " + show(replayed) + " replayed";
    }
    return *this;
  }
  std::string str() const { return out_; }

 private:
  std::string out_;
};

// Writing row `replayed` where the file holds `recorded`: ok when they are the same row.
template <typename Record>
Status match(const char* table, const Record& recorded, const Record& replayed,
             const std::string& which) {
  const std::string d = firstDifference(recorded, replayed);
  if (d.empty()) return Status::ok();
  return failedPrecondition(
      std::string("--resume: the replayed simulation differs from the recorded run in ") + table +
      " (" + which + "), " + d +
      ": this build, machine or data does not reproduce the run, so it cannot be continued; "
      "run it again under another run.name");
}

}  // namespace

std::string firstDifference(const history::RoundRecord& a, const history::RoundRecord& b) {
  return Diff()
      .col("run_id", a.run_id, b.run_id)
      .col("round", a.round, b.round)
      .col("start_time", a.start_time, b.start_time)
      .col("end_time", a.end_time, b.end_time)
      .col("selected", a.selected, b.selected)
      .col("completed", a.completed, b.completed)
      .col("late", a.late, b.late)
      .col("dropped", a.dropped, b.dropped)
      .col("rejected", a.rejected, b.rejected)
      .col("status", a.status, b.status)
      .col("train_loss", a.train_loss, b.train_loss)
      .col("test_loss", a.test_loss, b.test_loss)
      .col("test_accuracy", a.test_accuracy, b.test_accuracy)
      .col("bytes_up", a.bytes_up, b.bytes_up)
      .col("bytes_down", a.bytes_down, b.bytes_down)
      .col("model_version", a.model_version, b.model_version)
      .col("fed_eval_clients", a.fed_eval_clients, b.fed_eval_clients)
      .col("fed_eval_samples", a.fed_eval_samples, b.fed_eval_samples)
      .col("fed_eval_loss", a.fed_eval_loss, b.fed_eval_loss)
      .col("fed_eval_accuracy", a.fed_eval_accuracy, b.fed_eval_accuracy)
      .col("test_metrics", a.test_metrics, b.test_metrics)
      .col("fed_eval_metrics", a.fed_eval_metrics, b.fed_eval_metrics)
      .col("dp_epsilon", a.dp_epsilon, b.dp_epsilon)
      .col("dp_clip", a.dp_clip, b.dp_clip)
      .str();
}

std::string firstDifference(const history::UpdateRecord& a, const history::UpdateRecord& b) {
  return Diff()
      .col("run_id", a.run_id, b.run_id)
      .col("round", a.round, b.round)
      .col("client_id", a.client_id, b.client_id)
      .col("partition", a.partition, b.partition)
      .col("n_samples", a.n_samples, b.n_samples)
      .col("steps", a.steps, b.steps)
      .col("loss", a.loss, b.loss)
      .col("compute_s", a.compute_s, b.compute_s)
      .col("upload_s", a.upload_s, b.upload_s)
      .col("start_time", a.start_time, b.start_time)
      .col("end_time", a.end_time, b.end_time)
      .col("codec", a.codec, b.codec)
      .col("grant_wait_s", a.grant_wait_s, b.grant_wait_s)
      .col("bytes_up", a.bytes_up, b.bytes_up)
      .col("bytes_down", a.bytes_down, b.bytes_down)
      .col("weight", a.weight, b.weight)
      .col("status", a.status, b.status)
      .col("served_block", a.served_block, b.served_block)
      .col("served_model", a.served_model, b.served_model)
      .col("served_version", a.served_version, b.served_version)
      .col("served_sha256", a.served_sha256_hex, b.served_sha256_hex)
      .col("served_bytes", a.served_bytes, b.served_bytes)
      .col("served_samples", a.served_samples, b.served_samples)
      .col("served_loss", a.served_loss, b.served_loss)
      .col("served_accuracy", a.served_accuracy, b.served_accuracy)
      .col("eval_samples", a.eval_samples, b.eval_samples)
      .col("eval_loss", a.eval_loss, b.eval_loss)
      .col("eval_accuracy", a.eval_accuracy, b.eval_accuracy)
      .col("eval_metrics", a.eval_metrics, b.eval_metrics)
      .str();
}

std::string firstDifference(const history::EventRecord& a, const history::EventRecord& b) {
  return Diff()
      .col("run_id", a.run_id, b.run_id)
      .col("time", a.time, b.time)
      .col("kind", a.kind, b.kind)
      .col("client_id", a.client_id, b.client_id)
      .col("detail", a.detail, b.detail)
      .str();
}

std::string firstDifference(const history::BlockMetricRecord& a,
                            const history::BlockMetricRecord& b) {
  return Diff()
      .col("run_id", a.run_id, b.run_id)
      .col("round", a.round, b.round)
      .col("block", a.block, b.block)
      .col("model", a.model, b.model)
      .col("accuracy", a.accuracy, b.accuracy)
      .col("loss", a.loss, b.loss)
      .str();
}

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
