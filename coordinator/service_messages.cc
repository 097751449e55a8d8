// The ZeroMQ coordinator's messages: each client frame checked and handed to the engine (Hello
// first), and the engine's tasks and answers sent; the rounds' stamps, block evaluations and
// commits.
#include "coordinator/service_impl.h"

namespace fedfleet::coordinator::internal {

void ZmqCoordinator::sendTo(const engine::ClientId& id, const wire::Message& message) {
  auto it = peer_of_client_.find(id);
  if (it == peer_of_client_.end()) return;
  Status st = server_->send(it->second, wire::encode(message));
  if (!st.isOk()) {
    spdlog::warn("send {} to {}: {}", wire::messageName(message), id, st.toString());
    // The connection is gone; the engine treats the client as lost after liveness_s.
  }
}

// Sends the Task frame and, as its model frame, the shared model buffer (and the served model's
// after it, when the task carries one): ZeroMQ references those buffers rather than copying
// them for each client (protocols 4 and 5, wire/messages.h).
void ZmqCoordinator::sendTask(engine::SendTask& send) {
  round_of_token_[send.task.task_token] = send.task.round;
  send.task.coordinator_session = session_;
  sent_tasks_[send.client] = SentTask{send, 0};
  transmitTask(send);
}

void ZmqCoordinator::transmitTask(const engine::SendTask& send) {
  auto it = peer_of_client_.find(send.client);
  if (it == peer_of_client_.end()) return;
  // A served model to attach follows the training model in the same model frame.
  Status st = send.served_bytes
                  ? server_->send(it->second, wire::encode(send.task),
                                  std::vector<std::shared_ptr<const std::string>>{
                                      send.model_bytes, send.served_bytes})
                  : server_->send(it->second, wire::encode(send.task), send.model_bytes);
  if (!st.isOk()) {
    spdlog::warn("send Task to {}: {}", send.client, st.toString());
    // As sendTo: the engine treats the client as lost after liveness_s.
  }
}

void ZmqCoordinator::handleEnvelope(const transport::Envelope& env, double now) {
  if (retired_peers_.count(env.peer)) return;  // closing: replaced, revoked or rate-limited
  const bool secure = !config_.coordinator.insecure;
  Peer& peer = peers_[env.peer];
  // CURVE: the connection is the client its key belongs to, whatever it says.
  if (secure) peer.client = env.client_id;
  const engine::ClientId who = peer.client;

  peer.last_message = now;
  wire::DecodeLimits limits;
  limits.max_bytes = config_.clientFrameLimitBytes();
  auto decoded = wire::decode(env.payload, limits);
  Status bad = decoded.isOk() ? wire::checkClientMessage(*decoded) : decoded.status();
  if (!bad.isOk()) {
    if (!admit(env, ConnectionLimits::kBadFrame, now)) return;
    recordClientEvent("malformed_frame", who,
                      "peer " + transport::printableRoutingId(env.peer) + ", " +
                          std::to_string(env.payload.size()) + " bytes: " + bad.message(),
                      now);
    server_
        ->send(env.peer, wire::encode(wire::Error{wire::ErrorCode::kMalformed, bad.message(), 0}))
        .isOk();
    if (!who.empty() && peer_of_client_.count(who) && peer_of_client_[who] == env.peer) {
      engine_->onHeartbeat(who, now);
    }
    return;
  }
  wire::Message& msg = decoded.value();
  if (auto* hello = std::get_if<wire::Hello>(&msg)) {
    if (!admit(env, ConnectionLimits::kHello, now)) return;
    handleHello(env, *hello, now);
    return;
  }
  if (std::holds_alternative<wire::Heartbeat>(msg) &&
      !admit(env, ConnectionLimits::kHeartbeat, now)) {
    return;
  }

  auto current = who.empty() ? peer_of_client_.end() : peer_of_client_.find(who);
  if (secure && current != peer_of_client_.end() && current->second != env.peer &&
      engine_->isKnown(who)) {
    // The same key on a new connection (the client reconnected): it is the same client, so
    // the new connection carries on and the old one is closed.
    const std::string old = current->second;
    recordClientEvent("connection_replaced", who,
                      "peer " + transport::printableRoutingId(env.peer) + " replaces " +
                          transport::printableRoutingId(old),
                      now);
    retire(old, now);
    peer_of_client_[who] = env.peer;
    current = peer_of_client_.find(who);
    resendUnstartedTask(who, "its connection was replaced", now);
  }
  if (current == peer_of_client_.end() || current->second != env.peer || !engine_->isKnown(who)) {
    // No Hello from this client yet: ask for one. After a coordinator restart every client's
    // first messages are its old session's (an upload on its way); that is expected and only
    // logged at debug. A connection that keeps talking without ever saying Hello is recorded
    // once.
    Peer& p = peers_[env.peer];
    ++p.before_hello;
    spdlog::debug("{} from peer {} ({}) before Hello: asking for one", wire::messageName(msg),
                  transport::printableRoutingId(env.peer), who);
    if (!p.warned_unknown && p.before_hello >= kMessagesBeforeHelloRecorded) {
      p.warned_unknown = true;
      recordClientEvent("unknown_client", who,
                        std::to_string(p.before_hello) + " messages (the latest " +
                            wire::messageName(msg) + ") from peer " +
                            transport::printableRoutingId(env.peer) +
                            " without a Hello, though asked for one",
                        now);
    }
    // One reply a second per connection is enough for the client to say Hello again.
    if (p.unknown_reply_at < 0 || now - p.unknown_reply_at >= 1.0) {
      p.unknown_reply_at = now;
      server_
          ->send(env.peer,
                 wire::encode(wire::Error{wire::ErrorCode::kUnknownClient, "send Hello first", 0}))
          .isOk();
    }
    return;
  }
  handleMessage(env, msg, who, now);
}

void ZmqCoordinator::handleHello(const transport::Envelope& env, const wire::Hello& hello,
                                 double now) {
  const bool secure = !config_.coordinator.insecure;
  const engine::ClientId id = secure ? env.client_id : hello.client_id;
  std::string problem;
  if (!transport::isValidClientId(hello.client_id)) {
    problem = "client id must be 1-128 characters of [A-Za-z0-9._@-]";
  } else if (secure && hello.client_id != env.client_id) {
    problem = "this connection's key is client '" + env.client_id + "' (its allow-list file is " +
              env.client_id + ".key), not '" + hello.client_id + "'";
  } else if (secure && hello.public_key != env.user_id) {
    problem = "Hello names a public key other than the one the connection authenticated with";
  } else if (auto k = key_of_client_.find(id);
             secure && k != key_of_client_.end() && k->second != env.user_id) {
    problem = "client id '" + id + "' is bound to key " + k->second +
              " in this run's history; a new key needs a new client id";
  } else if (hello.requested_partition >= 0 &&
             static_cast<uint32_t>(hello.requested_partition) >= config_.partitions()) {
    problem = "Hello asks for partition " + std::to_string(hello.requested_partition) +
              ", and the run has " + std::to_string(config_.partitions()) +
              " (data.partitions): ask for one of 0.." + std::to_string(config_.partitions() - 1) +
              " or for none (client.partition = -1)";
  }
  if (!problem.empty()) {
    recordClientEvent("hello_refused", id, problem, now);
    server_->send(env.peer, wire::encode(wire::Error{wire::ErrorCode::kRejected, problem, 0}))
        .isOk();
    return;
  }
  bool replaced = false;
  if (auto old = peer_of_client_.find(id);
      old != peer_of_client_.end() && old->second != env.peer) {
    replaced = true;
    const std::string old_peer = old->second;
    recordClientEvent("connection_replaced", id,
                      "peer " + transport::printableRoutingId(env.peer) + " replaces " +
                          transport::printableRoutingId(old_peer),
                      now);
    if (secure) {
      retire(old_peer, now);
    } else {
      peers_.erase(old_peer);  // no identity to go by: the newest Hello wins
    }
  }
  peers_[env.peer].client = id;
  peers_[env.peer].said_hello = true;
  peer_of_client_[id] = env.peer;
  if (secure) key_of_client_.emplace(id, env.user_id);
  engine_->onHello(id, hello, now);
  // The same client process greeting again keeps its task (a new process lost it): it may not
  // have received it (on a connection now closed, or it dropped it after an UNKNOWN_CLIENT).
  resendUnstartedTask(id, replaced ? "its connection was replaced" : "it said Hello again", now);
}

void ZmqCoordinator::resendUnstartedTask(const engine::ClientId& id, const std::string& why,
                                         double now) {
  auto sent = sent_tasks_.find(id);
  if (sent == sent_tasks_.end()) return;
  SentTask& t = sent->second;
  const uint64_t token = engine_->unstartedTask(id);
  if (token == 0 || token != t.send.task.task_token || t.resent >= kMaxTaskResends) return;
  ++t.resent;
  spdlog::info("client {}: round {} task sent again: {} before its upload started", id,
               t.send.task.round, why);
  recordClientEvent("task_resent", id,
                    "round " + std::to_string(t.send.task.round) + ": " + why +
                        " before its upload started (" + std::to_string(t.resent) + " of at most " +
                        std::to_string(kMaxTaskResends) + ")",
                    now);
  transmitTask(t.send);
}

void ZmqCoordinator::handleMessage(const transport::Envelope& env, wire::Message& msg,
                                   const engine::ClientId& who, double now) {
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, wire::Chunk>) {
          const auto t0 = std::chrono::steady_clock::now();
          engine_->onChunk(who, m, env.payload.size(), now);
          auto task = round_of_token_.find(m.task_token);
          if (task != round_of_token_.end()) {
            decode_seconds_[{task->second, who}] +=
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          }
        } else if constexpr (std::is_same_v<T, wire::Summary>) {
          engine_->onSummary(who, m, env.payload.size(), now);
        } else if constexpr (std::is_same_v<T, wire::UploadRequest>) {
          engine_->onUploadRequest(who, m.task_token, now);
        } else if constexpr (std::is_same_v<T, wire::SecAgg>) {
          engine_->onSecAgg(who, m, env.payload.size(), now);
        } else if constexpr (std::is_same_v<T, wire::Heartbeat>) {
          engine_->onHeartbeat(who, now);
          sendTo(who, wire::Heartbeat{m.seq});
        } else if constexpr (std::is_same_v<T, wire::Bye>) {
          engine_->onBye(who, now);
        } else if constexpr (std::is_same_v<T, wire::Error>) {
          engine_->onClientError(who, m, now);
        } else {
          if (!admit(env, ConnectionLimits::kBadFrame, now)) return;
          recordClientEvent("unexpected_message", who,
                            std::string(wire::messageName(msg)) + " is not a client message", now);
          sendTo(who,
                 wire::Error{wire::ErrorCode::kMalformed,
                             std::string(wire::messageName(msg)) + " is not a client message", 0});
        }
      },
      msg);
}

void ZmqCoordinator::stampRound(engine::CommitRound& commit) {
  // Real time is the run's clock here.
  commit.round.wall_start = commit.round.start_time;
  commit.round.wall_end = commit.round.end_time;
  for (auto& u : commit.updates) {
    u.wall_compute_s = u.compute_s;
    auto d = decode_seconds_.find({u.round, u.client_id});
    if (d != decode_seconds_.end()) {
      u.decode_s = d->second;
      decode_seconds_.erase(d);
    }
  }
  std::erase_if(round_of_token_, [&](const auto& kv) { return kv.second <= commit.round.round; });
}

// Block-cyclic runs: evaluates the block models on their blocks' sets, on the event loop (a few
// thousand samples a model, at the end of each block), and reports to the engine.
void ZmqCoordinator::evaluateBlocks(const engine::EvaluateBlocks& ev) {
  std::vector<engine::BlockEvalOutcome> outcomes;
  for (const auto& m : ev.models) {
    if (!block_model_ || m.block >= block_sets_.size()) continue;
    const auto& set = block_sets_[m.block];
    Status st = block_model_->setFlatParameters(*m.params);
    if (!st.isOk()) {
      spdlog::warn("block {} model {}: {}", m.block, m.model, st.toString());
      continue;
    }
    auto test = model::evaluateIndices(*block_model_, block_data_, set.test);
    if (!test.isOk()) {
      spdlog::warn("block {} model {}: {}", m.block, m.model, test.status().toString());
      continue;
    }
    engine::BlockEvalOutcome o;
    o.block = m.block;
    o.model = m.model;
    o.loss = test->loss;
    o.accuracy = test->accuracy.value_or(0);  // block-cyclic runs classify
    if (!set.validation.empty()) {
      auto val = model::evaluateIndices(*block_model_, block_data_, set.validation);
      if (val.isOk()) o.validation_loss = val->loss;
    }
    outcomes.push_back(std::move(o));
  }
  engine_->onBlocksEvaluated(ev.round, outcomes, unixNow());
}

// Folds a committed round into the live metrics.
void ZmqCoordinator::roundCommitted(const engine::CommitRound& commit) {
  MetricsSnapshot& m = metrics_snapshot_;
  const history::RoundRecord& r = commit.round;
  ++m.rounds_committed;
  m.last_committed_round = r.round;
  m.bytes_up += r.bytes_up;
  m.bytes_down += r.bytes_down;
  if (r.test_accuracy) m.test_accuracy = r.test_accuracy;
  if (r.test_loss) m.test_loss = r.test_loss;
  for (const auto& u : commit.updates) ++m.updates_by_status[u.status];
  if (commit.outcome != engine::RoundOutcome::kInitial)
    m.round_duration.observe(r.end_time - r.start_time);
  for (auto it = sent_tasks_.begin(); it != sent_tasks_.end();) {
    const bool keep = engine_->unstartedTask(it->first) == it->second.send.task.task_token;
    it = keep ? std::next(it) : sent_tasks_.erase(it);
  }
}

}  // namespace fedfleet::coordinator::internal
