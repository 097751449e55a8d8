// The fleet simulator's virtual clients: a task's way to a client (download, compute and
// upload times from its profile, stragglers, drop-outs), the client's session and what it asks
// for, uploads, secure-aggregation messages, grants, cancels and refusals.
#include "engine/client_record.h"
#include "sim/simulator_impl.h"

namespace fedfleet::sim::internal {

client::ClientSession& Simulator::sessionOf(uint64_t k) {
  auto it = sessions_.find(k);
  if (it != sessions_.end()) return it->second;
  client::ClientSessionOptions o;
  o.client_id = idOf(k);
  o.control_storage = residual_storage_;
  o.served_evaluation = client::ClientSessionOptions::ServedEvaluationPolicy::kWhenBytesArrive;
  o.progress_level = spdlog::level::debug;  // one line per virtual client's task: debug only
  // Secure aggregation's secrets from the seed, the round and the client (never the token,
  // which is random): the same seed gives the same history.
  o.secagg_key = [this, k](uint64_t token) {
    auto it = in_flight_.find(token);
    const uint32_t round = it == in_flight_.end() ? 0 : it->second.round;
    return crypto::streamKeyFromSeed("fedfleet sim secagg", mix(config_.run.seed, round, k));
  };
  return sessions_.try_emplace(k, std::move(o)).first->second;
}

void Simulator::dispatch(engine::SendTask& st) {
  const wire::Task& task = st.task;
  const uint64_t k = indexOf(st.client);
  const ClientProfile p = fleet_->profile(k);
  wall_start_.emplace(task.round, unixNow());
  participants_.insert(k);
  if (recorded_clients_.insert(k).second) {
    const wire::Hello h = helloFor(k, p, 1);
    driver_->upsertClient(engine::clientRecordOf(st.client, h, h.data_size, now_));
  }

  InFlight f;
  f.client = k;
  f.id = st.client;
  f.round = task.round;
  f.sent_at = now_;
  const uint64_t down_bytes =
      st.model_bytes->size() + (st.served_bytes ? st.served_bytes->size() : 0);
  f.download_s = p.latency_s + static_cast<double>(down_bytes) / p.down_bytes_per_s;
  wire::HyperParams hp = task.hparams;
  const double samples_per_s = p.speed * ref_samples_per_s_;
  const auto& sc = config_.sim;
  const uint64_t token = task.task_token;
  bool reports = true;
  if (sc.stragglers > 0 && hp.epochs > 1 && hp.max_steps == 0) {
    // A straggler this round: only 1..E-1 epochs (uniform), drawn from (seed, round, client).
    const uint64_t h = mix(config_.run.seed ^ 0x73747267ull, task.round, k);
    if (unitInterval(h) < sc.stragglers) {
      if (sc.straggler_mode == config::StragglerMode::kDrop) {
        reports = false;  // it gets the task but never reports: late at the deadline
      } else {
        hp.epochs = 1 + static_cast<uint32_t>(unitInterval(mix(h, 7, 0)) * (hp.epochs - 1));
      }
    }
  }
  if (reports) {
    f.compute_s = static_cast<double>(plannedSamples(data_->shardSize(k), hp)) / samples_per_s;
    if (hp.stop_after_s > 0 && f.compute_s > hp.stop_after_s) {
      // Partial work: the client is stopped stop_after_s after receipt and sends the steps it
      // finished by then (at least one), as a real client's stop flag would.
      const double steps_fit =
          std::floor(hp.stop_after_s * samples_per_s / std::max<uint32_t>(hp.batch_size, 1));
      hp.max_steps = static_cast<uint32_t>(std::clamp(steps_fit, 1.0, 1e9));
      f.compute_s = static_cast<double>(plannedSamples(data_->shardSize(k), hp)) / samples_per_s;
    }
    if (task.fed_eval) {
      // Federated evaluation first: a forward pass over its held-out samples, a third of a
      // training step's work per sample (forward, backward, update).
      f.compute_s += static_cast<double>(data_->heldOutSize(k)) / (3 * samples_per_s);
    }
    f.done_at = now_ + f.download_s + f.compute_s;
    const double upload_guess =
        p.latency_s + static_cast<double>(num_params_ * sizeof(float)) / p.up_bytes_per_s;

    // Dropping out: the per-round draw, or the end of the client's online window. The task is
    // lost with the client: its session never takes it.
    double drop_at = std::numeric_limits<double>::infinity();
    double fraction = 0;
    if (fleet_->dropsOut(p, k, task.round, &fraction)) {
      drop_at = now_ + f.download_s + fraction * f.compute_s;
      if (task.secagg.on()) {
        // Under secure aggregation the drop falls in one of its stages, each as likely: the key
        // stages (while it trains, as above), its masked upload (after part of it, or before
        // the first chunk when it is one chunk), or the unmasking (after its whole upload).
        const double stage = unitInterval(mix(config_.run.seed ^ 0x5ec466c1ull, task.round, k));
        if (stage >= 1.0 / 3) {
          f.secagg_drop = stage < 2.0 / 3 ? SecAggDrop::kDuringUpload : SecAggDrop::kAtUnmasking;
          drop_at = std::numeric_limits<double>::infinity();
        }
      }
    }
    const double offline_at = fleet_->onlineUntil(p, now_);
    if (offline_at < f.done_at + upload_guess) {
      drop_at = std::min(drop_at, offline_at);
      f.secagg_drop = SecAggDrop::kNone;  // its window closes first
    }
    if (f.secagg_drop == SecAggDrop::kAtUnmasking) unmask_drops_.insert(token);
    if (std::isfinite(drop_at)) {
      push(drop_at, EventKind::kDropOut, token, k);
      if (!task.secagg.on()) {
        in_flight_.emplace(token, std::move(f));
        return;
      }
      // Secure aggregation: it takes part in the key stages until it goes, never reporting.
      f.drop_at = drop_at;
      f.compute_s = std::numeric_limits<double>::infinity();
      f.done_at = f.compute_s;
    }
    f.options = client::trainOptionsFrom(hp);
    f.options.precision = precision_;
  } else {
    f.compute_s = std::numeric_limits<double>::infinity();
    f.done_at = f.compute_s;
  }
  in_flight_.emplace(token, std::move(f));

  // The client receives the task: its session checks it and asks for its training.
  client::ReceivedTask received;
  received.model_bytes = st.model_bytes;
  received.served_bytes = st.served_bytes;
  if (task.hparams.scaffold) {
    if (task.model_version != control_version_ || !control_cache_) {
      control_cache_ = std::make_shared<const std::string>(std::move(st.task.control_bytes));
      control_version_ = task.model_version;
    }
    received.control_bytes = control_cache_;
  }
  received.task = std::move(st.task);
  received.task.control_bytes.clear();
  if (receive_filter_) receive_filter_(k, received);
  sessionOf(k).onTask(std::move(received), now_);
  runSession(k);
}

void Simulator::runSession(uint64_t k) {
  client::ClientSession& session = sessionOf(k);
  std::vector<client::ClientAction> actions;
  while (!(actions = session.takeActions()).empty()) {
    for (auto& a : actions) carryOut(k, a);
  }
}

// A virtual client's actions. Only time is simulated: the upload request and its grant cost
// none (they are small); every chunk frame and then the Summary go over the client's uplink
// one after the other from the grant on, arriving latency + bytes so far / rate later (the
// uplink, or sim.coordinator_ingress_mbps where that is lower).
void Simulator::carryOut(uint64_t k, client::ClientAction& action) {
  std::visit(
      [&](auto& a) {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<T, client::StartTraining>) {
          auto it = in_flight_.find(a.request->task.task_token);
          if (it != in_flight_.end()) submitTraining(it->first, it->second, *a.request);
        } else if constexpr (std::is_same_v<T, client::AbandonTraining>) {
          auto it = in_flight_.find(a.token);
          if (it != in_flight_.end() && it->second.stop) it->second.stop->store(true);
        } else if constexpr (std::is_same_v<T, client::SendSecAgg>) {
          secAggUp(k, std::move(a.message));
        } else if constexpr (std::is_same_v<T, client::SendUploadRequest>) {
          const uint64_t token = a.request.task_token;
          InFlight& f = in_flight_.at(token);
          if (a.masker && f.encoded.empty()) {
            Status masked = maskUpload(f, a);
            if (!masked.isOk()) {
              sessionOf(k).onEncodingFailed(token, masked);
              return;
            }
          }
          for (auto& c : f.encoded) sessionOf(k).onChunkEncoded(token, std::move(c));
          f.encoded.clear();
          engine_->onUploadRequest(f.id, token, now_);
        } else if constexpr (std::is_same_v<T, client::SendChunk>) {
          const uint64_t token = a.chunk.task_token;
          InFlight& f = in_flight_.at(token);
          const ClientProfile p = fleet_->profile(k);
          const uint64_t bytes = wire::encodedSize(a.chunk);
          f.upload_sent += static_cast<double>(bytes);
          const double t = f.upload_base + f.mask_s + p.latency_s + f.upload_sent / uploadRate(p);
          f.frame_bytes.push_back(bytes);
          f.chunks.push_back(std::move(a.chunk));
          if (f.secagg_drop == SecAggDrop::kDuringUpload && f.chunks.size() > f.plan.size() / 2) {
            // It goes with half its masked chunks sent (none of a one-chunk upload).
            f.secagg_drop = SecAggDrop::kNone;
            spdlog::debug(
                "sim: client {} round {}: drops out during its masked upload ({} of {} "
                "chunks sent)",
                f.id, f.round, f.chunks.size() - 1, f.plan.size());
            push(t, EventKind::kDropOut, token, k);
          }
          push(t, EventKind::kChunk, token, k, static_cast<uint32_t>(f.chunks.size() - 1));
          sessionOf(k).onChunkSent(token, t);
        } else if constexpr (std::is_same_v<T, client::SendSummary>) {
          const uint64_t token = a.summary.task_token;
          InFlight& f = in_flight_.at(token);
          const ClientProfile p = fleet_->profile(k);
          f.summary = a.summary;
          f.summary.upload_seconds = 0;
          f.summary.encode_seconds = f.encode_seconds;
          f.summary_bytes = wire::encode(wire::Message(f.summary)).size();
          f.upload_sent += static_cast<double>(f.summary_bytes);
          const double t = f.upload_base + f.mask_s + p.latency_s + f.upload_sent / uploadRate(p);
          f.summary.upload_seconds = t - f.upload_base;
          push(t, EventKind::kSummary, token, k);
        } else if constexpr (std::is_same_v<T, client::SendError>) {
          auto it = in_flight_.find(a.error.task_token);
          if (it == in_flight_.end()) return;
          InFlight& f = it->second;
          f.error = a.error;
          // A refused task is answered once it has arrived; a failed one at once.
          push(std::max(now_, f.sent_at + f.download_s), EventKind::kClientError,
               a.error.task_token, k);
        }
        // StopTraining: partial work is simulated as the steps that fit (dispatch).
        // AbandonUpload: frames already on their way arrive to nothing (the task is gone from
        // in_flight_); the client's residual is kept as it is.
        // PublishServedModel, ControlVariateCommitted: virtual clients keep them in memory.
      },
      action);
}

void Simulator::tell(const engine::ClientId& id,
                     const std::function<void(client::ClientSession&)>& event) {
  const uint64_t k = indexOf(id);
  if (!sessions_.count(k)) return;  // never sampled: nothing of its own to hear about
  event(sessionOf(k));
  runSession(k);
}

void Simulator::secAggDown(const engine::SendSecAgg& a) {
  const uint64_t k = indexOf(a.client);
  if (offline_.count(k)) return;
  const ClientProfile p = fleet_->profile(k);
  const double bytes = static_cast<double>(wire::encode(wire::Message(a.message)).size());
  const uint64_t mail = next_mail_++;
  secagg_mail_.emplace(mail, std::make_pair(k, a.message));
  push(now_ + p.latency_s + bytes / p.down_bytes_per_s, EventKind::kSecAggDown, mail, k);
}

void Simulator::secAggUp(uint64_t k, wire::SecAgg m) {
  if (offline_.count(k)) return;
  const ClientProfile p = fleet_->profile(k);
  // The client's cryptographic work for this step, on its device (sim/secagg_cost.h).
  const double work = secAggStepSeconds(m) / p.speed;
  auto f = in_flight_.find(m.task_token);
  if (f != in_flight_.end() && f->second.drop_at <= now_ + work) return;  // gone first
  const double bytes = static_cast<double>(wire::encode(wire::Message(m)).size());
  const uint64_t mail = next_mail_++;
  secagg_mail_.emplace(mail, std::make_pair(k, std::move(m)));
  push(now_ + work + p.latency_s + bytes / uploadRate(p), EventKind::kSecAggUp, mail, k);
}

Status Simulator::maskUpload(InFlight& f, const client::SendUploadRequest& ask) {
  const ClientProfile p = fleet_->profile(f.client);
  const double weight =
      client::maskedUploadWeight(ask.secagg, ask.secagg_weight, f.delta.data(), f.delta.size());
  // The loop thread masks with the workers that are free (the same bytes as on one thread).
  const client::RunPieces run = [this](size_t pieces, const std::function<void(size_t)>& piece) {
    pool_->runPieces(pieces, piece);
  };
  for (size_t j = 0; j < f.plan.size(); ++j) {
    client::EncodedChunk c;
    c.index = j;
    c.range = f.plan[j];
    c.last = j + 1 == f.plan.size();
    FEDFLEET_RETURN_IF_ERROR(client::encodeMaskedChunk(
        *ask.masker, ask.secagg, weight, client::chunkSeed(f.task_seed, j), f.plan[j],
        f.delta.data() + f.plan[j].offset, &c.payload, run));
    f.encoded.push_back(std::move(c));
  }
  // Opening the neighbours' shares, then quantising and masking (one stream per partner and
  // the self mask), on the client's device.
  const size_t partners = ask.masker->maskPartners().size();
  f.mask_s = (secAggOpenSeconds(partners) + secAggMaskSeconds(f.delta.size(), partners)) / p.speed;
  f.delta.clear();
  f.delta.shrink_to_fit();
  return Status::ok();
}

void Simulator::grant(const engine::SendGrant& g) {
  auto it = in_flight_.find(g.grant.task_token);
  if (it == in_flight_.end()) return;
  it->second.upload_base = now_;
  tell(g.client, [&](client::ClientSession& s) { s.onUploadGrant(g.grant.task_token, now_); });
}

void Simulator::cancel(const engine::SendCancel& c) {
  tell(c.client, [&](client::ClientSession& s) { s.onCancel(c.cancel, now_); });
  in_flight_.erase(c.cancel.task_token);
  unmask_drops_.erase(c.cancel.task_token);
}

void Simulator::rejected(const engine::SendError& e) {
  // A rejected update: the client stops sending.
  tell(e.client, [&](client::ClientSession& s) { s.onCoordinatorError(e.error, now_); });
  in_flight_.erase(e.error.task_token);
  unmask_drops_.erase(e.error.task_token);
}

}  // namespace fedfleet::sim::internal
