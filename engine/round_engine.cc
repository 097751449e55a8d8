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

RoundEngine::RoundEngine(EngineOptions options, std::vector<float> initial_params)
    : options_(std::move(options)),
      params_(std::move(initial_params)),
      rng_(options_.seed),
      version_(options_.model_version),
      aggregator_(Aggregator::create(options_, params_.size())),
      assembler_(options_, *aggregator_, params_.size()),
      credits_(options_.max_concurrent_uploads, options_.upload_idle_s),
      work_(options_) {
  FEDFLEET_CHECK(options_.clients_per_round > 0);
  FEDFLEET_CHECK(options_.quorum <= options_.clients_per_round);
  round_ = options_.first_round - 1;
  refreshModelBytes();
  if (options_.selector.kind != SelectorKind::kUniform) {
    auto sel = Selector::create(options_.selector);
    FEDFLEET_CHECK(sel.isOk());  // checkEngineOptions() at start-up says why
    selector_ = std::move(*sel);
  }
  auto opt = ServerOptimizer::create(serverOptimizerOptions(options_));
  FEDFLEET_CHECK(opt.isOk());
  optimizer_ = std::move(*opt);
  deadline_ = DeadlinePolicy::create(options_);
  mode_ = RoundMode::create(*this, options_);
  if (options_.blocks.count > 0) {
    FEDFLEET_CHECK(!options_.async && !options_.sample_partitions);  // checkEngineOptions says why
    blocks_ = std::make_unique<BlockCoordinator>(options_.blocks, options_.block_mode);
  }
  configured_rounds_ = options_.rounds;
  if (options_.secagg.enabled) {
    FEDFLEET_CHECK(validateSecAggOptions(options_).isOk());  // checkEngineOptions says why
    secagg_ = std::make_unique<SecureAggregation>(options_, params_.size());
  }
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
  std::vector<std::pair<ClientId, int32_t>> assigned;
  for (const auto& [id, c] : clients_) {
    if (c.partition >= 0 && c.hello.requested_partition != c.partition) {
      assigned.emplace_back(id, c.partition);
    }
  }
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
    if (!clients_.count(id)) partitions_.reserve(id, partition);
  }
  return Status::ok();
}

void RoundEngine::feedback(const Participant& p, double now) {
  if (!selector_) return;
  ParticipationFeedback f;
  f.client = p.client;
  f.round = round_;
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
  for (const auto& [id, c] : clients_) n += c.connected;
  return n;
}

size_t RoundEngine::availableIdle(double now) const {
  if (!eligible_ && !blocksOn()) return idle_.size();
  size_t n = 0;
  for (const ClientId& id : idle_) {
    n += (!eligible_ || eligible_(id, now)) && (!blocksOn() || inCurrentBlock(id));
  }
  return n;
}

RoundEngine::WaitingStatus RoundEngine::waitingStatus(std::optional<double> now) const {
  WaitingStatus w;
  w.waiting = phase_ == Phase::kWaiting;
  w.idle = idle_.size();
  w.available = now ? availableIdle(*now) : idle_.size();
  w.needed = options_.min_clients;
  w.since = wait_since_;
  for (const auto& [id, c] : clients_) {
    if (c.connected) w.connected.push_back(id);
  }
  return w;
}

int32_t RoundEngine::partitionOf(const ClientId& id) const {
  auto it = clients_.find(id);
  return it == clients_.end() ? -1 : it->second.partition;
}

void RoundEngine::refreshModelBytes() {
  auto bytes = std::make_shared<std::string>(params_.size() * sizeof(float), '\0');
  std::memcpy(bytes->data(), params_.data(), bytes->size());
  model_sha_ = crypto::sha256(*bytes);
  model_bytes_ = std::move(bytes);
}

bool RoundEngine::fedEvalDue() {
  const uint32_t every = options_.fed_eval_every;
  if (every == 0 || round_ == 0 || (round_ - 1) % every != 0) return false;
  if (fed_eval_round_ != round_) {
    fed_eval_round_ = round_;
    fed_eval_asked_ = 0;
  }
  return options_.fed_eval_clients == 0 || fed_eval_asked_ < options_.fed_eval_clients;
}

uint64_t RoundEngine::newToken() {
  uint64_t t = crypto::randomToken();
  while (participants_.count(t) || finished_tokens_.count(t)) t = crypto::randomToken();
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
  for (auto& e : event_budget_.closeRound(options_.run_id, round_, now)) {
    emit(RecordEvent{std::move(e)});
  }
}

std::vector<Action> RoundEngine::takeActions() {
  std::vector<Action> out;
  out.swap(actions_);
  return out;
}

void RoundEngine::start(double now) {
  FEDFLEET_CHECK(phase_ == Phase::kIdle);
  if (options_.first_round == 1 && options_.evaluate_initial) commits_.evaluateInitial(now);
  phase_ = Phase::kWaiting;
  wait_since_ = now;
  if (dp_ && options_.rounds < configured_rounds_) {
    event("privacy_budget", "",
          "dp.target_epsilon " + std::to_string(options_.dp.target_epsilon) + " at delta " +
              std::to_string(options_.dp.delta) + " allows " + std::to_string(options_.rounds) +
              " of the configured " + std::to_string(configured_rounds_) +
              " rounds (epsilon after them: " + std::to_string(dp_->epsilonAfter(options_.rounds)) +
              "); the run ends after round " + std::to_string(options_.rounds),
          now);
  }
  if (round_ >= options_.rounds) {
    finishRun(true, "all rounds done", now);
    return;
  }
  tryStartRound(now);
}

RoundEngine::ClientState& RoundEngine::addClient(const ClientId& id, const wire::Hello& hello,
                                                 double now) {
  ClientState state;
  state.hello = hello;
  if (!options_.sample_partitions) {
    state.partition = partitions_.join(id, hello.requested_partition, [this] {
      std::vector<int32_t> held;
      held.reserve(clients_.size());
      for (const auto& [other, known] : clients_) held.push_back(known.partition);
      return held;
    });
  }
  state.connected = true;
  state.last_seen = now;
  auto& c = clients_.emplace(id, std::move(state)).first->second;
  refreshIdle(id, c);
  return c;
}

void RoundEngine::registerClient(const ClientId& id, const wire::Hello& hello, double now) {
  if (clients_.count(id) > 0) return;
  addClient(id, hello, now);
}

void RoundEngine::refreshIdle(const ClientId& id, const ClientState& c) {
  idle_.set(id, c.connected && c.task_token == 0);
}

void RoundEngine::onHello(const ClientId& id, const wire::Hello& hello, double now) {
  SettleCreditsOnExit settle(this, now);
  if (phase_ == Phase::kFinished) {
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
  auto it = clients_.find(id);
  if (it != clients_.end()) {
    if (it->second.connected && it->second.hello.session == hello.session) {
      // The same client process greeting again (for example after an Error it took for a
      // restart of ours): nothing changes, its task in flight stays valid.
      it->second.last_seen = now;
      return;
    }
    if (it->second.task_token != 0) {
      loseClient(id, "restarted while its task was in flight", now);
    }
    it->second.served_sha.reset();  // a new process: it may have lost its served model
    it->second.hello = hello;
    it->second.connected = true;
    it->second.last_seen = now;
    refreshIdle(id, it->second);
    event("client_rejoined", id, "partition " + std::to_string(it->second.partition), now);
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
  if (phase_ == Phase::kWaiting) tryStartRound(now);
  if (phase_ == Phase::kRunning) mode_->clientsAvailable(now);
}

void RoundEngine::onHeartbeat(const ClientId& id, double now) {
  auto it = clients_.find(id);
  if (it != clients_.end() && it->second.connected) it->second.last_seen = now;
}

void RoundEngine::onBye(const ClientId& id, double now) {
  SettleCreditsOnExit settle(this, now);
  auto it = clients_.find(id);
  if (it == clients_.end() || !it->second.connected) return;
  loseClient(id, "client said goodbye", now);
}

void RoundEngine::loseClient(const ClientId& id, const std::string& why, double now) {
  auto& c = clients_.at(id);
  c.connected = false;
  idle_.erase(id);
  if (c.task_token != 0) {
    auto pit = participants_.find(c.task_token);
    if (pit != participants_.end() && pit->second.state == UpdateState::kPending) {
      pit->second.state = UpdateState::kDropped;
      pit->second.finished_at = now;
      takeBack(pit->second, c.task_token, now);
      finished_tokens_.insert(c.task_token);
      event("client_dropped", id, "round " + std::to_string(round_) + ": " + why, now);
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
      for (const ClientId& id : idle_) {
        if (ok(id)) candidates.push_back(id);
      }
      return selector_->select(candidates, k, round, now, rng_);
    }
    return idle_.sample(k, ok, rng_);
  };
  // Nobody in quarantine (every run without a flagged update): the one draw as ever.
  if (!quarantine_.anyHeld(round)) return draw(false);
  std::vector<ClientId> drawn = draw(true);
  if (drawn.size() >= std::min(k, at_least)) return drawn;
  return draw(false);
}

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
  const std::optional<uint32_t> until = quarantine_.flag(client, round_);
  if (!until) return;
  event("client_quarantined", client,
        "round " + std::to_string(round_) + ": the norm bound clipped or rejected its updates in " +
            std::to_string(quarantine_.strikes(client)) +
            " of its rounds in a row; not sampled before round " + std::to_string(*until) +
            " (aggregation.quarantine_after = " + std::to_string(options_.quarantine_after) +
            ", aggregation.quarantine_rounds = " + std::to_string(options_.quarantine_rounds) +
            ")",
        now);
}

void RoundEngine::closeFlagged(uint32_t round) {
  if (round_flagged_.empty()) return;
  std::map<ClientId, uint32_t>& kept = flagged_by_round_[round];
  for (const auto& [client, n] : round_flagged_) kept[client] += n;
  round_flagged_.clear();
}

void RoundEngine::tryStartRound(double now) {
  if (phase_ != Phase::kWaiting) return;
  if (blocks_) blocks_->noteWaiting(now);
  if (commits_.evaluationsBehind()) return;  // onEvaluated tries again (protocol step 9)
  if (idle_.size() >= options_.min_clients) startRound(now);
}

void RoundEngine::startRound(double now) { mode_->startRound(now); }

void RoundEngine::dispatch(const ClientId& id, uint32_t partition, double deadline_s, double now) {
  auto& c = clients_.at(id);
  Participant p;
  p.client = id;
  p.partition = partition;
  p.bytes_down = model_bytes_->size();
  p.start_version = version_;
  p.sent_at = now;
  p.deadline = now + deadline_s;

  wire::Task task;
  task.run_id = static_cast<uint64_t>(options_.run_id);
  task.round = round_;
  task.model_version = version_;
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
  task.hparams.seed = taskSeed(options_.seed, round_, p.partition);
  task.data = options_.data;
  task.data.num_partitions = options_.num_partitions;
  task.data.index = p.partition;
  task.deadline_s = deadline_s;
  task.codec = options_.codec;
  if (!options_.slow_link_codec.empty() && c.uplink_bytes_per_s > 0 &&
      c.uplink_bytes_per_s * 8 / 1e6 < options_.slow_link_mbps) {
    task.codec = options_.slow_link_codec;
  }
  // The codec of this round: topk's sparsity warm-up asks for denser updates in the first
  // rounds (compress::codecForRound).
  if (auto spec = compress::parseCodecSpec(task.codec); spec.isOk()) {
    task.codec = compress::toString(compress::codecForRound(*spec, round_));
  }
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
  if (secagg_ && secagg_->active()) {
    task.secagg = secagg_->taskFor(task.task_token);
    task.codec = "none";
  }
  std::shared_ptr<const std::string> served;
  if (blocksOn()) served = serve(c, p, task);

  c.task_token = task.task_token;
  idle_.erase(id);
  participants_.emplace(task.task_token, std::move(p));
  emit(SendTask{id, std::move(task), std::move(bytes), std::move(served)});
}

RoundEngine::Participant* RoundEngine::participantFor(const ClientId& id, uint64_t token,
                                                      double now) {
  auto it = participants_.find(token);
  if (it != participants_.end() && it->second.client == id &&
      it->second.state == UpdateState::kPending) {
    return &it->second;
  }
  // Unknown, finished, or someone else's token: answer once per token and record it.
  const bool stale = finished_tokens_.count(token) > 0 || it != participants_.end();
  bool first = false;
  if (stale) {
    first = answered_stale_.insert(token);
  } else {
    first = answered_unknown_.count(token) == 0;
    if (first && answered_unknown_.size() < kUnknownTokensKept) answered_unknown_.insert(token);
  }
  if (first) {
    std::string what = stale ? "update for a finished or cancelled task" : "unknown task token";
    wire::Error err{wire::ErrorCode::kStaleTask, what, token};
    emit(SendError{id, err});
    event(stale ? "stale_update" : "unknown_token", id,
          what + " (token " + std::to_string(token) + ", round " + std::to_string(round_) + ")",
          now);
  }
  return nullptr;
}

void RoundEngine::rejectUpdate(Participant& p, uint64_t token, const std::string& why, double now) {
  p.state = UpdateState::kRejected;
  p.finished_at = now;
  takeBack(p, token, now);
  finished_tokens_.insert(token);
  answered_stale_.insert(token);  // the client is told here; later frames stay quiet
  auto cit = clients_.find(p.client);
  if (cit != clients_.end() && cit->second.task_token == token) {
    cit->second.task_token = 0;
    refreshIdle(p.client, cit->second);
  }
  emit(SendError{p.client, wire::Error{wire::ErrorCode::kRejected, why, token}});
  event("update_rejected", p.client, "round " + std::to_string(round_) + ": " + why, now);
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
  if (secagg_ && secagg_->holds(token)) {
    // Masked: checked like any chunk, then only added to the round's masked sum.
    if (!secagg_->keysDone()) {
      return rejectUpdate(*p, token,
                          "secure aggregation: a masked chunk before the key stages "
                          "ended",
                          now);
    }
    if (auto why = assembler_.addMaskedChunk(*p, chunk)) return rejectUpdate(*p, token, *why, now);
    Status st = secagg_->onMaskedChunk(token, chunk.offset, chunk.payload, chunk.elements);
    if (!st.isOk()) return rejectUpdate(*p, token, "secure aggregation: " + st.message(), now);
    return;
  }
  if (auto why = assembler_.addChunk(*p, token, chunk)) return rejectUpdate(*p, token, *why, now);
}

void RoundEngine::onSecAgg(const ClientId& id, const wire::SecAgg& message, uint64_t frame_bytes,
                           double now) {
  SettleCreditsOnExit settle(this, now);
  onHeartbeat(id, now);
  const uint64_t token = message.task_token;
  if (message.step == wire::SecAggStep::kReveal) {
    // After its update completed: the task is finished but still in the round being unmasked.
    auto it = participants_.find(token);
    if (it == participants_.end() || it->second.client != id || !secagg_ || !secagg_->unmasking() ||
        !secagg_->holds(token)) {
      event("secagg_refused", id,
            "revealed shares for a task not being unmasked (token " + std::to_string(token) + ")",
            now);
      return;
    }
    it->second.bytes_up += frame_bytes;
    SecureAggregation::Outgoing out;
    Status st = secagg_->onMessage(token, message, now, out);
    if (!st.isOk()) {
      // Its update is in the sum already: its shares are left out, not the update.
      event("secagg_refused", id, "round " + std::to_string(round_) + ": " + st.message(), now);
      secagg_->markGone(token);
    }
    return;
  }
  Participant* p = participantFor(id, token, now);
  if (!p) return;
  p->bytes_up += frame_bytes;
  if (!secagg_ || !secagg_->holds(token)) {
    return rejectUpdate(*p, token, "secure aggregation message for a task without it", now);
  }
  SecureAggregation::Outgoing out;
  Status st = secagg_->onMessage(token, message, now, out);
  if (!st.isOk()) return rejectUpdate(*p, token, "secure aggregation: " + st.message(), now);
  sendSecAgg(out);
}

void RoundEngine::sendSecAgg(SecureAggregation::Outgoing& out) {
  for (auto& [token, message] : out) {
    auto it = participants_.find(token);
    if (it == participants_.end()) continue;
    emit(SendSecAgg{it->second.client, std::move(message)});
  }
  out.clear();
}

void RoundEngine::secAggStep(double now) {
  if (!secagg_ || !secagg_->active() || phase_ != Phase::kRunning) return;
  for (const auto& [token, p] : participants_) {
    if (!secagg_->holds(token)) continue;
    const bool ended = p.state != UpdateState::kPending && p.state != UpdateState::kCompleted;
    auto c = clients_.find(p.client);
    const bool gone = c == clients_.end() || !c->second.connected;
    if (ended || gone) secagg_->markGone(token);
  }
  SecureAggregation::Outgoing out;
  std::vector<uint64_t> left_out;
  secagg_->onTick(now, out, left_out);
  sendSecAgg(out);
  for (uint64_t token : left_out) {
    auto it = participants_.find(token);
    if (it != participants_.end() && it->second.state == UpdateState::kPending) {
      rejectUpdate(it->second, token,
                   "secure aggregation: its keys or shares were not in by the stage's end "
                   "(secagg.stage_timeout_s), or too few of its neighbours took part",
                   now);
    }
  }
  if (secagg_->unmasking() && secagg_->unmaskingDone(now)) mode_->finishIfDone(now);
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
  if (secagg_ && secagg_->holds(token)) {
    Status st = secagg_->onCompleted(token);
    if (!st.isOk()) return rejectUpdate(*p, token, "secure aggregation: " + st.message(), now);
  }
  p->summary = checked;
  auto& client = clients_.at(id);
  takeServedReport(client, *p, checked, now);
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
  return aggregator_->buffer(full.data(), full.size());
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
  // The pseudo-gradient G, computed in place in the first n values of sum_.
  RoundTotals totals;
  totals.weight = sum_weight_;
  totals.completed = completed;
  totals.registered_clients = clients_.size();
  if (dp_ && !options_.dp.local) {
    // G = (sum of clipped updates + N(0, (z_D C)^2 I)) / K (engine/central_dp.h). Central
    // under secure aggregation: the clients clipped, the unmasked sum gets the noise here.
    // Distributed: the clients' noise is in the sum already.
    if (options_.dp.central) dp_->addNoise(sum_.data(), n, round_);
    totals.weight = dp_->denominator();
  }
  if (!aggregator_->pseudoGradient(sum_.data(), totals, &step_failure_)) return false;
  if (!kernels::allFinite(sum_.data(), n)) {
    step_failure_ = "the aggregate is not finite";
    return false;
  }
  if (!stepModel(sum_.data())) return false;
  aggregator_->stepTaken();
  if (dp_ && !options_.dp.local) dp_->stepTaken(round_);
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
    auto it = participants_.find(token);
    return it != participants_.end() && it->second.state == UpdateState::kPending;
  };
  for (uint64_t token : credits_.settle(pending)) {
    Participant& p = participants_.at(token);
    p.granted_at = now;
    emit(SendGrant{p.client, wire::UploadGrant{token}});
  }
}

std::optional<double> RoundEngine::lastUploadActivity(uint64_t token) const {
  auto it = participants_.find(token);
  if (it == participants_.end() || it->second.state != UpdateState::kPending) return std::nullopt;
  return std::max(it->second.granted_at, it->second.last_chunk_at);
}

void RoundEngine::onClientError(const ClientId& id, const wire::Error& error, double now) {
  SettleCreditsOnExit settle(this, now);
  onHeartbeat(id, now);
  event("client_error", id, error.message, now);
  // It may have refused the task before taking its served model: send it again next time.
  if (auto c = clients_.find(id); c != clients_.end()) c->second.served_sha.reset();
  auto it = participants_.find(error.task_token);
  if (it != participants_.end() && it->second.client == id &&
      it->second.state == UpdateState::kPending) {
    rejectUpdate(it->second, error.task_token, "client reported: " + error.message, now);
  }
}

void RoundEngine::onTick(double now) {
  SettleCreditsOnExit settle(this, now);
  if (phase_ == Phase::kFinished) return;
  // Liveness: a connected client silent for liveness_s is gone.
  std::vector<ClientId> lost;
  if (options_.liveness_s > 0) {
    for (const auto& [id, c] : clients_) {
      if (c.connected && now >= c.last_seen + options_.liveness_s) lost.push_back(id);
    }
  }
  for (const auto& id : lost) {
    if (phase_ == Phase::kFinished) return;
    loseClient(id, "silent for more than " + formatDuration(options_.liveness_s), now);
  }
  if (phase_ == Phase::kRunning) mode_->onTick(now);  // deadlines
  // A stalled upload must not hold a credit others wait for.
  const auto last = [this](uint64_t token) { return lastUploadActivity(token); };
  for (uint64_t token : credits_.idleUploads(now, last)) {
    const std::optional<double> at = lastUploadActivity(token);
    if (!at) continue;
    rejectUpdate(participants_.at(token), token,
                 "upload sent nothing for " + formatDuration(now - *at) +
                     " holding an upload credit (coordinator.upload_idle_s = " +
                     formatDuration(credits_.idleSeconds()) + ")",
                 now);
    mode_->finishIfDone(now);
  }
  if (phase_ == Phase::kWaiting) {
    tryStartRound(now);
    if (phase_ == Phase::kWaiting && !commits_.evaluationsBehind() &&
        now >= wait_since_ + options_.wait_clients_s) {  // exactly when nextWakeup() says
      const size_t available = availableIdle(now);
      const std::string away = available < idle_.size()
                                   ? " (" + std::to_string(idle_.size() - available) +
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
    for (const auto& [id, c] : clients_) {
      if (c.connected) consider(c.last_seen + options_.liveness_s);
    }
  }
  if (phase_ == Phase::kRunning) {
    if (auto deadline = mode_->nextDeadline()) consider(*deadline);
  }
  if (phase_ == Phase::kWaiting) consider(wait_since_ + options_.wait_clients_s);
  if (auto idle =
          credits_.nextIdleCheck([this](uint64_t token) { return lastUploadActivity(token); })) {
    consider(*idle);
  }
  if (phase_ == Phase::kWaiting && blocks_) {
    // A clock schedule may bring the next block's clients: look again at the boundary.
    if (auto wakeup = blocks_->wakeup()) consider(*wakeup);
  }
  return t;
}

void RoundEngine::expire(Participant& p, uint64_t token, const std::string& why, double now) {
  auto cit = clients_.find(p.client);
  const bool alive = cit != clients_.end() && cit->second.connected;
  p.state = alive ? UpdateState::kLate : UpdateState::kDropped;
  p.finished_at = now;
  if (alive) {
    emit(SendCancel{p.client, wire::Cancel{token, why}});
    cit->second.task_token = 0;
    refreshIdle(p.client, cit->second);
  }
  takeBack(p, token, now);
  finished_tokens_.insert(token);
  // Censored: it took at least until now (engine/deadline_policy.h).
  if (alive) deadline_->observe(now - p.sent_at);
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
  history::ClientRecord rec;
  rec.client_id = id;
  rec.public_key = c.hello.public_key;
  rec.device_kind = wire::deviceKindName(c.hello.device_kind);
  rec.device_name = c.hello.device_name;
  rec.cores = c.hello.cores;
  rec.memory_bytes = c.hello.memory_bytes;
  // What it trains on: its partition's size where the coordinator knows it, else its claim.
  rec.data_size = dataSizeOf(c);
  if (c.partition >= 0 && static_cast<size_t>(c.partition) < options_.partition_sizes.size()) {
    rec.data_size = options_.partition_sizes[c.partition];
  }
  rec.first_seen = now;  // the store keeps the first one
  rec.last_seen = now;
  return rec;
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
      failed_in_row_ < options_.max_failed_rounds || phase_ == Phase::kFinished) {
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
                suspectClients(flagged_in_row_) + ". Fix the cause and continue with --resume, or raise "
                "coordinator.max_failed_rounds (0: never stop)",
            now);
}

void RoundEngine::finishRun(bool ok, const std::string& message, double now) {
  phase_ = Phase::kFinished;
  // Whatever one client's budget still owes is written now: nothing counted is lost.
  for (auto& e : event_budget_.closeRun(options_.run_id, round_, now)) {
    emit(RecordEvent{std::move(e)});
  }
  if (options_.bye_on_finish) {
    for (auto& [id, c] : clients_) {
      if (c.connected) emit(SendBye{id, message});
    }
  }
  event(ok ? "run_finished" : "run_failed", "", message, now);
  emit(RunFinished{ok, message});
}

// ---- Blocks (block-cyclic training; protocol steps B1-B6 in round_engine.h) ----

bool RoundEngine::inCurrentBlock(const ClientId& id) const {
  auto it = clients_.find(id);
  return it != clients_.end() && blocks_->available(it->second.partition);
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
  if (commits_.drained() && !blocksPending() && phase_ != Phase::kFinished) {
    finishRun(true, "all rounds done", now);
  }
}

const std::vector<float>& RoundEngine::servedModel(uint32_t block) const {
  if (!blocksOn()) return params_;
  return blocks_->servedModel(block, params_);
}

std::shared_ptr<const std::string> RoundEngine::serve(ClientState& c, Participant& p,
                                                      wire::Task& task) {
  std::shared_ptr<const std::string> attach =
      blocks_->serve(c.served_sha, task, SharedModel{params_, model_bytes_, model_sha_, version_});
  if (attach) {
    p.served_bytes = attach->size();
    p.bytes_down += p.served_bytes;
  }
  p.served = task.served;
  return attach;
}

void RoundEngine::takeServedReport(ClientState& c, Participant& p, const wire::Summary& summary,
                                   double now) {
  std::optional<std::string> mismatch =
      BlockCoordinator::servedMismatch(p.served, summary.served_sha256);
  if (!mismatch) return;
  event("served_mismatch", p.client, *mismatch, now);
  c.served_sha.reset();
  p.summary.served_samples = 0;
}

}  // namespace fedfleet::engine
