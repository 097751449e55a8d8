// The fleet simulator's server-side evaluations (and the blocks' per-block ones) on the worker
// pool, fed back to the engine in round order; the rounds' wall-time stamps.
#include "sim/simulator_impl.h"

namespace fedfleet::sim::internal {

// The server's evaluation in 250-sample pieces summed in order (collectEvaluations), so the
// numbers are the same on any worker: one job a piece on this process's pool, a few pieces a
// job on MPI ranks (each job carries the model).
void Simulator::submitEvaluation(const engine::Evaluate& ev) {
  PendingEval pe;
  pe.round = ev.round;
  pe.at = now_;
  const auto test = data_->testSet();
  constexpr uint32_t kPiece = 250;
  constexpr uint64_t kPiecesPerRemoteJob = 8;
  const wire::SimModelRecipe recipe = modelRecipe();
  const uint64_t stretch = remote_ ? kPiece * kPiecesPerRemoteJob : kPiece;
  std::shared_ptr<const std::string> bytes;
  if (remote_) {
    bytes = std::make_shared<const std::string>(reinterpret_cast<const char*>(ev.params->data()),
                                                ev.params->size() * sizeof(float));
  }
  for (uint64_t begin = 0; begin < test->size(); begin += stretch) {
    const uint64_t end = std::min<uint64_t>(test->size(), begin + stretch);
    if (remote_) {
      wire::SimEvalJob job{recipe, bytes, begin, end, kPiece};
      auto reply = std::make_shared<std::future<Result<std::string>>>(
          remote_->submit(wire::encodeSimJob(job)));
      pe.pieces.push_back(pool_->submit([reply]() -> Result<std::vector<wire::SimEvalPiece>> {
        FEDFLEET_ASSIGN_OR_RETURN(wire::SimEvalResult e,
                                  awaitRemote<wire::SimEvalResult>(*reply, "an evaluation job"));
        FEDFLEET_RETURN_IF_ERROR(e.status);
        return std::move(e.pieces);
      }));
    } else {
      auto params = ev.params;
      pe.pieces.push_back(pool_->submit([=]() -> Result<std::vector<wire::SimEvalPiece>> {
        return evaluateTestPieces(recipe, *params, *test, begin, end, kPiece);
      }));
    }
  }
  evals_.push_back(std::move(pe));
}

namespace {

// Sums of loss and correct predictions over `idx`, in 250-sample pieces summed in order (the
// same numbers on any worker).
Result<EvalPiece> evaluatePieces(model::Model& model, const data::Dataset& data,
                                 const std::vector<uint32_t>& idx) {
  constexpr size_t kPiece = 250;
  EvalPiece total;
  for (size_t begin = 0; begin < idx.size(); begin += kPiece) {
    const std::vector<uint32_t> part(idx.begin() + begin,
                                     idx.begin() + std::min(idx.size(), begin + kPiece));
    FEDFLEET_ASSIGN_OR_RETURN(model::EvalResult r,
                              model::evaluateIndices(model, data, part, part.size()));
    total.add(r);
  }
  return total;
}

}  // namespace

// Evaluates the block models on their blocks' sets (on the pool, waiting for all of it: a few
// thousand samples a model) and reports to the engine.
void Simulator::evaluateBlocks(const engine::EvaluateBlocks& ev) {
  const auto& sets = data_->blockSets();
  const wire::SimModelRecipe recipe = modelRecipe();
  struct Job {
    engine::BlockModelToEvaluate what;
    std::future<Result<std::pair<EvalPiece, EvalPiece>>> result;  // validation, test
  };
  std::vector<Job> jobs;
  for (const auto& m : ev.models) {
    if (m.block >= sets.size()) continue;
    const FleetData::BlockEvalSet* set = &sets[m.block];
    auto params = m.params;
    jobs.push_back({m, pool_->submit([=]() -> Result<std::pair<EvalPiece, EvalPiece>> {
                      FEDFLEET_ASSIGN_OR_RETURN(model::Model * model, workerModel(recipe));
                      FEDFLEET_RETURN_IF_ERROR(model->setFlatParameters(*params));
                      FEDFLEET_ASSIGN_OR_RETURN(
                          EvalPiece v, evaluatePieces(*model, *set->data, set->validation));
                      FEDFLEET_ASSIGN_OR_RETURN(EvalPiece t,
                                                evaluatePieces(*model, *set->data, set->test));
                      return std::make_pair(v, t);
                    })});
  }
  std::vector<engine::BlockEvalOutcome> outcomes;
  for (auto& job : jobs) {
    auto r = job.result.get();
    if (!r.isOk()) {
      spdlog::warn("sim: evaluating block {} model {} after round {}: {}", job.what.block,
                   job.what.model, ev.round, r.status().toString());
      continue;
    }
    const auto& [v, t] = *r;
    if (t.n == 0) continue;
    engine::BlockEvalOutcome o;
    o.block = job.what.block;
    o.model = job.what.model;
    if (v.n > 0) o.validation_loss = v.loss_sum / static_cast<double>(v.n);
    o.loss = t.loss_sum / static_cast<double>(t.n);
    o.accuracy = t.accuracy().value_or(0);  // block-cyclic runs classify
    outcomes.push_back(std::move(o));
  }
  engine_->onBlocksEvaluated(ev.round, outcomes, now_);
}

void Simulator::collectEvaluations(bool block) {
  while (!evals_.empty()) {
    PendingEval& pe = evals_.front();
    bool ready = true;
    for (auto& f : pe.pieces) {
      if (block) f.wait();
      ready = ready && f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    }
    if (!ready) return;
    std::optional<engine::EvalOutcome> outcome;
    EvalPiece total;
    bool ok = true;
    for (auto& f : pe.pieces) {
      Result<std::vector<wire::SimEvalPiece>> r = f.get();
      if (!r.isOk()) {
        spdlog::warn("sim: evaluating round {}: {}", pe.round, r.status().toString());
        ok = false;
        continue;
      }
      for (const wire::SimEvalPiece& piece : *r) total.add(piece);
    }
    if (ok && total.n > 0) {
      const auto n = static_cast<double>(total.n);
      outcome = engine::EvalOutcome{total.loss_sum / n, total.accuracy(), {}};
      for (const auto& [name, sum] : total.metric_sums)
        outcome->metrics.emplace_back(name, sum / n);
    }
    const uint32_t round = pe.round;
    const double at = pe.at;
    evals_.pop_front();
    engine_->onEvaluated(round, outcome, at);
    block = false;  // one blocking wait per call is enough to make progress
  }
}

void Simulator::evaluate(const engine::Evaluate& ev) {
  wall_end_.emplace(ev.round, unixNow());
  submitEvaluation(ev);
}

void Simulator::stampRound(engine::CommitRound& commit) {
  auto& r = commit.round;
  wall_end_.emplace(r.round, unixNow());
  auto ws = wall_start_.find(r.round);
  r.wall_start = ws != wall_start_.end() ? ws->second : wall_end_[r.round];
  r.wall_end = wall_end_[r.round];
  for (auto& u : commit.updates) {
    auto wc = wall_compute_.find({u.round, u.client_id});
    if (wc != wall_compute_.end()) {
      u.wall_compute_s = wc->second;
      wall_compute_.erase(wc);
    }
    auto dw = decode_wall_.find({u.round, u.client_id});
    if (dw != decode_wall_.end()) {
      u.decode_s = dw->second;
      decode_wall_.erase(dw);
    }
  }
  wall_start_.erase(r.round);
  wall_end_.erase(r.round);
}

void Simulator::roundCommitted(const engine::CommitRound& commit) {
  const auto& r = commit.round;
  if (r.round > 0) {
    ++summary_.rounds;
    if (commit.outcome == engine::RoundOutcome::kFailed) ++summary_.failed_rounds;
    summary_.completed += r.completed;
    summary_.late += r.late;
    summary_.dropped += r.dropped;
    summary_.rejected += r.rejected;
    summary_.bytes_up += r.bytes_up;
    summary_.bytes_down += r.bytes_down;
    round_virtual_s_.push_back(r.end_time - r.start_time);
    round_wall_s_.push_back(r.wall_end - r.wall_start);
  }
  // The run's virtual time ends where its last recorded round ends (events after it, such as
  // a dropped client's rejoin, are not part of the run).
  summary_.virtual_seconds = std::max(summary_.virtual_seconds, r.end_time);
  if (r.test_accuracy) {
    summary_.final_accuracy = r.test_accuracy;
    summary_.best_accuracy = std::max(summary_.best_accuracy.value_or(0), *r.test_accuracy);
  }
  if (std::string metrics = history::roundMetricsText(r); !metrics.empty()) {
    summary_.last_metrics = std::move(metrics);
    summary_.last_metrics_round = r.round;
  }
  progress_->update(r.round, r.test_accuracy, r.end_time);
  if (round_observer_) round_observer_(r);
}

void Simulator::blockMetricsRecorded(const std::vector<history::BlockMetricRecord>& rows) {
  if (rows.empty()) return;
  // One log line per block evaluation: the served models' mean accuracy.
  double sum = 0;
  int n = 0;
  for (const auto& row : rows) {
    if (row.model == "served" && row.accuracy) sum += *row.accuracy, ++n;
  }
  if (n > 0) {
    spdlog::info("round {:>3} blocks  served mean acc {:.2f}% over {} blocks", rows.front().round,
                 100 * sum / n, n);
  }
}

}  // namespace fedfleet::sim::internal
