// The round engine: an update's way in (chunks, summaries, secure aggregation's stages), its
// checks (the norm bound and quarantine), upload credits, and the server's step.
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
#include "engine/round_engine.h"
#include "kernels/accumulate.h"

namespace fedfleet::engine {

std::optional<double> RoundEngine::normBound() const {
  const std::optional<double> reference = norm_ref_.reference();
  if (!(options_.norm_bound > 0) || !reference) return std::nullopt;
  return options_.norm_bound * *reference;
}

bool RoundEngine::quarantined(const ClientId& id) const {
  return quarantine_.holds(id, mode_->selectionRound());
}

void RoundEngine::noteNormVerdict(const ClientId& client, bool flagged, double now) {
  if (!flagged) {
    quarantine_.clear(client);
    return;
  }
  noteFlagged(client);
  const std::optional<uint32_t> until = quarantine_.flag(client, state_.round);
  if (!until) return;
  event("client_quarantined", client,
        "round " + std::to_string(state_.round) +
            ": the norm bound clipped or rejected its updates in " +
            std::to_string(quarantine_.strikes(client)) +
            " of its rounds in a row; not sampled before round " + std::to_string(*until) +
            " (aggregation.quarantine_after = " + std::to_string(options_.quarantine_after) +
            ", aggregation.quarantine_rounds = " + std::to_string(options_.quarantine_rounds) + ")",
        now);
}

void RoundEngine::closeFlagged(uint32_t round) {
  if (round_flagged_.empty()) return;
  std::map<ClientId, uint32_t>& kept = flagged_by_round_[round];
  for (const auto& [client, n] : round_flagged_) kept[client] += n;
  round_flagged_.clear();
}

void RoundEngine::rejectUpdate(Participant& p, uint64_t token, const std::string& why, double now) {
  p.state = UpdateState::kRejected;
  p.finished_at = now;
  takeBack(p, token, now);
  finished_tokens_.insert(token);
  answered_stale_.insert(token);  // the client is told here; later frames stay quiet
  ClientState* c = clients_.find(p.client);
  if (c && c->task_token == token) {
    c->task_token = 0;
    refreshIdle(p.client, *c);
  }
  emit(SendError{p.client, wire::Error{wire::ErrorCode::kRejected, why, token}});
  event("update_rejected", p.client, "round " + std::to_string(state_.round) + ": " + why, now);
  ++round_rejections_[why];
  noteFlagged(p.client);
  mode_->taskEnded(token, now);  // p may be gone from here on (asynchronous)
  mode_->slotFreed(now);
}

void RoundEngine::takeBack(Participant& /*p*/, uint64_t token, double /*now*/) {
  assembler_.takeBack(token);  // nothing of it was folded: forgetting its payloads is enough
}

void RoundEngine::onChunk(const ClientId& id, const wire::Chunk& chunk, uint64_t frame_bytes,
                          double now) {
  SettleCreditsOnExit settle(this, now);
  onHeartbeat(id, now);
  Participant* p = participantFor(id, chunk.task_token, now);
  if (!p) return;
  const uint64_t token = chunk.task_token;
  if (credits_.bounded() && !credits_.holds(token)) {
    return rejectUpdate(*p, token, "chunk sent before its upload grant", now);
  }
  p->bytes_up += frame_bytes;
  if (p->first_chunk_at < 0) p->first_chunk_at = now;
  p->last_chunk_at = now;
  if (mode_->masks(token)) {  // secure aggregation: into the round's masked sum
    if (auto why = mode_->onMaskedChunk(*p, token, chunk)) {
      return rejectUpdate(*p, token, *why, now);
    }
    return;
  }
  if (auto why = assembler_.addChunk(*p, token, chunk)) return rejectUpdate(*p, token, *why, now);
}

void RoundEngine::onSecAgg(const ClientId& id, const wire::SecAgg& message, uint64_t frame_bytes,
                           double now) {
  SettleCreditsOnExit settle(this, now);
  onHeartbeat(id, now);
  if (message.step == wire::SecAggStep::kReveal) {
    // After its update completed: the task is finished but still in the round being unmasked.
    return mode_->onReveal(id, message, frame_bytes, now);
  }
  const uint64_t token = message.task_token;
  Participant* p = participantFor(id, token, now);
  if (!p) return;
  p->bytes_up += frame_bytes;
  if (auto why = mode_->onSecAgg(*p, message, now)) return rejectUpdate(*p, token, *why, now);
}

bool RoundEngine::connected(const ClientId& id) const {
  const ClientState* c = clients_.find(id);
  return c && c->connected;
}

void RoundEngine::onSummary(const ClientId& id, const wire::Summary& summary, uint64_t frame_bytes,
                            double now) {
  SettleCreditsOnExit settle(this, now);
  onHeartbeat(id, now);
  Participant* p = participantFor(id, summary.task_token, now);
  if (!p) return;
  p->bytes_up += frame_bytes;
  const uint64_t token = summary.task_token;
  wire::Summary checked;
  if (auto why = assembler_.checkSummary(*p, summary, checked, now)) {
    return rejectUpdate(*p, token, *why, now);
  }
  if (auto why = mode_->onSummaryAccepted(token)) return rejectUpdate(*p, token, *why, now);
  p->summary = checked;
  auto& client = clients_.at(id);
  takeServedReport(*p, checked, now);
  if (mode_->buffersCompleted() && aggregator_->buffersUpdates()) {
    Status counted = bufferComplete(*p, token);
    if (!counted.isOk()) return rejectUpdate(*p, token, "coordinator: " + counted.message(), now);
  }
  p->finished_at = now;
  finished_tokens_.insert(token);
  client.task_token = 0;
  if (checked.upload_seconds > 0) {
    client.uplink_bytes_per_s = static_cast<double>(p->bytes_up) / checked.upload_seconds;
  }
  learnFromCompletion(client, *p, now);
  refreshIdle(id, client);
  mode_->completed(token, now);
}

Status RoundEngine::bufferComplete(Participant& p, uint64_t token) {
  const double clip =
      options_.clip_norm > 0 ? clipScale(std::sqrt(p.sq_norm), options_.clip_norm) : 1.0;
  std::vector<float> full(params_.size());
  FEDFLEET_RETURN_IF_ERROR(assembler_.decode(token, full.data()));
  if (clip < 1) {
    for (float& v : full) v = static_cast<float>(v * clip);
  }
  BufferedUpdate facts;
  facts.client = p.client;
  facts.samples = static_cast<double>(p.summary.n_samples);
  facts.steps = p.summary.steps;
  facts.weight = p.weight;
  return aggregator_->buffer(full.data(), full.size(), facts);
}

std::optional<double> RoundEngine::normBoundScale(double norm, double median,
                                                  bool clippable) const {
  if (!(options_.norm_bound > 0) || !(median > 0)) return 1.0;
  const double bound = options_.norm_bound * median;
  if (!(norm > bound)) return 1.0;
  if (options_.norm_bound_action == NormBoundAction::kReject || !clippable) return std::nullopt;
  return bound / norm;
}

bool RoundEngine::applyServerStep(uint32_t completed) {
  const size_t n = params_.size();
  step_failure_.clear();
  // The pseudo-gradient G, computed in place in the first n values of state_.sum.
  RoundTotals totals;
  totals.round = state_.round;
  totals.weight = state_.sum_weight;
  totals.completed = completed;
  totals.registered_clients = clients_.size();
  if (dp_ && !options_.dp.local) {
    // G = (sum of clipped updates + N(0, (z_D C)^2 I)) / K (engine/central_dp.h). Central
    // under secure aggregation: the clients clipped, the unmasked sum gets the noise here.
    // Distributed: the clients' noise is in the sum already.
    if (options_.dp.central) dp_->addNoise(state_.sum.data(), n, state_.round);
    totals.weight = dp_->denominator();
  }
  if (!aggregator_->pseudoGradient(state_.sum.data(), totals, &step_failure_)) return false;
  if (!kernels::allFinite(state_.sum.data(), n)) {
    step_failure_ = "the aggregate is not finite";
    return false;
  }
  if (!stepModel(state_.sum.data())) return false;
  aggregator_->stepTaken();
  if (dp_ && !options_.dp.local) dp_->stepTaken(state_.round);
  return true;
}

bool RoundEngine::stepModel(const float* g) {
  // The step itself may overflow (an adaptive optimiser's state, a large server_lr): it is
  // tried on the model and refused, with model and optimiser state restored, if the result is
  // not finite.
  const size_t n = params_.size();
  std::vector<float> before = params_;
  const std::string optimizer_before = optimizer_->saveState();
  optimizer_->apply(params_.data(), g, n);
  if (kernels::allFinite(params_.data(), n)) return true;
  params_ = std::move(before);
  Status st = optimizer_->loadState(optimizer_before);
  FEDFLEET_CHECK(st.isOk());  // its own state of a moment ago
  step_failure_ = "the server step would make the model non-finite";
  return false;
}

void RoundEngine::learnFromCompletion(ClientState& c, const Participant& p, double now) {
  const double duration = now - p.sent_at;
  if (p.summary.compute_seconds > 0 && p.summary.steps > 0) {
    c.steps_per_s = static_cast<double>(p.summary.steps) / p.summary.compute_seconds;
    c.overhead_s = std::max(0.0, duration - p.summary.compute_seconds);
  }
  deadline_->observe(duration);
}

void RoundEngine::onUploadRequest(const ClientId& id, uint64_t token, double now) {
  SettleCreditsOnExit settle(this, now);
  onHeartbeat(id, now);
  Participant* p = participantFor(id, token, now);
  if (!p) return;
  if (p->granted_at >= 0) {
    emit(SendGrant{id, wire::UploadGrant{token}});  // its grant may have been lost: again
    return;
  }
  if (p->upload_asked_at >= 0) return;  // already waiting
  p->upload_asked_at = now;
  credits_.request(token);
}

void RoundEngine::settleCredits(double now) {
  auto pending = [&](uint64_t token) {
    auto it = state_.participants.find(token);
    return it != state_.participants.end() && it->second.state == UpdateState::kPending;
  };
  for (uint64_t token : credits_.settle(pending)) {
    Participant& p = state_.participants.at(token);
    p.granted_at = now;
    emit(SendGrant{p.client, wire::UploadGrant{token}});
  }
}

std::optional<double> RoundEngine::lastUploadActivity(uint64_t token) const {
  auto it = state_.participants.find(token);
  if (it == state_.participants.end() || it->second.state != UpdateState::kPending)
    return std::nullopt;
  return std::max(it->second.granted_at, it->second.last_chunk_at);
}

}  // namespace fedfleet::engine
