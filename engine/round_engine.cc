// The round engine: clients coming and going, sampling and dispatching a round, ticks and
// deadlines. An update's way in is in round_engine_updates.cc; state, evaluations and round
// outcomes in round_engine_outcomes.cc.
#include "engine/round_engine.h"

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
#include "kernels/accumulate.h"

namespace fedfleet::engine {

namespace {

// Mixes run seed, round and partition into one task seed (splitmix64 finaliser).
uint64_t taskSeed(uint64_t seed, uint32_t round, uint32_t partition) {
  uint64_t z = seed ^ (uint64_t{round} << 32) ^ partition ^ 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

RoundEngine::RoundEngine(EngineOptions options, std::vector<float> initial_params)
    : options_(std::move(options)),
      params_(std::move(initial_params)),
      rng_(options_.seed),
      aggregator_(Aggregator::create(options_, params_.size())),
      assembler_(options_, *aggregator_, params_.size()),
      credits_(options_.max_concurrent_uploads, options_.upload_idle_s),
      work_(options_) {
  state_.version = options_.model_version;
  FEDFLEET_CHECK(options_.clients_per_round > 0);
  FEDFLEET_CHECK(options_.quorum <= options_.clients_per_round);
  auto codec = compress::parseCodecSpec(options_.codec);
  FEDFLEET_CHECK(codec.isOk());  // checkEngineOptions says why
  codec_spec_ = *codec;
  if (!options_.slow_link_codec.empty()) {
    auto slow = compress::parseCodecSpec(options_.slow_link_codec);
    FEDFLEET_CHECK(slow.isOk());
    slow_link_codec_spec_ = *slow;
  }
  state_.round = options_.first_round - 1;
  refreshModelBytes();
  if (options_.selector.kind != SelectorKind::kUniform) {
    auto sel = Selector::create(options_.selector);
    FEDFLEET_CHECK(sel.isOk());  // checkEngineOptions() at start-up says why
    selector_ = std::move(*sel);
  }
  auto opt = ServerOptimizer::create(options_.server);
  FEDFLEET_CHECK(opt.isOk());
  optimizer_ = std::move(*opt);
  deadline_ = DeadlinePolicy::create(options_);
  mode_ = RoundMode::create(*this, options_);
  if (options_.blocks.count > 0) {
    FEDFLEET_CHECK(!options_.async && !options_.sample_partitions);  // checkEngineOptions says why
    blocks_ = std::make_unique<BlockCoordinator>(options_.blocks, options_.block_mode);
  }
  configured_rounds_ = options_.rounds;
  if (options_.dp.on()) {
    FEDFLEET_CHECK(validateDpOptions(options_).isOk());  // checkEngineOptions says why
    dp_ = std::make_unique<CentralDp>(options_);
    // The privacy budget: no more rounds than keep epsilon within it (each round spends at
    // most one step, so the steps of a resumed run stay within it too).
    if (options_.dp.target_epsilon > 0) {
      options_.rounds =
          static_cast<uint32_t>(dp_->stepsWithin(options_.dp.target_epsilon, options_.rounds));
    }
  }
}

void RoundEngine::setSelectorHints(SpeedHint speed, AvailabilityHint availability) {
  if (!selector_) return;
  selector_->setSpeedHint(std::move(speed));
  selector_->setAvailabilityHint(std::move(availability));
}

void RoundEngine::feedback(const Participant& p, double now) {
  if (!selector_) return;
  ParticipationFeedback f;
  f.client = p.client;
  f.round = state_.round;
  f.completed = p.state == UpdateState::kCompleted;
  f.n_samples = p.summary.n_samples;
  f.sum_sq_loss = p.summary.sum_sq_loss;
  // Late and dropped clients are charged their deadline: they took at least that long.
  const bool missed = p.state == UpdateState::kLate || p.state == UpdateState::kDropped;
  f.duration_s = (missed               ? std::max(p.deadline, p.finished_at)
                  : p.finished_at >= 0 ? p.finished_at
                                       : now) -
                 p.sent_at;
  selector_->feedback(f);
}

size_t RoundEngine::connectedClients() const {
  size_t n = 0;
  clients_.forEach([&n](const ClientId&, const ClientState& c) { n += c.connected; });
  return n;
}

uint64_t RoundEngine::unstartedTask(const ClientId& id) const {
  const ClientState* c = clients_.find(id);
  if (!c || !c->connected || c->task_token == 0) return 0;
  if (!mode_->resendsTasks()) return 0;  // secure aggregation: its key stages went there too
  auto p = state_.participants.find(c->task_token);
  if (p == state_.participants.end() || p->second.client != id ||
      p->second.state != UpdateState::kPending || p->second.first_chunk_at >= 0 ||
      p->second.upload_asked_at >= 0) {
    return 0;
  }
  return p->first;
}

size_t RoundEngine::availableIdle(double now) const {
  if (!eligible_ && !blocksOn()) return clients_.idleCount();
  size_t n = 0;
  clients_.forEachIdle([&](const ClientId& id) {
    n += (!eligible_ || eligible_(id, now)) && (!blocksOn() || inCurrentBlock(id));
  });
  return n;
}

RoundEngine::WaitingStatus RoundEngine::waitingStatus(std::optional<double> now) const {
  WaitingStatus w;
  w.waiting = state_.phase == Phase::kWaiting;
  w.idle = clients_.idleCount();
  w.available = now ? availableIdle(*now) : clients_.idleCount();
  w.needed = options_.min_clients;
  w.since = state_.wait_since;
  clients_.forEach([&w](const ClientId& id, const ClientState& c) {
    if (c.connected) w.connected.push_back(id);
  });
  return w;
}

int32_t RoundEngine::partitionOf(const ClientId& id) const {
  const ClientState* c = clients_.find(id);
  return c ? c->partition : -1;
}

void RoundEngine::refreshModelBytes() {
  auto bytes = std::make_shared<std::string>(params_.size() * sizeof(float), '\0');
  std::memcpy(bytes->data(), params_.data(), bytes->size());
  model_sha_ = crypto::sha256(*bytes);
  model_bytes_ = std::move(bytes);
}

bool RoundEngine::fedEvalDue() {
  const uint32_t every = options_.fed_eval_every;
  if (every == 0 || state_.round == 0 || (state_.round - 1) % every != 0) return false;
  if (fed_eval_round_ != state_.round) {
    fed_eval_round_ = state_.round;
    fed_eval_asked_ = 0;
  }
  return options_.fed_eval_clients == 0 || fed_eval_asked_ < options_.fed_eval_clients;
}

uint64_t RoundEngine::newToken() {
  uint64_t t = crypto::randomToken();
  while (state_.participants.count(t) || finished_tokens_.count(t)) t = crypto::randomToken();
  return t;
}

void RoundEngine::event(const std::string& kind, const ClientId& client, const std::string& detail,
                        double now) {
  if (!event_budget_.admit(client, now)) return;  // counted; flushLeftOutEvents says how many
  history::EventRecord e;
  e.run_id = options_.run_id;
  e.time = now;
  e.kind = kind;
  e.client_id = client;
  e.detail = detail;
  emit(RecordEvent{std::move(e)});
}

void RoundEngine::flushLeftOutEvents(double now) {
  for (auto& e : event_budget_.closeRound(options_.run_id, state_.round, now)) {
    emit(RecordEvent{std::move(e)});
  }
}

std::vector<Action> RoundEngine::takeActions() {
  std::vector<Action> out;
  out.swap(actions_);
  return out;
}

void RoundEngine::start(double now) {
  FEDFLEET_CHECK(state_.phase == Phase::kIdle);
  if (options_.first_round == 1 && options_.evaluate_initial) commits_.evaluateInitial(now);
  state_.phase = Phase::kWaiting;
  state_.wait_since = now;
  if (dp_ && options_.rounds < configured_rounds_) {
    event("privacy_budget", "",
          "dp.target_epsilon " + std::to_string(options_.dp.target_epsilon) + " at delta " +
              std::to_string(options_.dp.delta) + " allows " + std::to_string(options_.rounds) +
              " of the configured " + std::to_string(configured_rounds_) +
              " rounds (epsilon after them: " + std::to_string(dp_->epsilonAfter(options_.rounds)) +
              "); the run ends after round " + std::to_string(options_.rounds),
          now);
  }
  if (state_.round >= options_.rounds) {
    finishRun(true, "all rounds done", now);
    return;
  }
  tryStartRound(now);
}

RoundEngine::ClientState& RoundEngine::addClient(const ClientId& id, const wire::Hello& hello,
                                                 double now) {
  ClientState state;
  if (!options_.sample_partitions) {
    state.partition = partitions_.join(id, hello.requested_partition, [this] {
      std::vector<int32_t> held;
      held.reserve(clients_.size());
      clients_.forEach(
          [&held](const ClientId&, const ClientState& known) { held.push_back(known.partition); });
      return held;
    });
  }
  state.connected = true;
  state.last_seen = now;
  ClientState& c = clients_.add(id, state, hello);
  refreshIdle(id, c);
  notePartition(id, c);
  return c;
}

void RoundEngine::notePartition(const ClientId& id, const ClientState& c) {
  if (c.partition >= 0 && c.hello.requested_partition != c.partition) {
    assigned_partitions_[id] = c.partition;
  } else {
    assigned_partitions_.erase(id);
  }
}

void RoundEngine::registerClient(const ClientId& id, const wire::Hello& hello, double now) {
  if (clients_.contains(id)) return;
  addClient(id, hello, now);
}

void RoundEngine::refreshIdle(const ClientId& id, const ClientState& c) {
  clients_.setIdle(id, c.connected && c.task_token == 0);
}

void RoundEngine::onHello(const ClientId& id, const wire::Hello& hello, double now) {
  SettleCreditsOnExit settle(this, now);
  if (state_.phase == Phase::kFinished) {
    emit(SendBye{id, "run finished"});
    return;
  }
  if (hello.protocol_version != wire::kProtocolVersion) {
    wire::Error err{wire::ErrorCode::kBadVersion,
                    "protocol version " + std::to_string(hello.protocol_version) +
                        " not supported (coordinator speaks " +
                        std::to_string(wire::kProtocolVersion) + ")",
                    0};
    emit(SendError{id, err});
    event("bad_version", id, err.message, now);
    return;
  }
  if (ClientState* c = clients_.find(id)) {
    if (c->connected && c->hello.session == hello.session) {
      // The same client process greeting again (for example after an Error it took for a
      // restart of ours): nothing changes, its task in flight stays valid.
      c->last_seen = now;
      return;
    }
    if (c->task_token != 0) {
      loseClient(id, "restarted while its task was in flight", now);
    }
    served_sha_.erase(id);  // a new process: it may have lost its served model
    clients_.setHello(*c, hello);
    notePartition(id, *c);
    c->connected = true;
    c->last_seen = now;
    refreshIdle(id, *c);
    event("client_rejoined", id, "partition " + std::to_string(c->partition), now);
  } else {
    const ClientState& state = addClient(id, hello, now);
    event("client_joined", id,
          std::string(wire::deviceKindName(hello.device_kind)) + " " + hello.device_name +
              (state.partition >= 0 ? ", partition " + std::to_string(state.partition) : ""),
          now);
  }
  history::ClientRecord rec = clientRecord(id, clients_.at(id), now);
  rec.first_seen = now;
  emit(UpsertClient{rec});
  if (state_.phase == Phase::kWaiting) tryStartRound(now);
  if (state_.phase == Phase::kRunning) mode_->clientsAvailable(now);
}

void RoundEngine::onHeartbeat(const ClientId& id, double now) {
  ClientState* c = clients_.find(id);
  if (c && c->connected) c->last_seen = now;
}

void RoundEngine::onBye(const ClientId& id, double now) {
  SettleCreditsOnExit settle(this, now);
  const ClientState* c = clients_.find(id);
  if (!c || !c->connected) return;
  loseClient(id, "client said goodbye", now);
}

void RoundEngine::loseClient(const ClientId& id, const std::string& why, double now) {
  auto& c = clients_.at(id);
  c.connected = false;
  clients_.setIdle(id, false);
  if (c.task_token != 0) {
    auto pit = state_.participants.find(c.task_token);
    if (pit != state_.participants.end() && pit->second.state == UpdateState::kPending) {
      pit->second.state = UpdateState::kDropped;
      pit->second.finished_at = now;
      takeBack(pit->second, c.task_token, now);
      finished_tokens_.insert(c.task_token);
      event("client_dropped", id, "round " + std::to_string(state_.round) + ": " + why, now);
      mode_->taskEnded(c.task_token, now);
    }
    c.task_token = 0;
  } else {
    event("client_left", id, why, now);
  }
  mode_->slotFreed(now);
}

std::vector<ClientId> RoundEngine::sampleIdle(size_t k, double now, size_t at_least) {
  const uint32_t round = mode_->selectionRound();
  auto draw = [&](bool skip_quarantined) {
    auto ok = [&](const ClientId& id) {
      return (!eligible_ || eligible_(id, now)) && (!blocksOn() || inCurrentBlock(id)) &&
             !(skip_quarantined && quarantine_.holds(id, round));
    };
    if (selector_) {
      std::vector<ClientId> candidates;
      clients_.forEachIdle([&](const ClientId& id) {
        if (ok(id)) candidates.push_back(id);
      });
      return selector_->select(candidates, k, round, now, rng_);
    }
    return clients_.sample(k, ok, rng_);
  };
  // Nobody in quarantine (every run without a flagged update): the one draw as ever.
  if (!quarantine_.anyHeld(round)) return draw(false);
  std::vector<ClientId> drawn = draw(true);
  if (drawn.size() >= std::min(k, at_least)) return drawn;
  return draw(false);
}

void RoundEngine::tryStartRound(double now) {
  if (state_.phase != Phase::kWaiting) return;
  if (blocks_) blocks_->noteWaiting(now);
  if (commits_.evaluationsBehind()) return;  // onEvaluated tries again (protocol step 9)
  if (clients_.idleCount() >= options_.min_clients) startRound(now);
}

void RoundEngine::startRound(double now) { mode_->startRound(now); }

void RoundEngine::dispatch(const ClientId& id, uint32_t partition, double deadline_s, double now) {
  auto& c = clients_.at(id);
  Participant p;
  p.client = id;
  p.partition = partition;
  p.bytes_down = model_bytes_->size();
  p.start_version = state_.version;
  p.sent_at = now;
  p.deadline = now + deadline_s;

  wire::Task task;
  task.run_id = static_cast<uint64_t>(options_.run_id);
  task.round = state_.round;
  task.model_version = state_.version;
  task.model_name = options_.model_name;
  // task.model_bytes stays empty: SendTask shares one buffer per model (model_bytes_, or the
  // chain of a multichain round) with every task.
  std::shared_ptr<const std::string> bytes = model_bytes_;
  task.model_sha256 = model_sha_;
  if (blocks_ && blocks_->roundChain() >= 0) {  // multichain: this round trains a chain
    bytes = blocks_->chainBytes();
    task.model_sha256 = blocks_->chainSha();
  }
  task.hparams = options_.hparams;
  task.hparams.seed = taskSeed(options_.seed, state_.round, p.partition);
  aggregator_->configureTask(id, task.hparams);
  task.data = options_.data;
  task.data.num_partitions = options_.num_partitions;
  task.data.index = p.partition;
  task.deadline_s = deadline_s;
  const bool slow_link = slow_link_codec_spec_ && c.uplink_bytes_per_s > 0 &&
                         c.uplink_bytes_per_s * 8 / 1e6 < options_.slow_link_mbps;
  // The codec of this round: topk's sparsity warm-up asks for denser updates in the first
  // rounds (compress::codecForRound).
  p.asked = compress::codecForRound(slow_link ? *slow_link_codec_spec_ : codec_spec_, state_.round);
  task.codec = compress::toString(p.asked);
  work_.size(task.hparams, ClientSpeed{c.steps_per_s, c.overhead_s, dataSizeOf(c)}, deadline_s);
  aggregator_->prepareTask(task);
  // The steps this task can run at most (step 5a); with the partition's size unknown, the
  // first chunk's (bounded) sample claim stands in for it.
  if (p.partition < options_.partition_sizes.size()) {
    const auto& hp = task.hparams;
    p.max_steps =
        plannedSteps(hp.epochs, hp.max_steps, hp.batch_size, options_.partition_sizes[p.partition]);
  }
  p.planned = task.hparams;
  if (fedEvalDue()) {
    task.fed_eval = true;
    p.fed_eval = true;
    ++fed_eval_asked_;
  }
  task.task_token = newToken();
  task.chunk_bytes = options_.chunk_bytes;
  if (options_.dp.local) {
    task.local_dp = {options_.dp.clip_norm, options_.dp.noise_multiplier, options_.dp.delta};
  }
  mode_->prepareTask(task);
  std::shared_ptr<const std::string> served;
  if (blocksOn()) served = serve(p, task);

  c.task_token = task.task_token;
  c.sent_task = true;
  clients_.setIdle(id, false);
  state_.participants.emplace(task.task_token, std::move(p));
  emit(SendTask{id, std::move(task), std::move(bytes), std::move(served)});
}

RoundEngine::Participant* RoundEngine::participantFor(const ClientId& id, uint64_t token,
                                                      double now) {
  auto it = state_.participants.find(token);
  ClientState* known = clients_.find(id);
  if (it != state_.participants.end() && it->second.client == id &&
      it->second.state == UpdateState::kPending) {
    if (known) known->sent_frames = true;
    return &it->second;
  }
  // Unknown, finished, or someone else's token: answer once per token and record it.
  const bool stale = finished_tokens_.count(token) > 0 || it != state_.participants.end();
  bool first = false;
  if (stale) {
    first = answered_stale_.insert(token);
  } else {
    first = answered_unknown_.count(token) == 0;
    if (first && answered_unknown_.size() < kUnknownTokensKept) answered_unknown_.insert(token);
  }
  // A client this engine has sent no task yet can only hold a token of an earlier session of
  // the run (the coordinator restarted while its upload was on its way, and it said Hello
  // again first) or invent one; so can one whose Hello names an earlier coordinator process
  // and that has sent nothing of this engine's tasks yet (the rest of that upload may come
  // after its new task went out). Expected after every restart: answered, not recorded.
  bool earlier_session = false;
  if (!stale && known) {
    const ClientState& c = *known;
    const uint64_t before = c.hello.last_coordinator_session;
    earlier_session =
        !c.sent_task || (before != 0 && before != options_.coordinator_session && !c.sent_frames);
  }
  if (first) {
    std::string what = stale             ? "update for a finished or cancelled task"
                       : earlier_session ? "unknown task token (this coordinator has sent you none)"
                                         : "unknown task token";
    wire::Error err{wire::ErrorCode::kStaleTask, what, token};
    emit(SendError{id, err});
    if (earlier_session) return nullptr;
    event(
        stale ? "stale_update" : "unknown_token", id,
        what + " (token " + std::to_string(token) + ", round " + std::to_string(state_.round) + ")",
        now);
  }
  return nullptr;
}

void RoundEngine::onClientError(const ClientId& id, const wire::Error& error, double now) {
  SettleCreditsOnExit settle(this, now);
  onHeartbeat(id, now);
  event("client_error", id, error.message, now);
  // It may have refused the task before taking its served model: send it again next time.
  served_sha_.erase(id);
  auto it = state_.participants.find(error.task_token);
  if (it != state_.participants.end() && it->second.client == id &&
      it->second.state == UpdateState::kPending) {
    rejectUpdate(it->second, error.task_token, "client reported: " + error.message, now);
  }
}

void RoundEngine::onTick(double now) {
  SettleCreditsOnExit settle(this, now);
  if (state_.phase == Phase::kFinished) return;
  // Liveness: a connected client silent for liveness_s is gone.
  std::vector<ClientId> lost;
  if (options_.liveness_s > 0) {
    clients_.forEach([&](const ClientId& id, const ClientState& c) {
      if (c.connected && now >= c.last_seen + options_.liveness_s) lost.push_back(id);
    });
  }
  for (const auto& id : lost) {
    if (state_.phase == Phase::kFinished) return;
    loseClient(id, "silent for more than " + formatDuration(options_.liveness_s), now);
  }
  if (state_.phase == Phase::kRunning) mode_->onTick(now);  // deadlines
  // A stalled upload must not hold a credit others wait for.
  const auto last = [this](uint64_t token) { return lastUploadActivity(token); };
  for (uint64_t token : credits_.idleUploads(now, last)) {
    const std::optional<double> at = lastUploadActivity(token);
    if (!at) continue;
    rejectUpdate(state_.participants.at(token), token,
                 "upload sent nothing for " + formatDuration(now - *at) +
                     " holding an upload credit (coordinator.upload_idle_s = " +
                     formatDuration(credits_.idleSeconds()) + ")",
                 now);
    mode_->finishIfDone(now);
  }
  if (state_.phase == Phase::kWaiting) {
    tryStartRound(now);
    if (state_.phase == Phase::kWaiting && !commits_.evaluationsBehind() &&
        now >= state_.wait_since + options_.wait_clients_s) {  // exactly when nextWakeup() says
      const size_t available = availableIdle(now);
      const std::string away = available < clients_.idleCount()
                                   ? " (" + std::to_string(clients_.idleCount() - available) +
                                         " more connected but not available now)"
                                   : "";
      finishRun(false,
                "only " + std::to_string(available) + " of " +
                    std::to_string(options_.min_clients) + " clients available after " +
                    formatDuration(options_.wait_clients_s) + away +
                    " (coordinator.wait_clients_s); start more clients, or lower "
                    "coordinator.min_clients",
                now);
    }
  }
}

std::optional<double> RoundEngine::nextWakeup() const {
  std::optional<double> t;
  auto consider = [&t](double v) { t = t ? std::min(*t, v) : v; };
  if (options_.liveness_s > 0) {
    clients_.forEach([&](const ClientId&, const ClientState& c) {
      if (c.connected) consider(c.last_seen + options_.liveness_s);
    });
  }
  if (state_.phase == Phase::kRunning) {
    if (auto deadline = mode_->nextDeadline()) consider(*deadline);
  }
  if (state_.phase == Phase::kWaiting) consider(state_.wait_since + options_.wait_clients_s);
  if (auto idle =
          credits_.nextIdleCheck([this](uint64_t token) { return lastUploadActivity(token); })) {
    consider(*idle);
  }
  if (state_.phase == Phase::kWaiting && blocks_) {
    // A clock schedule may bring the next block's clients: look again at the boundary.
    if (auto wakeup = blocks_->wakeup()) consider(*wakeup);
  }
  return t;
}

void RoundEngine::expire(Participant& p, uint64_t token, const std::string& why, double now) {
  ClientState* c = clients_.find(p.client);
  const bool alive = c && c->connected;
  p.state = alive ? UpdateState::kLate : UpdateState::kDropped;
  p.finished_at = now;
  if (alive) {
    emit(SendCancel{p.client, wire::Cancel{token, why}});
    c->task_token = 0;
    refreshIdle(p.client, *c);
  }
  takeBack(p, token, now);
  finished_tokens_.insert(token);
  // Censored: it took at least until now (engine/deadline_policy.h).
  if (alive) deadline_->observe(now - p.sent_at);
}

}  // namespace fedfleet::engine
