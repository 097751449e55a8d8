// The round engine: its saved state, evaluations, a round's outcome and the run's end, and
// block-cyclic training's served models.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <sstream>

#include "common/check.h"
#include "common/compress/codec_spec.h"
#include "common/compress/payload.h"
#include "common/crypto/random.h"
#include "common/crypto/sha256.h"
#include "common/format.h"
#include "engine/client_record.h"
#include "engine/round_engine.h"
#include "kernels/accumulate.h"

namespace fedfleet::engine {

namespace {

// ". Suspect clients, by updates clipped or rejected in these rounds: c (6), a (2)" for the
// clients most flagged (at most 5 named), or "" when none was.
std::string suspectClients(const std::map<ClientId, uint32_t>& flagged) {
  if (flagged.empty()) return "";
  std::vector<std::pair<ClientId, uint32_t>> most(flagged.begin(), flagged.end());
  std::stable_sort(most.begin(), most.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  constexpr size_t kNamed = 5;
  std::string out = ". Suspect clients, by updates clipped or rejected in these rounds: ";
  for (size_t i = 0; i < most.size() && i < kNamed; ++i) {
    if (i > 0) out += ", ";
    out += most[i].first + " (" + std::to_string(most[i].second) + ")";
  }
  if (most.size() > kNamed) out += " and " + std::to_string(most.size() - kNamed) + " more";
  return out;
}

}  // namespace

std::string RoundEngine::saveState() const {
  EngineStateWriter out;  // engine/engine_state.h
  std::ostringstream rng;
  rng << rng_;
  out.section(rng.str());
  out.section(selector_ ? selector_->saveState() : std::string());
  out.section(optimizer_->saveState());
  out.section(aggregator_->saveState());
  // Block section: the current visit (block, first round), then the block models.
  if (blocksOn()) out.section(blocks_->save());
  // Partition section: which partition the coordinator assigned each client, so that a restart
  // keeps every client on its data. A client that asked for its partition asks again; only
  // assigned ones need keeping.
  std::vector<std::pair<ClientId, int32_t>> assigned(assigned_partitions_.begin(),
                                                     assigned_partitions_.end());
  for (const auto& [id, partition] : partitions_.reserved()) assigned.emplace_back(id, partition);
  out.section(encodePartitions(assigned));
  // Privacy section (differentially private runs only): the clip and the steps spent.
  if (dp_) out.section(dp_->saveState());
  // The norm bound's reference, and the strikes and quarantines (each opens with its magic).
  out.section(norm_ref_.save());
  out.section(quarantine_.save());
  return std::move(out).finish();
}

Status RoundEngine::loadState(std::string_view blob) {
  FEDFLEET_ASSIGN_OR_RETURN(EngineStateReader state, EngineStateReader::open(blob));
  FEDFLEET_ASSIGN_OR_RETURN(std::string_view rng_text, state.section("generator"));
  FEDFLEET_ASSIGN_OR_RETURN(std::string_view selector_blob, state.section("selector"));
  FEDFLEET_ASSIGN_OR_RETURN(std::string_view optimizer_blob, state.section("optimiser"));
  FEDFLEET_ASSIGN_OR_RETURN(std::string_view control_blob, state.section("control"));
  // The block section (absent in states saved without blocks: the block models start empty).
  std::optional<BlockCoordinator::SavedState> blocks;
  if (blocksOn() && !state.atEnd()) {
    FEDFLEET_ASSIGN_OR_RETURN(std::string_view block_blob, state.section("blocks"));
    FEDFLEET_ASSIGN_OR_RETURN(BlockCoordinator::SavedState saved,
                              blocks_->parse(block_blob, params_.size()));
    blocks.emplace(std::move(saved));
  }
  // The partition section (absent in states saved before assignments were kept).
  std::map<ClientId, int32_t> partitions;
  if (!state.atEnd()) {
    FEDFLEET_ASSIGN_OR_RETURN(std::string_view part_blob, state.section("partitions"));
    if (!options_.sample_partitions) {
      FEDFLEET_ASSIGN_OR_RETURN(partitions, parsePartitions(part_blob, options_.num_partitions));
    }
  }
  std::optional<CentralDp> dp;
  if (dp_) {
    if (state.atEnd() || state.nextStartsWith(kNormReferenceMagic)) {
      return corrupt(
          "engine state: no privacy section (the state was saved by a run without "
          "differential privacy; resume it with dp.mode as it was)");
    }
    FEDFLEET_ASSIGN_OR_RETURN(std::string_view dp_blob, state.section("privacy"));
    dp.emplace(*dp_);
    FEDFLEET_RETURN_IF_ERROR(dp->loadState(dp_blob));
  } else if (!state.atEnd() && !state.nextStartsWith(kNormReferenceMagic)) {
    // A privacy section of a run that had differential privacy: not this run's concern.
    FEDFLEET_RETURN_IF_ERROR(state.section("privacy").status());
  }
  // The norm reference and quarantine sections (absent in states saved before them: a resumed
  // run then starts both afresh).
  std::optional<NormReference> norm_ref;
  std::optional<Quarantine> quarantine;
  if (!state.atEnd()) {
    FEDFLEET_ASSIGN_OR_RETURN(std::string_view ref_blob, state.section("norm reference"));
    norm_ref.emplace(norm_ref_);
    FEDFLEET_RETURN_IF_ERROR(norm_ref->load(ref_blob));
  }
  if (!state.atEnd()) {
    FEDFLEET_ASSIGN_OR_RETURN(std::string_view q_blob, state.section("quarantine"));
    quarantine.emplace(quarantine_);
    FEDFLEET_RETURN_IF_ERROR(quarantine->load(q_blob));
  }
  std::mt19937_64 rng;
  std::istringstream in{std::string(rng_text)};
  in >> rng;
  if (in.fail()) return corrupt("engine state: bad generator state");
  FEDFLEET_RETURN_IF_ERROR(aggregator_->checkState(control_blob));
  // Everything checked that can be without changing state; the optimiser and selector leave
  // theirs unchanged when they refuse a blob.
  auto optimizer = ServerOptimizer::create(optimizer_->options());
  FEDFLEET_RETURN_IF_ERROR(optimizer.status());
  FEDFLEET_RETURN_IF_ERROR((*optimizer)->loadState(optimizer_blob));
  if ((*optimizer)->stateSize() != 0 && (*optimizer)->stateSize() != params_.size()) {
    return corrupt("engine state: optimiser state for " +
                   std::to_string((*optimizer)->stateSize()) + " values, the model has " +
                   std::to_string(params_.size()));
  }
  if (selector_ && !selector_blob.empty()) {
    FEDFLEET_RETURN_IF_ERROR(selector_->loadState(selector_blob));
  }
  optimizer_ = std::move(*optimizer);
  aggregator_->loadState(control_blob);
  rng_ = rng;
  if (blocks) blocks_->restore(std::move(*blocks));
  if (dp) {
    *dp_ = std::move(*dp);
    if (options_.dp.local) dp_release_floor_ = dp_->steps();
  }
  if (norm_ref) norm_ref_ = std::move(*norm_ref);
  if (quarantine) quarantine_ = std::move(*quarantine);
  for (auto& [id, partition] : partitions) {
    if (!clients_.contains(id)) partitions_.reserve(id, partition);
  }
  return Status::ok();
}

void RoundEngine::onEvaluated(uint32_t round, std::optional<EvalOutcome> outcome, double now) {
  SettleCreditsOnExit settle(this, now);
  commits_.onEvaluated(round, std::move(outcome), now);
}

uint64_t RoundEngine::dataSizeOf(const ClientState& c) const {
  const uint64_t said = c.hello.data_size;
  if (c.partition >= 0 && static_cast<size_t>(c.partition) < options_.partition_sizes.size()) {
    return std::min(said, options_.partition_sizes[c.partition]);
  }
  const uint64_t bound = options_.max_samples_per_update;
  return bound > 0 ? std::min(said, bound) : said;
}

history::ClientRecord RoundEngine::clientRecord(const ClientId& id, const ClientState& c,
                                                double now) const {
  // What it trains on: its partition's size where the coordinator knows it, else its claim.
  uint64_t data_size = dataSizeOf(c);
  if (c.partition >= 0 && static_cast<size_t>(c.partition) < options_.partition_sizes.size()) {
    data_size = options_.partition_sizes[c.partition];
  }
  return clientRecordOf(id, clients_.hello(id, c.hello), data_size, now);
}

void RoundEngine::roundFailed(uint32_t round, const std::string& detail, double now) {
  event("round_failed", "", "round " + std::to_string(round) + ": " + detail, now);
  last_failure_ = "round " + std::to_string(round) + ": " + detail;
  if (!round_rejections_.empty()) {
    // The most frequent reason first: it is usually the one that matters.
    auto most = std::max_element(round_rejections_.begin(), round_rejections_.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
    uint32_t total = 0;
    for (const auto& [why, n] : round_rejections_) total += n;
    last_failure_ += "; " + std::to_string(total) + " update" + (total == 1 ? "" : "s") +
                     " rejected (" + std::to_string(most->second) + " x \"" + most->first + "\")";
  }
  round_rejections_.clear();
}

void RoundEngine::countRoundOutcome(uint32_t round, bool failed, double now) {
  if (round == 0) return;  // the initial model's evaluation
  if (next_round_counted_ == 0) next_round_counted_ = options_.first_round;
  outcomes_waiting_[round] = {failed, failed ? last_failure_ : std::string()};
  std::string reason;
  for (auto it = outcomes_waiting_.begin();
       it != outcomes_waiting_.end() && it->first <= next_round_counted_;
       it = outcomes_waiting_.erase(it)) {
    next_round_counted_ = it->first + 1;
    auto flagged = flagged_by_round_.find(it->first);
    if (!it->second.first) {
      failed_in_row_ = 0;
      flagged_in_row_.clear();
    } else {
      ++failed_in_row_;
      reason = it->second.second;
      if (flagged != flagged_by_round_.end()) {
        for (const auto& [client, n] : flagged->second) flagged_in_row_[client] += n;
      }
    }
    if (flagged != flagged_by_round_.end()) flagged_by_round_.erase(flagged);
  }
  // Rounds never counted (a run resumed past them) keep nothing.
  flagged_by_round_.erase(flagged_by_round_.begin(),
                          flagged_by_round_.lower_bound(next_round_counted_));
  if (reason.empty() || options_.max_failed_rounds == 0 ||
      failed_in_row_ < options_.max_failed_rounds || state_.phase == Phase::kFinished) {
    return;
  }
  last_failure_ = reason;
  const bool non_finite = last_failure_.find("NaN") != std::string::npos ||
                          last_failure_.find("finite") != std::string::npos ||
                          last_failure_.find("too large") != std::string::npos;
  finishRun(false,
            std::to_string(failed_in_row_) + " rounds in a row failed (coordinator." +
                "max_failed_rounds = " + std::to_string(options_.max_failed_rounds) +
                "); the latest, " + last_failure_ +
                (non_finite ? ". The updates are not finite or too large: the model has "
                              "probably diverged (lower train.lr, or clip with "
                              "aggregation.clip_norm)"
                            : "") +
                suspectClients(flagged_in_row_) +
                ". Fix the cause and continue with --resume, or raise "
                "coordinator.max_failed_rounds (0: never stop)",
            now);
}

void RoundEngine::finishRun(bool ok, const std::string& message, double now) {
  state_.phase = Phase::kFinished;
  // Whatever one client's budget still owes is written now: nothing counted is lost.
  for (auto& e : event_budget_.closeRun(options_.run_id, state_.round, now)) {
    emit(RecordEvent{std::move(e)});
  }
  if (options_.bye_on_finish) {
    clients_.forEach([&](const ClientId& id, const ClientState& c) {
      if (c.connected) emit(SendBye{id, message});
    });
  }
  event(ok ? "run_finished" : "run_failed", "", message, now);
  emit(RunFinished{ok, message});
}

// ---- Blocks (block-cyclic training; protocol steps B1-B6 in round_engine.h) ----

bool RoundEngine::inCurrentBlock(const ClientId& id) const {
  const ClientState* c = clients_.find(id);
  return c && blocks_->available(c->partition);
}

bool RoundEngine::applyRoundStep(uint32_t completed) {
  if (!blocks_) return applyServerStep(completed);
  return blocks_->applyStep(params_, [&] { return applyServerStep(completed); });
}

void RoundEngine::onBlocksEvaluated(uint32_t round, const std::vector<BlockEvalOutcome>& outcomes,
                                    double now) {
  if (!blocksOn()) return;
  std::optional<RecordBlockMetrics> rec = blocks_->onEvaluated(round, outcomes, options_.run_id);
  if (!rec) return;
  emit(std::move(*rec));
  if (commits_.drained() && !blocksPending() && state_.phase != Phase::kFinished) {
    finishRun(true, "all rounds done", now);
  }
}

const std::vector<float>& RoundEngine::servedModel(uint32_t block) const {
  if (!blocksOn()) return params_;
  return blocks_->servedModel(block, params_);
}

std::shared_ptr<const std::string> RoundEngine::serve(Participant& p, wire::Task& task) {
  std::shared_ptr<const std::string> attach = blocks_->serve(
      served_sha_[p.client], task, SharedModel{params_, model_bytes_, model_sha_, state_.version});
  if (attach) {
    p.served_bytes = attach->size();
    p.bytes_down += p.served_bytes;
  }
  p.served = task.served;
  return attach;
}

void RoundEngine::takeServedReport(Participant& p, const wire::Summary& summary, double now) {
  std::optional<std::string> mismatch =
      BlockCoordinator::servedMismatch(p.served, summary.served_sha256);
  if (!mismatch) return;
  event("served_mismatch", p.client, *mismatch, now);
  served_sha_.erase(p.client);
  p.summary.served_samples = 0;
}

}  // namespace fedfleet::engine
