// PeerMesh: one decentralised peer's connections to the other peers.
//
// Each peer binds one ROUTER (a ServerTransport): its CURVE server key is the peer's own key
// pair and its ZAP allow-list is the directory of peer public keys, so the sender of every
// message that arrives is the peer id that allow-list gives the sender's authenticated key
// (the key file's name), never anything the message says. To send, a peer dials the ROUTER of
// the target (one DEALER, a ClientTransport, per target, with the peer's own key pair and the
// target's public key from the rendezvous). Traffic is therefore one-way per connection:
// everything a peer receives comes in on its ROUTER, everything it sends leaves on a DEALER.
//
// Frames: one byte of kind ('H' heartbeat, 'D' data) and then the caller's bytes. Data is
// opaque here (common/wire encodes it); a frame of another kind, an empty frame, or a frame
// from a key that is not one of the peers set with setPeers() is dropped and counted.
//
// Liveness: every heartbeat_interval_ms the mesh sends a heartbeat to every peer it knows that
// is not down. Any frame from a peer counts as a sign of life. A peer from which nothing came
// for heartbeat_timeout_ms (counted from setPeers() for a peer never heard) is declared down:
// poll() reports it once (PeerEvent::kPeerDown), send() to it fails with kUnavailable from
// then on, and what it sends later is dropped. Down is final for the mesh's lifetime: the
// algorithms above (peer/) have already moved on without it.
//
// Bounds: data over max_message_bytes is refused by send() (kResourceExhausted) and dropped by
// the receiver (ZeroMQ closes the connection of a frame over the socket limit); at most
// send_hwm messages wait per target (send() then fails at once with kResourceExhausted rather
// than blocking the caller's loop), and at most receive_hwm per sender. Connections to the
// ROUTER are bounded before they authenticate, in number, per address and in time, and per key
// after (`admission`, `handshake_timeout_ms`; as the coordinator's, docs/ARCHITECTURE.md,
// "Connections"); what they close is counted (connectionsRefused()) and logged at most once a
// minute.
//
// Threading: a PeerMesh belongs to the thread that created it; every call must come from it.
// It includes no ZeroMQ header.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/transport/transport.h"

namespace fedfleet::transport {

// Where one peer listens: the address it bound and its CURVE public key (the rendezvous hands
// these out; the key is the one the coordinator authenticated for that peer).
struct PeerAddress {
  std::string id;          // the peer's id: its key file's name in the allow-list
  std::string endpoint;    // e.g. tcp://127.0.0.1:40123
  std::string public_key;  // Z85; empty when insecure
};

struct PeerMeshOptions {
  std::string self_id;  // this peer's id (a valid client id)
  std::string listen_endpoint = "tcp://127.0.0.1:0";
  bool insecure = false;  // plain text: anyone can be anyone (tests and trusted networks only)
  KeyPair keys;           // this peer's key pair; required unless insecure
  std::string allow_dir;  // peer public keys (*.key; name = peer id); required unless insecure
  uint64_t max_message_bytes = 64ull << 20;  // largest data message (the model's size bounds it)
  int heartbeat_interval_ms = 500;
  int heartbeat_timeout_ms = 3000;  // silent this long: down
  int send_hwm = 64;                // data messages queued per target
  int receive_hwm = 1000;           // messages queued per sender
  int io_threads = 1;
  // Connections to this peer's ROUTER before they authenticate, and per key: the coordinator's
  // limits (common/transport/connection_admission.h), scaled to a mesh, where each peer holds
  // one connection to each other peer and sends a heartbeat at once.
  AdmissionOptions admission{
      .max_unauthenticated = 64, .max_unauthenticated_per_host = 16, .max_connections_per_key = 2};
  int handshake_timeout_ms = 5000;  // ZMQ_HANDSHAKE_IVL
};

// What poll() reports.
struct PeerEvent {
  enum Kind { kMessage, kPeerDown };
  Kind kind = kMessage;
  std::string peer;     // the sender (kMessage) or the peer that went down (authenticated id)
  std::string payload;  // kMessage: the data
  std::string reason;   // kPeerDown: why, for logs and errors
};

class PeerMesh {
 public:
  // Binds the listening ROUTER. kInvalidArgument for options that cannot work (bad id, bad
  // keys, heartbeat timeout not above the interval, ...); the transport's errors for a bad
  // endpoint, an unreadable allow-list, an allow-list whose path others may change
  // (kPermissionDenied, as checkAllowListDir) or a port in use.
  static Result<std::unique_ptr<PeerMesh>> create(const PeerMeshOptions& options);
  ~PeerMesh();

  PeerMesh(const PeerMesh&) = delete;
  PeerMesh& operator=(const PeerMesh&) = delete;

  // The endpoint actually bound (a port of 0 resolved), which the rendezvous publishes.
  std::string boundEndpoint() const;
  const std::string& selfId() const { return options_.self_id; }

  // Sets the peers this mesh talks to (this peer's own entry, if present, is skipped): dials
  // each, starts their heartbeats and their liveness clocks. Only messages from these peers are
  // accepted. Call once; kFailedPrecondition on a second call. kInvalidArgument for an entry
  // with a bad id, a duplicate id, or (unless insecure) a bad public key. Until it is called,
  // poll() drops whatever arrives (no sender is known yet): a caller that expects messages
  // before its table should not poll before, and ZeroMQ keeps them queued meanwhile.
  Status setPeers(const std::vector<PeerAddress>& peers);

  // Queues `data` for `peer`. kNotFound: not a peer of setPeers(); kUnavailable: declared down;
  // kResourceExhausted: over max_message_bytes, or send_hwm messages already wait for it;
  // kPermissionDenied: the peer refused this peer's key.
  Status send(const std::string& peer, const std::string& data);

  // Waits up to `timeout_ms` (0: no wait) for something to report, sending heartbeats and
  // checking liveness meanwhile. Returns the messages that arrived (in order per sender) and
  // the peers newly declared down; empty on timeout. A non-OK Status only when the listening
  // socket failed.
  Result<std::vector<PeerEvent>> poll(int timeout_ms);

  // True when `peer` was declared down.
  bool isDown(const std::string& peer) const { return down_.count(peer) > 0; }
  // The peers of setPeers() not declared down, sorted.
  std::vector<std::string> livePeers() const;

  // Frames dropped: unknown sender, bad kind, over the size limit (including those ZeroMQ
  // refused).
  uint64_t framesDropped() const;
  // Refusals of keys not in the allow-list since the last call (ZAP), and what happened to the
  // allow-list directory: replaced, its path refused (the last list that passed stays in
  // force) or passing again (AuthEvent::kAllowList*; the directory's path is checked as
  // checkAllowListDir checks it at every read).
  std::vector<AuthEvent> takeAuthEvents();
  // Connections the ROUTER closed by its connection limits, in all.
  uint64_t connectionsRefused() const { return refused_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Target {
    PeerAddress address;
    std::unique_ptr<ClientTransport> link;  // DEALER to the target's ROUTER
    Clock::time_point last_heard;
  };

  explicit PeerMesh(PeerMeshOptions options, std::unique_ptr<ServerTransport> server);

  void sendHeartbeats(Clock::time_point now);
  void checkLiveness(Clock::time_point now, std::vector<PeerEvent>& events);
  // Counts the connections the ROUTER closed by a limit; logs them at most once a minute.
  void noteRefusals(Clock::time_point now);
  // Handles one received frame; appends a kMessage event for data.
  void accept(Envelope envelope, std::vector<PeerEvent>& events);

  // Constant after construction.
  const PeerMeshOptions options_;
  const std::unique_ptr<ServerTransport> server_;

  // Owned by the mesh's thread.
  bool peers_set_ = false;
  std::map<std::string, Target> targets_;  // by peer id
  std::set<std::string> down_;
  Clock::time_point next_heartbeat_{};
  uint64_t dropped_ = 0;
  static constexpr size_t kMaxAuthEvents = 1024;
  std::vector<AuthEvent> auth_events_;  // refusals seen by poll(), kept for takeAuthEvents()
  static constexpr std::chrono::seconds kRefusalLogInterval{60};
  uint64_t refused_ = 0;
  std::map<std::string, uint64_t> refused_since_log_;  // by cause name, since the last warning
  std::set<std::string> refused_hosts_;                // a few of their hosts
  Clock::time_point refusals_logged_at_{};
};

}  // namespace fedfleet::transport
