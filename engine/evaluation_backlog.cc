#include "engine/evaluation_backlog.h"

#include <iterator>
#include <utility>

#include "common/check.h"

namespace fedfleet::engine {

void EvaluationBacklog::hold(uint32_t round, CommitRound commit,
                             std::optional<ModelSnapshot> before) {
  if (before) snapshots_[round] = std::move(*before);
  awaiting_.emplace(round, std::move(commit));
}

bool EvaluationBacklog::full(uint32_t last_ended) const {
  if (max_behind_ == 0) return false;
  const auto behind = std::distance(awaiting_.begin(), awaiting_.lower_bound(last_ended));
  return static_cast<uint64_t>(behind) >= max_behind_;
}

CommitRound EvaluationBacklog::accept(uint32_t round) {
  auto it = awaiting_.find(round);
  FEDFLEET_CHECK(it != awaiting_.end());
  snapshots_.erase(round);  // the model is usable: no way back to before it is needed
  CommitRound c = std::move(it->second);
  awaiting_.erase(it);
  return c;
}

EvaluationBacklog::Refusal EvaluationBacklog::refuse(uint32_t round) {
  Refusal out;
  if (auto snap = snapshots_.find(round); snap != snapshots_.end()) {
    out.before = std::move(snap->second);
  }
  snapshots_.clear();
  for (auto it = awaiting_.find(round); it != awaiting_.end();) {
    out.rounds.push_back(std::move(it->second));
    it = awaiting_.erase(it);
  }
  return out;
}

std::vector<CommitRound> EvaluationBacklog::takeAll() {
  std::vector<CommitRound> out;
  for (auto& [round, c] : awaiting_) out.push_back(std::move(c));
  awaiting_.clear();
  snapshots_.clear();
  return out;
}

}  // namespace fedfleet::engine
