#include "engine/commit_pipeline.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "common/check.h"
#include "engine/aggregator.h"
#include "engine/block_coordinator.h"
#include "engine/engine_options.h"
#include "engine/round_context.h"
#include "engine/round_mode.h"

namespace fedfleet::engine {

const char* outcomeName(RoundOutcome outcome) {
  static const char* kNames[] = {"initial", "ok", "failed"};
  return kNames[static_cast<int>(outcome)];
}

CommitPipeline::CommitPipeline(RoundContext& context, const EngineOptions& options)
    : ctx_(context), s_(context.state()), backlog_(options.max_evaluations_behind) {}

void CommitPipeline::evaluateInitial(double now) {
  CommitRound c;
  c.round.run_id = ctx_.options().run_id;
  c.round.round = 0;
  c.round.start_time = now;
  c.round.end_time = now;
  c.setOutcome(RoundOutcome::kInitial);
  c.round.model_version = s_.version;
  if (!ctx_.options().server_eval) {  // nothing to evaluate it on: round 0 is recorded at once
    commit(std::move(c), now);
    return;
  }
  backlog_.hold(0, std::move(c), std::nullopt);
  ctx_.emit(Evaluate{0, std::make_shared<const std::vector<float>>(ctx_.params())});
}

bool CommitPipeline::evaluationsBehind() const { return backlog_.full(s_.round); }

bool CommitPipeline::evaluates(uint32_t round, bool last) const {
  const EngineOptions& o = ctx_.options();
  if (!o.server_eval) return false;
  return o.eval_every <= 1 || round % o.eval_every == 0 || last;
}

void federatedEvaluation(history::RoundRecord& r, const std::vector<history::UpdateRecord>& us,
                         const std::vector<UpdateState>& states) {
  FEDFLEET_CHECK(us.size() == states.size());
  double loss = 0;
  double correct = 0, accuracy_samples = 0;
  // Each metric's weighted sum and samples, in the order the metrics first appear.
  std::vector<std::pair<std::string, std::pair<double, double>>> metrics;
  for (size_t i = 0; i < us.size(); ++i) {
    const history::UpdateRecord& u = us[i];
    if (states[i] != UpdateState::kCompleted || u.eval_samples == 0 || !u.eval_loss) continue;
    const auto n = static_cast<double>(u.eval_samples);
    ++r.fed_eval_clients;
    r.fed_eval_samples += u.eval_samples;
    loss += n * *u.eval_loss;
    if (u.eval_accuracy) {
      correct += n * *u.eval_accuracy;
      accuracy_samples += n;
    }
    for (const auto& [name, value] : u.eval_metrics) {
      auto it = std::find_if(metrics.begin(), metrics.end(),
                             [&](const auto& m) { return m.first == name; });
      if (it == metrics.end()) it = metrics.insert(metrics.end(), {name, {0.0, 0.0}});
      it->second.first += n * value;
      it->second.second += n;
    }
  }
  if (r.fed_eval_samples == 0) return;
  r.fed_eval_loss = loss / static_cast<double>(r.fed_eval_samples);
  if (accuracy_samples > 0) r.fed_eval_accuracy = correct / accuracy_samples;
  for (const auto& [name, sums] : metrics) {
    r.fed_eval_metrics.emplace_back(name, sums.first / sums.second);
  }
}

void CommitPipeline::customEvaluation(history::RoundRecord& r,
                                      const std::vector<history::UpdateRecord>& us,
                                      const std::vector<UpdateState>& states, double now) {
  if (r.fed_eval_samples == 0) return;
  std::vector<EvaluationReport> reports;
  for (size_t i = 0; i < us.size(); ++i) {
    const history::UpdateRecord& u = us[i];
    if (states[i] != UpdateState::kCompleted || u.eval_samples == 0 || !u.eval_loss) continue;
    reports.push_back({u.client_id, u.eval_samples, *u.eval_loss, u.eval_accuracy, u.eval_metrics});
  }
  RoundEvaluation evaluation{r.fed_eval_loss, r.fed_eval_accuracy, r.fed_eval_metrics};
  Status st = ctx_.aggregator().aggregateEvaluation(r.round, reports, evaluation);
  if (!st.isOk()) {
    ctx_.event("aggregation_error", "",
               "round " + std::to_string(r.round) + ": federated evaluation: " + st.message() +
                   "; the clients' weighted means are recorded",
               now);
    return;
  }
  r.fed_eval_loss = evaluation.loss;
  r.fed_eval_accuracy = evaluation.accuracy;
  r.fed_eval_metrics = std::move(evaluation.metrics);
}

void CommitPipeline::endServerStep(CommitRound c, bool ok, bool last,
                                   std::optional<ModelSnapshot> before, double now) {
  const EngineOptions& o = ctx_.options();
  ctx_.ageTokens(s_.round);
  auto& r = c.round;
  c.setOutcome(ok ? RoundOutcome::kOk : RoundOutcome::kFailed);
  federatedEvaluation(r, c.updates, c.states);
  customEvaluation(r, c.updates, c.states, now);
  r.model_version = s_.version;
  if (ok && o.checkpoint_every > 0 && (s_.round % o.checkpoint_every == 0 || last)) {
    c.checkpoint = ctx_.checkpoint();
  }
  const uint32_t round = s_.round;
  if (last) {
    last_round_done_ = true;
    s_.phase = EnginePhase::kDraining;  // nothing new starts; the run ends after the commit
  }
  if (!ok) {
    // A failed round is committed at once, and before the next round goes out: a failure that
    // ends the run (max_failed_rounds) leaves no round started that would never run.
    commit(std::move(c), now);
    if (!last && s_.phase != EnginePhase::kFinished) ctx_.mode().afterStep(now);
    return;
  }
  // The next round goes out before this round's model is evaluated (protocol step 9).
  if (!last) ctx_.mode().afterStep(now);
  if (evaluates(round, last)) {
    // The model before the step, until the evaluation says the new one is usable.
    backlog_.hold(round, std::move(c), std::move(before));
    ctx_.emit(Evaluate{round, std::make_shared<const std::vector<float>>(ctx_.params())});
  } else {
    commit(std::move(c), now);
  }
}

void CommitPipeline::onEvaluated(uint32_t round, std::optional<EvalOutcome> outcome, double now) {
  const EngineOptions& o = ctx_.options();
  if (!backlog_.awaiting(round)) return;
  if (outcome && !(std::isfinite(outcome->loss) && std::isfinite(outcome->accuracy.value_or(0)))) {
    return rollBack(round,
                    "its evaluation is not finite (loss " + std::to_string(outcome->loss) +
                        ", accuracy " + std::to_string(outcome->accuracy.value_or(0)) + ")",
                    now);
  }
  CommitRound c = backlog_.accept(round);
  if (outcome) {
    c.round.test_loss = outcome->loss;
    c.round.test_accuracy = outcome->accuracy;
    c.round.test_metrics = outcome->metrics;
  }
  const bool reached = o.target_accuracy > 0 && outcome && round > 0 &&
                       outcome->accuracy.value_or(0) >= o.target_accuracy &&
                       s_.phase != EnginePhase::kFinished;
  commit(std::move(c), now);
  if (!reached || s_.phase == EnginePhase::kFinished) {
    ctx_.tryStartRound(now);  // a round held back by the evaluations behind (step 9) may start now
    return;
  }
  // Target reached: rounds awaiting their evaluation are committed without test metrics, tasks
  // in flight are cancelled (their round is never recorded), and the run ends.
  for (CommitRound& pending : backlog_.takeAll()) ctx_.emit(std::move(pending));
  ctx_.cancelPending("target accuracy reached");
  ctx_.finishRun(true,
                 "target accuracy " + std::to_string(o.target_accuracy) + " reached in round " +
                     std::to_string(round),
                 now);
}

void CommitPipeline::rollBack(uint32_t round, const std::string& why, double now) {
  const std::string refused = "round " + std::to_string(round) + ": " + why;
  EvaluationBacklog::Refusal refusal = backlog_.refuse(round);
  // Round 0 (the initial model) has no step to undo; its row is recorded failed all the same.
  if (refusal.before) {
    ctx_.restoreModel(*refusal.before);
    ++s_.version;  // a new version holding the old parameters: caches keyed by version refresh
    ctx_.refreshModelBytes();
    if (ctx_.blocks()) ctx_.blocks()->modelsChanged();
  }
  ctx_.event("evaluation_refused", "",
             refused + "; the model is rolled back to the one before that round (now version " +
                 std::to_string(s_.version) + ")",
             now);
  // The refused round and every later one awaiting its evaluation are recorded failed (they
  // hold the refused model or models built on it), in round order.
  for (CommitRound& c : refusal.rounds) {
    c.setOutcome(RoundOutcome::kFailed);
    c.round.model_version = s_.version;
    c.checkpoint.reset();
    ctx_.roundFailed(c.round.round,
                     c.round.round == round
                         ? why
                         : "built on round " + std::to_string(round) + "'s refused model",
                     now);
  }
  // The round in flight trained from the refused model: it is aborted (pending tasks
  // cancelled, completed updates refused) and recorded failed; the next one starts from the
  // restored model. Asynchronous mode: the step being buffered is emptied likewise.
  const std::string abort_reason =
      "trained from round " + std::to_string(round) + "'s refused model (rolled back)";
  for (CommitRound& c : refusal.rounds) commit(std::move(c), now);
  ctx_.tryStartRound(now);  // one held back by the evaluations behind (step 9)
  if (round == 0) return;   // nothing was trained from a step of it: nothing to abort
  ctx_.mode().abort(abort_reason, now);
}

void CommitPipeline::commit(CommitRound c, double now) {
  ctx_.upsertClientsOf(c);
  const uint32_t round = c.round.round;
  const bool failed = c.outcome == RoundOutcome::kFailed;
  ctx_.emit(std::move(c));
  // The run ends with the commit that leaves nothing behind once the last round is done: the
  // last round's own, or, when it failed and was committed at once while an earlier round
  // still awaited its evaluation, that earlier round's.
  if (last_round_done_ && backlog_.empty() && !ctx_.blocksPending() &&
      s_.phase != EnginePhase::kFinished) {
    ctx_.finishRun(true, "all rounds done", now);
    return;
  }
  ctx_.countRoundOutcome(round, failed, now);
}

}  // namespace fedfleet::engine
