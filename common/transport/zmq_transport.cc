// ZeroMQ implementation of common/transport/transport.h.
//
// Server: ROUTER socket; every message arrives as [routing id][payload]. ROUTER_MANDATORY makes a
// send to an unknown peer fail (kUnavailable) instead of vanishing. Hand-over is off: a
// connection that presents a routing id already in use is ignored by ZeroMQ, so no connection
// can take another's messages. Unless insecure, the socket is a CURVE server and every
// handshake is checked by a ZapAuthenticator running in the same context, which names the
// client id of the key in the connection's metadata. Client: DEALER socket; every message is
// one frame [payload].
//
// Connections: a socket monitor reports each accepted connection (its file descriptor) and
// each disconnect. The server keeps a duplicate of every connection's descriptor, so that
// disconnect() can shut one connection down (libzmq 4.3 has no call for that on a ROUTER) and
// so that a disconnect can be told apart: the server closed it, the peer did, or ZeroMQ dropped
// it with input still unread in the kernel (what a frame over the size limit does: libzmq reads
// the frame header, refuses it and closes). The duplicate stays open up to kSettle after
// ZeroMQ's report, so that the rest of a refused frame has time to arrive and show. Messages carry
// their connection's descriptor (ZMQ_SRCFD), which ties a routing id to its connection.
// Descriptors are reused as soon as ZeroMQ closes them, and the reports are read later than
// they happen, so a duplicate is trusted only once verified (drainMonitor says how), and a
// routing id is tied to a connection only once (notePeer).
//
// Limits before authentication (connection_admission.h): a connection that has not delivered a
// message is unauthenticated. Each newly verified connection is checked against the admission
// limits (count, random early drop, per source address, the descriptor reserve) and shut down
// at once if refused; libzmq closes one whose handshake outlasts ZMQ_HANDSHAKE_IVL; the server
// closes one that delivers nothing within first_message_timeout_ms, and the oldest of a key's
// connections past max_connections_per_key. Each is counted by host and cause for
// takeRefusals(), never logged one by one.
//
// A message with an attachment leaves the server as [routing id][payload][piece]..[piece]: the
// attachment cut into frames of at most kAttachmentPieceBytes (one empty frame for an empty
// attachment); several attachments go one after the other. Each piece is a zero-copy frame
// (zmq_msg_init_data) over the caller's buffer whose free function drops one reference to it;
// libzmq calls it, from an I/O thread, once the frame is encrypted (CURVE) or written (plain text).
// The client joins the pieces again.
//
// Sizes: ZMQ_MAXMSGSIZE applies to the frames on the wire, which under CURVE carry
// kCurveOverheadBytes more than the payload. The socket limit therefore gets that slack, and
// receive() drops (with a warning) any payload over max_message_bytes; a frame over the socket
// limit makes libzmq drop the connection (the peer reconnects) when it reads the frame's header,
// before it buffers any of it (handshake commands included: the limit holds before
// authentication too). A received payload stays in ZeroMQ's buffer (MessageBytes), so a frame
// is held once, not copied again.
//
// Shutdown order (destructor): close the data socket (linger 0), shut the context down (so the
// ZAP thread wakes with ETERM), join the ZAP thread, terminate the context.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "common/check.h"
#include "common/transport/descriptor_limit.h"
#include "common/transport/key_files.h"
#include "common/transport/transport.h"
#include "common/transport/zap_authenticator.h"

#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
#define ZMQ_ZAP_ENFORCE_DOMAIN 93  // draft option in libzmq 4.3; accepted by its non-draft builds
#endif

namespace fedfleet::transport {
namespace {

constexpr const char* kZapDomain = "fedfleet";
constexpr int kHighWaterMark = 10000;  // messages queued per peer before send blocks
constexpr int kSendTimeoutMs = 5000;   // send() gives up with kTimeout after this
// A CURVE MESSAGE command adds "\x07MESSAGE" (8), a short nonce (8), a flags byte and the box
// MAC (16) to the payload.
constexpr uint64_t kCurveOverheadBytes = 64;

std::string zmqText(int err) { return zmq_strerror(err); }

// Status for a failed bind/connect of `endpoint`.
Status endpointError(const char* what, const std::string& endpoint, int err) {
  std::string message = std::string(what) + " " + endpoint + ": " + zmqText(err);
  if (err == EADDRINUSE) return unavailable(message);
  return invalidArgument(message);
}

int64_t socketSizeLimit(uint64_t max_message_bytes, bool curve) {
  const uint64_t limit = max_message_bytes + (curve ? kCurveOverheadBytes : 0);
  return static_cast<int64_t>(std::min<uint64_t>(limit, INT64_MAX));
}

void setHeartbeats(zmq::socket_t& socket, int ivl_ms, int timeout_ms) {
  if (ivl_ms <= 0) return;
  socket.set(zmq::sockopt::heartbeat_ivl, ivl_ms);
  if (timeout_ms > 0) {
    socket.set(zmq::sockopt::heartbeat_timeout, timeout_ms);
    // The TTL tells the peer when to give up on us; libzmq keeps it in deciseconds.
    socket.set(zmq::sockopt::heartbeat_ttl,
               std::clamp((timeout_ms + 99) / 100 * 100, 100, 6553500));
  }
}

// Outcome of reading one multipart message.
struct Frames {
  std::vector<zmq::message_t> parts;  // the first kKeepParts frames
  size_t count = 0;                   // all frames of the message
};

// Waits up to `timeout_ms` for a message and reads all its frames (keeping the first
// `keep_parts`). nullopt on timeout or EINTR; kUnavailable if the socket failed.
Result<std::optional<Frames>> receiveFrames(zmq::socket_t& socket, int timeout_ms,
                                            size_t keep_parts) {
  zmq_pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  const int rc = zmq_poll(&item, 1, timeout_ms < 0 ? -1 : timeout_ms);
  if (rc < 0) {
    if (zmq_errno() == EINTR) return std::optional<Frames>();
    return unavailable("poll: " + zmqText(zmq_errno()));
  }
  if (rc == 0 || (item.revents & ZMQ_POLLIN) == 0) return std::optional<Frames>();

  Frames frames;
  bool more = true;
  while (more) {
    zmq::message_t frame;
    if (zmq_msg_recv(frame.handle(), socket.handle(), ZMQ_DONTWAIT) < 0) {
      const int err = zmq_errno();
      // The rest of a multipart message is always there once its first frame is; EINTR can
      // still interrupt the call, so retry. Before the first frame, EAGAIN/EINTR are a timeout.
      if (err == EINTR && frames.count > 0) continue;
      if ((err == EAGAIN || err == EINTR) && frames.count == 0) return std::optional<Frames>();
      return unavailable("receive: " + zmqText(err));
    }
    more = frame.more();
    ++frames.count;
    if (frames.parts.size() < keep_parts) frames.parts.push_back(std::move(frame));
  }
  return std::optional<Frames>(std::move(frames));
}

// Sends one frame; kTimeout when the send timeout runs out (peer's queue full). On failure the
// frame stays with the caller (its destructor releases it).
Status sendFrame(zmq::socket_t& socket, zmq::message_t& frame, int flags, const char* what) {
  while (zmq_msg_send(frame.handle(), socket.handle(), flags) < 0) {
    const int err = zmq_errno();
    if (err == EINTR) continue;
    if (err == EAGAIN) {
      return timeoutError(std::string("send ") + what +
                          ": not connected or queue full past the send timeout");
    }
    if (err == EHOSTUNREACH)
      return unavailable(std::string("send ") + what + ": peer not connected");
    return unavailable(std::string("send ") + what + ": " + zmqText(err));
  }
  return Status::ok();
}

// Sends a copy of `size` bytes at `data` as one frame.
Status sendFrame(zmq::socket_t& socket, const void* data, size_t size, int flags,
                 const char* what) {
  zmq::message_t frame(data, size);
  return sendFrame(socket, frame, flags, what);
}

// Free function of an attachment piece: drops the piece's reference to the shared buffer.
void releaseAttachment(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const std::string>*>(hint);
}

// Sends `attachment` as frames of the current message (its last ones unless `more`): pieces of
// at most kAttachmentPieceBytes that reference the buffer (each holds one shared_ptr copy).
Status sendAttachment(zmq::socket_t& socket, const std::shared_ptr<const std::string>& attachment,
                      bool more) {
  const size_t size = attachment->size();
  size_t offset = 0;
  do {
    const size_t n = std::min(kAttachmentPieceBytes, size - offset);
    auto* reference = new std::shared_ptr<const std::string>(attachment);
    zmq::message_t piece(const_cast<char*>(attachment->data()) + offset, n, releaseAttachment,
                         reference);
    offset += n;
    FEDFLEET_RETURN_IF_ERROR(
        sendFrame(socket, piece, offset < size || more ? ZMQ_SNDMORE : 0, "attachment"));
  } while (offset < size);
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------

class ZmqServerTransport final : public ServerTransport {
 public:
  explicit ZmqServerTransport(const ServerOptions& options)
      : context_(std::max(1, options.io_threads)),
        insecure_(options.insecure),
        max_message_bytes_(options.max_message_bytes),
        handshake_timeout_(std::max(0, options.handshake_timeout_ms)),
        first_message_timeout_(firstMessageTimeout(options)),
        admission_(options.admission,
                   options.admission_seed != 0 ? options.admission_seed : randomSeed()) {}

  ~ZmqServerTransport() override {
    monitor_.close();
    socket_.close();
    for (auto& [fd, c] : connections_) ::close(c.dup_fd);
    if (zap_) {
      context_.shutdown();
      zap_.reset();
    }
    context_.close();
  }

  // Starts the ZAP handler (unless insecure), then creates and binds the ROUTER socket.
  Status start(const ServerOptions& options) {
    if (!insecure_) {
      FEDFLEET_ASSIGN_OR_RETURN(zap_, ZapAuthenticator::start(context_, options.allow_dir));
    }
    try {
      socket_ = zmq::socket_t(context_, zmq::socket_type::router);
      socket_.set(zmq::sockopt::linger, 0);
      socket_.set(zmq::sockopt::router_mandatory, 1);
      socket_.set(zmq::sockopt::sndhwm, kHighWaterMark);
      socket_.set(zmq::sockopt::rcvhwm, options.receive_hwm);
      socket_.set(zmq::sockopt::sndtimeo, kSendTimeoutMs);
      socket_.set(zmq::sockopt::maxmsgsize,
                  socketSizeLimit(options.max_message_bytes, !options.insecure));
      socket_.set(zmq::sockopt::handshake_ivl, static_cast<int>(handshake_timeout_.count()));
      setHeartbeats(socket_, options.heartbeat_ivl_ms, options.heartbeat_timeout_ms);
      if (!insecure_) {
        socket_.set(zmq::sockopt::curve_server, 1);
        socket_.set(zmq::sockopt::curve_secretkey, options.server_keys.secret_key);
        socket_.set(zmq::sockopt::zap_domain, kZapDomain);
        // Fail closed should the ZAP handler ever be missing (see ZapAuthenticator::run).
        const int one = 1;
        zmq_setsockopt(socket_.handle(), ZMQ_ZAP_ENFORCE_DOMAIN, &one, sizeof(one));
      }
    } catch (const zmq::error_t& e) {
      return internalError(std::string("configuring server socket: ") + e.what());
    }
    static std::atomic<int> generation{0};
    const std::string monitor_endpoint =
        "inproc://fedfleet-server-monitor-" + std::to_string(++generation);
    if (zmq_socket_monitor(socket_.handle(), monitor_endpoint.c_str(),
                           ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0) {
      return internalError("socket monitor: " + zmqText(zmq_errno()));
    }
    try {
      monitor_ = zmq::socket_t(context_, zmq::socket_type::pair);
      monitor_.set(zmq::sockopt::linger, 0);
      // libzmq's I/O threads send the reports with a blocking send: a bounded queue would stall
      // every connection while the loop is busy (a flood reports three events a connection).
      monitor_.set(zmq::sockopt::rcvhwm, 0);
      monitor_.connect(monitor_endpoint);
    } catch (const zmq::error_t& e) {
      return internalError(std::string("socket monitor: ") + e.what());
    }
    if (zmq_bind(socket_.handle(), options.endpoint.c_str()) != 0) {
      return endpointError("bind", options.endpoint, zmq_errno());
    }
    try {
      bound_endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t&) {
      bound_endpoint_ = options.endpoint;
    }
    if (insecure_) {
      spdlog::warn("plain-text transport: traffic is not encrypted (server {})", bound_endpoint_);
    }
    return Status::ok();
  }

  Result<std::optional<Envelope>> receive(int timeout_ms) override {
    housekeeping();
    std::optional<Frames> frames;
    if (waitForMessage(timeout_ms)) {
      FEDFLEET_ASSIGN_OR_RETURN(frames, receiveFrames(socket_, 0, /*keep_parts=*/2));
    }
    housekeeping();
    if (!frames) return std::optional<Envelope>();
    if (frames->count != 2) {
      spdlog::warn("server: dropped a message of {} frames (expected routing id + payload)",
                   frames->count);
      return std::optional<Envelope>();
    }
    zmq::message_t& id = frames->parts[0];
    Envelope env;
    env.peer.assign(id.data<char>(), id.size());
    // The payload stays in ZeroMQ's buffer: the Envelope holds the message, no second copy.
    auto payload = std::make_shared<zmq::message_t>(std::move(frames->parts[1]));
    if (const char* user_id = zmq_msg_gets(payload->handle(), "User-Id")) env.user_id = user_id;
    if (const char* client = zmq_msg_gets(payload->handle(), kClientIdProperty)) {
      env.client_id = client;
    }
    if (!insecure_ && (env.user_id.empty() || env.client_id.empty())) {
      spdlog::error("server: dropped a message from {} that no ZAP check authenticated",
                    printableRoutingId(env.peer));
      return std::optional<Envelope>();
    }
    notePeer(env.peer, env.user_id, zmq_msg_get(payload->handle(), ZMQ_SRCFD));
    if (payload->size() > max_message_bytes_) {
      spdlog::warn("server: dropped a {}-byte message from {} (limit {} bytes)", payload->size(),
                   printableRoutingId(env.peer), max_message_bytes_);
      ++frames_refused_;
      return std::optional<Envelope>();
    }
    const char* data = payload->data<char>();
    const size_t size = payload->size();
    env.payload = MessageBytes(std::shared_ptr<const void>(std::move(payload)), data, size);
    return std::optional<Envelope>(std::move(env));
  }

  Status send(const std::string& peer, const std::string& payload) override {
    if (peer.empty()) return unavailable("send: empty peer id");
    Status st = sendFrame(socket_, peer.data(), peer.size(), ZMQ_SNDMORE, "routing id");
    if (!st.isOk()) return st.withContext("peer " + peer);
    // Once the routing id is accepted, ROUTER queues the rest of the message without blocking.
    return sendFrame(socket_, payload.data(), payload.size(), 0, "payload");
  }

  Status send(const std::string& peer, const std::string& payload,
              std::shared_ptr<const std::string> attachment) override {
    return send(peer, payload, std::vector<std::shared_ptr<const std::string>>{attachment});
  }

  Status send(const std::string& peer, const std::string& payload,
              const std::vector<std::shared_ptr<const std::string>>& attachments) override {
    FEDFLEET_CHECK(!attachments.empty());
    for (const auto& a : attachments) FEDFLEET_CHECK(a != nullptr);
    if (peer.empty()) return unavailable("send: empty peer id");
    Status st = sendFrame(socket_, peer.data(), peer.size(), ZMQ_SNDMORE, "routing id");
    if (!st.isOk()) return st.withContext("peer " + peer);
    FEDFLEET_RETURN_IF_ERROR(
        sendFrame(socket_, payload.data(), payload.size(), ZMQ_SNDMORE, "payload"));
    for (size_t i = 0; i < attachments.size(); ++i) {
      FEDFLEET_RETURN_IF_ERROR(sendAttachment(socket_, attachments[i], i + 1 < attachments.size()));
    }
    return Status::ok();
  }

  std::vector<AuthEvent> takeAuthEvents() override {
    std::vector<AuthEvent> out = zap_ ? zap_->takeEvents() : std::vector<AuthEvent>();
    for (auto& e : handshake_failures_) out.push_back(std::move(e));
    handshake_failures_.clear();
    return out;
  }

  std::string boundEndpoint() const override { return bound_endpoint_; }

  Status disconnect(const std::string& peer) override {
    auto p = fd_of_peer_.find(peer);
    if (p == fd_of_peer_.end()) return notFound("no connection " + printableRoutingId(peer));
    auto c = connections_.find(p->second);
    if (c == connections_.end()) return notFound("no connection " + printableRoutingId(peer));
    if (!c->second.closing) {
      // A moment's grace first, so that what was just sent to it (an Error, a Bye) goes out.
      c->second.closing = true;
      c->second.shutdown_at = Clock::now() + kDisconnectGrace;
    }
    return Status::ok();
  }

  std::vector<ConnectionClosed> takeClosedConnections() override {
    housekeeping();
    return std::exchange(closed_, {});
  }

  uint64_t framesRefused() const override { return frames_refused_; }

  std::vector<ConnectionRefusals> takeRefusals() override {
    housekeeping();
    std::vector<ConnectionRefusals> out;
    out.reserve(refusals_.size());
    for (const auto& [key, count] : refusals_) out.push_back({key.first, key.second, count});
    refusals_.clear();
    refusal_hosts_.clear();
    return out;
  }

  void reloadAllowList() override {
    if (zap_) zap_->reload();
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kDisconnectGrace{200};
  static constexpr std::chrono::milliseconds kSettle{250};
  // How often the descriptors in use are counted (/proc/self/fd); between counts each
  // accepted connection adds two.
  static constexpr std::chrono::milliseconds kDescriptorRecount{100};
  static constexpr size_t kMaxRefusalHosts = 256;
  static constexpr size_t kMaxClosedReports = 4096;
  static constexpr const char* kUnknownAddress = "an address not known";

  struct Connection {
    int dup_fd = -1;
    uint64_t order = 0;      // accept order: lower is older
    std::string address;     // "ip:port" (kUnknownAddress until verified)
    std::string host;        // the address without its port
    std::string peer;        // routing id, once a message came
    std::string key;         // CURVE key (User-Id) of its messages; empty when insecure
    bool verified = false;   // the duplicate is known to be this connection's (drainMonitor)
    bool admitted = false;   // checked by the admission limits and kept
    bool delivered = false;  // a message came: it authenticated
    bool counted = false;    // in unauthenticated_ / unauthenticated_by_host_
    std::optional<RefusalCause> refused;  // closed by a limit
    bool closing = false;                 // disconnect() asked for it
    bool shut = false;                    // our duplicate is shut down
    bool gone = false;                    // ZeroMQ reported it disconnected
    Clock::time_point accepted_at{};
    Clock::time_point gone_at{};
    Clock::time_point shutdown_at{};
  };

  static std::chrono::milliseconds firstMessageTimeout(const ServerOptions& options) {
    if (options.first_message_timeout_ms < 0) return std::chrono::milliseconds(0);
    if (options.first_message_timeout_ms > 0) {
      return std::chrono::milliseconds(options.first_message_timeout_ms);
    }
    return std::chrono::milliseconds(2 * int64_t{std::max(0, options.handshake_timeout_ms)});
  }

  static uint64_t randomSeed() {
    std::random_device device;
    return (uint64_t{device()} << 32) ^ device();
  }

  // "ip:port" and "ip" of the connection of `fd` ("[v6]:port" and "[v6]").
  static std::pair<std::string, std::string> addressOf(int fd) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return {kUnknownAddress, kUnknownAddress};
    }
    char host[INET6_ADDRSTRLEN] = "?";
    if (addr.ss_family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
      return {std::string(host) + ":" + std::to_string(ntohs(a->sin_port)), host};
    }
    if (addr.ss_family == AF_INET6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
      const std::string bracketed = "[" + std::string(host) + "]";
      return {bracketed + ":" + std::to_string(ntohs(a->sin6_port)), bracketed};
    }
    return {"local", "local"};
  }

  // Ties `peer` (with CURVE key `key`) to the connection of descriptor `fd` (from ZMQ_SRCFD;
  // -1 when unknown); its first message marks the connection authenticated.
  //
  // The descriptor names the connection libzmq read the message from, but the message may be
  // read here after that connection closed and its descriptor went to a newer one (a routing id
  // never changes during a connection's life). So a routing id is tied to a connection only
  // when the connection has none yet; a different routing id on a connection that has one is
  // a message of an earlier connection of that descriptor and ties nothing.
  void notePeer(const std::string& peer, const std::string& key, int fd) {
    if (fd < 0) return;
    auto c = connections_.find(fd);
    if (c == connections_.end() || !c->second.verified) {
      // The ACCEPTED report may still be queued. The connection delivered a message: it is
      // past the limits of unauthenticated connections.
      delivering_fd_ = fd;
      drainMonitor();
      delivering_fd_ = -1;
      c = connections_.find(fd);
      if (c == connections_.end() || !c->second.verified) {
        // Its ACCEPTED report was not queued yet, or the connection ended before this message
        // was read. Should the next ACCEPTED(fd) find the descriptor closed, the connection
        // this message came on has ended, and its close is said under `peer` (else it would
        // never be; with the descriptor open it may be a newer connection's: nothing is tied,
        // the peer's next message ties its connection).
        if (c == connections_.end() && pending_ties_.size() < kMaxPendingTies) {
          pending_ties_[fd] = {peer, Clock::now()};
        }
        return;
      }
    }
    tiePeer(fd, c->second, peer, key);
  }

  void tiePeer(int fd, Connection& conn, const std::string& peer, const std::string& key) {
    if (conn.peer == peer) return;
    if (!conn.peer.empty()) return;  // an earlier connection's message (see above)
    if (auto p = fd_of_peer_.find(peer); p != fd_of_peer_.end() && p->second != fd) {
      // A routing id a peer chose again (plain text) on a new connection: the old one must be
      // gone, else ZeroMQ would have ignored the new one.
      auto old = connections_.find(p->second);
      if (old != connections_.end() && !old->second.gone) {
        drainMonitor();
        old = connections_.find(p->second);
      }
      if (old != connections_.end() && !old->second.gone) return;
      fd_of_peer_.erase(p);
    }
    conn.peer = peer;
    conn.key = key;
    fd_of_peer_[peer] = fd;
    if (!conn.delivered) {
      conn.delivered = true;
      uncount(conn);
      if (!conn.refused) limitPerKey(fd, conn);
    }
  }

  // Past max_connections_per_key connections of the key of `newest` (which just authenticated):
  // closes the oldest of them.
  void limitPerKey(int newest_fd, const Connection& newest) {
    const uint32_t cap = admission_.options().max_connections_per_key;
    if (cap == 0 || newest.key.empty()) return;
    std::vector<std::pair<uint64_t, int>> same;  // (order, fd) of the key's open connections
    for (const auto& [fd, c] : connections_) {
      if (c.key == newest.key && c.delivered && !c.gone && !c.closing && !c.refused) {
        same.push_back({c.order, fd});
      }
    }
    if (same.size() <= cap) return;
    std::sort(same.begin(), same.end());
    for (size_t i = 0; i + cap < same.size(); ++i) {
      if (same[i].second == newest_fd) continue;
      refuse(connections_.at(same[i].second), RefusalCause::kPerKeyLimit);
    }
  }

  // Waits up to `timeout_ms` (< 0: no limit) for a message on the socket, taking connection
  // reports as they come rather than only between messages: a connection's descriptor has to
  // be duplicated before ZeroMQ closes it, and a refused frame closes it within milliseconds
  // of its handshake. A loop that slept through that (200 ms between messages) missed the
  // connection, and with it the report of the refused frame. True when a message is there,
  // or when the poll failed (receiveFrames then says why).
  bool waitForMessage(int timeout_ms) {
    const auto until = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
    while (true) {
      zmq_pollitem_t items[2] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                                 {monitor_ ? monitor_.handle() : nullptr, 0, ZMQ_POLLIN, 0}};
      int wait = -1;
      if (timeout_ms >= 0) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
        wait = static_cast<int>(std::max<int64_t>(left.count(), 0));
      }
      // Time limits fall due while nothing arrives: wake for them too.
      if (unauthenticated_ > 0) wait = wait < 0 ? 100 : std::min(wait, 100);
      const int rc = zmq_poll(items, monitor_ ? 2 : 1, wait);
      if (rc < 0) return true;
      if (items[0].revents & ZMQ_POLLIN) return true;
      if (monitor_ && (items[1].revents & ZMQ_POLLIN)) drainMonitor();
      enforceTimeLimits();
      if (timeout_ms >= 0 && Clock::now() >= until) return false;
      if (wait == 0) return false;
    }
  }

  void housekeeping() {
    drainMonitor();
    enforceTimeLimits();
    settleClosed();
    const auto now = Clock::now();
    for (auto& [fd, c] : connections_) {
      if (c.closing && !c.shut && !c.gone && now >= c.shutdown_at) {
        ::shutdown(c.dup_fd, SHUT_RDWR);
        c.shut = true;
      }
    }
  }

  // Reads the monitor's reports up to the last one queued.
  //
  // Descriptors are reused: ZeroMQ reports a connection's DISCONNECTED before it closes the
  // descriptor, and the next connection accepted may get the same number at once. And libzmq
  // 4.3 reports ACCEPTED only after it has handed the connection to an I/O thread, which may
  // have found it broken, reported DISCONNECTED and closed it first. What does hold, per
  // descriptor: the two reports of one connection come before any report of the next one on
  // that descriptor (its close comes before the next accept, its ACCEPTED before the listener
  // accepts again). So a DISCONNECTED(fd) with no open connection of fd is the next
  // connection's, which ended before its ACCEPTED (nothing is duplicated for it then). And a
  // report of ACCEPTED(fd) read late may find fd closed, or another connection's: a duplicate
  // is known to be right once the queue was read empty after it was taken without a
  // DISCONNECTED(fd) in between (that report comes before the close, so the close had not
  // happened when the duplicate was taken); until then it is unverified, and a connection
  // whose DISCONNECTED comes first is closed without reading anything from the duplicate
  // (address not known). Connections are checked against the admission limits only once
  // verified.
  void drainMonitor() {
    bool emptied = false;
    while (monitor_) {
      zmq::message_t event;
      if (zmq_msg_recv(event.handle(), monitor_.handle(), ZMQ_DONTWAIT) < 0) {
        emptied = zmq_errno() == EAGAIN;
        break;
      }
      const bool more = event.more();
      if (more) {  // the event's second frame: the endpoint
        zmq::message_t endpoint;
        zmq_msg_recv(endpoint.handle(), monitor_.handle(), ZMQ_DONTWAIT);
      }
      if (event.size() < 6) continue;
      uint16_t id;
      int32_t fd;
      std::memcpy(&id, event.data(), 2);
      std::memcpy(&fd, event.data<char>() + 2, 4);
      if (id == ZMQ_EVENT_ACCEPTED) {
        onAccepted(fd);
      } else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
                 id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
        // The value is the protocol error (or errno), not a descriptor: the connection is the
        // one ZeroMQ disconnects next without it ever having sent a message.
        if (unattributed_failures_.size() >= kMaxHandshakeReports) {
          unattributed_failures_.erase(unattributed_failures_.begin());
        }
        unattributed_failures_.push_back(handshakeFailure(id, static_cast<uint32_t>(fd)));
      } else if (id == ZMQ_EVENT_DISCONNECTED) {
        onDisconnected(fd);
      }
    }
    if (!emptied) return;
    for (int fd : unverified_) {
      auto c = connections_.find(fd);
      if (c != connections_.end() && !c->second.gone) c->second.verified = true;
    }
    unverified_.clear();
    admitVerified();
  }

  void onAccepted(int fd) {
    if (auto old = connections_.find(fd); old != connections_.end()) {
      // Its DISCONNECTED came before (ZeroMQ reports it before closing the descriptor).
      closeConnection(
          old, old->second.verified && old->second.gone ? causeOf(old->second) : "peer_closed");
    }
    // The routing id of a message read from fd before this report (see notePeer).
    std::optional<std::string> tie;
    if (auto t = pending_ties_.find(fd); t != pending_ties_.end()) {
      if (Clock::now() - t->second.second < kPendingTieLife) tie = std::move(t->second.first);
      pending_ties_.erase(t);
    }
    // Ended before it was reported accepted: fd is closed, or already another connection's.
    if (ended_before_accept_.erase(fd) > 0) {
      if (tie) reportClosedUntracked(*tie);
      return;
    }
    Connection c;
    c.dup_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    const int dup_errno = errno;
    if (c.dup_fd < 0) untracked_.insert(fd);  // its DISCONNECTED report is then passed over
    if (c.dup_fd < 0 && dup_errno == EBADF) {
      // Closed already: this report was read after ZeroMQ closed the connection (its
      // DISCONNECTED is queued behind), so there is nothing to watch.
      if (tie) reportClosedUntracked(*tie);
      return;
    }
    if (c.dup_fd < 0) {
      // Out of descriptors (the reserve should prevent it): this connection cannot be watched
      // or closed here; ZeroMQ's handshake timeout still applies.
      if (!dup_failure_logged_) {
        spdlog::warn(
            "server: cannot duplicate an accepted connection's descriptor ({}); it is "
            "not tracked",
            std::strerror(dup_errno));
        dup_failure_logged_ = true;
      }
      return;
    }
    c.order = ++accepted_;
    std::tie(c.address, c.host) = addressOf(c.dup_fd);
    c.accepted_at = Clock::now();
    connections_.emplace(fd, std::move(c));
    unverified_.push_back(fd);
    ++accepted_since_count_;
  }

  // `peer`'s connection closed before it could be watched: said as any close is, without an
  // address, unless the peer has another connection now.
  void reportClosedUntracked(const std::string& peer) {
    if (auto p = fd_of_peer_.find(peer); p != fd_of_peer_.end()) return;
    if (closed_.size() >= kMaxClosedReports) closed_.erase(closed_.begin());
    closed_.push_back({peer, kUnknownAddress, "peer_closed"});
  }

  void onDisconnected(int fd) {
    auto c = connections_.find(fd);
    const bool tracked = c != connections_.end() && !c->second.gone;
    std::optional<std::string> failure;
    // A connection that completed its handshake (it had a message, or was closed for silence
    // after the handshake timeout) had no failure reported.
    const bool handshaken = tracked && (c->second.delivered ||
                                        c->second.refused == RefusalCause::kSilentAfterHandshake);
    if (!handshaken && !unattributed_failures_.empty()) {
      failure = std::move(unattributed_failures_.front());
      unattributed_failures_.erase(unattributed_failures_.begin());
    }
    if (!tracked) {
      // Not the connection tracked under fd (none is, or it ended): an untracked one, or the
      // next one, ended before its ACCEPTED report.
      if (untracked_.erase(fd) == 0) ended_before_accept_.insert(fd);
      if (failure) reportHandshakeFailure(kUnknownAddress, std::move(*failure));
      return;
    }
    Connection& conn = c->second;
    uncount(conn);
    if (!conn.verified) {
      // The duplicate may be another connection's (see drainMonitor): read nothing from it.
      std::erase(unverified_, fd);
      conn.address = conn.host = kUnknownAddress;
      if (failure && !conn.refused) reportHandshakeFailure(kUnknownAddress, std::move(*failure));
      closeConnection(c, conn.refused ? "refused" : conn.closing ? "by_server" : "peer_closed");
      return;
    }
    if (!conn.delivered && !conn.refused && !conn.closing && handshake_timeout_.count() > 0 &&
        Clock::now() - conn.accepted_at >= handshake_timeout_ - kTimerSlack && failure) {
      // libzmq's handshake timer closed it (ZMQ_HANDSHAKE_IVL): a limit, not a refused key.
      conn.refused = RefusalCause::kHandshakeTimeout;
      countRefusal(conn.host, RefusalCause::kHandshakeTimeout);
    } else if (failure && !conn.refused) {
      reportHandshakeFailure(conn.address, std::move(*failure));
    }
    // ZeroMQ is done with it; keep the duplicate a moment to see whether the peer was still
    // sending (a refused frame's bytes keep arriving), then say why it ended.
    conn.gone = true;
    conn.gone_at = Clock::now();
  }

  void reportHandshakeFailure(const std::string& address, std::string reason) {
    if (handshake_failures_.size() >= kMaxHandshakeReports) return;
    AuthEvent e;
    e.kind = AuthEvent::kHandshakeFailed;
    e.peer_address = address;
    e.reason = std::move(reason);
    handshake_failures_.push_back(std::move(e));
  }

  // Descriptors in use: counted at most every kDescriptorRecount, plus two for each connection
  // accepted since (libzmq's and the duplicate).
  uint64_t openDescriptors() {
    const auto now = Clock::now();
    if (now - descriptors_counted_at_ >= kDescriptorRecount) {
      if (auto n = countOpenDescriptors()) {
        open_descriptors_ = *n;
        descriptors_counted_at_ = now;
        accepted_since_count_ = 0;
        const uint64_t soft = descriptorLimit().soft;
        descriptor_limit_ = soft == UINT64_MAX ? 0 : soft;
      }
    }
    return open_descriptors_ + 2 * accepted_since_count_;
  }

  // Checks the connections verified since the last call, oldest first, against the admission
  // limits; refused ones are shut down at once.
  void admitVerified() {
    std::vector<std::pair<uint64_t, int>> fresh;
    for (const auto& [fd, c] : connections_) {
      if (c.verified && !c.admitted && !c.gone && !c.refused) fresh.push_back({c.order, fd});
    }
    std::sort(fresh.begin(), fresh.end());
    for (const auto& [order, fd] : fresh) {
      Connection& c = connections_.at(fd);
      c.admitted = true;
      // A message came first: it authenticated.
      if (c.delivered || c.closing || fd == delivering_fd_) continue;
      const auto host = unauthenticated_by_host_.find(c.host);
      const uint64_t from_host = host == unauthenticated_by_host_.end() ? 0 : host->second;
      if (auto cause =
              admission_.admit(unauthenticated_, from_host, openDescriptors(), descriptor_limit_)) {
        refuse(c, *cause);
        continue;
      }
      count(c);
    }
  }

  // Closes unauthenticated connections past their time, and the oldest ones while the
  // descriptors in use are within the reserve.
  void enforceTimeLimits() {
    if (unauthenticated_ == 0) return;
    const auto now = Clock::now();
    if (first_message_timeout_.count() > 0) {
      for (auto& [fd, c] : connections_) {
        if (c.counted && now - c.accepted_at >= first_message_timeout_) {
          refuse(c, RefusalCause::kSilentAfterHandshake);
        }
      }
    }
    if (descriptor_limit_ == 0 || !admission_.overReserve(openDescriptors(), descriptor_limit_)) {
      return;
    }
    // Each one closed frees two descriptors once ZeroMQ has closed its own.
    const uint64_t low_water = descriptor_limit_ - admission_.reserveFor(descriptor_limit_);
    uint64_t excess = openDescriptors() - low_water + 1;
    std::vector<std::pair<uint64_t, int>> oldest;
    for (const auto& [fd, c] : connections_) {
      if (c.counted) oldest.push_back({c.order, fd});
    }
    std::sort(oldest.begin(), oldest.end());
    for (const auto& [order, fd] : oldest) {
      if (excess == 0) break;
      refuse(connections_.at(fd), RefusalCause::kDescriptorReserve);
      excess = excess > 2 ? excess - 2 : 0;
    }
  }

  void count(Connection& c) {
    if (c.counted) return;
    c.counted = true;
    ++unauthenticated_;
    ++unauthenticated_by_host_[c.host];
  }

  void uncount(Connection& c) {
    if (!c.counted) return;
    c.counted = false;
    --unauthenticated_;
    auto h = unauthenticated_by_host_.find(c.host);
    if (h != unauthenticated_by_host_.end() && --h->second == 0) unauthenticated_by_host_.erase(h);
  }

  // Closes `c` now for `cause` (ZeroMQ sees the peer hang up) and counts the refusal.
  void refuse(Connection& c, RefusalCause cause) {
    if (c.refused || c.gone) return;
    uncount(c);
    c.refused = cause;
    if (!c.shut) {
      ::shutdown(c.dup_fd, SHUT_RDWR);
      c.shut = true;
    }
    countRefusal(c.host, cause);
  }

  void countRefusal(const std::string& host, RefusalCause cause) {
    std::string key = host;
    if (refusal_hosts_.count(host) == 0) {
      if (refusal_hosts_.size() >= kMaxRefusalHosts) {
        key = "other hosts";
      } else {
        refusal_hosts_.insert(host);
      }
    }
    ++refusals_[{key, cause}];
  }

  // What a failed handshake means, for the operator.
  std::string handshakeFailure(uint16_t id, uint32_t value) const {
    if (id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
      const int err = static_cast<int>(value);
      if (err == EPIPE || err == ECONNRESET) {
        // The peer hung up mid-handshake: what a client of the other mechanism does once it
        // reads this side's greeting, and what a scanner or a non-ZMTP client does.
        return insecure_ ? "the client closed the connection during the handshake (a CURVE "
                           "client at this plain-text coordinator, or not a fedfleet client)"
                         : "the client closed the connection during the CURVE handshake (a "
                           "plain-text --insecure client, or not a fedfleet client)";
      }
      return "handshake failed (" + zmqText(err) + ")";
    }
    switch (value) {
      case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return insecure_ ? "the client speaks CURVE and this coordinator plain text (--insecure): "
                           "run both with CURVE, or both with --insecure"
                         : "plain text: the client has no CURVE keys (it runs --insecure?); give "
                           "it its key pair and this coordinator's public key";
      case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return "CURVE handshake failed: the client holds another coordinator public key (give "
               "it this coordinator's keys/coordinator.key)";
      default: {
        char code[16];
        std::snprintf(code, sizeof code, "0x%08x", value);
        return std::string("ZMTP protocol error ") + code + ": not a fedfleet client?";
      }
    }
  }

  // Why a connection ZeroMQ closed ended (see the top of this file). Reads the duplicate, so
  // only for a verified connection.
  std::string causeOf(const Connection& c) const {
    if (c.refused) return "refused";
    if (c.closing) return "by_server";
    int unread = 0;
    const bool pending = ::ioctl(c.dup_fd, FIONREAD, &unread) == 0 && unread > 0;
    return pending ? "unread_input" : "peer_closed";
  }

  // Closes the connections ZeroMQ dropped, once their input had kSettle to show up (at once
  // when some has, or when a limit closed them).
  void settleClosed() {
    const auto now = Clock::now();
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto next = std::next(it);
      if (it->second.gone) {
        const std::string cause = causeOf(it->second);
        if (cause != "peer_closed" || now - it->second.gone_at >= kSettle) {
          closeConnection(it, cause);
        }
      }
      it = next;
    }
  }

  void closeConnection(std::map<int, Connection>::iterator c, const std::string& cause) {
    Connection& conn = c->second;
    uncount(conn);
    const std::string who = conn.peer.empty() ? "" : " (" + printableRoutingId(conn.peer) + ")";
    if (cause == "unread_input") {
      ++frames_refused_;
      spdlog::warn(
          "server: ZeroMQ dropped the connection from {}{} with input unread: a frame over the "
          "size limit ({} bytes, transport max_message_bytes) or a broken ZMTP stream",
          conn.address, who, max_message_bytes_);
    } else {
      spdlog::debug("server: connection from {}{} closed ({})", conn.address, who, cause);
    }
    // A connection refused before it sent anything concerns no caller (takeRefusals() counts
    // it); the rest are kept for takeClosedConnections(), the latest kMaxClosedReports.
    if (cause != "refused" || !conn.peer.empty()) {
      if (closed_.size() >= kMaxClosedReports) closed_.erase(closed_.begin());
      closed_.push_back({conn.peer, conn.address, cause});
    }
    if (!conn.peer.empty()) {
      auto p = fd_of_peer_.find(conn.peer);
      if (p != fd_of_peer_.end() && p->second == c->first) fd_of_peer_.erase(p);
    }
    ::close(conn.dup_fd);
    connections_.erase(c);
  }

  // A timer firing a little early, or the accept reported a little late, still counts as the
  // handshake timeout.
  static constexpr std::chrono::milliseconds kTimerSlack{250};

  // Constant after construction.
  zmq::context_t context_;
  const bool insecure_;
  const uint64_t max_message_bytes_;
  const std::chrono::milliseconds handshake_timeout_;      // 0: none
  const std::chrono::milliseconds first_message_timeout_;  // 0: none
  std::unique_ptr<ZapAuthenticator> zap_;                  // null when insecure
  std::string bound_endpoint_;

  // Owned by the caller's thread.
  zmq::socket_t socket_;
  zmq::socket_t monitor_;  // ACCEPTED / DISCONNECTED reports of socket_
  ConnectionAdmission admission_;
  std::map<int, Connection> connections_;  // by libzmq's descriptor
  std::vector<int> unverified_;            // descriptors duplicated since the queue was empty
  std::set<int> ended_before_accept_;      // DISCONNECTED came first: skip their ACCEPTED
  std::set<int> untracked_;                // ACCEPTED, but no duplicate could be made
  // The routing id of a message read from a descriptor no tracked connection had, and when
  // (see notePeer); taken by that descriptor's next ACCEPTED report.
  std::map<int, std::pair<std::string, Clock::time_point>> pending_ties_;
  static constexpr size_t kMaxPendingTies = 4096;
  static constexpr std::chrono::seconds kPendingTieLife{10};
  std::map<std::string, int> fd_of_peer_;  // routing id -> descriptor
  uint64_t accepted_ = 0;
  uint64_t unauthenticated_ = 0;  // verified, admitted, no message yet, not closing
  std::map<std::string, uint64_t> unauthenticated_by_host_;
  uint64_t open_descriptors_ = 0;
  uint64_t accepted_since_count_ = 0;
  uint64_t descriptor_limit_ = 0;  // soft RLIMIT_NOFILE; 0: unlimited or unknown
  Clock::time_point descriptors_counted_at_{};
  bool dup_failure_logged_ = false;
  int delivering_fd_ = -1;  // notePeer's connection while it drains the monitor
  std::vector<ConnectionClosed> closed_;
  std::map<std::pair<std::string, RefusalCause>, uint64_t> refusals_;  // since takeRefusals()
  std::set<std::string> refusal_hosts_;
  // Failed handshakes: reported (why) and not yet matched to the connection they closed, and
  // matched ones waiting for takeAuthEvents(), at most kMaxHandshakeReports of them between
  // two calls (a flood is counted by the caller's aggregate, not stored).
  static constexpr size_t kMaxHandshakeReports = 1024;
  std::vector<std::string> unattributed_failures_;
  std::vector<AuthEvent> handshake_failures_;
  uint64_t frames_refused_ = 0;
};

// ---------------------------------------------------------------------------------------------

// libzmq 4.3 ends a connection for good when the ZAP handler refuses its key: the DEALER never
// reconnects, and later sends block. So that a client whose key is added to the allow-list
// later gets in without a restart, the client watches its handshakes (a socket monitor) and,
// after a refusal, replaces the socket after reconnect_ivl_max_ms. Until then send() fails fast
// with kPermissionDenied.
class ZmqClientTransport final : public ClientTransport {
 public:
  explicit ZmqClientTransport(const ClientOptions& options)
      : options_(options), context_(std::max(1, options.io_threads)) {}

  ~ZmqClientTransport() override {
    closeSocket();
    context_.close();
  }

  // Creates the DEALER socket (and its handshake monitor) and connects it.
  Status open() {
    try {
      socket_ = zmq::socket_t(context_, zmq::socket_type::dealer);
      socket_.set(zmq::sockopt::linger, 0);
      socket_.set(zmq::sockopt::sndhwm, options_.send_hwm);
      socket_.set(zmq::sockopt::rcvhwm, kHighWaterMark);
      socket_.set(zmq::sockopt::sndtimeo, std::max(0, options_.send_timeout_ms));
      socket_.set(zmq::sockopt::maxmsgsize,
                  socketSizeLimit(options_.max_message_bytes, !options_.insecure));
      socket_.set(zmq::sockopt::reconnect_ivl, std::max(1, options_.reconnect_ivl_ms));
      socket_.set(zmq::sockopt::reconnect_ivl_max, std::max(0, options_.reconnect_ivl_max_ms));
      setHeartbeats(socket_, options_.heartbeat_ivl_ms, options_.heartbeat_timeout_ms);
      if (!options_.routing_id.empty()) socket_.set(zmq::sockopt::routing_id, options_.routing_id);
      if (!options_.insecure) {
        socket_.set(zmq::sockopt::curve_serverkey, options_.server_public_key);
        socket_.set(zmq::sockopt::curve_publickey, options_.client_keys.public_key);
        socket_.set(zmq::sockopt::curve_secretkey, options_.client_keys.secret_key);
      }
      // One monitor endpoint per socket generation; inproc names are per context.
      const std::string monitor_endpoint =
          "inproc://fedfleet-client-monitor-" + std::to_string(++generation_);
      if (zmq_socket_monitor(
              socket_.handle(), monitor_endpoint.c_str(),
              ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_CONNECTED |
                  ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                  ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_DISCONNECTED) != 0) {
        return internalError("socket monitor: " + zmqText(zmq_errno()));
      }
      monitor_ = zmq::socket_t(context_, zmq::socket_type::pair);
      monitor_.set(zmq::sockopt::linger, 0);
      monitor_.connect(monitor_endpoint);
    } catch (const zmq::error_t& e) {
      return internalError(std::string("configuring client socket: ") + e.what());
    }
    if (zmq_connect(socket_.handle(), options_.endpoint.c_str()) != 0) {
      return endpointError("connect", options_.endpoint, zmq_errno());
    }
    return Status::ok();
  }

  Result<std::optional<Delivery>> receive(int timeout_ms) override {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(0, timeout_ms));
    while (true) {
      FEDFLEET_RETURN_IF_ERROR(checkRefusal());
      int wait_ms = timeout_ms < 0 ? -1 : remainingMs(deadline);
      if (refused_)
        wait_ms = wait_ms < 0 ? remainingMs(retry_at_) : std::min(wait_ms, remainingMs(retry_at_));
      zmq_pollitem_t items[2] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                                 {monitor_.handle(), 0, ZMQ_POLLIN, 0}};
      const int rc = zmq_poll(items, monitor_ ? 2 : 1, wait_ms);
      if (rc < 0) {
        if (zmq_errno() == EINTR) return std::optional<Delivery>();
        return unavailable("poll: " + zmqText(zmq_errno()));
      }
      if (items[0].revents & ZMQ_POLLIN) {
        FEDFLEET_ASSIGN_OR_RETURN(std::optional<Frames> frames,
                                  receiveFrames(socket_, 0, /*keep_parts=*/SIZE_MAX));
        if (frames) return unpack(*frames);
      }
      if (timeout_ms >= 0 && std::chrono::steady_clock::now() >= deadline) {
        return std::optional<Delivery>();
      }
    }
  }

  Status send(const std::string& payload) override {
    FEDFLEET_RETURN_IF_ERROR(checkRefusal());
    if (refused_) {
      return permissionDenied(
          "the coordinator refused this client's key (not in its allow-list); "
          "retrying in " +
          std::to_string(remainingMs(retry_at_)) + " ms");
    }
    return sendFrame(socket_, payload.data(), payload.size(), 0, "payload");
  }

 private:
  static int remainingMs(std::chrono::steady_clock::time_point until) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    return static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT_MAX));
  }

  void closeSocket() {
    monitor_.close();
    socket_.close();
  }

  // A Delivery from [payload] or [payload][attachment piece]...; nullopt (with a warning) for a
  // payload or attachment over max_message_bytes.
  Result<std::optional<Delivery>> unpack(const Frames& frames) {
    const zmq::message_t& payload = frames.parts[0];
    if (payload.size() > options_.max_message_bytes) {
      spdlog::warn("client: dropped a {}-byte message (limit {} bytes)", payload.size(),
                   options_.max_message_bytes);
      return std::optional<Delivery>();
    }
    Delivery delivery;
    if (frames.parts.size() > 1) {
      uint64_t total = 0;
      for (size_t i = 1; i < frames.parts.size(); ++i) total += frames.parts[i].size();
      if (total > options_.max_message_bytes) {
        spdlog::warn("client: dropped a message with a {}-byte attachment (limit {} bytes)", total,
                     options_.max_message_bytes);
        return std::optional<Delivery>();
      }
      std::string attachment;
      attachment.reserve(total);
      for (size_t i = 1; i < frames.parts.size(); ++i) {
        attachment.append(frames.parts[i].data<char>(), frames.parts[i].size());
      }
      delivery.attachment = std::move(attachment);
    }
    delivery.payload.assign(payload.data<char>(), payload.size());
    return std::optional<Delivery>(std::move(delivery));
  }

  // Reads pending handshake events; after a refusal, replaces the socket once retry_at_ passes.
  // Fails only if a new socket cannot be made.
  Status checkRefusal() {
    while (monitor_) {
      zmq::message_t event;
      if (zmq_msg_recv(event.handle(), monitor_.handle(), ZMQ_DONTWAIT) < 0) break;
      const bool more = event.more();
      if (event.size() >= 6) {
        uint16_t id;
        uint32_t value;
        std::memcpy(&id, event.data(), 2);
        std::memcpy(&value, event.data<char>() + 2, 4);
        noteEvent(id, value);
        if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH && !refused_ && !options_.insecure) {
          refused_ = true;
          const int delay_ms =
              std::max({kMinRetryMs, options_.reconnect_ivl_ms, options_.reconnect_ivl_max_ms});
          retry_at_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(delay_ms);
          spdlog::warn("client: {} refused this client's key (status {}); retrying in {} ms",
                       options_.endpoint, value, delay_ms);
        }
      }
      if (more) {  // the event's second frame: the endpoint
        zmq::message_t endpoint;
        zmq_msg_recv(endpoint.handle(), monitor_.handle(), ZMQ_DONTWAIT);
      }
    }
    if (refused_ && std::chrono::steady_clock::now() >= retry_at_) {
      closeSocket();
      refused_ = false;
      return open();
    }
    return Status::ok();
  }

  void noteEvent(uint16_t id, uint32_t value) {
    switch (id) {
      case ZMQ_EVENT_CONNECTED:
        ++connects_;
        break;
      case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        handshake_ok_ = true;
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        auth_refused_ = true;
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
          mechanism_mismatch_ = true;
        else
          protocol_error_ = true;
        break;
      case ZMQ_EVENT_DISCONNECTED:
        ++disconnects_;
        break;
      default:
        break;
    }
  }

 public:
  std::string diagnosis() const override {
    // Events still queued in the monitor are read by the next receive()/send().
    if (handshake_ok_) return "";
    if (connects_ == 0) {
      return "no TCP connection to " + options_.endpoint +
             " was ever made: is the coordinator running, and are the address and port right?";
    }
    // A plain-text client's handshake with a plain-text server cannot fail: connections closed
    // before it completed mean the coordinator speaks CURVE (libzmq does not always report the
    // mismatch as such).
    if (mechanism_mismatch_ ||
        (options_.insecure && (disconnects_ > 0 || protocol_error_ || connects_ > 1))) {
      return options_.insecure
                 ? "the coordinator speaks CURVE and this client plain text (--insecure): drop "
                   "--insecure and give the client its keys"
                 : "the coordinator speaks plain text (--insecure) and this client CURVE: run "
                   "both with CURVE, or both with --insecure";
    }
    if (auth_refused_) {
      return "the coordinator refused this client's key: it is not in the coordinator's "
             "allow-list (copy this client's .key file into the coordinator's keys/clients/)";
    }
    if (!options_.insecure && (disconnects_ > 0 || protocol_error_)) {
      return "the CURVE handshake never completed (" + std::to_string(connects_) +
             " connections closed by the coordinator): most likely a wrong coordinator public "
             "key (the client's coordinator.key must be the coordinator's)";
    }
    return "connected " + std::to_string(connects_) + " times but no handshake completed yet";
  }

 private:
  static constexpr int kMinRetryMs = 100;
  int connects_ = 0;
  int disconnects_ = 0;
  bool handshake_ok_ = false;
  bool auth_refused_ = false;
  bool mechanism_mismatch_ = false;
  bool protocol_error_ = false;

  const ClientOptions options_;
  zmq::context_t context_;
  zmq::socket_t socket_;
  zmq::socket_t monitor_;  // handshake events of socket_ (CURVE only)
  int generation_ = 0;
  bool refused_ = false;
  std::chrono::steady_clock::time_point retry_at_{};
};

Status checkCommon(const std::string& endpoint, int io_threads, uint64_t max_message_bytes) {
  if (endpoint.empty()) return invalidArgument("endpoint is empty");
  if (io_threads < 1) return invalidArgument("io_threads must be at least 1");
  if (max_message_bytes == 0) return invalidArgument("max_message_bytes must be positive");
  return Status::ok();
}

}  // namespace

std::string printableRoutingId(const std::string& id) {
  std::string out;
  for (unsigned char ch : id) {
    if (std::isprint(ch)) {
      out.push_back(static_cast<char>(ch));
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", ch);
      out += buf;
    }
  }
  return out;
}

Result<std::unique_ptr<ServerTransport>> createServer(const ServerOptions& options) {
  FEDFLEET_RETURN_IF_ERROR(
      checkCommon(options.endpoint, options.io_threads, options.max_message_bytes));
  if (options.receive_hwm < 0 || options.receive_hwm == 1) {
    // 1: with libzmq 4.3.4 a CURVE ROUTER delivered nothing at all in our test
    // (tests/common/transport/transport_test.cc, ShortReceiveQueueTest); 2 works.
    return invalidArgument("receive_hwm must be 0 (no limit) or at least 2, not " +
                           std::to_string(options.receive_hwm));
  }
  if (!options.insecure) {
    if (!zmq_has("curve")) return failedPrecondition("libzmq was built without CURVE support");
    if (!isZ85Key(options.server_keys.secret_key)) {
      return invalidArgument("server_keys: secret key is not a 40-character Z85 key");
    }
    if (!options.server_keys.public_key.empty()) {
      FEDFLEET_RETURN_IF_ERROR(checkKeyPair(options.server_keys, "server_keys"));
    }
    if (options.allow_dir.empty()) return invalidArgument("allow_dir is required unless insecure");
  }
  try {
    auto server = std::make_unique<ZmqServerTransport>(options);
    FEDFLEET_RETURN_IF_ERROR(server->start(options));
    return std::unique_ptr<ServerTransport>(std::move(server));
  } catch (const zmq::error_t& e) {
    return internalError(std::string("creating server: ") + e.what());
  } catch (const std::exception& e) {
    return internalError(std::string("creating server: ") + e.what());
  }
}

Result<std::unique_ptr<ClientTransport>> createClient(const ClientOptions& options) {
  FEDFLEET_RETURN_IF_ERROR(
      checkCommon(options.endpoint, options.io_threads, options.max_message_bytes));
  if (options.routing_id.size() > 255) return invalidArgument("routing_id is over 255 bytes");
  if (options.send_hwm < 0) return invalidArgument("send_hwm must not be negative");
  if (!options.routing_id.empty() && options.routing_id[0] == '\0') {
    return invalidArgument("routing_id must not start with a zero byte (reserved by ZeroMQ)");
  }
  if (!options.insecure) {
    if (!zmq_has("curve")) return failedPrecondition("libzmq was built without CURVE support");
    FEDFLEET_RETURN_IF_ERROR(checkKeyPair(options.client_keys, "client_keys"));
    if (!isZ85Key(options.server_public_key)) {
      return invalidArgument("server_public_key is not a 40-character Z85 key");
    }
  }
  try {
    auto client = std::make_unique<ZmqClientTransport>(options);
    FEDFLEET_RETURN_IF_ERROR(client->open());
    if (options.insecure) {
      spdlog::warn("plain-text transport: traffic is not encrypted (client to {})",
                   options.endpoint);
    }
    return std::unique_ptr<ClientTransport>(std::move(client));
  } catch (const zmq::error_t& e) {
    return internalError(std::string("creating client: ") + e.what());
  } catch (const std::exception& e) {
    return internalError(std::string("creating client: ") + e.what());
  }
}

}  // namespace fedfleet::transport
