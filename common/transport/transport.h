// Message transport between coordinator and clients.
//
// The coordinator owns one ServerTransport (a ZeroMQ ROUTER socket); each client owns one
// ClientTransport (a DEALER). CURVE encryption is on unless `insecure` is set; the server
// authenticates clients against an allow-list directory of public keys through a ZAP handler
// and reports each refusal as an AuthEvent. Payloads are opaque bytes (common/wire encodes
// them). Nothing outside common/transport/ includes zmq.hpp.
//
// Attachments: the server can send a payload followed by an attachment, an immutable shared
// buffer that is not copied: ZeroMQ holds a reference to it (in pieces of kAttachmentPieceBytes)
// in the peer's queue until each piece is written, so one buffer sent to any number of clients
// costs one copy, not one per client. The client receives the payload and the attachment,
// joined again, as one Delivery.
//
// Threading: a transport object belongs to the thread that created it; all calls except
// ServerTransport::takeAuthEvents() (thread safe) must come from that thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/transport/connection_admission.h"

namespace fedfleet::transport {

// A CURVE key pair in Z85 text (40 characters each).
struct KeyPair {
  std::string public_key;
  std::string secret_key;
};

// Generates a fresh CURVE key pair (libzmq/libsodium).
Result<KeyPair> generateKeyPair();

// Writes `<dir>/<name>.key` (public, mode 0644) and `<dir>/<name>.key_secret` (secret, mode
// 0600), creating `dir` (mode 0700) if needed. Refuses to overwrite existing files unless
// `overwrite` (kFailedPrecondition). Files are text: `#` comment lines, then
// `public-key = "<Z85>"` (and `secret-key = "<Z85>"` in the secret file).
// kInvalidArgument for a bad name or keys that are not a matching Z85 pair.
Status writeKeyPair(const std::string& dir, const std::string& name, const KeyPair& keys,
                    bool overwrite = false);
// Reads a key pair written by writeKeyPair (`<dir>/<name>.key` and `.key_secret`). kNotFound
// for a missing file; kCorrupt for a file without a valid key or halves that do not match.
Result<KeyPair> readKeyPair(const std::string& dir, const std::string& name);
// Reads one public key file: the first non-comment line holding a 40-character Z85 key, either
// bare or as `public-key = "<key>"`. kNotFound if missing; kCorrupt if it holds no such key.
Result<std::string> readPublicKeyFile(const std::string& path);

// A client id: 1 to 128 characters of [A-Za-z0-9._@-], not starting with '.'. Allow-list file
// names, Hello messages and the history use the same rule.
bool isValidClientId(std::string_view id);

// A routing id (or any bytes a peer chose) as log text: printable bytes as they are, others as
// \xNN.
std::string printableRoutingId(const std::string& id);

// Start-up checks of the files that decide who may connect, as OpenSSH's StrictModes checks a
// user's keys: every directory from the file up to / must be owned by root or the user this
// process runs as and writable by no one else (a sticky directory such as /tmp is accepted above
// the key directory only), every symbolic link on the way owned by them too; the secret key file
// must be a regular file of theirs that group and others may not read or write, the allow-list
// directory one of theirs that group and others may not write (anyone who can add a file there,
// or rename a directory above it, can admit a key of their choice). kPermissionDenied naming the
// path at fault and the chown or chmod that fixes it; kNotFound when missing; kInvalidArgument
// when a path is not a file (directory) where one is expected.
Status checkSecretKeyFile(const std::string& path);
Status checkAllowListDir(const std::string& dir);

struct ServerOptions {
  std::string endpoint = "tcp://127.0.0.1:7700";  // bind address
  bool insecure = false;                          // plain text; logs a warning
  KeyPair server_keys;                            // required unless insecure
  std::string
      allow_dir;  // directory of allowed client public keys (*.key); required unless insecure
  // The largest payload a peer may send. ZMQ_MAXMSGSIZE is set from it, so libzmq refuses a
  // bigger frame at its header, before it buffers any of it, and closes the connection.
  uint64_t max_message_bytes = 512ull << 20;
  int heartbeat_ivl_ms = 1000;      // ZMQ_HEARTBEAT_IVL
  int heartbeat_timeout_ms = 5000;  // ZMQ_HEARTBEAT_TIMEOUT
  int io_threads = 2;               // CURVE runs on ZeroMQ's I/O threads
  // ZMQ_RCVHWM: messages queued per peer before ZeroMQ stops reading that peer's connection
  // (backpressure, nothing is dropped). While a peer's queue stays full its ZMTP heartbeats are
  // not read either: the server must read at least one message of it per heartbeat_timeout_ms,
  // or the connection times out. 0: no limit; 1 is refused (libzmq 4.3 stalls with it).
  int receive_hwm = 10000;
  // Connections before they authenticate, and per key (common/transport/connection_admission.h).
  AdmissionOptions admission;
  // ZMQ_HANDSHAKE_IVL: libzmq closes a connection whose ZMTP handshake (CURVE and the ZAP check
  // included) has not completed this long after it was accepted. 0: no limit.
  int handshake_timeout_ms = 5000;
  // A connection that has delivered no message this long after it was accepted is closed
  // (honest peers send one at once). 0: twice handshake_timeout_ms; negative: no limit.
  int first_message_timeout_ms = 0;
  // Seeds the random early drop; 0: a seed from std::random_device.
  uint64_t admission_seed = 0;
};

struct ClientOptions {
  std::string endpoint = "tcp://127.0.0.1:7700";  // coordinator address
  bool insecure = false;
  KeyPair client_keys;            // required unless insecure
  std::string server_public_key;  // required unless insecure
  // Empty (the default and what fedfleet's client uses): ZeroMQ picks one. The coordinator
  // never takes a routing id as an identity; a connection that chooses one already in use is
  // refused by ZeroMQ (no hand-over).
  std::string routing_id;
  uint64_t max_message_bytes = 512ull << 20;
  int heartbeat_ivl_ms = 1000;
  int heartbeat_timeout_ms = 5000;
  int reconnect_ivl_ms = 100;
  int reconnect_ivl_max_ms = 2000;
  int io_threads = 1;
  int send_timeout_ms = 5000;  // send() gives up with kTimeout (no connection, queue full)
  // ZMQ_SNDHWM: messages queued for the server before send() waits (then kTimeout).
  int send_hwm = 10000;
};

// Bytes a transport received, held without a copy: the received ZeroMQ message's own buffer
// (or a string's, for bytes made in-process). Read-only; copies share the buffer, which lives
// as long as the last of them.
class MessageBytes {
 public:
  MessageBytes() = default;
  // Takes `bytes` (no copy of its characters).
  MessageBytes(std::string bytes);  // NOLINT(google-explicit-constructor): tests compare strings
  // `size` bytes at `data`, kept alive by `owner`.
  MessageBytes(std::shared_ptr<const void> owner, const char* data, size_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {}

  const char* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  char operator[](size_t i) const { return data_[i]; }
  std::string_view view() const { return {data_, size_}; }
  operator std::string_view() const { return view(); }  // NOLINT(google-explicit-constructor)
  // A copy of the bytes.
  std::string str() const { return std::string(data_, size_); }

  friend bool operator==(const MessageBytes& a, std::string_view b) { return a.view() == b; }

 private:
  std::shared_ptr<const void> owner_;
  const char* data_ = "";
  size_t size_ = 0;
};

inline MessageBytes::MessageBytes(std::string bytes) {
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  data_ = owned->data();
  size_ = owned->size();
  owner_ = std::move(owned);
}

// A message received by the server.
struct Envelope {
  std::string peer;       // ZeroMQ routing id of the sender connection (an address, no identity)
  std::string user_id;    // CURVE public key (Z85) the ZAP handler authenticated; empty if insecure
  std::string client_id;  // the client id the allow-list gives that key; empty if insecure
  MessageBytes payload;   // ZeroMQ's buffer: decode it in place
};

// A connection refused by the ZAP handler.
// A message the client received: the payload and, when the server sent one, the attachment.
struct Delivery {
  std::string payload;
  std::optional<std::string> attachment;
};

// The attachment travels as frames of at most this many bytes. Under CURVE, libzmq encrypts a
// frame into a new buffer when it starts writing it and holds that buffer until the kernel has
// taken all of it, so the piece size bounds what each connection holds beyond the shared buffer.
// 64 KiB: a round sent to 50 clients then holds about 3 MiB of encrypted pieces, not 12.5 MiB
// as with 256 KiB (bench/coordinator_memory.sh).
constexpr size_t kAttachmentPieceBytes = 64 * 1024;

struct AuthEvent {
  // kRefused: the ZAP handler refused the key (or mechanism); kRevoked: a key left the
  // allow-list; kHandshakeFailed: the ZMTP handshake itself failed before any key was
  // checked (a plain-text client at a CURVE server or the other way round, a client holding
  // another coordinator public key, bytes that are not ZMTP).
  // The allow-list directory itself (common/transport/zap_authenticator.h): kAllowListReplaced,
  // its path names another directory, which passed the checks and was read;
  // kAllowListRefused, its path fails the checks of checkAllowListDir (the last list that
  // passed stays in force); kAllowListRestored, it passes them again.
  enum Kind {
    kRefused,
    kRevoked,
    kHandshakeFailed,
    kAllowListReplaced,
    kAllowListRefused,
    kAllowListRestored
  };
  Kind kind = kRefused;
  // Remote address: the IP address as ZAP reports it (kRefused), "ip:port" of the connection
  // (kHandshakeFailed; "an address not known" when the connection was gone before it could be
  // read), empty for the others.
  std::string peer_address;
  std::string public_key;  // Z85 public key that was refused or left the allow-list
  std::string client_id;   // kRevoked: the id the key had
  std::string reason;
};

// The events-table kind of an allow-list event ("allow_list_replaced", "allow_list_refused",
// "allow_list_restored"); nullptr for the other kinds.
const char* allowListEventName(AuthEvent::Kind kind);

// A connection that ended. `peer` is its routing id (empty when it never sent a message).
struct ConnectionClosed {
  std::string peer;
  std::string address;  // remote address ("an address not known" when it could not be read)
  // "by_server" (disconnect()), "refused" (closed by a limit: ConnectionRefusals says which),
  // "peer_closed" (the peer closed or its heartbeats stopped), or "unread_input": ZeroMQ
  // dropped it with bytes still unread, which is what a frame over the size limit (or a broken
  // ZMTP stream) does.
  std::string cause;
};

// Connections the server closed by a limit of ServerOptions::admission or a timeout, counted
// by source host and cause since the last takeRefusals().
struct ConnectionRefusals {
  std::string host;  // address without its port; "other hosts" past the hosts tracked
  RefusalCause cause = RefusalCause::kUnauthenticatedLimit;
  uint64_t count = 0;
};

class ServerTransport {
 public:
  virtual ~ServerTransport() = default;

  // Waits up to `timeout_ms` (0: poll, -1: forever) for one message. Returns std::nullopt on
  // timeout; a non-OK Status only if the socket failed (not for a peer's bad payload).
  virtual Result<std::optional<Envelope>> receive(int timeout_ms) = 0;

  // Queues `payload` to `peer`. kUnavailable when the peer is not connected (ROUTER_MANDATORY);
  // kTimeout when the peer's queue stays full for 5 s.
  virtual Status send(const std::string& peer, const std::string& payload) = 0;

  // Queues `payload` followed by `attachment` (not null) to `peer`, as one message that arrives
  // whole or not at all. The attachment is not copied: ZeroMQ keeps a reference to it until its
  // last piece is written (CURVE encrypts each piece then), so the caller must never modify it.
  // Errors as send(); after one, ZeroMQ has dropped its references.
  virtual Status send(const std::string& peer, const std::string& payload,
                      std::shared_ptr<const std::string> attachment) = 0;
  // As above with several attachments (none null), sent one after the other and joined on
  // the client into one attachment (their sizes must be known to the receiver to split them
  // again). Each is referenced, not copied.
  virtual Status send(const std::string& peer, const std::string& payload,
                      const std::vector<std::shared_ptr<const std::string>>& attachments) = 0;

  // Returns and clears the refusals and revocations recorded by the ZAP handler since the last
  // call.
  virtual std::vector<AuthEvent> takeAuthEvents() = 0;

  // Closes the connection `peer` (a routing id a message came from): its socket is shut down
  // and ZeroMQ drops the connection; messages it still had queued may be delivered first.
  // kNotFound when no open connection has that routing id.
  virtual Status disconnect(const std::string& peer) = 0;

  // Returns and clears the connections that ended since the last call (each also logged; those
  // ZeroMQ dropped with unread input are counted in framesRefused()).
  virtual std::vector<ConnectionClosed> takeClosedConnections() = 0;
  virtual uint64_t framesRefused() const = 0;

  // Returns and clears the connections closed by a limit since the last call (at most 256
  // hosts named; the rest counted under "other hosts"). Nothing is logged per connection: the
  // caller aggregates.
  virtual std::vector<ConnectionRefusals> takeRefusals() = 0;

  // Re-reads the allow-list soon (SIGHUP). Safe from a signal handler. No-op when insecure.
  virtual void reloadAllowList() = 0;

  // The endpoint actually bound (resolves a port of 0 / "*").
  virtual std::string boundEndpoint() const = 0;
};

class ClientTransport {
 public:
  virtual ~ClientTransport() = default;
  // As ServerTransport::receive, for messages from the coordinator: a payload and, if the server
  // attached one, the attachment. A message over max_message_bytes (payload or attachment) is
  // dropped with a warning.
  virtual Result<std::optional<Delivery>> receive(int timeout_ms) = 0;
  // Queues `payload` for the coordinator. kTimeout when the queue stays full for 5 s;
  // kPermissionDenied after the coordinator refused this client's key: the client then
  // reconnects by itself every reconnect_ivl_max_ms (receive() and send() drive this), so a key
  // added to the allow-list later is picked up without recreating the transport.
  virtual Status send(const std::string& payload) = 0;
  // What the socket monitor says about the connection, for a message to the operator when the
  // coordinator stays silent: empty once a handshake succeeded; otherwise the likely cause
  // (no TCP connection, plain text against CURVE or the reverse, a wrong coordinator key, a key
  // not in the allow-list).
  virtual std::string diagnosis() const = 0;
};

// Binds a ROUTER socket. Fails with a clear Status on a bad endpoint, missing keys or an
// unreadable allow-list directory.
Result<std::unique_ptr<ServerTransport>> createServer(const ServerOptions& options);

// Connects a DEALER socket (connection is asynchronous; sends queue until it is up).
Result<std::unique_ptr<ClientTransport>> createClient(const ClientOptions& options);

}  // namespace fedfleet::transport
