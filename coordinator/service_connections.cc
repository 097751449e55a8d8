// The ZeroMQ coordinator's connections: admission, the transport's reports (closed, refused,
// over a limit), retired connections, silent ones without a Hello, events about a client and
// the rows left out by the event budget.
#include "coordinator/service_impl.h"

namespace fedfleet::coordinator::internal {

void ZmqCoordinator::recordEvent(const std::string& kind, const std::string& client,
                                 const std::string& detail, double now) {
  history::EventRecord e;
  e.run_id = run_id_;
  e.time = now;
  e.kind = kind;
  e.client_id = client;
  e.detail = detail;
  spdlog::warn("event {}: {}{}{}", kind, client, client.empty() ? "" : " ", detail);
  driver_->recordEvent(e);
}

void ZmqCoordinator::recordClientEvent(const std::string& kind, const std::string& client,
                                       const std::string& detail, double now) {
  const auto& limits = config_.limits;
  const bool timed = limits.events_burst > 0 && limits.events_every_s > 0;  // else: unbounded
  EventBudget& budget =
      event_budget_
          .try_emplace(client,
                       timed ? limits.events_burst : std::numeric_limits<double>::infinity(),
                       limits.events_every_s)
          .first->second;
  flushLeftOut(client, budget, now);
  if (budget.take(now)) recordEvent(kind, client, detail, now);
}

void ZmqCoordinator::flushLeftOut(const std::string& client, EventBudget& budget, double now) {
  if (budget.leftOut() == 0) return;
  const uint64_t left = budget.leftOut();
  if (!budget.takeQuietly(now)) return;
  budget.takeLeftOut();
  recordEvent("events_left_out", client,
              std::to_string(left) +
                  " event rows about this client left out (over its budget of the coordinator's "
                  "own rows: limits.events_burst = " +
                  fmt::format("{:g}", config_.limits.events_burst) +
                  " at once, then one every limits.events_every_s = " +
                  fmt::format("{:g}", config_.limits.events_every_s) + " s)",
              now);
}

void ZmqCoordinator::retire(const std::string& peer, double now) {
  (void)now;
  retired_peers_[peer] = std::numeric_limits<double>::infinity();
  auto p = peers_.find(peer);
  if (p != peers_.end()) {
    auto c = peer_of_client_.find(p->second.client);
    if (c != peer_of_client_.end() && c->second == peer) peer_of_client_.erase(c);
    peers_.erase(p);
  }
  Status st = server_->disconnect(peer);
  if (!st.isOk())
    spdlog::debug("disconnect {}: {}", transport::printableRoutingId(peer), st.toString());
}

bool ZmqCoordinator::admit(const transport::Envelope& env, ConnectionLimits::Kind kind,
                           double now) {
  Peer& peer = peers_[env.peer];
  if (peer.limits.admit(kind, now)) return true;
  if (!peer.limit_recorded) {
    peer.limit_recorded = true;
    const std::string who = peer.client.empty() ? env.client_id : peer.client;
    server_
        ->send(env.peer,
               wire::encode(wire::Error{wire::ErrorCode::kRejected,
                                        "rate limit exceeded; closing the connection", 0}))
        .isOk();
    recordClientEvent("rate_limited", who,
                      "peer " + transport::printableRoutingId(env.peer) + ": " +
                          peer.limits.refusedSummary() + "; connection closed",
                      now);
    retire(env.peer, now);
  }
  return false;
}

void ZmqCoordinator::takeTransportReports(double now) {
  // Refused before they became clients: one warning and one event per cause and host, the
  // repeats counted and reported once a minute (coordinator/refusal_log.h).
  auto report = [&](const RefusalLog::Report& r) { recordEvent(r.kind, "", r.text(), now); };
  for (auto& auth : server_->takeAuthEvents()) {
    if (auth.kind == transport::AuthEvent::kRefused ||
        auth.kind == transport::AuthEvent::kHandshakeFailed) {
      const bool key = auth.kind == transport::AuthEvent::kRefused;
      const std::string cause =
          key ? (auth.public_key.empty() ? "" : "key " + auth.public_key + ": ") + auth.reason
              : auth.reason;
      ++metrics_snapshot_.refused_connections_by_cause[key ? "key_refused" : "handshake_failed"];
      if (auto r = refusals_.note(key ? "auth_rejected" : "handshake_refused", auth.peer_address,
                                  cause, now)) {
        report(*r);
      }
      continue;
    }
    if (const char* kind = transport::allowListEventName(auth.kind)) {
      recordEvent(kind, "", auth.reason, now);  // the allow-list directory itself
      continue;
    }
    // Revoked: close its connection now (ZAP is asked only at the handshake) and end its task.
    recordEvent("key_revoked", auth.client_id, "key " + auth.public_key + ": " + auth.reason, now);
    std::vector<std::string> doomed;
    for (const auto& [routing_id, peer] : peers_) {
      if (peer.client == auth.client_id) doomed.push_back(routing_id);
    }
    if (auto c = peer_of_client_.find(auth.client_id); c != peer_of_client_.end()) {
      server_->send(c->second, wire::encode(wire::Bye{"key revoked: " + auth.reason})).isOk();
    }
    for (const auto& routing_id : doomed) retire(routing_id, now);
    if (engine_->isKnown(auth.client_id)) engine_->onBye(auth.client_id, now);
  }
  // Closed by a connection limit: counted by the transport per host and cause, one row for all
  // hosts a minute.
  for (const auto& refused : server_->takeRefusals()) {
    noteLimitRefusals(refused.host, refused.cause, refused.count, now);
  }
  if (now - hello_swept_at_ >= 1.0) {
    hello_swept_at_ = now;
    closeSilentWithoutHello(now);
  }
  for (const auto& r : refusals_.flush(now)) report(r);
  std::erase_if(retired_peers_, [now](const auto& r) { return now - r.second > kRetiredGraceS; });
  for (const auto& closed : server_->takeClosedConnections()) {
    if (closed.peer.empty()) continue;
    if (auto r = retired_peers_.find(closed.peer); r != retired_peers_.end()) r->second = now;
    auto p = peers_.find(closed.peer);
    if (p == peers_.end()) continue;
    auto c = peer_of_client_.find(p->second.client);
    if (c != peer_of_client_.end() && c->second == closed.peer) peer_of_client_.erase(c);
    peers_.erase(p);
  }
}

void ZmqCoordinator::noteLimitRefusals(const std::string& host, transport::RefusalCause cause,
                                       uint64_t count, double now) {
  metrics_snapshot_.refused_connections_by_cause[transport::refusalCauseName(cause)] += count;
  if (auto r = refusals_.note(kLimitEventKind, host, kLimitCause, now, count, limitDetail(cause))) {
    recordEvent(r->kind, "", r->text(), now);
  }
}

std::string ZmqCoordinator::limitDetail(transport::RefusalCause cause) const {
  const auto& cc = config_.coordinator;
  switch (cause) {
    case transport::RefusalCause::kUnauthenticatedLimit:
      return "coordinator.max_unauthenticated (" + std::to_string(cc.max_unauthenticated) +
             ") connections were waiting to authenticate";
    case transport::RefusalCause::kEarlyDrop:
      return "random early drop, over half of coordinator.max_unauthenticated (" +
             std::to_string(cc.max_unauthenticated) + ") waiting to authenticate";
    case transport::RefusalCause::kPerHostLimit:
      return "coordinator.max_unauthenticated_per_host (" +
             std::to_string(cc.max_unauthenticated_per_host) +
             ") from its address were waiting to authenticate";
    case transport::RefusalCause::kDescriptorReserve:
      return "the coordinator was within its reserve of the descriptor limit (" +
             std::to_string(descriptor_limit_) + ", ulimit -n)";
    case transport::RefusalCause::kHandshakeTimeout:
      return "no handshake within coordinator.handshake_timeout_s (" +
             formatDuration(cc.handshake_timeout_s) + ")";
    case transport::RefusalCause::kSilentAfterHandshake:
      return "no message within twice coordinator.handshake_timeout_s (" +
             formatDuration(2 * cc.handshake_timeout_s) + ")";
    case transport::RefusalCause::kPerKeyLimit:
      return "more than coordinator.max_connections_per_key (" +
             std::to_string(cc.max_connections_per_key) + ") connections of one key";
    case transport::RefusalCause::kSilentWithoutHello:
      return "no Hello and nothing sent for " + formatDuration(kSilentWithoutHelloS);
  }
  return transport::refusalCauseName(cause);
}

void ZmqCoordinator::closeSilentWithoutHello(double now) {
  std::vector<std::pair<std::string, std::string>> silent;  // routing id, client
  for (const auto& [routing_id, peer] : peers_) {
    if (!peer.said_hello && peer.last_message > 0 &&
        now - peer.last_message >= kSilentWithoutHelloS) {
      silent.push_back({routing_id, peer.client});
    }
  }
  for (const auto& [routing_id, client] : silent) {
    // Its host is not known here: the client's id (or "unknown") stands for it.
    noteLimitRefusals(client.empty() ? "a client without a Hello" : "client " + client,
                      transport::RefusalCause::kSilentWithoutHello, 1, now);
    retire(routing_id, now);
  }
}

void ZmqCoordinator::flushRefusals(double now) {
  // The refusals of this takeTransportReports() call count too.
  for (const auto& refused : server_->takeRefusals()) {
    noteLimitRefusals(refused.host, refused.cause, refused.count, now);
  }
  for (const auto& r : refusals_.flushAll()) recordEvent(r.kind, "", r.text(), now);
}

}  // namespace fedfleet::coordinator::internal
