#include "engine/round_mode.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "common/check.h"
#include "common/format.h"
#include "common/splitmix.h"
#include "engine/round_engine.h"
#include "kernels/accumulate.h"

namespace fedfleet::engine {

std::unique_ptr<RoundMode> RoundMode::create(RoundEngine& engine, const EngineOptions& options) {
  if (options.async) return std::make_unique<BufferedAsyncRounds>(engine);
  return std::make_unique<SynchronousRounds>(engine);
}

// ---- SynchronousRounds ----------------------------------------------------------------------

void SynchronousRounds::startRound(double now) {
  const EngineOptions& o = e_.options_;
  if (e_.blocksOn()) {
    if (auto started = e_.blocks_->prepareRound(e_.round_ + 1, now, e_.params_)) {
      e_.event("block_started", "", *started, now);
    }
  }
  size_t want = o.clients_per_round;
  if (o.over_selection > 0) {
    want = static_cast<size_t>(std::ceil(o.clients_per_round * (1.0 + o.over_selection) - 1e-9));
  }
  std::vector<ClientId> idle = e_.sampleIdle(want, now, o.quorum);
  if (idle.empty()) return;
  // Secure aggregation: a single client's masked sum would be its update; wait for another.
  if (e_.secagg_ && idle.size() < 2) return;
  const size_t k = idle.size();

  std::vector<uint32_t> partitions;
  if (o.sample_partitions) {
    std::vector<uint32_t> all(o.num_partitions);
    for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), e_.rng_);
    partitions.assign(all.begin(), all.begin() + std::min<size_t>(k, all.size()));
  }

  ++e_.round_;
  e_.phase_ = RoundEngine::Phase::kRunning;
  e_.round_start_ = now;
  const double deadline_s = e_.deadline_->startRound();
  round_deadline_ = now + deadline_s;
  e_.participants_.clear();
  e_.sum_.assign(e_.updateSize(), 0.0f);
  e_.sum_weight_ = 0;
  if (e_.secagg_) {
    // The cohort's largest partition scales every client's weight n_k into (0, 1].
    // Sizes the engine knows, else what the clients said they hold (bounded like a claim).
    uint64_t max_samples = 1;
    for (size_t i = 0; i < k; ++i) {
      const auto& c = e_.clients_.at(idle[i]);
      const int32_t part = c.partition;
      const bool known = part >= 0 && static_cast<size_t>(part) < o.partition_sizes.size();
      const uint64_t said = c.hello.data_size > 0
                                ? std::min<uint64_t>(c.hello.data_size, o.max_samples_per_update)
                                : o.max_samples_per_update;
      max_samples = std::max(max_samples, known ? o.partition_sizes[part] : said);
    }
    // The graph's relabelling from the seed and the round, not the selection generator (whose
    // draws decide the cohorts: a run's cohorts are the same with and without it).
    const uint64_t graph_seed = splitMix64(o.seed ^ (0x5ec466ull << 32) ^ e_.round_);
    e_.secagg_->startRound(e_.round_, static_cast<uint32_t>(k), max_samples, graph_seed, now);
  }

  e_.aggregator_->roundStarting(e_.round_, idle);
  for (size_t i = 0; i < k; ++i) {
    const ClientId& id = idle[i];
    const uint32_t partition = o.sample_partitions
                                   ? partitions[i % partitions.size()]
                                   : static_cast<uint32_t>(e_.clients_.at(id).partition);
    e_.dispatch(id, partition, deadline_s, now);
  }
}

uint32_t SynchronousRounds::selectionRound() const { return e_.round_ + 1; }

void SynchronousRounds::finishIfDone(double now) {
  if (e_.phase_ != RoundEngine::Phase::kRunning) return;
  if (e_.secagg_ && e_.secagg_->unmasking()) {  // the uploads are over: the shares decide
    if (e_.secagg_->unmaskingDone(now)) finish(now);
    return;
  }
  uint32_t completed = 0;
  bool pending = false;
  for (const auto& [token, p] : e_.participants_) {
    pending |= p.state == UpdateState::kPending;
    completed += p.state == UpdateState::kCompleted;
  }
  // Over-selection: the first K completed updates end the round; the rest are cancelled.
  const EngineOptions& o = e_.options_;
  if (!pending || (o.over_selection > 0 && completed >= o.clients_per_round)) {
    finish(now);
  }
}

void SynchronousRounds::completed(uint64_t token, double now) {
  Participant& p = e_.participants_.at(token);
  p.agg_weight = p.weight;
  if (e_.aggregator_->buffersUpdates()) {
    e_.sum_weight_ += p.weight;
    e_.assembler_.takeBack(token);  // in the aggregator's buffer now
  }
  // Linear aggregators keep the payloads in the PartialLog until the round settles.
  p.state = UpdateState::kCompleted;
  finishIfDone(now);
}

void SynchronousRounds::onTick(double now) {
  if (e_.secagg_ && e_.secagg_->unmasking()) {
    if (e_.secagg_->unmaskingDone(now)) finish(now);
    return;
  }
  if (now >= round_deadline_) finish(now);
}

std::optional<double> SynchronousRounds::nextDeadline() const {
  if (e_.secagg_ && e_.secagg_->active()) {
    const std::optional<double> stage = e_.secagg_->nextDeadline();
    if (e_.secagg_->unmasking()) return stage;
    if (stage) return std::min(*stage, round_deadline_);
  }
  return round_deadline_;
}

void SynchronousRounds::afterStep(double now) {
  e_.phase_ = RoundEngine::Phase::kWaiting;
  e_.wait_since_ = now;
  e_.tryStartRound(now);
}

void SynchronousRounds::abort(const std::string& reason, double now) {
  if (e_.phase_ == RoundEngine::Phase::kRunning) finish(now, &reason);
}

void SynchronousRounds::rejectAtSettlement(Participant& p, uint64_t token, const std::string& why,
                                           double now) {
  p.state = UpdateState::kRejected;
  p.agg_weight = 0;
  e_.assembler_.takeBack(token);
  e_.event("update_rejected", p.client, "round " + std::to_string(e_.round_) + ": " + why, now);
  ++e_.round_rejections_[why];
}

void SynchronousRounds::settle(double now) {
  const std::string round = "round " + std::to_string(e_.round_) + ": ";
  std::vector<double> norms;
  for (const auto& [token, p] : e_.participants_) {
    if (p.state == UpdateState::kCompleted) norms.push_back(std::sqrt(p.sq_norm));
  }
  // The norm bound against the reference norm of the rounds settled before
  // (engine/norm_reference.h), which no update of this round moves; the first round, without
  // any before it, against the lower median of its completed updates' delta norms. SCAFFOLD's
  // update is delta and control delta: scaling one with the other's norm is not defined, so an
  // update beyond the bound is rejected there.
  const EngineOptions& o = e_.options_;
  const std::optional<double> history = e_.norm_ref_.reference();
  const double reference = history ? *history : lowerMedian(norms);
  const std::string against =
      std::string(history ? " x the reference norm " : " x the median norm ") +
      std::to_string(reference);
  const bool bounding = o.norm_bound > 0 && reference > 0;
  std::vector<double> observed;  // each norm at most the bound, for the next rounds' reference
  std::vector<double> scale;     // per completed update that stays, in dispatch order
  std::vector<double> samples;
  for (auto& [token, p] : e_.participants_) {
    if (p.state != UpdateState::kCompleted) continue;
    const double norm = std::sqrt(p.sq_norm);
    observed.push_back(bounding ? std::min(norm, o.norm_bound * reference) : norm);
    const std::optional<double> bounded =
        e_.normBoundScale(norm, reference, e_.aggregator_->clippable());
    e_.noteNormVerdict(p.client, !bounded || *bounded < 1, now);
    if (!bounded) {
      rejectAtSettlement(p, token,
                         "update norm " + std::to_string(norm) +
                             " exceeds aggregation.norm_bound " + std::to_string(o.norm_bound) +
                             against,
                         now);
      continue;
    }
    if (*bounded < 1) {
      e_.event("update_clipped", p.client,
               round + "norm " + std::to_string(norm) + " clipped to " +
                   std::to_string(o.norm_bound * reference) + " (aggregation.norm_bound " +
                   std::to_string(o.norm_bound) + against + ")",
               now);
    }
    const double clip = e_.options_.clip_norm > 0 ? clipScale(norm, e_.options_.clip_norm) : 1.0;
    scale.push_back(std::min(*bounded, clip));
    samples.push_back(p.weight);
  }
  // The weight cap against the lower median of the sample counts that stay.
  const double cap = e_.options_.weight_cap > 0 ? e_.options_.weight_cap * lowerMedian(samples) : 0;
  size_t i = 0;
  for (auto& [token, p] : e_.participants_) {
    if (p.state != UpdateState::kCompleted) continue;
    p.agg_weight = p.weight;
    if (cap > 0 && p.weight > cap) {
      p.agg_weight = cap;
      e_.event("weight_capped", p.client,
               round + std::to_string(static_cast<uint64_t>(p.weight)) + " samples weighed as " +
                   std::to_string(cap) + " (aggregation.weight_cap " +
                   std::to_string(e_.options_.weight_cap) + " x the median " +
                   std::to_string(cap / e_.options_.weight_cap) + ")",
               now);
    }
    const double fold = e_.aggregator_->settleFoldWeight(p.agg_weight, p.steps);
    foldKept(p, token, fold * scale[i++], now);
  }
  if (o.norm_bound > 0) e_.norm_ref_.observe(observed);
}

void SynchronousRounds::settlePrivately(double now) {
  CentralDp& dp = *e_.dp_;
  for (auto& [token, p] : e_.participants_) {
    if (p.state != UpdateState::kCompleted) continue;
    const double norm = std::sqrt(p.sq_norm);
    dp.observe(norm);
    p.agg_weight = 1;
    foldKept(p, token, dp.clipScale(norm), now);
  }
}

bool SynchronousRounds::settleSecurely(double now, std::string* failure) {
  const std::vector<uint64_t> survivors = e_.secagg_->survivors();
  const std::set<uint64_t> in(survivors.begin(), survivors.end());
  for (auto& [token, p] : e_.participants_) {
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
    p.agg_weight = e_.dp_ ? 1.0 : std::min(p.weight, e_.secagg_->weightScale());
    e_.aggregator_->settleFoldWeight(p.agg_weight, p.steps);
    e_.sum_weight_ += p.agg_weight;
  }
  std::vector<float> sum;
  Status st = e_.secagg_->finish(sum);
  if (!st.isOk()) {
    *failure = st.message();
    return false;
  }
  e_.sum_ = std::move(sum);
  return true;
}

void SynchronousRounds::foldKept(Participant& p, uint64_t token, double fold, double now) {
  // Folded in dispatch order with its final weight: the sum does not depend on the order in
  // which uploads arrived, and a clipped update enters it already scaled.
  Status st = e_.assembler_.fold(token, static_cast<float>(fold), e_.sum_.data());
  if (!st.isOk()) {
    e_.sum_tainted_ = true;
    e_.event("aggregation_error", p.client,
             "round " + std::to_string(e_.round_) + ": folding a kept update: " + st.message(),
             now);
  }
  e_.sum_weight_ += p.agg_weight;
  e_.assembler_.takeBack(token);
}

void SynchronousRounds::finish(double now, const std::string* abort_reason) {
  FEDFLEET_CHECK(e_.phase_ == RoundEngine::Phase::kRunning);
  CommitRound c;
  auto& r = c.round;
  r.run_id = e_.options_.run_id;
  r.round = e_.round_;
  r.start_time = e_.round_start_;
  r.end_time = now;
  r.selected = static_cast<uint32_t>(e_.participants_.size());

  for (auto& [token, p] : e_.participants_) {
    if (p.state == UpdateState::kPending) {
      e_.expire(p, token, abort_reason ? *abort_reason : "deadline passed", now);
    } else if (abort_reason && p.state == UpdateState::kCompleted) {
      rejectAtSettlement(p, token, *abort_reason, now);
    }
  }
  const bool secure = e_.secagg_ && e_.secagg_->active();
  if (secure && abort_reason) e_.secagg_->clear();
  if (secure && !abort_reason && !e_.secagg_->unmasking() && e_.secagg_->keysDone()) {
    // The uploads are over: ask the survivors for their shares, and finish when they are in.
    SecureAggregation::Outgoing out;
    e_.secagg_->beginUnmasking(now, out);
    e_.sendSecAgg(out);
    if (!e_.secagg_->unmaskingDone(now)) return;
  }
  std::string secure_failure;
  if (secure && !abort_reason && !settleSecurely(now, &secure_failure)) {
    e_.event(
        "secagg_failed", "",
        "round " + std::to_string(e_.round_) + ": " + secure_failure + "; the model is unchanged",
        now);
  }
  if (!e_.aggregator_->buffersUpdates() && !abort_reason && !secure) {
    if (e_.dp_ && !e_.options_.dp.local) {
      settlePrivately(now);
    } else {
      settle(now);
    }
  }
  double loss_sum = 0;
  for (auto& [token, p] : e_.participants_) {
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
    const double denominator =
        e_.dp_ && !e_.options_.dp.local ? e_.dp_->denominator() : std::max(e_.sum_weight_, 1.0);
    c.addUpdate(p.state, e_.updateRecord(p, p.agg_weight / denominator, now));
    e_.feedback(p, now);
  }

  bool ok = !abort_reason && secure_failure.empty() && r.completed >= e_.options_.quorum &&
            r.completed > 0 && e_.sum_weight_ > 0;
  if (ok && (e_.sum_tainted_ || !kernels::allFinite(e_.sum_.data(), e_.sum_.size()))) {
    ok = false;  // recorded as failed below; the model is unchanged
    e_.event("aggregation_error", "",
             "round " + std::to_string(e_.round_) + ": the running sum is not usable", now);
  }
  std::optional<ModelSnapshot> before;  // kept only for a step whose evaluation is awaited
  if (ok && e_.commits_.evaluates(e_.round_, e_.round_ >= e_.options_.rounds))
    before = e_.commits_.snapshotModel();
  if (e_.dp_) r.dp_clip = e_.dp_->clip();  // the clip this round's updates were clipped to
  if (ok && !e_.applyRoundStep(r.completed)) {
    ok = false;
    e_.event("step_refused", "",
             "round " + std::to_string(e_.round_) + ": " + e_.step_failure_ + " (" +
                 e_.aggregator_->name() + ", " + e_.optimizer_->name() +
                 "); the model is unchanged",
             now);
  }
  if (e_.dp_ && e_.options_.dp.local) {
    // Local DP: every update that reached the coordinator, even in part, was a release of its
    // client's, whatever became of it.
    uint64_t most = 0;
    for (const auto& [token, p] : e_.participants_) {
      if (p.first_chunk_at < 0) continue;
      auto c = e_.clients_.find(p.client);
      if (c == e_.clients_.end()) continue;
      ++c->second.dp_releases;
      most = std::max(most, c->second.dp_releases);
    }
    e_.dp_->releasesObserved(e_.dp_release_floor_ + most);
  }
  if (e_.dp_) {
    if (!ok) e_.dp_->clearRound();  // nothing released: nothing spent
    r.dp_epsilon = e_.dp_->epsilon();
  }
  if (ok) {
    ++e_.version_;
    e_.refreshModelBytes();
    r.train_loss = loss_sum / e_.sum_weight_;
  } else {
    e_.roundFailed(e_.round_,
                   abort_reason ? *abort_reason
                                : std::to_string(r.completed) + " updates, quorum " +
                                      std::to_string(e_.options_.quorum),
                   now);
  }
  e_.round_rejections_.clear();
  e_.closeFlagged(e_.round_);
  e_.sum_.clear();
  e_.sum_.shrink_to_fit();
  e_.sum_tainted_ = false;
  e_.aggregator_->clearRound();
  e_.assembler_.clear();
  e_.participants_.clear();
  e_.flushLeftOutEvents(now);
  if (e_.blocksOn()) {
    if (auto ev =
            e_.blocks_->endRound(e_.round_, e_.round_ >= e_.options_.rounds, now, e_.params_)) {
      e_.emit(std::move(*ev));
    }
    e_.blocks_->modelsChanged();  // x, a chain or z_m may have changed
  }
  e_.commits_.endServerStep(std::move(c), ok, e_.round_ >= e_.options_.rounds, std::move(before),
                            now);
}

// ---- BufferedAsyncRounds --------------------------------------------------------------------

void BufferedAsyncRounds::startRound(double now) {
  ++e_.round_;
  e_.phase_ = RoundEngine::Phase::kRunning;
  e_.round_start_ = now;
  window_start_ = now;
  e_.sum_.assign(e_.params_.size(), 0.0f);
  buffered_ = 0;
  window_loss_ = 0;
  refill(now);
}

uint32_t BufferedAsyncRounds::selectionRound() const { return e_.round_; }

void BufferedAsyncRounds::noteTaskEnd(const Participant& p, const std::string& how, double now) {
  if (p.state == UpdateState::kCompleted) {
    unproductive_ = 0;
    return;
  }
  ++unproductive_;
  const EngineOptions& o = e_.options_;
  const uint64_t bound = uint64_t{o.max_failed_rounds} * o.async_buffer;
  if (bound == 0 || unproductive_ < bound || e_.phase_ == RoundEngine::Phase::kFinished) return;
  e_.finishRun(false,
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
  Participant& p = e_.participants_.at(token);
  noteTaskEnd(p,
              std::string("was ") +
                  (p.state == UpdateState::kDropped ? "dropped (its client left)" : "rejected"),
              now);
  window_.addUpdate(p.state, e_.updateRecord(p, 0, now));
  e_.feedback(p, now);
  e_.participants_.erase(token);
}

void BufferedAsyncRounds::refill(double now) {
  if (e_.phase_ != RoundEngine::Phase::kRunning) return;
  const EngineOptions& o = e_.options_;
  size_t pending = 0;
  for (const auto& [token, p] : e_.participants_) {
    pending += p.state == UpdateState::kPending;
  }
  if (pending >= o.async_concurrency) return;
  const std::vector<ClientId> ids =
      e_.sampleIdle(o.async_concurrency - pending, now, pending == 0 ? 1 : 0);
  if (pending == 0 && ids.empty()) {
    if (!starved_since_) starved_since_ = now;
  } else {
    starved_since_.reset();
  }
  for (const ClientId& id : ids) {
    uint32_t partition = static_cast<uint32_t>(std::max(e_.clients_.at(id).partition, 0));
    if (o.sample_partitions) {
      partition = std::uniform_int_distribution<uint32_t>(0, o.num_partitions - 1)(e_.rng_);
    }
    e_.dispatch(id, partition, o.deadline_s, now);
  }
}

void BufferedAsyncRounds::completed(uint64_t token, double now) {
  const EngineOptions& o = e_.options_;
  Participant& p = e_.participants_.at(token);
  const uint64_t s = e_.version_ - p.start_version;
  p.staleness = static_cast<uint32_t>(std::min<uint64_t>(s, UINT32_MAX));
  double weight = 0;
  if (s > o.max_staleness) {
    p.state = UpdateState::kRejected;
    e_.assembler_.takeBack(token);
    e_.event("stale_update", p.client,
             "round " + std::to_string(e_.round_) + ": " + std::to_string(s) +
                 " versions behind (max_staleness " + std::to_string(o.max_staleness) + ")",
             now);
  } else if (std::optional<double> bounded = normBound(token, now); !bounded) {
    p.state = UpdateState::kRejected;
    e_.assembler_.takeBack(token);
  } else {
    // w(s) = 1 / sqrt(1 + s) (FedBuff); the step divides the sum by the buffer size K.
    weight = stalenessWeight(s);
    const double norm = std::sqrt(p.sq_norm);
    const double clip = o.clip_norm > 0 ? clipScale(norm, o.clip_norm) : 1.0;
    Status st = e_.assembler_.fold(token, static_cast<float>(weight * std::min(clip, *bounded)),
                                   e_.sum_.data());
    e_.assembler_.takeBack(token);
    if (!st.isOk()) {
      // A partly folded update cannot be taken out again reliably: this step is tainted.
      e_.sum_tainted_ = true;
      p.state = UpdateState::kRejected;
      e_.event(
          "aggregation_error", p.client,
          "round " + std::to_string(e_.round_) + ": folding a buffered update: " + st.message(),
          now);
    } else {
      p.state = UpdateState::kCompleted;
      ++buffered_;
      window_loss_ += weight * p.summary.mean_loss;
      e_.sum_weight_ += weight;
    }
  }
  window_.addUpdate(p.state, e_.updateRecord(p, weight / o.async_buffer, now));
  e_.feedback(p, now);
  noteTaskEnd(p, "was rejected when it completed (stale, or beyond the norm bound)", now);
  e_.participants_.erase(token);
  if (e_.phase_ == RoundEngine::Phase::kFinished) return;
  if (buffered_ >= o.async_buffer) {
    flush(now);
  } else {
    refill(now);
  }
}

std::optional<double> BufferedAsyncRounds::normBound(uint64_t token, double now) {
  const EngineOptions& o = e_.options_;
  const Participant& p = e_.participants_.at(token);
  // Updates complete one at a time here, so the median is over the last completed updates
  // (2 x async_buffer of them, this one included) instead of the round's.
  const double norm = std::sqrt(p.sq_norm);
  recent_norms_.push_back(norm);
  while (recent_norms_.size() > 2 * size_t{o.async_buffer}) recent_norms_.pop_front();
  const double median = lowerMedian({recent_norms_.begin(), recent_norms_.end()});
  const std::optional<double> scale = e_.normBoundScale(norm, median, true);
  const std::string what = "round " + std::to_string(e_.round_) + ": update norm " +
                           std::to_string(norm) + " exceeds aggregation.norm_bound " +
                           std::to_string(o.norm_bound) + " x the median norm " +
                           std::to_string(median) + " of the last updates";
  if (!scale) {
    e_.event("update_rejected", p.client, what, now);
  } else if (*scale < 1) {
    e_.event("update_clipped", p.client, what + ": clipped", now);
  }
  e_.noteNormVerdict(p.client, !scale || *scale < 1, now);
  return scale;
}

void BufferedAsyncRounds::flush(double now) {
  const EngineOptions& o = e_.options_;
  const bool last = e_.round_ >= o.rounds;
  if (last) {
    // The run ends with this step: tasks still out are cancelled and recorded with it.
    for (auto& [token, p] : e_.participants_) {
      if (p.state != UpdateState::kPending) continue;
      e_.expire(p, token, "run finished", now);
      window_.addUpdate(p.state, e_.updateRecord(p, 0, now));
      e_.feedback(p, now);
    }
    e_.participants_.clear();
  }
  CommitRound c;
  auto& r = c.round;
  r.run_id = o.run_id;
  r.round = e_.round_;
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
  std::vector<float>& sum = e_.sum_;
  bool ok = buffered_ > 0 && !e_.sum_tainted_ && kernels::allFinite(sum.data(), sum.size());
  std::optional<ModelSnapshot> before;
  if (ok && e_.commits_.evaluates(e_.round_, last)) before = e_.commits_.snapshotModel();
  if (ok) {
    // G = (1/K) sum_i w(s_i) D_i; the server optimiser applies eta_g.
    kernels::scale(sum.data(), 1.0f / static_cast<float>(o.async_buffer), sum.size());
    if (!e_.stepModel(sum.data())) {
      ok = false;
      e_.event("step_refused", "",
               "round " + std::to_string(e_.round_) + ": " + e_.step_failure_ +
                   "; the model is unchanged",
               now);
    }
  }
  if (ok) {
    ++e_.version_;
    e_.refreshModelBytes();
    r.train_loss = window_loss_ / e_.sum_weight_;
  } else {
    e_.roundFailed(e_.round_, "the buffered sum is not usable", now);
  }
  e_.round_rejections_.clear();
  e_.closeFlagged(e_.round_);
  std::fill(sum.begin(), sum.end(), 0.0f);
  e_.sum_weight_ = 0;
  e_.sum_tainted_ = false;
  buffered_ = 0;
  window_loss_ = 0;
  e_.flushLeftOutEvents(now);
  e_.commits_.endServerStep(std::move(c), ok, last, std::move(before), now);
  if (!last) refill(now);
}

void BufferedAsyncRounds::onTick(double now) {
  std::vector<uint64_t> due;
  for (const auto& [token, p] : e_.participants_) {
    if (p.state == UpdateState::kPending && now >= p.deadline) due.push_back(token);
  }
  for (uint64_t token : due) {
    auto it = e_.participants_.find(token);
    if (it == e_.participants_.end()) continue;
    e_.expire(it->second, token, "deadline passed", now);
    window_.addUpdate(it->second.state, e_.updateRecord(it->second, 0, now));
    e_.feedback(it->second, now);
    noteTaskEnd(it->second,
                "passed its deadline (coordinator.deadline_s = " +
                    formatDuration(e_.options_.deadline_s) + ")",
                now);
    e_.participants_.erase(it);
  }
  if (!due.empty()) refill(now);
  if (starved_since_ && e_.phase_ == RoundEngine::Phase::kRunning) {
    // (A client that comes back refills at once: clientsAvailable.)
    if (now >= *starved_since_ + e_.options_.wait_clients_s) {
      e_.finishRun(false,
                   "asynchronous rounds: no task in flight and no client to give one for " +
                       formatDuration(e_.options_.wait_clients_s) +
                       " (coordinator.wait_clients_s); start more clients, or raise "
                       "coordinator.wait_clients_s",
                   now);
    }
  }
}

std::optional<double> BufferedAsyncRounds::nextDeadline() const {
  std::optional<double> t;
  if (starved_since_) t = *starved_since_ + e_.options_.wait_clients_s;
  for (const auto& [token, p] : e_.participants_) {
    if (p.state == UpdateState::kPending) t = t ? std::min(*t, p.deadline) : p.deadline;
  }
  return t;
}

void BufferedAsyncRounds::afterStep(double now) {
  ++e_.round_;
  e_.round_start_ = now;
  window_start_ = now;
}

void BufferedAsyncRounds::abort(const std::string& reason, double now) {
  if (e_.phase_ != RoundEngine::Phase::kRunning) return;
  for (auto& [token, p] : e_.participants_) {
    if (p.state != UpdateState::kPending) continue;
    e_.expire(p, token, reason, now);
    window_.addUpdate(p.state, e_.updateRecord(p, 0, now));
    e_.feedback(p, now);
  }
  e_.participants_.clear();
  for (size_t i = 0; i < window_.updates.size(); ++i) {
    if (window_.states[i] == UpdateState::kCompleted) {
      window_.states[i] = UpdateState::kRejected;
      window_.updates[i].status = stateName(UpdateState::kRejected);
    }
    window_.updates[i].weight = 0;
  }
  std::fill(e_.sum_.begin(), e_.sum_.end(), 0.0f);
  e_.sum_weight_ = 0;
  buffered_ = 0;
  window_loss_ = 0;
  refill(now);
}

}  // namespace fedfleet::engine
