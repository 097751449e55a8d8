// The round engine as a RoundContext (engine/round_context.h): the steps the round modes and the
// commit pipeline ask of the core that touch its clients, tokens and model bytes, which they do
// not see.
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/crypto/sha256.h"
#include "engine/round_engine.h"

namespace fedfleet::engine {

uint64_t RoundEngine::cohortSampleScale(const std::vector<ClientId>& cohort) const {
  // Sizes the engine knows, else what the clients said they hold (bounded like a claim).
  uint64_t max_samples = 1;
  for (const ClientId& id : cohort) {
    const ClientState& c = clients_.at(id);
    const int32_t part = c.partition;
    const bool known = part >= 0 && static_cast<size_t>(part) < options_.partition_sizes.size();
    const uint64_t said =
        c.hello.data_size > 0
            ? std::min<uint64_t>(c.hello.data_size, options_.max_samples_per_update)
            : options_.max_samples_per_update;
    max_samples = std::max(max_samples, known ? options_.partition_sizes[part] : said);
  }
  return max_samples;
}

void RoundEngine::countLocalDpReleases() {
  uint64_t most = 0;
  for (const auto& [token, p] : state_.participants) {
    if (p.first_chunk_at < 0) continue;
    ClientState* c = clients_.find(p.client);
    if (!c) continue;
    ++c->dp_releases;
    most = std::max(most, c->dp_releases);
  }
  dp_->releasesObserved(dp_release_floor_ + most);
}

void RoundEngine::closeRound(uint32_t round) {
  round_rejections_.clear();
  closeFlagged(round);
}

void RoundEngine::ageTokens(uint32_t round) {
  finished_tokens_.advance(round);
  answered_stale_.advance(round);
  answered_unknown_.advance(round);
}

history::CheckpointRecord RoundEngine::checkpoint() const {
  history::CheckpointRecord cp;
  cp.run_id = options_.run_id;
  cp.round = state_.round;
  cp.model_version = state_.version;
  cp.sha256_hex = crypto::toHex(model_sha_);
  cp.blob = *model_bytes_;
  cp.engine_state = saveState();
  return cp;
}

ModelSnapshot RoundEngine::snapshotModel() const {
  return ModelSnapshot{params_, optimizer_->saveState(), aggregator_->saveState()};
}

void RoundEngine::restoreModel(const ModelSnapshot& snapshot) {
  params_ = snapshot.params;
  Status st = optimizer_->loadState(snapshot.optimizer_state);
  FEDFLEET_CHECK(st.isOk());  // its own saveState() of the same run
  aggregator_->loadState(snapshot.aggregator_state);
}

void RoundEngine::cancelPending(const std::string& reason) {
  for (auto& [token, p] : state_.participants) {
    if (p.state != UpdateState::kPending) continue;
    finished_tokens_.insert(token);
    ClientState* c = clients_.find(p.client);
    if (c && c->connected) {
      emit(SendCancel{p.client, wire::Cancel{token, reason}});
      c->task_token = 0;
      refreshIdle(p.client, *c);
    }
  }
  state_.participants.clear();
  assembler_.clear();
}

void RoundEngine::upsertClientsOf(const CommitRound& c) {
  // The round's participants were seen up to now: their client rows say so.
  // (A completed or rejected update ended with something it sent; a late or dropped one says
  // nothing of when its client was last heard from.)
  std::map<ClientId, double> seen;
  for (size_t i = 0; i < c.updates.size(); ++i) {
    const history::UpdateRecord& u = c.updates[i];
    const ClientState* known = clients_.find(u.client_id);
    if (!known) continue;
    const bool sent =
        c.states[i] == UpdateState::kCompleted || c.states[i] == UpdateState::kRejected;
    const double at = std::max(known->last_seen, sent ? u.end_time : 0.0);
    double& last = seen[u.client_id];
    last = std::max(last, at);
  }
  for (const auto& [id, at] : seen) {
    if (at > 0) emit(UpsertClient{clientRecord(id, clients_.at(id), at)});
  }
}

}  // namespace fedfleet::engine
