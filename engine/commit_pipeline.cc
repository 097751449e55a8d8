#include "engine/commit_pipeline.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/crypto/sha256.h"
#include "engine/round_engine.h"

namespace fedfleet::engine {

const char* outcomeName(RoundOutcome outcome) {
  static const char* kNames[] = {"initial", "ok", "failed"};
  return kNames[static_cast<int>(outcome)];
}

CommitPipeline::CommitPipeline(RoundEngine& engine, const EngineOptions& options)
    : e_(engine), backlog_(options.max_evaluations_behind) {}

void CommitPipeline::evaluateInitial(double now) {
  CommitRound c;
  c.round.run_id = e_.options_.run_id;
  c.round.round = 0;
  c.round.start_time = now;
  c.round.end_time = now;
  c.setOutcome(RoundOutcome::kInitial);
  c.round.model_version = e_.version_;
  if (!e_.options_.server_eval) {  // nothing to evaluate it on: round 0 is recorded at once
    commit(std::move(c), now);
    return;
  }
  backlog_.hold(0, std::move(c), std::nullopt);
  e_.emit(Evaluate{0, std::make_shared<const std::vector<float>>(e_.params_)});
}

bool CommitPipeline::evaluationsBehind() const { return backlog_.full(e_.round_); }

ModelSnapshot CommitPipeline::snapshotModel() const {
  return ModelSnapshot{e_.params_, e_.optimizer_->saveState(), e_.aggregator_->saveState()};
}

void CommitPipeline::restoreModel(const ModelSnapshot& snapshot) {
  e_.params_ = snapshot.params;
  Status st = e_.optimizer_->loadState(snapshot.optimizer_state);
  FEDFLEET_CHECK(st.isOk());  // its own saveState() of the same run
  e_.aggregator_->loadState(snapshot.aggregator_state);
}

bool CommitPipeline::evaluates(uint32_t round, bool last) const {
  const EngineOptions& o = e_.options_;
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
  Status st = e_.aggregator_->aggregateEvaluation(r.round, reports, evaluation);
  if (!st.isOk()) {
    e_.event("aggregation_error", "",
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
  const EngineOptions& o = e_.options_;
  e_.finished_tokens_.advance(e_.round_);
  e_.answered_stale_.advance(e_.round_);
  e_.answered_unknown_.advance(e_.round_);
  auto& r = c.round;
  c.setOutcome(ok ? RoundOutcome::kOk : RoundOutcome::kFailed);
  federatedEvaluation(r, c.updates, c.states);
  customEvaluation(r, c.updates, c.states, now);
  r.model_version = e_.version_;
  if (ok && o.checkpoint_every > 0 && (e_.round_ % o.checkpoint_every == 0 || last)) {
    history::CheckpointRecord cp;
    cp.run_id = o.run_id;
    cp.round = e_.round_;
    cp.model_version = e_.version_;
    cp.sha256_hex = crypto::toHex(e_.model_sha_);
    cp.blob = *e_.model_bytes_;
    cp.engine_state = e_.saveState();
    c.checkpoint = std::move(cp);
  }
  const uint32_t round = e_.round_;
  if (last) {
    last_round_done_ = true;
    e_.phase_ = RoundEngine::Phase::kDraining;  // nothing new starts; the run ends after the commit
  }
  if (!ok) {
    // A failed round is committed at once, and before the next round goes out: a failure that
    // ends the run (max_failed_rounds) leaves no round started that would never run.
    commit(std::move(c), now);
    if (!last && e_.phase_ != RoundEngine::Phase::kFinished) e_.mode_->afterStep(now);
    return;
  }
  // The next round goes out before this round's model is evaluated (protocol step 9).
  if (!last) e_.mode_->afterStep(now);
  if (evaluates(round, last)) {
    // The model before the step, until the evaluation says the new one is usable.
    backlog_.hold(round, std::move(c), std::move(before));
    e_.emit(Evaluate{round, std::make_shared<const std::vector<float>>(e_.params_)});
  } else {
    commit(std::move(c), now);
  }
}

void CommitPipeline::onEvaluated(uint32_t round, std::optional<EvalOutcome> outcome, double now) {
  const EngineOptions& o = e_.options_;
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
                       e_.phase_ != RoundEngine::Phase::kFinished;
  commit(std::move(c), now);
  if (!reached || e_.phase_ == RoundEngine::Phase::kFinished) {
    e_.tryStartRound(now);  // a round held back by the evaluations behind (step 9) may start now
    return;
  }
  // Target reached: rounds awaiting their evaluation are committed without test metrics, tasks
  // in flight are cancelled (their round is never recorded), and the run ends.
  for (CommitRound& pending : backlog_.takeAll()) e_.emit(std::move(pending));
  for (auto& [token, p] : e_.participants_) {
    if (p.state != UpdateState::kPending) continue;
    e_.finished_tokens_.insert(token);
    auto cit = e_.clients_.find(p.client);
    if (cit != e_.clients_.end() && cit->second.connected) {
      e_.emit(SendCancel{p.client, wire::Cancel{token, "target accuracy reached"}});
      cit->second.task_token = 0;
      e_.refreshIdle(p.client, cit->second);
    }
  }
  e_.participants_.clear();
  e_.assembler_.clear();
  e_.finishRun(true,
               "target accuracy " + std::to_string(o.target_accuracy) + " reached in round " +
                   std::to_string(round),
               now);
}

void CommitPipeline::rollBack(uint32_t round, const std::string& why, double now) {
  const std::string refused = "round " + std::to_string(round) + ": " + why;
  EvaluationBacklog::Refusal refusal = backlog_.refuse(round);
  // Round 0 (the initial model) has no step to undo; its row is recorded failed all the same.
  if (refusal.before) {
    restoreModel(*refusal.before);
    ++e_.version_;  // a new version holding the old parameters: caches keyed by version refresh
    e_.refreshModelBytes();
    if (e_.blocks_) e_.blocks_->modelsChanged();
  }
  e_.event("evaluation_refused", "",
           refused + "; the model is rolled back to the one before that round (now version " +
               std::to_string(e_.version_) + ")",
           now);
  // The refused round and every later one awaiting its evaluation are recorded failed (they
  // hold the refused model or models built on it), in round order.
  for (CommitRound& c : refusal.rounds) {
    c.setOutcome(RoundOutcome::kFailed);
    c.round.model_version = e_.version_;
    c.checkpoint.reset();
    e_.roundFailed(c.round.round,
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
  e_.tryStartRound(now);   // one held back by the evaluations behind (step 9)
  if (round == 0) return;  // nothing was trained from a step of it: nothing to abort
  e_.mode_->abort(abort_reason, now);
}

void CommitPipeline::commit(CommitRound c, double now) {
  // The round's participants were seen up to now: their client rows say so.
  // (A completed or rejected update ended with something it sent; a late or dropped one says
  // nothing of when its client was last heard from.)
  std::map<ClientId, double> seen;
  for (size_t i = 0; i < c.updates.size(); ++i) {
    const history::UpdateRecord& u = c.updates[i];
    auto it = e_.clients_.find(u.client_id);
    if (it == e_.clients_.end()) continue;
    const bool sent =
        c.states[i] == UpdateState::kCompleted || c.states[i] == UpdateState::kRejected;
    const double at = std::max(it->second.last_seen, sent ? u.end_time : 0.0);
    double& last = seen[u.client_id];
    last = std::max(last, at);
  }
  for (const auto& [id, at] : seen) {
    if (at > 0) e_.emit(UpsertClient{e_.clientRecord(id, e_.clients_.at(id), at)});
  }
  const uint32_t round = c.round.round;
  const bool failed = c.outcome == RoundOutcome::kFailed;
  e_.emit(std::move(c));
  // The run ends with the commit that leaves nothing behind once the last round is done: the
  // last round's own, or, when it failed and was committed at once while an earlier round
  // still awaited its evaluation, that earlier round's.
  if (last_round_done_ && backlog_.empty() && !e_.blocksPending() &&
      e_.phase_ != RoundEngine::Phase::kFinished) {
    e_.finishRun(true, "all rounds done", now);
    return;
  }
  e_.countRoundOutcome(round, failed, now);
}

}  // namespace fedfleet::engine
