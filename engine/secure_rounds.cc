// SecureRounds: synchronous rounds under secure aggregation (engine/round_mode.h).
#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/splitmix.h"
#include "engine/aggregator.h"
#include "engine/engine_options.h"
#include "engine/round_mode.h"
#include "engine/update_assembler.h"

namespace fedfleet::engine {

SecureRounds::SecureRounds(RoundContext& context)
    : SynchronousRounds(context), secagg_(context.options(), context.params().size()) {
  FEDFLEET_CHECK(validateSecAggOptions(context.options()).isOk());  // checkEngineOptions says why
}

void SecureRounds::cohortChosen(const std::vector<ClientId>& cohort, double now) {
  const EngineOptions& o = ctx_.options();
  // The cohort's largest partition scales every client's weight n_k into (0, 1].
  const uint64_t max_samples = ctx_.cohortSampleScale(cohort);
  // The graph's relabelling from the seed and the round, not the selection generator (whose
  // draws decide the cohorts: a run's cohorts are the same with and without it).
  const uint64_t graph_seed = splitMix64(o.seed ^ (0x5ec466ull << 32) ^ s_.round);
  secagg_.startRound(s_.round, static_cast<uint32_t>(cohort.size()), max_samples, graph_seed, now);
}

void SecureRounds::prepareTask(wire::Task& task) {
  if (!secagg_.active()) return;
  task.secagg = secagg_.taskFor(task.task_token);
  task.codec = "none";
}

void SecureRounds::finishIfDone(double now) {
  if (s_.phase != EnginePhase::kRunning) return;
  if (secagg_.unmasking()) {  // the uploads are over: the shares decide
    if (secagg_.unmaskingDone(now)) finish(now);
    return;
  }
  SynchronousRounds::finishIfDone(now);
}

void SecureRounds::onTick(double now) {
  if (secagg_.unmasking()) {
    if (secagg_.unmaskingDone(now)) finish(now);
    return;
  }
  SynchronousRounds::onTick(now);
}

std::optional<double> SecureRounds::nextDeadline() const {
  if (secagg_.active()) {
    const std::optional<double> stage = secagg_.nextDeadline();
    if (secagg_.unmasking()) return stage;
    if (stage) return std::min(*stage, round_deadline_);
  }
  return round_deadline_;
}

std::optional<std::string> SecureRounds::onMaskedChunk(Participant& p, uint64_t token,
                                                       const wire::Chunk& chunk) {
  // Checked like any chunk, then only added to the round's masked sum.
  if (!secagg_.keysDone()) {
    return "secure aggregation: a masked chunk before the key stages ended";
  }
  if (auto why = ctx_.assembler().addMaskedChunk(p, chunk)) return why;
  Status st = secagg_.onMaskedChunk(token, chunk.offset, chunk.payload, chunk.elements);
  if (!st.isOk()) return "secure aggregation: " + st.message();
  return std::nullopt;
}

std::optional<std::string> SecureRounds::onSummaryAccepted(uint64_t token) {
  if (!secagg_.holds(token)) return std::nullopt;
  Status st = secagg_.onCompleted(token);
  if (!st.isOk()) return "secure aggregation: " + st.message();
  return std::nullopt;
}

std::optional<std::string> SecureRounds::onSecAgg(Participant& p, const wire::SecAgg& message,
                                                  double now) {
  const uint64_t token = message.task_token;
  if (!secagg_.holds(token)) return RoundMode::onSecAgg(p, message, now);
  SecureAggregation::Outgoing out;
  Status st = secagg_.onMessage(token, message, now, out);
  if (!st.isOk()) return "secure aggregation: " + st.message();
  send(out);
  return std::nullopt;
}

void SecureRounds::onReveal(const ClientId& id, const wire::SecAgg& message, uint64_t frame_bytes,
                            double now) {
  const uint64_t token = message.task_token;
  auto it = s_.participants.find(token);
  if (it == s_.participants.end() || it->second.client != id || !secagg_.unmasking() ||
      !secagg_.holds(token)) {
    return RoundMode::onReveal(id, message, frame_bytes, now);
  }
  it->second.bytes_up += frame_bytes;
  SecureAggregation::Outgoing out;
  Status st = secagg_.onMessage(token, message, now, out);
  if (!st.isOk()) {
    // Its update is in the sum already: its shares are left out, not the update.
    ctx_.event("secagg_refused", id, "round " + std::to_string(s_.round) + ": " + st.message(),
               now);
    secagg_.markGone(token);
  }
}

void SecureRounds::send(SecureAggregation::Outgoing& out) {
  for (auto& [token, message] : out) {
    auto it = s_.participants.find(token);
    if (it == s_.participants.end()) continue;
    ctx_.emit(SendSecAgg{it->second.client, std::move(message)});
  }
  out.clear();
}

void SecureRounds::afterEvent(double now) {
  if (!secagg_.active() || s_.phase != EnginePhase::kRunning) return;
  for (const auto& [token, p] : s_.participants) {
    if (!secagg_.holds(token)) continue;
    const bool ended = p.state != UpdateState::kPending && p.state != UpdateState::kCompleted;
    if (ended || !ctx_.connected(p.client)) secagg_.markGone(token);
  }
  SecureAggregation::Outgoing out;
  std::vector<uint64_t> left_out;
  secagg_.onTick(now, out, left_out);
  send(out);
  for (uint64_t token : left_out) {
    auto it = s_.participants.find(token);
    if (it != s_.participants.end() && it->second.state == UpdateState::kPending) {
      ctx_.rejectUpdate(it->second, token,
                        "secure aggregation: its keys or shares were not in by the stage's end "
                        "(secagg.stage_timeout_s), or too few of its neighbours took part",
                        now);
    }
  }
  if (secagg_.unmasking() && secagg_.unmaskingDone(now)) finishIfDone(now);
}

bool SecureRounds::settleRound(double now, const std::string* abort_reason, std::string* failure) {
  if (!secagg_.active()) return SynchronousRounds::settleRound(now, abort_reason, failure);
  if (abort_reason) {
    secagg_.clear();
    return true;
  }
  if (!secagg_.unmasking() && secagg_.keysDone()) {
    // The uploads are over: ask the survivors for their shares, and finish when they are in.
    SecureAggregation::Outgoing out;
    secagg_.beginUnmasking(now, out);
    send(out);
    if (!secagg_.unmaskingDone(now)) return false;
  }
  if (!settleSecurely(now, failure)) {
    ctx_.event("secagg_failed", "",
               "round " + std::to_string(s_.round) + ": " + *failure + "; the model is unchanged",
               now);
  }
  return true;
}

bool SecureRounds::settleSecurely(double now, std::string* failure) {
  const std::vector<uint64_t> survivors = secagg_.survivors();
  const std::set<uint64_t> in(survivors.begin(), survivors.end());
  for (auto& [token, p] : s_.participants) {
    if (p.state != UpdateState::kCompleted) continue;
    if (!in.count(token)) {  // cannot happen: a completed update is in the masked sum
      rejectAtSettlement(p, token, "secure aggregation: not in the masked sum", now);
      continue;
    }
    // The client weighted its update by min(1, n_k / scale) (client/masked_upload.h); under
    // DP (central or distributed) by its clip scale alone: each counts 1, the average divides
    // by K. No norm is observed: the coordinator sees none (adaptive clipping is refused). The
    // aggregator records the update as its fold would (FedNova: n_k and a_k in its totals); the
    // fold weight it returns was applied on the client already (FedNova's 1 / a_k).
    p.agg_weight = ctx_.dp() ? 1.0 : std::min(p.weight, secagg_.weightScale());
    ctx_.aggregator().settleFoldWeight(p.agg_weight, p.steps);
    s_.sum_weight += p.agg_weight;
  }
  std::vector<float> sum;
  Status st = secagg_.finish(sum);
  if (!st.isOk()) {
    *failure = st.message();
    return false;
  }
  s_.sum = std::move(sum);
  return true;
}

}  // namespace fedfleet::engine
