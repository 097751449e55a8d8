// PeerMesh over the ZeroMQ transports of common/transport/transport.h (see peer_mesh.h).

#include "common/transport/peer_mesh.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "common/transport/key_files.h"

namespace fedfleet::transport {
namespace {

constexpr char kHeartbeat = 'H';
constexpr char kData = 'D';
// Messages taken from the socket in one poll() before it returns what it has, so that a peer
// flooding the mesh cannot keep heartbeats and liveness checks from running.
constexpr size_t kMaxMessagesPerPoll = 256;

}  // namespace

Result<std::unique_ptr<PeerMesh>> PeerMesh::create(const PeerMeshOptions& options) {
  if (!isValidClientId(options.self_id)) {
    return invalidArgument("peer mesh: self id '" + printableRoutingId(options.self_id) +
                           "' is not a valid id");
  }
  if (options.heartbeat_interval_ms <= 0 ||
      options.heartbeat_timeout_ms <= options.heartbeat_interval_ms) {
    return invalidArgument("peer mesh: heartbeat_timeout_ms (" +
                           std::to_string(options.heartbeat_timeout_ms) +
                           ") must be above heartbeat_interval_ms (" +
                           std::to_string(options.heartbeat_interval_ms) + ") and both positive");
  }
  if (options.send_hwm < 1) return invalidArgument("peer mesh: send_hwm must be at least 1");
  if (options.max_message_bytes == 0) {
    return invalidArgument("peer mesh: max_message_bytes must be positive");
  }
  if (!options.insecure) {
    FEDFLEET_RETURN_IF_ERROR(checkKeyPair(options.keys, "peer keys"));
  }
  ServerOptions server;
  server.endpoint = options.listen_endpoint;
  server.insecure = options.insecure;
  server.server_keys = options.keys;
  server.allow_dir = options.allow_dir;
  server.max_message_bytes = options.max_message_bytes + 1;  // the kind byte
  server.receive_hwm = std::max(2, options.receive_hwm);
  server.io_threads = options.io_threads;
  server.admission = options.admission;
  server.handshake_timeout_ms = options.handshake_timeout_ms;
  FEDFLEET_ASSIGN_OR_RETURN(std::unique_ptr<ServerTransport> transport, createServer(server));
  return std::unique_ptr<PeerMesh>(new PeerMesh(options, std::move(transport)));
}

PeerMesh::PeerMesh(PeerMeshOptions options, std::unique_ptr<ServerTransport> server)
    : options_(std::move(options)), server_(std::move(server)) {}

PeerMesh::~PeerMesh() = default;

std::string PeerMesh::boundEndpoint() const { return server_->boundEndpoint(); }

Status PeerMesh::setPeers(const std::vector<PeerAddress>& peers) {
  if (peers_set_) return failedPrecondition("peer mesh: setPeers() was already called");
  std::map<std::string, Target> targets;
  for (const PeerAddress& peer : peers) {
    if (peer.id == options_.self_id) continue;
    if (!isValidClientId(peer.id)) {
      return invalidArgument("peer table: '" + printableRoutingId(peer.id) +
                             "' is not a valid peer id");
    }
    if (targets.count(peer.id) > 0) {
      return invalidArgument("peer table: peer '" + peer.id + "' appears twice");
    }
    if (!options_.insecure && !isZ85Key(peer.public_key)) {
      return invalidArgument("peer table: peer '" + peer.id + "' has no valid public key");
    }
    ClientOptions link;
    link.endpoint = peer.endpoint;
    link.insecure = options_.insecure;
    link.client_keys = options_.keys;
    link.server_public_key = peer.public_key;
    // Under CURVE the receiver ignores routing ids; in plain text they are all it has.
    if (options_.insecure) link.routing_id = options_.self_id;
    link.max_message_bytes = options_.max_message_bytes + 1;
    link.send_hwm = options_.send_hwm;
    link.send_timeout_ms = 0;  // a full queue is an error now, never a stalled loop
    link.io_threads = options_.io_threads;
    Result<std::unique_ptr<ClientTransport>> client = createClient(link);
    if (!client.isOk()) return client.status().withContext("dialling peer " + peer.id);
    Target target;
    target.address = peer;
    target.link = std::move(*client);
    targets.emplace(peer.id, std::move(target));
  }
  const Clock::time_point now = Clock::now();
  for (auto& [id, target] : targets) target.last_heard = now;
  targets_ = std::move(targets);
  peers_set_ = true;
  next_heartbeat_ = now;  // the first poll() greets everyone
  return Status::ok();
}

Status PeerMesh::send(const std::string& peer, const std::string& data) {
  auto it = targets_.find(peer);
  if (it == targets_.end()) return notFound("peer mesh: '" + peer + "' is not a known peer");
  if (down_.count(peer) > 0) return unavailable("peer mesh: peer " + peer + " is down");
  if (data.size() > options_.max_message_bytes) {
    return resourceExhausted("peer mesh: a " + std::to_string(data.size()) +
                             "-byte message to peer " + peer + " is over the limit of " +
                             std::to_string(options_.max_message_bytes) + " bytes");
  }
  std::string frame;
  frame.reserve(data.size() + 1);
  frame.push_back(kData);
  frame.append(data);
  Status st = it->second.link->send(frame);
  if (st.code() == StatusCode::kTimeout) {
    return resourceExhausted("peer mesh: " + std::to_string(options_.send_hwm) +
                             " messages already wait for peer " + peer +
                             " (not connected yet, or not reading)");
  }
  return st.isOk() ? st : st.withContext("peer " + peer);
}

Result<std::vector<PeerEvent>> PeerMesh::poll(int timeout_ms) {
  std::vector<PeerEvent> events;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(std::max(0, timeout_ms));
  while (true) {
    Clock::time_point now = Clock::now();
    if (peers_set_ && now >= next_heartbeat_) sendHeartbeats(now);
    checkLiveness(now, events);
    for (AuthEvent& refused : server_->takeAuthEvents()) {
      if (allowListEventName(refused.kind) != nullptr) {
        // The allow-list directory replaced, refused or passing again (logged by the handler).
        spdlog::warn("peer {}: {}: {}", options_.self_id, allowListEventName(refused.kind),
                     refused.reason);
      } else {
        spdlog::warn("peer {}: refused a connection from {} (key {}): {}", options_.self_id,
                     refused.peer_address, refused.public_key, refused.reason);
      }
      if (auth_events_.size() < kMaxAuthEvents) auth_events_.push_back(std::move(refused));
    }
    noteRefusals(now);
    if (!events.empty() || now >= deadline) return events;

    Clock::time_point wake = deadline;
    if (peers_set_) wake = std::min(wake, next_heartbeat_);
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
    FEDFLEET_ASSIGN_OR_RETURN(std::optional<Envelope> envelope,
                              server_->receive(static_cast<int>(std::max<int64_t>(wait, 0))));
    for (size_t taken = 0; envelope && taken < kMaxMessagesPerPoll; ++taken) {
      accept(std::move(*envelope), events);
      FEDFLEET_ASSIGN_OR_RETURN(envelope, server_->receive(0));
    }
    if (envelope) accept(std::move(*envelope), events);
  }
}

void PeerMesh::accept(Envelope envelope, std::vector<PeerEvent>& events) {
  // Under CURVE the sender is the id the allow-list gives its authenticated key.
  const std::string& sender = options_.insecure ? envelope.peer : envelope.client_id;
  auto it = targets_.find(sender);
  if (it == targets_.end() || envelope.payload.empty()) {
    ++dropped_;
    spdlog::warn("peer {}: dropped a {}-byte frame from '{}', not a peer of this run",
                 options_.self_id, envelope.payload.size(), printableRoutingId(sender));
    return;
  }
  if (down_.count(sender) > 0) {
    ++dropped_;
    spdlog::debug("peer {}: dropped a frame from {}, declared down", options_.self_id, sender);
    return;
  }
  it->second.last_heard = Clock::now();
  const char kind = envelope.payload[0];
  if (kind == kHeartbeat) return;
  if (kind != kData) {
    ++dropped_;
    spdlog::warn("peer {}: dropped a frame of unknown kind {} from {}", options_.self_id,
                 static_cast<int>(static_cast<unsigned char>(kind)), sender);
    return;
  }
  PeerEvent event;
  event.kind = PeerEvent::kMessage;
  event.peer = sender;
  event.payload = std::string(envelope.payload.view().substr(1));
  events.push_back(std::move(event));
}

void PeerMesh::noteRefusals(Clock::time_point now) {
  server_->takeClosedConnections();  // the mesh goes by heartbeats, not by connections
  for (const ConnectionRefusals& r : server_->takeRefusals()) {
    refused_ += r.count;
    refused_since_log_[refusalCauseName(r.cause)] += r.count;
    if (refused_hosts_.size() < 8) refused_hosts_.insert(r.host);
  }
  // One warning a minute at most, however many connections a flood opens.
  if (refused_since_log_.empty() || now - refusals_logged_at_ < kRefusalLogInterval) return;
  std::string causes;
  uint64_t total = 0;
  for (const auto& [cause, n] : refused_since_log_) {
    causes += (causes.empty() ? "" : ", ") + std::to_string(n) + " " + cause;
    total += n;
  }
  std::string hosts;
  for (const std::string& h : refused_hosts_) hosts += (hosts.empty() ? "" : ", ") + h;
  spdlog::warn("peer {}: closed {} connection(s) by its connection limits ({}), from {}",
               options_.self_id, total, causes, hosts);
  refused_since_log_.clear();
  refused_hosts_.clear();
  refusals_logged_at_ = now;
}

void PeerMesh::sendHeartbeats(Clock::time_point now) {
  static const std::string kBeat(1, kHeartbeat);
  for (auto& [id, target] : targets_) {
    if (down_.count(id) > 0) continue;
    // A full queue means the target does not read: liveness will say so; nothing to add here.
    Status st = target.link->send(kBeat);
    if (!st.isOk() && st.code() != StatusCode::kTimeout) {
      spdlog::debug("peer {}: heartbeat to {}: {}", options_.self_id, id, st.toString());
    }
  }
  next_heartbeat_ = now + std::chrono::milliseconds(options_.heartbeat_interval_ms);
}

void PeerMesh::checkLiveness(Clock::time_point now, std::vector<PeerEvent>& events) {
  const auto timeout = std::chrono::milliseconds(options_.heartbeat_timeout_ms);
  for (auto& [id, target] : targets_) {
    if (down_.count(id) > 0 || now - target.last_heard < timeout) continue;
    down_.insert(id);
    PeerEvent event;
    event.kind = PeerEvent::kPeerDown;
    event.peer = id;
    event.reason = "no message or heartbeat from peer " + id + " (" + target.address.endpoint +
                   ") for " + std::to_string(options_.heartbeat_timeout_ms) + " ms";
    spdlog::warn("peer {}: {}", options_.self_id, event.reason);
    events.push_back(std::move(event));
  }
}

std::vector<std::string> PeerMesh::livePeers() const {
  std::vector<std::string> live;
  for (const auto& [id, target] : targets_) {
    if (down_.count(id) == 0) live.push_back(id);
  }
  return live;
}

uint64_t PeerMesh::framesDropped() const { return dropped_ + server_->framesRefused(); }

std::vector<AuthEvent> PeerMesh::takeAuthEvents() {
  std::vector<AuthEvent> events = std::exchange(auth_events_, {});
  for (AuthEvent& refused : server_->takeAuthEvents()) events.push_back(std::move(refused));
  return events;
}

}  // namespace fedfleet::transport
