// ConnectionAdmission: which TCP connections a server transport keeps before they authenticate.
//
// libzmq accepts every connection itself; the server transport learns of each one from its
// socket monitor a moment later and can only close it then (zmq_transport.cc). Until a
// connection delivers its first message it is *unauthenticated*: under CURVE no message comes
// before the handshake and the ZAP check succeeded, and an honest fedfleet client or peer sends
// one at once (its Hello, a heartbeat). Each such connection costs two descriptors (libzmq's and
// the transport's duplicate) and whatever its peer makes libzmq buffer, so a peer that opens
// connections and says nothing could hold a coordinator at its descriptor limit. The limits here
// bound them the way OpenSSH's MaxStartups (start:rate:full) and nginx's limit_conn do:
//
//   - descriptors: while the process has `descriptor_limit - reserve` or more descriptors open,
//     every new unauthenticated connection is refused (kDescriptorReserve), and the transport
//     closes its oldest unauthenticated ones, so the reserve stays for the connections that did
//     authenticate, the history, the allow-list and the metrics endpoint;
//   - per source address: at most `max_unauthenticated_per_host` at once (kPerHostLimit);
//   - in all: with n unauthenticated connections open, a new one is refused with probability 0
//     below `early_drop_start`, `early_drop_rate` at it, rising linearly to 1 at
//     `max_unauthenticated` (kEarlyDrop; kUnauthenticatedLimit at and past the full count);
//   - in time: the transport gives each the handshake timeout (ZMQ_HANDSHAKE_IVL, closed by
//     libzmq: kHandshakeTimeout) and then a bound for its first message (kSilentAfterHandshake);
//   - per key: once authenticated, at most `max_connections_per_key` connections of one CURVE key
//     stay open; a newer one closes the oldest (kPerKeyLimit).
//
// Plain value type; the random draws come from the seeded generator it holds, so a test (or a
// caller passing a seed) gets the same decisions every time.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>

namespace fedfleet::transport {

// Why a connection was refused or closed before (or, for the last two, after) it authenticated.
enum class RefusalCause {
  kUnauthenticatedLimit,  // max_unauthenticated were already open
  kEarlyDrop,             // random early drop between early_drop_start and max_unauthenticated
  kPerHostLimit,          // max_unauthenticated_per_host from its address were already open
  kDescriptorReserve,     // the process was within the reserve of its descriptor limit
  kHandshakeTimeout,      // no handshake within the handshake timeout (libzmq closed it)
  kSilentAfterHandshake,  // handshake done, but no message within the first-message bound
  kPerKeyLimit,           // a newer connection of the same key past max_connections_per_key
  kSilentWithoutHello,    // (coordinator) keyed, never said Hello, silent past its bound
};

// Stable snake_case name, the metric label: "unauthenticated_limit", "early_drop",
// "per_host_limit", "descriptor_reserve", "handshake_timeout", "silent_after_handshake",
// "per_key_limit", "silent_without_hello".
const char* refusalCauseName(RefusalCause cause);

struct AdmissionOptions {
  // Unauthenticated connections open at once ("full"); 0: no limit.
  uint32_t max_unauthenticated = 256;
  // Where random early drop starts ("start"); 0: half of max_unauthenticated.
  uint32_t early_drop_start = 0;
  // Drop probability at early_drop_start ("rate"), in [0, 1].
  double early_drop_rate = 0.3;
  // Unauthenticated connections from one source address at once; 0: no limit.
  uint32_t max_unauthenticated_per_host = 64;
  // Authenticated connections of one CURVE key at once; 0: no limit.
  uint32_t max_connections_per_key = 4;
  // Descriptors kept for authenticated work; 0: an eighth of the limit, at least 32, at most
  // 4096.
  uint64_t descriptor_reserve = 0;
};

class ConnectionAdmission {
 public:
  ConnectionAdmission(const AdmissionOptions& options, uint64_t seed);

  // Whether a connection just accepted may stay: nullopt when it may, else why not. The counts
  // are of what is open besides it: `unauthenticated` in all, `from_host` from its address,
  // `open_descriptors` of the process (its own two included) against `descriptor_limit` (the
  // soft RLIMIT_NOFILE; 0: unknown, no check). Draws from the generator only between
  // early_drop_start and max_unauthenticated.
  std::optional<RefusalCause> admit(uint64_t unauthenticated, uint64_t from_host,
                                    uint64_t open_descriptors, uint64_t descriptor_limit);

  // The probability that admit() refuses a connection when `unauthenticated` are open (the
  // per-host and descriptor checks aside): 0, then rate to 1 between start and full.
  double dropProbability(uint64_t unauthenticated) const;

  // True when `open_descriptors` is within the reserve of `descriptor_limit` (never when the
  // limit is 0): the transport then closes unauthenticated connections, oldest first.
  bool overReserve(uint64_t open_descriptors, uint64_t descriptor_limit) const;

  // The reserve for `descriptor_limit` (the option, or the automatic one).
  uint64_t reserveFor(uint64_t descriptor_limit) const;

  uint32_t earlyDropStart() const;
  const AdmissionOptions& options() const { return options_; }

 private:
  AdmissionOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace fedfleet::transport
