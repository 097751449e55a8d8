// EvaluationBacklog: the server steps whose model awaits its evaluation (protocol steps 9, 10
// and 10a in round_engine.h). Per round it keeps the CommitRound to record once the evaluation
// is reported and, for a step that may be refused, the model before it. It only keeps them:
// CommitPipeline (engine/commit_pipeline.h) decides what a report means. One owner: not
// thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/actions.h"

namespace fedfleet::engine {

// Model, server-optimiser state and control variate before a server step, kept until the
// step's model is evaluated (step 10a).
struct ModelSnapshot {
  std::vector<float> params;
  std::string optimizer_state;
  std::string aggregator_state;  // SCAFFOLD's c
};

class EvaluationBacklog {
 public:
  // `max_behind`: EngineOptions::max_evaluations_behind (0: unbounded).
  explicit EvaluationBacklog(uint64_t max_behind) : max_behind_(max_behind) {}

  // Round `round` awaits its evaluation; `before` is the model before its step (none: round 0,
  // or nothing to go back to). A round already held is kept as it was.
  void hold(uint32_t round, CommitRound commit, std::optional<ModelSnapshot> before);
  bool awaiting(uint32_t round) const { return awaiting_.count(round) > 0; }
  bool empty() const { return awaiting_.empty(); }
  // Whether max_behind rounds before `last_ended` still await their evaluation, so that no
  // round may start (step 9). `last_ended` itself is not counted: its evaluation overlaps the
  // next round. Never full when unbounded.
  bool full(uint32_t last_ended) const;

  // The evaluation of `round` (held) was accepted: its commit, and its snapshot is dropped.
  CommitRound accept(uint32_t round);

  // The evaluation of `round` (held) was refused (step 10a).
  struct Refusal {
    std::optional<ModelSnapshot> before;  // the model before round's step, if kept
    std::vector<CommitRound> rounds;      // `round` and every later one held, in round order
  };
  // Takes `round` and every later round, and drops every snapshot (later ones are of models
  // built on the refused one). Earlier rounds stay held.
  Refusal refuse(uint32_t round);

  // Every round held, in round order; the backlog is empty after.
  std::vector<CommitRound> takeAll();

 private:
  const uint64_t max_behind_;
  std::map<uint32_t, CommitRound> awaiting_;     // rounds whose evaluation is pending
  std::map<uint32_t, ModelSnapshot> snapshots_;  // ... and the model before their step
};

}  // namespace fedfleet::engine
