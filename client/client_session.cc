#include "client/client_session.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "client/masked_upload.h"
#include "common/crypto/hkdf.h"
#include "common/crypto/keyed_stream.h"
#include "common/crypto/sha256.h"
#include "common/privacy/rdp_accountant.h"
#include "common/secagg/quantizer.h"

namespace fedfleet::client {

ReceivedTask receivedTask(wire::Task task) {
  ReceivedTask r;
  r.model_bytes = std::make_shared<const std::string>(std::move(task.model_bytes));
  if (task.served.source == wire::ServedSource::kAttached) {
    r.served_bytes = std::make_shared<const std::string>(std::move(task.served.bytes));
  }
  if (task.hparams.scaffold) {
    r.control_bytes = std::make_shared<const std::string>(std::move(task.control_bytes));
  }
  task.model_bytes.clear();
  task.control_bytes.clear();
  task.served.bytes.clear();
  r.task = std::move(task);
  return r;
}

std::vector<float> floatsOf(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

ClientSession::ClientSession(ClientSessionOptions options)
    : options_(std::move(options)), served_(options_.served_model_path) {}

std::vector<ClientAction> ClientSession::takeActions() {
  std::vector<ClientAction> out;
  out.swap(actions_);
  return out;
}

void ClientSession::refuse(const wire::Task& task, std::string why) {
  emit(SendError{wire::Error{wire::ErrorCode::kRejected, std::move(why), task.task_token}});
}

std::string ClientSession::localDpShortfall(const wire::Task& task) const {
  const double min_noise = options_.local_dp_min_noise;
  if (!(min_noise > 0)) return {};
  const wire::LocalDpTask& dp = task.local_dp;
  const std::string key = fmt::format("client.local_dp_min_noise = {:g}", min_noise);
  if (!dp.on()) {
    return key + " needs local DP (dp.mode = \"local\"); this task has none";
  }
  // The noise is z C on an update clipped to C, so z alone says how private a release is; a
  // clip that is not finite would clip nothing.
  if (!std::isfinite(dp.clip)) return key + ": this task's local DP clip is not finite";
  if (!(dp.noise_multiplier >= min_noise)) {
    return fmt::format("{}: this task's local DP noise multiplier {:g} is below it", key,
                       dp.noise_multiplier);
  }
  return {};
}

Result<std::shared_ptr<const compress::Codec>> ClientSession::codecFor(const std::string& text) {
  auto it = codecs_.find(text);
  if (it != codecs_.end()) return it->second;
  FEDFLEET_ASSIGN_OR_RETURN(compress::CodecSpec spec, compress::parseCodecSpec(text));
  FEDFLEET_ASSIGN_OR_RETURN(std::unique_ptr<compress::Codec> codec, compress::makeCodec(spec));
  std::shared_ptr<const compress::Codec> shared = std::move(codec);
  codecs_.emplace(text, shared);
  return shared;
}

ControlVariate& ClientSession::controlVariateFor(size_t n) {
  if (!control_) {
    control_ = options_.load_control ? options_.load_control(n)
                                     : ControlVariate(n, options_.control_storage);
    if (control_->size() != n) control_ = ControlVariate(n, options_.control_storage);
  } else if (control_->size() != n) {
    spdlog::log(options_.progress_level,
                "client {}: SCAFFOLD control variate reset to zero ({} -> {} values)",
                options_.client_id, control_->size(), n);
    control_->reset(n);
  }
  return *control_;
}

void ClientSession::onTask(ReceivedTask received, double now) {
  wire::Task& task = received.task;
  if (task.coordinator_session != 0) {
    if (coordinator_session_ != 0 && task.coordinator_session != coordinator_session_) {
      // The coordinator restarted: nothing of the old session will be taken any more.
      spdlog::log(
          options_.progress_level,
          "client {}: the coordinator restarted (new session); dropping the old session's work",
          options_.client_id);
      abandonAll("the coordinator restarted");
    }
    coordinator_session_ = task.coordinator_session;
  }
  if ((training_ && training_->token == task.task_token) || holdsUpload(task.task_token)) {
    // The coordinator sends a task again when this client's connection was replaced before its
    // upload started (it may have gone to the closed connection): the one held goes on.
    spdlog::log(options_.progress_level, "client {}: round {} task again (already held)",
                options_.client_id, task.round);
    return;
  }
  if (training_) abandonTraining("a new task arrived");
  const std::string& model = received.model_bytes ? *received.model_bytes : std::string();
  if (model.size() % sizeof(float) != 0 || crypto::sha256(model) != task.model_sha256) {
    return refuse(task, "model bytes do not match their SHA-256");
  }
  auto codec = codecFor(task.codec);
  if (!codec.isOk()) return refuse(task, "codec: " + codec.status().message());
  const size_t control_size = received.control_bytes ? received.control_bytes->size() : 0;
  if (task.hparams.scaffold && control_size != model.size()) {
    return refuse(task, "SCAFFOLD task with " + std::to_string(control_size) +
                            " bytes of control variate for " + std::to_string(model.size()) +
                            " bytes of model");
  }
  if (std::string why = localDpShortfall(task); !why.empty()) return refuse(task, std::move(why));
  spdlog::log(options_.progress_level, "client {}: round {} task, partition {}, codec {}{}",
              options_.client_id, task.round, task.data.index, compress::toString((*codec)->spec()),
              uploads_.empty() ? "" : " (an upload is still draining)");
  auto request = std::make_shared<TrainingRequest>();
  if (!takeServed(received, request.get())) return;
  if (task.hparams.scaffold) {
    request->control_c = std::move(received.control_bytes);
    request->control_ck = controlVariateFor(model.size() / sizeof(float)).values();
  }
  if (task.secagg.on() && !startSecAgg(task, model.size() / sizeof(float))) return;
  Training t;
  t.token = task.task_token;
  t.round = task.round;
  t.received_at = now;
  t.deadline_s = task.deadline_s;
  t.stop_after_s = task.hparams.stop_after_s;
  t.serves = task.served.source != wire::ServedSource::kNone;
  t.evaluating = request->served_sha;
  t.local_dp = task.local_dp;
  training_ = t;
  request->task = std::move(task);
  request->model_bytes = std::move(received.model_bytes);
  request->codec = std::move(codec).value();
  emit(StartTraining{std::move(request)});
}

bool ClientSession::takeServed(const ReceivedTask& received, TrainingRequest* request) {
  const wire::Task& task = received.task;
  const wire::ServedModel& s = task.served;
  if (s.source == wire::ServedSource::kNone) return true;
  auto changed = served_.take(task, received.model_bytes, received.served_bytes);
  if (!changed.isOk()) {
    refuse(task, changed.status().message());
    return false;
  }
  if (*changed) {
    spdlog::log(options_.progress_level, "client {}: serving block {} model {} (version {}, {})",
                options_.client_id, s.block, s.model, s.version,
                crypto::toHex(s.sha256).substr(0, 12));
    emit(PublishServedModel{});
  } else if (!served_.holds(s.sha256)) {
    // Its summary says what it holds; the coordinator sends the model with the next task.
    spdlog::warn("client {}: the task names served model {}, which this client does not hold",
                 options_.client_id, crypto::toHex(s.sha256).substr(0, 12));
  }
  const bool known = served_eval_ && served_eval_->first == served_.sha256();
  const bool brought =
      s.source == wire::ServedSource::kTaskModel || s.source == wire::ServedSource::kAttached;
  const bool evaluate = !served_.empty() && !known &&
                        (options_.served_evaluation ==
                             ClientSessionOptions::ServedEvaluationPolicy::kUntilEvaluated ||
                         brought);
  if (evaluate) {
    request->served_to_evaluate = served_.sharedBytes();
    request->served_sha = served_.sha256();
  }
  return true;
}

void ClientSession::fillServed(wire::Summary* s) const {
  if (served_.empty()) return;
  s->served_sha256 = served_.sha256();
  if (served_eval_ && served_eval_->first == served_.sha256()) {
    s->served_samples = served_eval_->second.n;
    s->served_loss = served_eval_->second.loss;
    s->served_accuracy = served_eval_->second.accuracy.value_or(0);  // block-cyclic: classes
  }
}

void ClientSession::abandonTraining(const std::string& why) {
  if (!training_) return;
  secagg_.erase(training_->token);
  emit(AbandonTraining{training_->token, training_->round, why});
  training_.reset();
}

void ClientSession::onTrainingDone(uint64_t token, TrainingOutcome outcome, double now) {
  (void)now;
  if (!training_ || training_->token != token) return;
  const Training t = *training_;
  training_.reset();
  if (outcome.served_evaluation) {
    if (outcome.served_evaluation->isOk()) {
      served_eval_.emplace(t.evaluating, outcome.served_evaluation->value());
    } else {
      spdlog::warn("client {}: served model not evaluated: {}", options_.client_id,
                   outcome.served_evaluation->status().toString());
    }
  }
  if (outcome.fed_evaluation && !outcome.fed_evaluation->isOk()) {
    spdlog::warn("client {}: round {}: federated evaluation not reported: {}", options_.client_id,
                 t.round, outcome.fed_evaluation->status().toString());
    outcome.fed_evaluation.reset();
  }
  if (!outcome.status.isOk()) {
    spdlog::error("client {}: training failed: {}", options_.client_id, outcome.status.toString());
    emit(SendError{wire::Error{wire::ErrorCode::kInternal, outcome.status.message(), token}});
    return;
  }
  // Cancelled or past the deadline: nothing is uploaded. Stopped by stop_after_s: the work done
  // is, unless there is none.
  if (outcome.stopped_early && !t.partial) return;
  if (outcome.steps == 0) {
    spdlog::warn("client {}: round {} stopped after {:.3f} s before its first step",
                 options_.client_id, t.round, t.stop_after_s);
    emit(SendError{wire::Error{wire::ErrorCode::kInternal,
                               "stop_after_s passed before the first local step", token}});
    return;
  }
  Upload u;
  static_cast<TaskInHand&>(u) = t;
  u.outcome = std::move(outcome);
  uploads_.push_back(std::move(u));
  startUpload();
}

void ClientSession::startUpload() {
  if (uploads_.empty() || uploads_.front().asked) return;
  Upload& u = uploads_.front();
  auto sa = secagg_.find(u.token);
  // Secure aggregation: it cannot mask before its neighbours' shares arrive.
  if (sa != secagg_.end() && !sa->second.ready) return;
  u.asked = true;
  emit(uploadRequestFor(u));
}

SendUploadRequest ClientSession::uploadRequestFor(const Upload& u) const {
  SendUploadRequest ask;
  ask.request.task_token = u.token;
  auto sa = secagg_.find(u.token);
  if (sa != secagg_.end()) {
    ask.masker = sa->second.client;
    ask.secagg = sa->second.task;
    ask.secagg_weight = secAggWeight(sa->second.task, u.outcome.partition_size, u.outcome.steps);
  }
  return ask;
}

bool ClientSession::startSecAgg(const wire::Task& task, size_t n_values) {
  const wire::SecAggTask& t = task.secagg;
  secagg::RoundParams p;
  p.round = task.round;
  p.clients = t.clients;
  p.neighbours = t.neighbours;
  p.threshold = t.threshold;
  p.length = n_values;
  p.graph_seed = t.graph_seed;
  Status st = secagg::validateRoundParams(p);
  if (st.isOk() && t.index >= t.clients) st = invalidArgument("index outside the cohort");
  if (st.isOk()) st = secagg::validateQuantizer({t.clip_range, t.quant_range}, t.clients);
  if (st.isOk() && !(t.weight_scale > 0)) st = invalidArgument("weight scale must be positive");
  if (!st.isOk()) {
    refuse(task, "secure aggregation: " + st.message());
    return false;
  }
  // Rounds long past (their unmasking never came) are forgotten.
  for (auto it = secagg_.begin(); it != secagg_.end();) {
    it = it->second.round + 2 <= task.round ? secagg_.erase(it) : std::next(it);
  }
  // Distributed DP's noise needs a key of its own: the coordinator rebuilds every survivor's
  // self-mask seed at unmasking, so noise drawn from anything secret-shared could be regenerated
  // and subtracted, leaving it the noise-free sum.
  std::string key, noise_key;
  if (options_.secagg_key) {
    key = options_.secagg_key(task.task_token);
    noise_key = crypto::hkdfSha256(key, "", "fedfleet distributed dp noise key v1",
                                   crypto::kStreamKeyBytes);
  } else {
    key = crypto::randomStreamKey();
    noise_key = crypto::randomStreamKey();
  }
  SecAggRound r;
  r.client =
      std::make_shared<secagg::SecAggClient>(p, t.index, std::move(key), std::move(noise_key));
  r.task = t;
  r.round = task.round;
  wire::SecAgg advert;
  advert.task_token = task.task_token;
  advert.step = wire::SecAggStep::kAdvert;
  advert.adverts.push_back(r.client->advertise());
  secagg_[task.task_token] = std::move(r);
  emit(SendSecAgg{std::move(advert)});
  return true;
}

void ClientSession::onSecAgg(const wire::SecAgg& m, double now) {
  (void)now;
  auto it = secagg_.find(m.task_token);
  if (it == secagg_.end()) return;  // abandoned, or never ours
  SecAggRound& r = it->second;
  auto leave = [&](const Status& st) {
    spdlog::warn("client {}: round {}: leaving secure aggregation: {}", options_.client_id, r.round,
                 st.toString());
    secagg_.erase(it);
  };
  wire::SecAgg reply;
  reply.task_token = m.task_token;
  switch (m.step) {
    case wire::SecAggStep::kKeys: {
      auto shares = r.client->shareKeys(m.adverts);
      if (!shares.isOk()) return leave(shares.status());
      reply.step = wire::SecAggStep::kShares;
      reply.shares = std::move(shares).value();
      spdlog::log(options_.progress_level,
                  "client {}: round {}: secure aggregation: shares sealed for {} neighbours",
                  options_.client_id, r.round, reply.shares.size());
      emit(SendSecAgg{std::move(reply)});
      return;
    }
    case wire::SecAggStep::kForwarded: {
      Status st = r.client->receiveShares(m.shares);
      if (!st.isOk()) return leave(st);
      r.ready = true;
      spdlog::log(options_.progress_level,
                  "client {}: round {}: secure aggregation: {} neighbours' shares received",
                  options_.client_id, r.round, m.shares.size());
      startUpload();
      return;
    }
    case wire::SecAggStep::kUnmask: {
      auto revealed = r.client->unmask(m.request);
      if (!revealed.isOk()) return leave(revealed.status());
      reply.step = wire::SecAggStep::kReveal;
      reply.revealed = std::move(revealed).value();
      spdlog::log(options_.progress_level,
                  "client {}: round {}: secure aggregation: {} shares revealed", options_.client_id,
                  r.round, reply.revealed.size());
      secagg_.erase(it);
      emit(SendSecAgg{std::move(reply)});
      return;
    }
    default:
      return;  // a client's own steps: not for it to receive
  }
}

void ClientSession::onUploadGrant(uint64_t token, double now) {
  // Only an upload that asked (the front one) can be granted; a grant for an upload abandoned
  // meanwhile finds none, and the coordinator takes the credit back when the task ends there.
  if (uploads_.empty()) return;
  Upload& u = uploads_.front();
  if (u.token != token || !u.asked || u.granted) return;
  u.granted = true;
  u.granted_at = now;
  pumpChunks();
}

void ClientSession::onChunkEncoded(uint64_t token, EncodedChunk c) {
  if (uploads_.empty() || uploads_.front().token != token || !uploads_.front().asked) return;
  Upload& u = uploads_.front();
  wire::Chunk m;
  m.task_token = token;
  m.offset = c.range.offset;
  m.elements = c.range.elements;
  m.payload = std::move(c.payload);
  m.last = c.last;
  m.n_samples = u.outcome.partition_size;  // FedAvg weighs by the data held, not samples seen
  m.steps = u.outcome.steps;
  u.ready.push_back(std::move(m));
  pumpChunks();
}

void ClientSession::pumpChunks() {
  if (uploads_.empty()) return;
  Upload& u = uploads_.front();
  if (!u.granted || u.chunk_out || u.ready.empty()) return;
  u.chunk_out = true;
  u.last_out = u.ready.front().last;
  if (u.local_dp.on() && !u.released) {
    // Its first chunk leaves: one more release of this client's data (client/local_dp.h).
    u.released = true;
    ++local_dp_releases_;
    auto spent =
        privacy::epsilonOf(1.0, u.local_dp.noise_multiplier, local_dp_releases_, u.local_dp.delta);
    if (spent.isOk()) {
      spdlog::log(options_.progress_level,
                  "client {}: local DP: {} updates released, epsilon {:.3f} at delta {:g}",
                  options_.client_id, local_dp_releases_, spent->epsilon, u.local_dp.delta);
    }
  }
  emit(SendChunk{std::move(u.ready.front())});
  u.ready.pop_front();
}

void ClientSession::onChunkSent(uint64_t token, double now) {
  if (uploads_.empty() || uploads_.front().token != token || !uploads_.front().chunk_out) return;
  Upload& u = uploads_.front();
  u.chunk_out = false;
  ++u.chunks_sent;
  if (!u.last_out) return pumpChunks();
  wire::Summary s;
  s.task_token = token;
  s.n_samples = u.outcome.partition_size;
  s.steps = u.outcome.steps;
  s.mean_loss = u.outcome.mean_loss;
  s.sum_sq_loss = u.outcome.sum_sq_loss;
  s.compute_seconds = u.outcome.compute_seconds;
  s.upload_seconds = now - u.granted_at;  // the uplink's time, not the wait for a credit
  if (u.serves) fillServed(&s);
  if (u.outcome.fed_evaluation && u.outcome.fed_evaluation->value().n > 0) {
    const ServedEvaluation& e = u.outcome.fed_evaluation->value();
    s.eval_samples = e.n;
    s.eval_loss = e.loss;
    s.eval_accuracy = e.accuracy.value_or(0);
    s.eval_has_accuracy = e.accuracy.has_value();
    s.eval_metrics = e.metrics;
  }
  if (!u.outcome.control_delta.empty()) {
    delivering_[token] = std::move(u.outcome.control_delta);
  }
  uploads_.pop_front();
  emit(SendSummary{s});
  startUpload();
}

void ClientSession::onSummaryDelivered(uint64_t token) {
  auto it = delivering_.find(token);
  if (it == delivering_.end()) return;
  std::vector<float> delta = std::move(it->second);
  delivering_.erase(it);
  if (!control_ || control_->size() != delta.size()) {
    // A later task of another model size reset c_k meanwhile: this Dc_k belongs to no c_k now.
    spdlog::warn("client {}: SCAFFOLD control delta of {} values dropped (c_k has {})",
                 options_.client_id, delta.size(), control_ ? control_->size() : 0);
    return;
  }
  control_->apply(delta);
  emit(ControlVariateCommitted{});
}

bool ClientSession::abandonUpload(uint64_t token, const std::string& why) {
  for (auto it = uploads_.begin(); it != uploads_.end(); ++it) {
    if (it->token != token) continue;
    const bool front = it == uploads_.begin();
    secagg_.erase(token);
    emit(AbandonUpload{token, it->round, why, it->asked, it->chunks_sent});
    uploads_.erase(it);
    if (front) startUpload();
    return true;
  }
  return false;
}

void ClientSession::onEncodingFailed(uint64_t token, const Status& status) {
  if (!holdsUpload(token)) return;
  emit(SendError{wire::Error{wire::ErrorCode::kInternal, status.message(), token}});
  abandonUpload(token, "encoding failed");
}

void ClientSession::onSendFailed(uint64_t token) {
  abandonUpload(token, "a chunk could not be sent");
}

void ClientSession::onCancel(const wire::Cancel& cancel, double now) {
  (void)now;
  if (training_ && training_->token == cancel.task_token) {
    abandonTraining("cancelled: " + cancel.reason);
  }
  abandonUpload(cancel.task_token, "cancelled: " + cancel.reason);
  delivering_.erase(cancel.task_token);
}

void ClientSession::onCoordinatorError(const wire::Error& error, double now) {
  (void)now;
  if (error.code == wire::ErrorCode::kUnknownClient) return;  // the driver says Hello
  if (training_ && training_->token == error.task_token) abandonTraining(error.message);
  abandonUpload(error.task_token, error.message);
  delivering_.erase(error.task_token);
}

void ClientSession::onTimePassed(double now) {
  if (training_ && now - training_->received_at > training_->deadline_s) {
    abandonTraining("deadline passed");
  }
  if (training_ && !training_->partial && training_->stop_after_s > 0 &&
      now - training_->received_at >= training_->stop_after_s) {
    training_->partial = true;  // training ends after its current step; its work is uploaded
    emit(StopTraining{training_->token});
  }
  std::vector<uint64_t> late;
  for (const Upload& u : uploads_) {
    if (now - u.received_at > u.deadline_s) late.push_back(u.token);
  }
  for (uint64_t token : late) abandonUpload(token, "deadline passed");
}

std::optional<double> ClientSession::nextWakeup() const {
  std::optional<double> t;
  auto consider = [&t](double v) { t = t ? std::min(*t, v) : v; };
  if (training_) {
    consider(training_->received_at + training_->deadline_s);
    if (!training_->partial && training_->stop_after_s > 0) {
      consider(training_->received_at + training_->stop_after_s);
    }
  }
  for (const Upload& u : uploads_) consider(u.received_at + u.deadline_s);
  return t;
}

void ClientSession::onReconnected(double now) {
  (void)now;
  if (uploads_.empty() || !uploads_.front().asked || uploads_.front().granted) return;
  emit(uploadRequestFor(uploads_.front()));
}

void ClientSession::abandonAll(const std::string& why) {
  abandonTraining(why);
  while (!uploads_.empty()) abandonUpload(uploads_.front().token, why);
  delivering_.clear();
}

std::optional<uint64_t> ClientSession::trainingToken() const {
  if (!training_) return std::nullopt;
  return training_->token;
}

std::optional<uint64_t> ClientSession::activeUpload() const {
  if (uploads_.empty() || !uploads_.front().asked) return std::nullopt;
  return uploads_.front().token;
}

bool ClientSession::activeUploadGranted() const {
  return !uploads_.empty() && uploads_.front().asked && uploads_.front().granted;
}

bool ClientSession::wantsChunk(uint64_t token) const {
  if (uploads_.empty()) return false;
  const Upload& u = uploads_.front();
  return u.token == token && u.granted && !u.chunk_out && u.ready.empty();
}

bool ClientSession::holdsUpload(uint64_t token) const {
  return std::any_of(uploads_.begin(), uploads_.end(),
                     [token](const Upload& u) { return u.token == token; });
}

}  // namespace fedfleet::client
