// CommitPipeline: what happens to a server step's result until it is in the history (protocol
// steps 9, 10 and 10a in round_engine.h): the step's commit is recorded at once or held for the
// evaluation of its model (every eval_every rounds, and the last), with the model before the
// step; an accepted evaluation commits the round with its test metrics (and may end the run at
// the target accuracy), a refused one rolls the model back to that snapshot and records the
// rounds built on it failed. It owns the evaluation backlog (engine/evaluation_backlog.h) and
// whether the last round has ended; like the round modes it reaches the engine through its
// RoundContext (engine/round_context.h). One owner: not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/actions.h"
#include "engine/evaluation_backlog.h"
#include "engine/round_context.h"

namespace fedfleet::engine {

struct EngineOptions;

// A round's federated evaluation (RoundRecord::fed_eval_*) from its update rows: over the
// completed updates that report an evaluation, their count, their held-out samples and the
// sample-weighted means of their losses; of their accuracies over those that have one (not a
// regression's), and of each metric over those that report it. `states` are the rows' states.
void federatedEvaluation(history::RoundRecord& round,
                         const std::vector<history::UpdateRecord>& updates,
                         const std::vector<UpdateState>& states);

class CommitPipeline {
 public:
  // The pipeline of the engine behind `context` (which outlives it).
  CommitPipeline(RoundContext& context, const EngineOptions& options);

  // Round 0: the initial model's row, held for its evaluation, and the Evaluate action.
  void evaluateInitial(double now);
  // Whether the model after server step `round` is evaluated (every eval_every, and the last).
  bool evaluates(uint32_t round, bool last) const;
  // After a server step: evaluate (every eval_every) or commit, and finish after the last.
  // `before` is the model before the step, kept until its evaluation is reported.
  void endServerStep(CommitRound c, bool ok, bool last, std::optional<ModelSnapshot> before,
                     double now);
  // RoundEngine::onEvaluated: a round not awaiting its evaluation is ignored.
  void onEvaluated(uint32_t round, std::optional<EvalOutcome> outcome, double now);
  // max_evaluations_behind rounds await their evaluation: no round may start (step 9).
  bool evaluationsBehind() const;
  // The last round ended and every evaluation of the run has been reported.
  bool drained() const { return last_round_done_ && backlog_.empty(); }

 private:
  // The aggregator's own federated evaluation of the round (Aggregator::aggregateEvaluation),
  // in place of the weighted means federatedEvaluation put in `r`; an error is an event.
  void customEvaluation(history::RoundRecord& r, const std::vector<history::UpdateRecord>& us,
                        const std::vector<UpdateState>& states, double now);
  // Emits the round's client rows and the CommitRound; finishes the run after the last one.
  void commit(CommitRound c, double now);
  // A refused evaluation of `round` (step 10a): the model goes back to its snapshot, the
  // rounds awaiting their evaluation after it are recorded failed, and the round in flight
  // (trained from the refused model) is aborted.
  void rollBack(uint32_t round, const std::string& why, double now);

  RoundContext& ctx_;
  RoundState& s_;  // ctx_.state()
  EvaluationBacklog backlog_;
  bool last_round_done_ = false;  // finish the run after its commit
};

}  // namespace fedfleet::engine
