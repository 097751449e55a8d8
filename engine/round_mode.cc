#include "engine/round_mode.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "common/check.h"
#include "common/format.h"
#include "common/splitmix.h"
#include "engine/aggregator.h"
#include "engine/block_coordinator.h"
#include "engine/central_dp.h"
#include "engine/commit_pipeline.h"
#include "engine/deadline_policy.h"
#include "engine/engine_options.h"
#include "engine/norm_reference.h"
#include "engine/server_optimizer.h"
#include "engine/update_assembler.h"
#include "engine/update_weights.h"
#include "kernels/accumulate.h"

namespace fedfleet::engine {

std::unique_ptr<RoundMode> RoundMode::create(RoundContext& context, const EngineOptions& options) {
  if (options.async) return std::make_unique<BufferedAsyncRounds>(context);
  if (options.secagg.enabled) return std::make_unique<SecureRounds>(context);
  return std::make_unique<SynchronousRounds>(context);
}

std::optional<std::string> RoundMode::onMaskedChunk(Participant& /*p*/, uint64_t /*token*/,
                                                    const wire::Chunk& /*chunk*/) {
  return "a masked chunk for a task without secure aggregation";
}

std::optional<std::string> RoundMode::onSecAgg(Participant& /*p*/, const wire::SecAgg& /*message*/,
                                               double /*now*/) {
  return "secure aggregation message for a task without it";
}

void RoundMode::onReveal(const ClientId& id, const wire::SecAgg& message, uint64_t /*frame_bytes*/,
                         double now) {
  ctx_.event("secagg_refused", id,
             "revealed shares for a task not being unmasked (token " +
                 std::to_string(message.task_token) + ")",
             now);
}

// ---- SynchronousRounds ----------------------------------------------------------------------

void SynchronousRounds::startRound(double now) {
  const EngineOptions& o = ctx_.options();
  if (ctx_.blocks()) {
    if (auto started = ctx_.blocks()->prepareRound(s_.round + 1, now, ctx_.params())) {
      ctx_.event("block_started", "", *started, now);
    }
  }
  size_t want = o.clients_per_round;
  if (o.over_selection > 0) {
    want = static_cast<size_t>(std::ceil(o.clients_per_round * (1.0 + o.over_selection) - 1e-9));
  }
  std::vector<ClientId> idle = ctx_.sampleIdle(want, now, o.quorum);
  if (idle.empty()) return;
  if (idle.size() < minCohort()) return;
  const size_t k = idle.size();

  std::vector<uint32_t> partitions;
  if (o.sample_partitions) {
    std::vector<uint32_t> all(o.num_partitions);
    for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), ctx_.rng());
    partitions.assign(all.begin(), all.begin() + std::min<size_t>(k, all.size()));
  }

  ++s_.round;
  s_.phase = EnginePhase::kRunning;
  s_.round_start = now;
  const double deadline_s = ctx_.deadlines().startRound();
  round_deadline_ = now + deadline_s;
  s_.participants.clear();
  s_.sum.assign(ctx_.updateSize(), 0.0f);
  s_.sum_weight = 0;
  cohortChosen(idle, now);

  ctx_.aggregator().roundStarting(s_.round, idle);
  for (size_t i = 0; i < k; ++i) {
    const ClientId& id = idle[i];
    const uint32_t partition = o.sample_partitions ? partitions[i % partitions.size()]
                                                   : static_cast<uint32_t>(ctx_.partitionOf(id));
    ctx_.dispatch(id, partition, deadline_s, now);
  }
}

uint32_t SynchronousRounds::selectionRound() const { return s_.round + 1; }

void SynchronousRounds::finishIfDone(double now) {
  if (s_.phase != EnginePhase::kRunning) return;
  uint32_t completed = 0;
  bool pending = false;
  for (const auto& [token, p] : s_.participants) {
    pending |= p.state == UpdateState::kPending;
    completed += p.state == UpdateState::kCompleted;
  }
  // Over-selection: the first K completed updates end the round; the rest are cancelled.
  const EngineOptions& o = ctx_.options();
  if (!pending || (o.over_selection > 0 && completed >= o.clients_per_round)) {
    finish(now);
  }
}

void SynchronousRounds::completed(uint64_t token, double now) {
  Participant& p = s_.participants.at(token);
  p.agg_weight = p.weight;
  if (ctx_.aggregator().buffersUpdates()) {
    s_.sum_weight += p.weight;
    ctx_.assembler().takeBack(token);  // in the aggregator's buffer now
  }
  // Linear aggregators keep the payloads in the PartialLog until the round settles.
  p.state = UpdateState::kCompleted;
  finishIfDone(now);
}

void SynchronousRounds::onTick(double now) {
  if (now >= round_deadline_) finish(now);
}

std::optional<double> SynchronousRounds::nextDeadline() const { return round_deadline_; }

void SynchronousRounds::afterStep(double now) {
  s_.phase = EnginePhase::kWaiting;
  s_.wait_since = now;
  ctx_.tryStartRound(now);
}

void SynchronousRounds::abort(const std::string& reason, double now) {
  if (s_.phase == EnginePhase::kRunning) finish(now, &reason);
}

void SynchronousRounds::rejectAtSettlement(Participant& p, uint64_t token, const std::string& why,
                                           double now) {
  p.state = UpdateState::kRejected;
  p.agg_weight = 0;
  ctx_.assembler().takeBack(token);
  ctx_.event("update_rejected", p.client, "round " + std::to_string(s_.round) + ": " + why, now);
  ctx_.countRejection(why);
}

void SynchronousRounds::settle(double now) {
  const std::string round = "round " + std::to_string(s_.round) + ": ";
  std::vector<double> norms;
  for (const auto& [token, p] : s_.participants) {
    if (p.state == UpdateState::kCompleted) norms.push_back(std::sqrt(p.sq_norm));
  }
  // The norm bound against the reference norm of the rounds settled before
  // (engine/norm_reference.h), which no update of this round moves; the first round, without
  // any before it, against the lower median of its completed updates' delta norms. SCAFFOLD's
  // update is delta and control delta: scaling one with the other's norm is not defined, so an
  // update beyond the bound is rejected there.
  const EngineOptions& o = ctx_.options();
  const std::optional<double> history = ctx_.normReference().reference();
  const double reference = history ? *history : lowerMedian(norms);
  const std::string against =
      std::string(history ? " x the reference norm " : " x the median norm ") +
      std::to_string(reference);
  const bool bounding = o.norm_bound > 0 && reference > 0;
  std::vector<double> observed;  // each norm at most the bound, for the next rounds' reference
  std::vector<double> scale;     // per completed update that stays, in dispatch order
  std::vector<double> samples;
  for (auto& [token, p] : s_.participants) {
    if (p.state != UpdateState::kCompleted) continue;
    const double norm = std::sqrt(p.sq_norm);
    observed.push_back(bounding ? std::min(norm, o.norm_bound * reference) : norm);
    const std::optional<double> bounded =
        ctx_.normBoundScale(norm, reference, ctx_.aggregator().clippable());
    ctx_.noteNormVerdict(p.client, !bounded || *bounded < 1, now);
    if (!bounded) {
      rejectAtSettlement(p, token,
                         "update norm " + std::to_string(norm) +
                             " exceeds aggregation.norm_bound " + std::to_string(o.norm_bound) +
                             against,
                         now);
      continue;
    }
    if (*bounded < 1) {
      ctx_.event("update_clipped", p.client,
                 round + "norm " + std::to_string(norm) + " clipped to " +
                     std::to_string(o.norm_bound * reference) + " (aggregation.norm_bound " +
                     std::to_string(o.norm_bound) + against + ")",
                 now);
    }
    const double clip =
        ctx_.options().clip_norm > 0 ? clipScale(norm, ctx_.options().clip_norm) : 1.0;
    scale.push_back(std::min(*bounded, clip));
    samples.push_back(p.weight);
  }
  // The weight cap against the lower median of the sample counts that stay.
  const double cap =
      ctx_.options().weight_cap > 0 ? ctx_.options().weight_cap * lowerMedian(samples) : 0;
  size_t i = 0;
  for (auto& [token, p] : s_.participants) {
    if (p.state != UpdateState::kCompleted) continue;
    p.agg_weight = p.weight;
    if (cap > 0 && p.weight > cap) {
      p.agg_weight = cap;
      ctx_.event("weight_capped", p.client,
                 round + std::to_string(static_cast<uint64_t>(p.weight)) + " samples weighed as " +
                     std::to_string(cap) + " (aggregation.weight_cap " +
                     std::to_string(ctx_.options().weight_cap) + " x the median " +
                     std::to_string(cap / ctx_.options().weight_cap) + ")",
                 now);
    }
    const double fold = ctx_.aggregator().settleFoldWeight(p.agg_weight, p.steps);
    foldKept(p, token, fold * scale[i++], now);
  }
  if (o.norm_bound > 0) ctx_.normReference().observe(observed);
}

void SynchronousRounds::settlePrivately(double now) {
  CentralDp& dp = *ctx_.dp();
  for (auto& [token, p] : s_.participants) {
    if (p.state != UpdateState::kCompleted) continue;
    const double norm = std::sqrt(p.sq_norm);
    dp.observe(norm);
    p.agg_weight = 1;
    foldKept(p, token, dp.clipScale(norm), now);
  }
}

bool SynchronousRounds::settleRound(double now, const std::string* abort_reason,
                                    std::string* /*failure*/) {
  if (!ctx_.aggregator().buffersUpdates() && !abort_reason) {
    if (ctx_.dp() && !ctx_.options().dp.local) {
      settlePrivately(now);
    } else {
      settle(now);
    }
  }
  return true;
}

void SynchronousRounds::foldKept(Participant& p, uint64_t token, double fold, double now) {
  // Folded in dispatch order with its final weight: the sum does not depend on the order in
  // which uploads arrived, and a clipped update enters it already scaled.
  Status st = ctx_.assembler().fold(token, static_cast<float>(fold), s_.sum.data());
  if (!st.isOk()) {
    s_.sum_tainted = true;
    ctx_.event("aggregation_error", p.client,
               "round " + std::to_string(s_.round) + ": folding a kept update: " + st.message(),
               now);
  }
  s_.sum_weight += p.agg_weight;
  ctx_.assembler().takeBack(token);
}

void SynchronousRounds::finish(double now, const std::string* abort_reason) {
  FEDFLEET_CHECK(s_.phase == EnginePhase::kRunning);
  CommitRound c;
  auto& r = c.round;
  r.run_id = ctx_.options().run_id;
  r.round = s_.round;
  r.start_time = s_.round_start;
  r.end_time = now;
  r.selected = static_cast<uint32_t>(s_.participants.size());

  for (auto& [token, p] : s_.participants) {
    if (p.state == UpdateState::kPending) {
      ctx_.expire(p, token, abort_reason ? *abort_reason : "deadline passed", now);
    } else if (abort_reason && p.state == UpdateState::kCompleted) {
      rejectAtSettlement(p, token, *abort_reason, now);
    }
  }
  std::string settle_failure;
  if (!settleRound(now, abort_reason, &settle_failure)) return;
  double loss_sum = 0;
  for (auto& [token, p] : s_.participants) {
    switch (p.state) {
      case UpdateState::kCompleted:
        ++r.completed;
        loss_sum += p.agg_weight * p.summary.mean_loss;
        break;
      case UpdateState::kLate:
        ++r.late;
        break;
      case UpdateState::kDropped:
        ++r.dropped;
        break;
      case UpdateState::kRejected:
        ++r.rejected;
        break;
      case UpdateState::kPending:
        break;
    }
    r.bytes_up += p.bytes_up;
    r.bytes_down += p.bytes_down;
    // Each update's share of the average (differential privacy: of the fixed K).
    const double denominator = ctx_.dp() && !ctx_.options().dp.local ? ctx_.dp()->denominator()
                                                                     : std::max(s_.sum_weight, 1.0);
    c.addUpdate(p.state, ctx_.updateRecord(p, p.agg_weight / denominator, now));
    ctx_.feedback(p, now);
  }

  bool ok = !abort_reason && settle_failure.empty() && r.completed >= ctx_.options().quorum &&
            r.completed > 0 && s_.sum_weight > 0;
  if (ok && (s_.sum_tainted || !kernels::allFinite(s_.sum.data(), s_.sum.size()))) {
    ok = false;  // recorded as failed below; the model is unchanged
    ctx_.event("aggregation_error", "",
               "round " + std::to_string(s_.round) + ": the running sum is not usable", now);
  }
  std::optional<ModelSnapshot> before;  // kept only for a step whose evaluation is awaited
  if (ok && ctx_.commits().evaluates(s_.round, s_.round >= ctx_.options().rounds))
    before = ctx_.snapshotModel();
  if (ctx_.dp()) r.dp_clip = ctx_.dp()->clip();  // the clip this round's updates were clipped to
  if (ok && !ctx_.applyRoundStep(r.completed)) {
    ok = false;
    ctx_.event("step_refused", "",
               "round " + std::to_string(s_.round) + ": " + ctx_.stepFailure() + " (" +
                   ctx_.aggregator().name() + ", " + ctx_.optimizer().name() +
                   "); the model is unchanged",
               now);
  }
  if (ctx_.dp() && ctx_.options().dp.local) {
    // Local DP: every update that reached the coordinator, even in part, was a release of its
    // client's, whatever became of it.
    ctx_.countLocalDpReleases();
  }
  if (ctx_.dp()) {
    if (!ok) ctx_.dp()->clearRound();  // nothing released: nothing spent
    r.dp_epsilon = ctx_.dp()->epsilon();
  }
  if (ok) {
    ++s_.version;
    ctx_.refreshModelBytes();
    r.train_loss = loss_sum / s_.sum_weight;
  } else {
    ctx_.roundFailed(s_.round,
                     abort_reason ? *abort_reason
                                  : std::to_string(r.completed) + " updates, quorum " +
                                        std::to_string(ctx_.options().quorum),
                     now);
  }
  ctx_.closeRound(s_.round);
  s_.sum.clear();
  s_.sum.shrink_to_fit();
  s_.sum_tainted = false;
  ctx_.aggregator().clearRound();
  ctx_.assembler().clear();
  s_.participants.clear();
  ctx_.flushLeftOutEvents(now);
  if (ctx_.blocks()) {
    if (auto ev = ctx_.blocks()->endRound(s_.round, s_.round >= ctx_.options().rounds, now,
                                          ctx_.params())) {
      ctx_.emit(std::move(*ev));
    }
    ctx_.blocks()->modelsChanged();  // x, a chain or z_m may have changed
  }
  ctx_.commits().endServerStep(std::move(c), ok, s_.round >= ctx_.options().rounds,
                               std::move(before), now);
}

// ---- BufferedAsyncRounds --------------------------------------------------------------------

void BufferedAsyncRounds::startRound(double now) {
  ++s_.round;
  s_.phase = EnginePhase::kRunning;
  s_.round_start = now;
  window_start_ = now;
  s_.sum.assign(ctx_.params().size(), 0.0f);
  buffered_ = 0;
  window_loss_ = 0;
  refill(now);
}

uint32_t BufferedAsyncRounds::selectionRound() const { return s_.round; }

void BufferedAsyncRounds::noteTaskEnd(const Participant& p, const std::string& how, double now) {
  if (p.state == UpdateState::kCompleted) {
    unproductive_ = 0;
    return;
  }
  ++unproductive_;
  const EngineOptions& o = ctx_.options();
  const uint64_t bound = uint64_t{o.max_failed_rounds} * o.async_buffer;
  if (bound == 0 || unproductive_ < bound || s_.phase == EnginePhase::kFinished) return;
  ctx_.finishRun(false,
                 "asynchronous rounds: " + std::to_string(unproductive_) +
                     " tasks in a row ended without an update (coordinator.max_failed_rounds x "
                     "policy.async_buffer = " +
                     std::to_string(bound) + "); the latest " + how +
                     ". Fix the cause (coordinator.deadline_s, the clients' data and model) and "
                     "continue with --resume, or raise coordinator.max_failed_rounds (0: never "
                     "stop)",
                 now);
}

void BufferedAsyncRounds::taskEnded(uint64_t token, double now) {
  Participant& p = s_.participants.at(token);
  noteTaskEnd(p,
              std::string("was ") +
                  (p.state == UpdateState::kDropped ? "dropped (its client left)" : "rejected"),
              now);
  window_.addUpdate(p.state, ctx_.updateRecord(p, 0, now));
  ctx_.feedback(p, now);
  s_.participants.erase(token);
}

void BufferedAsyncRounds::refill(double now) {
  if (s_.phase != EnginePhase::kRunning) return;
  const EngineOptions& o = ctx_.options();
  size_t pending = 0;
  for (const auto& [token, p] : s_.participants) {
    pending += p.state == UpdateState::kPending;
  }
  if (pending >= o.async_concurrency) return;
  const std::vector<ClientId> ids =
      ctx_.sampleIdle(o.async_concurrency - pending, now, pending == 0 ? 1 : 0);
  if (pending == 0 && ids.empty()) {
    if (!starved_since_) starved_since_ = now;
  } else {
    starved_since_.reset();
  }
  for (const ClientId& id : ids) {
    uint32_t partition = static_cast<uint32_t>(std::max(ctx_.partitionOf(id), 0));
    if (o.sample_partitions) {
      partition = std::uniform_int_distribution<uint32_t>(0, o.num_partitions - 1)(ctx_.rng());
    }
    ctx_.dispatch(id, partition, o.deadline_s, now);
  }
}

void BufferedAsyncRounds::completed(uint64_t token, double now) {
  const EngineOptions& o = ctx_.options();
  Participant& p = s_.participants.at(token);
  const uint64_t s = s_.version - p.start_version;
  p.staleness = static_cast<uint32_t>(std::min<uint64_t>(s, UINT32_MAX));
  double weight = 0;
  if (s > o.max_staleness) {
    p.state = UpdateState::kRejected;
    ctx_.assembler().takeBack(token);
    ctx_.event("stale_update", p.client,
               "round " + std::to_string(s_.round) + ": " + std::to_string(s) +
                   " versions behind (max_staleness " + std::to_string(o.max_staleness) + ")",
               now);
  } else if (std::optional<double> bounded = normBound(token, now); !bounded) {
    p.state = UpdateState::kRejected;
    ctx_.assembler().takeBack(token);
  } else {
    // w(s) = 1 / sqrt(1 + s) (FedBuff); the step divides the sum by the buffer size K.
    weight = stalenessWeight(s);
    const double norm = std::sqrt(p.sq_norm);
    const double clip = o.clip_norm > 0 ? clipScale(norm, o.clip_norm) : 1.0;
    Status st = ctx_.assembler().fold(token, static_cast<float>(weight * std::min(clip, *bounded)),
                                      s_.sum.data());
    ctx_.assembler().takeBack(token);
    if (!st.isOk()) {
      // A partly folded update cannot be taken out again reliably: this step is tainted.
      s_.sum_tainted = true;
      p.state = UpdateState::kRejected;
      ctx_.event(
          "aggregation_error", p.client,
          "round " + std::to_string(s_.round) + ": folding a buffered update: " + st.message(),
          now);
    } else {
      p.state = UpdateState::kCompleted;
      ++buffered_;
      window_loss_ += weight * p.summary.mean_loss;
      s_.sum_weight += weight;
    }
  }
  window_.addUpdate(p.state, ctx_.updateRecord(p, weight / o.async_buffer, now));
  ctx_.feedback(p, now);
  noteTaskEnd(p, "was rejected when it completed (stale, or beyond the norm bound)", now);
  s_.participants.erase(token);
  if (s_.phase == EnginePhase::kFinished) return;
  if (buffered_ >= o.async_buffer) {
    flush(now);
  } else {
    refill(now);
  }
}

std::optional<double> BufferedAsyncRounds::normBound(uint64_t token, double now) {
  const EngineOptions& o = ctx_.options();
  const Participant& p = s_.participants.at(token);
  // Updates complete one at a time here, so the median is over the last completed updates
  // (2 x async_buffer of them, this one included) instead of the round's.
  const double norm = std::sqrt(p.sq_norm);
  recent_norms_.push_back(norm);
  while (recent_norms_.size() > 2 * size_t{o.async_buffer}) recent_norms_.pop_front();
  const double median = lowerMedian({recent_norms_.begin(), recent_norms_.end()});
  const std::optional<double> scale = ctx_.normBoundScale(norm, median, true);
  const std::string what = "round " + std::to_string(s_.round) + ": update norm " +
                           std::to_string(norm) + " exceeds aggregation.norm_bound " +
                           std::to_string(o.norm_bound) + " x the median norm " +
                           std::to_string(median) + " of the last updates";
  if (!scale) {
    ctx_.event("update_rejected", p.client, what, now);
  } else if (*scale < 1) {
    ctx_.event("update_clipped", p.client, what + ": clipped", now);
  }
  ctx_.noteNormVerdict(p.client, !scale || *scale < 1, now);
  return scale;
}

void BufferedAsyncRounds::flush(double now) {
  const EngineOptions& o = ctx_.options();
  const bool last = s_.round >= o.rounds;
  if (last) {
    // The run ends with this step: tasks still out are cancelled and recorded with it.
    for (auto& [token, p] : s_.participants) {
      if (p.state != UpdateState::kPending) continue;
      ctx_.expire(p, token, "run finished", now);
      window_.addUpdate(p.state, ctx_.updateRecord(p, 0, now));
      ctx_.feedback(p, now);
    }
    s_.participants.clear();
  }
  CommitRound c;
  auto& r = c.round;
  r.run_id = o.run_id;
  r.round = s_.round;
  r.start_time = window_start_;
  r.end_time = now;
  for (size_t i = 0; i < window_.updates.size(); ++i) {
    const UpdateState state = window_.states[i];
    ++r.selected;
    r.completed += state == UpdateState::kCompleted;
    r.late += state == UpdateState::kLate;
    r.dropped += state == UpdateState::kDropped;
    r.rejected += state == UpdateState::kRejected;
    r.bytes_up += window_.updates[i].bytes_up;
    r.bytes_down += window_.updates[i].bytes_down;
  }
  c.updates = std::move(window_.updates);
  c.states = std::move(window_.states);
  window_ = {};
  std::vector<float>& sum = s_.sum;
  bool ok = buffered_ > 0 && !s_.sum_tainted && kernels::allFinite(sum.data(), sum.size());
  std::optional<ModelSnapshot> before;
  if (ok && ctx_.commits().evaluates(s_.round, last)) before = ctx_.snapshotModel();
  if (ok) {
    // G = (1/K) sum_i w(s_i) D_i; the server optimiser applies eta_g.
    kernels::scale(sum.data(), 1.0f / static_cast<float>(o.async_buffer), sum.size());
    if (!ctx_.stepModel(sum.data())) {
      ok = false;
      ctx_.event("step_refused", "",
                 "round " + std::to_string(s_.round) + ": " + ctx_.stepFailure() +
                     "; the model is unchanged",
                 now);
    }
  }
  if (ok) {
    ++s_.version;
    ctx_.refreshModelBytes();
    r.train_loss = window_loss_ / s_.sum_weight;
  } else {
    ctx_.roundFailed(s_.round, "the buffered sum is not usable", now);
  }
  ctx_.closeRound(s_.round);
  std::fill(sum.begin(), sum.end(), 0.0f);
  s_.sum_weight = 0;
  s_.sum_tainted = false;
  buffered_ = 0;
  window_loss_ = 0;
  ctx_.flushLeftOutEvents(now);
  ctx_.commits().endServerStep(std::move(c), ok, last, std::move(before), now);
  if (!last) refill(now);
}

void BufferedAsyncRounds::onTick(double now) {
  std::vector<uint64_t> due;
  for (const auto& [token, p] : s_.participants) {
    if (p.state == UpdateState::kPending && now >= p.deadline) due.push_back(token);
  }
  for (uint64_t token : due) {
    auto it = s_.participants.find(token);
    if (it == s_.participants.end()) continue;
    ctx_.expire(it->second, token, "deadline passed", now);
    window_.addUpdate(it->second.state, ctx_.updateRecord(it->second, 0, now));
    ctx_.feedback(it->second, now);
    noteTaskEnd(it->second,
                "passed its deadline (coordinator.deadline_s = " +
                    formatDuration(ctx_.options().deadline_s) + ")",
                now);
    s_.participants.erase(it);
  }
  if (!due.empty()) refill(now);
  if (starved_since_ && s_.phase == EnginePhase::kRunning) {
    // (A client that comes back refills at once: clientsAvailable.)
    if (now >= *starved_since_ + ctx_.options().wait_clients_s) {
      ctx_.finishRun(false,
                     "asynchronous rounds: no task in flight and no client to give one for " +
                         formatDuration(ctx_.options().wait_clients_s) +
                         " (coordinator.wait_clients_s); start more clients, or raise "
                         "coordinator.wait_clients_s",
                     now);
    }
  }
}

std::optional<double> BufferedAsyncRounds::nextDeadline() const {
  std::optional<double> t;
  if (starved_since_) t = *starved_since_ + ctx_.options().wait_clients_s;
  for (const auto& [token, p] : s_.participants) {
    if (p.state == UpdateState::kPending) t = t ? std::min(*t, p.deadline) : p.deadline;
  }
  return t;
}

void BufferedAsyncRounds::afterStep(double now) {
  ++s_.round;
  s_.round_start = now;
  window_start_ = now;
}

void BufferedAsyncRounds::abort(const std::string& reason, double now) {
  if (s_.phase != EnginePhase::kRunning) return;
  for (auto& [token, p] : s_.participants) {
    if (p.state != UpdateState::kPending) continue;
    ctx_.expire(p, token, reason, now);
    window_.addUpdate(p.state, ctx_.updateRecord(p, 0, now));
    ctx_.feedback(p, now);
  }
  s_.participants.clear();
  for (size_t i = 0; i < window_.updates.size(); ++i) {
    if (window_.states[i] == UpdateState::kCompleted) {
      window_.states[i] = UpdateState::kRejected;
      window_.updates[i].status = stateName(UpdateState::kRejected);
    }
    window_.updates[i].weight = 0;
  }
  std::fill(s_.sum.begin(), s_.sum.end(), 0.0f);
  s_.sum_weight = 0;
  buffered_ = 0;
  window_loss_ = 0;
  refill(now);
}

}  // namespace fedfleet::engine
