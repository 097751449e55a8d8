// The control messages of a decentralised run, between each peer and the peer coordinator
// (coordinator/peer_coordinator.h), as a plain struct and as bytes.
//
// The coordinator never holds a model of its own; it is the run's rendezvous (who listens
// where), Prague's group generator, the history's writer, and the evaluator of the peers'
// average now and then. A peer registers (kRegister, with its mesh's endpoint), gets the table
// of all peers (kTable) once everyone registered, reports its iterations (kIterations), relays
// Prague's group messages to and from the generator (kEngine: an encoded wire::PeerMessage),
// answers model requests (kModelRequest -> kModelReply), says when it saw a peer go silent
// (kPeerDown), when it finished (kFinished) or failed (kFailed), beats (kHeartbeat), and stops
// at kStop.
//
// Peers are known by index 0 .. P-1 in the engine and by key name in the allow-list: peer i's
// key files are `peer-<i>.key{,_secret}` (peerKeyName), so the index of a connection comes from
// its authenticated key. Every count and size a message claims is bounded by what the receiver
// knows (PeerControlLimits); decoding never throws or aborts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/wire/messages.h"

namespace fedfleet::wire {

enum class PeerControlKind : uint8_t {
  kRegister = 0,      // peer -> coordinator: `endpoint`, where its mesh listens
  kTable = 1,         // coordinator -> peer: `table`, every peer's address; the run starts
  kIterations = 2,    // peer -> coordinator: `iterations` completed since its last report
  kEngine = 3,        // both ways: `data`, an encoded PeerMessage for or from the generator
  kModelRequest = 4,  // coordinator -> peer: send the current model, tagged `request`
  kModelReply = 5,    // peer -> coordinator: `request`, `values` (the model), `iteration`
  kFinished = 6,      // peer -> coordinator: all `iteration` iterations done
  kFailed = 7,        // peer -> coordinator: the engine cannot go on; `text` says why
  kPeerDown = 8,      // peer -> coordinator: `peer` went silent (its heartbeats stopped)
  kStop = 9,          // coordinator -> peer: the run is over (`text` empty) or aborted (`text`)
  kHeartbeat = 10,    // peer -> coordinator: still here
};

const char* peerControlKindName(PeerControlKind kind);

struct PeerTableEntry {
  uint32_t peer = 0;
  std::string endpoint;
  std::string public_key;  // Z85, the key the coordinator authenticated; empty when insecure
  bool operator==(const PeerTableEntry&) const = default;
};

// One iteration of the sender (history::PeerIterationRecord without run and peer, which the
// coordinator fills in from the connection).
struct PeerIteration {
  uint64_t iteration = 0;
  double t_start = 0;  // seconds since the peer received the table
  double t_end = 0;
  double compute_s = 0;
  double comm_s = 0;
  double wait_s = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint32_t exchanges = 0;
  uint32_t staleness = 0;
  bool skipped = false;
  double loss = 0;
  bool operator==(const PeerIteration&) const = default;
};

struct PeerControl {
  PeerControlKind kind = PeerControlKind::kHeartbeat;
  std::string endpoint;                   // kRegister
  std::vector<PeerTableEntry> table;      // kTable
  std::vector<PeerIteration> iterations;  // kIterations
  std::string data;                       // kEngine
  uint64_t request = 0;                   // kModelRequest, kModelReply
  uint64_t iteration = 0;                 // kModelReply, kFinished
  std::vector<float> values;              // kModelReply
  uint32_t peer = 0;                      // kPeerDown
  std::string text;                       // kFailed, kStop
  bool operator==(const PeerControl&) const = default;
};

// Bounds of a message, protocol constants far above what fedfleet's peers send.
constexpr size_t kMaxPeerEndpointBytes = 256;
constexpr size_t kMaxIterationsPerReport = 1024;
constexpr size_t kMaxPeerTextBytes = 1024;

// What the receiver knows, against which it checks a decoded message.
struct PeerControlLimits {
  uint32_t peers = 0;           // P
  uint64_t model_elements = 0;  // the flat model's size: `values` at most this
};

// Bytes of `message` (Cap'n Proto). A field over kMaxFieldBytes aborts.
std::string encodePeerControl(const PeerControl& message);

// The message of `bytes`, checked against `limits`. kResourceExhausted over decode.max_bytes;
// kCorrupt for bytes that are not a control message; kInvalidArgument, naming the field, for
// one that breaks a bound: an unknown kind; an endpoint that is empty (kRegister), longer than
// kMaxPeerEndpointBytes or not printable ASCII; a table of more than P entries, an entry's peer
// >= P or listed twice, a public key that is neither empty nor 40 characters; more than
// kMaxIterationsPerReport iterations, a time or duration negative or not finite, t_end <
// t_start; values over model_elements or not finite; a kPeerDown peer >= P; text over
// kMaxPeerTextBytes.
Result<PeerControl> decodePeerControl(std::string_view bytes, const PeerControlLimits& limits,
                                      const DecodeLimits& decode = {});

// "peer-<index>": the key name, and with it the authenticated id, of peer `index`.
std::string peerKeyName(uint32_t index);
// The index of key name `id` when it is "peer-<i>" with i < peers written without leading
// zeros; nullopt otherwise.
std::optional<uint32_t> peerIndexOf(std::string_view id, uint32_t peers);

}  // namespace fedfleet::wire
