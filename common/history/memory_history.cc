// MemoryHistory: HistoryStore in plain containers, with the SQLite backend's semantics (same
// checks, same error codes, same ordering, same NaN rule), so tests and quick simulations can
// swap one for the other.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "common/history/history.h"
#include "common/history/record_checks.h"

namespace fedfleet::history {
namespace {

// SQLite stores NaN as NULL, which an optional reads back as absent; do the same here.
std::optional<double> storedOptional(const std::optional<double>& v) {
  if (v && std::isnan(*v)) return std::nullopt;
  return v;
}

class MemoryHistory final : public HistoryStore {
 public:
  Result<int64_t> beginRun(const RunRecord& run) override {
    RunRecord stored = run;
    stored.run_id = next_run_id_++;
    runs_.emplace(stored.run_id, stored);
    return stored.run_id;
  }

  Status upsertClient(const ClientRecord& client) override {
    if (client.client_id.empty()) return invalidArgument("upsertClient: empty client_id");
    auto it = clients_.find(client.client_id);
    if (it == clients_.end()) {
      clients_.emplace(client.client_id, client);
    } else {
      double first_seen = it->second.first_seen;
      it->second = client;
      it->second.first_seen = first_seen;
    }
    return Status::ok();
  }

  Status commitRound(const RoundRecord& round, const std::vector<UpdateRecord>& updates,
                     const std::optional<CheckpointRecord>& checkpoint) override {
    // Every check comes before the first write, so a failure leaves nothing behind.
    FEDFLEET_RETURN_IF_ERROR(checkCommitArguments(round, updates, checkpoint));
    const std::string ctx = commitContext(round);
    if (runs_.count(round.run_id) == 0) {
      return notFound(ctx + ": run " + std::to_string(round.run_id) + " does not exist");
    }
    const auto key = std::make_pair(round.run_id, round.round);
    if (rounds_.count(key) != 0) {
      return failedPrecondition(ctx + ": the round is already committed (rounds are never " +
                                "overwritten)");
    }
    if (!isRoundStatus(round.status)) {
      return invalidArgument(ctx + ": insert round: status '" + round.status +
                             "' is not 'initial', 'ok' or 'failed'");
    }
    for (size_t i = 0; i < updates.size(); ++i) {
      if (!isUpdateStatus(updates[i].status)) {
        return invalidArgument(ctx + ": insert update " + std::to_string(i) + " (client '" +
                               updates[i].client_id + "', status '" + updates[i].status +
                               "'): status must be completed, late, dropped or rejected");
      }
    }
    RoundRecord stored = round;
    stored.test_loss = storedOptional(round.test_loss);
    stored.test_accuracy = storedOptional(round.test_accuracy);
    stored.fed_eval_loss = storedOptional(round.fed_eval_loss);
    stored.fed_eval_accuracy = storedOptional(round.fed_eval_accuracy);
    rounds_.emplace(key, std::move(stored));
    for (UpdateRecord u : updates) {
      u.served_loss = storedOptional(u.served_loss);
      u.served_accuracy = storedOptional(u.served_accuracy);
      u.eval_loss = storedOptional(u.eval_loss);
      u.eval_accuracy = storedOptional(u.eval_accuracy);
      updates_.push_back(std::move(u));
    }
    if (checkpoint) checkpoints_.emplace(key, *checkpoint);
    return Status::ok();
  }

  Status recordEvent(const EventRecord& event) override {
    if (event.run_id != 0 && runs_.count(event.run_id) == 0) {
      return notFound("recordEvent('" + event.kind + "'): run " + std::to_string(event.run_id) +
                      " does not exist");
    }
    events_.push_back(event);
    return Status::ok();
  }

  Result<std::vector<RunRecord>> runs() override {
    std::vector<RunRecord> out;
    for (const auto& [id, run] : runs_) out.push_back(run);
    return out;
  }

  Result<std::vector<RoundRecord>> rounds(int64_t run_id) override {
    std::vector<RoundRecord> out;
    for (auto it = rounds_.lower_bound({run_id, 0});
         it != rounds_.end() && it->first.first == run_id; ++it) {
      out.push_back(it->second);
    }
    return out;
  }

  Result<std::vector<UpdateRecord>> updates(int64_t run_id,
                                            std::optional<uint32_t> round) override {
    std::vector<UpdateRecord> out;
    for (const UpdateRecord& u : updates_) {
      if (u.run_id == run_id && (!round || u.round == *round)) out.push_back(u);
    }
    return out;
  }

  Result<std::vector<ClientRecord>> clients() override {
    std::vector<ClientRecord> out;
    for (const auto& [id, client] : clients_) out.push_back(client);
    return out;
  }

  Result<std::vector<EventRecord>> events(std::optional<int64_t> run_id) override {
    std::vector<EventRecord> out;
    for (const EventRecord& e : events_) {
      if (!run_id || e.run_id == *run_id) out.push_back(e);
    }
    return out;
  }

  Result<CheckpointRecord> latestCheckpoint(int64_t run_id) override {
    auto it = checkpoints_.upper_bound({run_id, UINT32_MAX});
    if (it == checkpoints_.begin() || std::prev(it)->first.first != run_id) {
      return notFound("latestCheckpoint(" + std::to_string(run_id) + "): run has no checkpoint");
    }
    return std::prev(it)->second;
  }

  Result<std::vector<uint32_t>> checkpointRounds(int64_t run_id) override {
    std::vector<uint32_t> out;
    for (auto it = checkpoints_.lower_bound({run_id, 0});
         it != checkpoints_.end() && it->first.first == run_id; ++it) {
      out.push_back(it->first.second);
    }
    return out;
  }

  Status recordBlockMetrics(const std::vector<BlockMetricRecord>& rows) override {
    const std::string ctx = "recordBlockMetrics(" + std::to_string(rows.size()) + " rows)";
    FEDFLEET_RETURN_IF_ERROR(checkBlockMetricRows(rows).withContext(ctx));
    for (const BlockMetricRecord& b : rows) {
      if (runs_.count(b.run_id) == 0) {
        return notFound(ctx + ": run " + std::to_string(b.run_id) + " does not exist");
      }
      if (block_metrics_.count({b.run_id, b.round, b.block, b.model}) != 0) {
        return failedPrecondition(ctx + ": round " + std::to_string(b.round) + " block " + b.block +
                                  " model " + b.model + " is already written");
      }
    }
    for (const BlockMetricRecord& b : rows) {
      BlockMetricRecord stored = b;
      stored.accuracy = storedOptional(b.accuracy);
      stored.loss = storedOptional(b.loss);
      block_metrics_.emplace(BlockKey{b.run_id, b.round, b.block, b.model}, std::move(stored));
    }
    return Status::ok();
  }

  Result<std::vector<BlockMetricRecord>> blockMetrics(int64_t run_id) override {
    std::vector<BlockMetricRecord> out;
    for (auto it = block_metrics_.lower_bound({run_id, 0, "", ""});
         it != block_metrics_.end() && std::get<0>(it->first) == run_id; ++it) {
      out.push_back(it->second);
    }
    return out;
  }

  Result<CheckpointRecord> checkpointAt(int64_t run_id, uint32_t round) override {
    auto it = checkpoints_.find({run_id, round});
    if (it == checkpoints_.end()) {
      return notFound("checkpointAt(" + std::to_string(run_id) + ", " + std::to_string(round) +
                      "): no checkpoint of that round");
    }
    return it->second;
  }

  Status pruneCheckpoints(int64_t run_id, uint32_t keep_last, bool keep_best) override {
    if (keep_last == 0) {
      return invalidArgument("pruneCheckpoints(" + std::to_string(run_id) +
                             ", 0): keep_last must be at least 1");
    }
    auto first = checkpoints_.lower_bound({run_id, 0});
    auto end = checkpoints_.upper_bound({run_id, UINT32_MAX});
    size_t count = static_cast<size_t>(std::distance(first, end));
    if (count <= keep_last) return Status::ok();
    // The best: the highest test accuracy (else the next round's federated accuracy of that
    // model; a regression: the lowest test loss, else federated loss), the earliest of equals.
    std::optional<uint32_t> best;
    double best_accuracy = 0;
    for (auto it = first; keep_best && it != end; ++it) {
      auto round = rounds_.find(it->first);
      auto next = rounds_.find({it->first.first, it->first.second + 1});
      std::optional<double> score;
      if (round != rounds_.end()) score = round->second.test_accuracy;
      if (!score && next != rounds_.end()) score = next->second.fed_eval_accuracy;
      // A run without accuracies (a regression): the lowest loss, the same way.
      if (!score && round != rounds_.end() && round->second.test_loss) {
        score = -*round->second.test_loss;
      }
      if (!score && next != rounds_.end() && next->second.fed_eval_loss) {
        score = -*next->second.fed_eval_loss;
      }
      if (!score) continue;
      const double a = *score;
      if (!best || a > best_accuracy) best = it->first.second, best_accuracy = a;
    }
    auto last_erased = std::next(first, static_cast<std::ptrdiff_t>(count - keep_last));
    for (auto it = first; it != last_erased;) {
      it = best && it->first.second == *best ? std::next(it) : checkpoints_.erase(it);
    }
    return Status::ok();
  }

  Status recordPeerIterations(const std::vector<PeerIterationRecord>& rows) override {
    const std::string ctx = "recordPeerIterations(" + std::to_string(rows.size()) + " rows)";
    FEDFLEET_RETURN_IF_ERROR(checkPeerIterationRows(rows).withContext(ctx));
    for (const PeerIterationRecord& r : rows) {
      const std::string row = "run " + std::to_string(r.run_id) + " peer " +
                              std::to_string(r.peer) + " iteration " + std::to_string(r.iteration);
      if (runs_.count(r.run_id) == 0) {
        return notFound(ctx + ": " + row + ": run " + std::to_string(r.run_id) + " does not exist");
      }
      if (peer_iterations_.count(peerKey(r)) != 0) {
        return failedPrecondition(ctx + ": " + row + " is already written");
      }
    }
    for (const PeerIterationRecord& r : rows) peer_iterations_.emplace(peerKey(r), r);
    return Status::ok();
  }

  Status recordPeerEval(const PeerEvalRecord& row) override {
    const std::string ctx = "recordPeerEval(run " + std::to_string(row.run_id) + ")";
    FEDFLEET_RETURN_IF_ERROR(checkPeerEval(row).withContext(ctx));
    if (runs_.count(row.run_id) == 0) {
      return notFound(ctx + ": run " + std::to_string(row.run_id) + " does not exist");
    }
    peer_evals_.push_back(row);
    return Status::ok();
  }

  Result<std::vector<PeerIterationRecord>> peerIterations(int64_t run_id) const override {
    std::vector<PeerIterationRecord> out;
    for (auto it = peer_iterations_.lower_bound({run_id, 0, INT64_MIN});
         it != peer_iterations_.end() && std::get<0>(it->first) == run_id; ++it) {
      out.push_back(it->second);
    }
    return out;
  }

  Result<std::vector<PeerEvalRecord>> peerEvals(int64_t run_id) const override {
    std::vector<PeerEvalRecord> out;
    for (const PeerEvalRecord& e : peer_evals_) {
      if (e.run_id == run_id) out.push_back(e);
    }
    // By time, equal times in insertion order, as SQLite's ORDER BY time_s, id.
    std::stable_sort(out.begin(), out.end(), [](const PeerEvalRecord& a, const PeerEvalRecord& b) {
      return a.time_s < b.time_s;
    });
    return out;
  }

 private:
  using RoundKey = std::pair<int64_t, uint32_t>;
  // SQLite orders iterations by the signed integer their bit pattern is; so does this key.
  using PeerKey = std::tuple<int64_t, uint32_t, int64_t>;
  static PeerKey peerKey(const PeerIterationRecord& r) {
    return {r.run_id, r.peer, static_cast<int64_t>(r.iteration)};
  }

  int64_t next_run_id_ = 1;
  std::map<int64_t, RunRecord> runs_;
  std::map<RoundKey, RoundRecord> rounds_;
  std::vector<UpdateRecord> updates_;  // insertion order
  std::map<std::string, ClientRecord> clients_;
  std::map<RoundKey, CheckpointRecord> checkpoints_;
  std::vector<EventRecord> events_;  // insertion order
  using BlockKey = std::tuple<int64_t, uint32_t, std::string, std::string>;
  std::map<BlockKey, BlockMetricRecord> block_metrics_;     // ordered as SQLite orders them
  std::map<PeerKey, PeerIterationRecord> peer_iterations_;  // ordered as SQLite orders them
  std::vector<PeerEvalRecord> peer_evals_;                  // insertion order
};

}  // namespace

std::unique_ptr<HistoryStore> createMemoryHistory() { return std::make_unique<MemoryHistory>(); }

}  // namespace fedfleet::history
