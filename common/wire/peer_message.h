// What decentralised peers send each other (peer/peer_engine.h), as a plain struct and as bytes.
//
// A PeerMessage carries one step of an exchange: a chunk of a ring all-reduce, a whole model
// (D-PSGD's and Hop's neighbour exchange, AD-PSGD's pairwise averaging), or Prague's group
// request and assignment between a peer and the group generator. The peer engine builds and
// reads the struct; only the network driver turns it into bytes (encodePeerMessage) and back
// (decodePeerMessage). The simulator passes the struct as it is.
//
// Every byte from another peer is hostile until checked: decodePeerMessage bounds every count
// and size by what the receiver knows (the number of peers, the model's size), so a message
// cannot make it allocate more than a model, name a peer that does not exist or a ring step
// past the ring, and a list cannot claim more elements than the bytes that carry it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/wire/messages.h"

namespace fedfleet::wire {

enum class PeerMessageKind : uint8_t {
  // One chunk of a ring all-reduce (allreduce, local, and Prague's group average): `step` is the
  // ring step (0 .. 2 (P - 1) - 1: reduce-scatter steps first, then all-gather), `chunk` the
  // chunk index (0 .. P - 1), `group` the ring's id (0 for the all-peers ring; Prague: the group
  // id), `iteration` the iteration it averages. Values dense (`values`) or compressed
  // (`payload`, a common/compress payload of `elements` values).
  kChunk = 0,
  // A whole model after iteration `iteration` (dpsgd, hop), in `values`.
  kModel = 1,
  // AD-PSGD: an active peer asks a passive one to average; `values` is the active's model.
  kAverageRequest = 2,
  // AD-PSGD: the passive peer's answer, `values` the average both now hold.
  kAverageReply = 3,
  // Prague: a peer tells the group generator it finished iteration `iteration` and is ready to
  // average. No values.
  kGroupRequest = 4,
  // Prague: the generator tells a peer its group `group` is complete: `members` (sorted, the
  // peer among them) average now with a ring all-reduce over the members in that order.
  kGroupAssign = 5,
  // Prague: a peer tells the generator it finished its iterations and joins no more groups.
  kLeave = 6,
};

// "chunk", "model", "average_request", "average_reply", "group_request", "group_assign",
// "leave".
const char* peerMessageKindName(PeerMessageKind kind);

struct PeerMessage {
  PeerMessageKind kind = PeerMessageKind::kChunk;
  uint32_t from = 0;  // sender: a peer 0 .. P - 1, or the group generator (kGeneratorId(P) = P)
  uint32_t to = 0;    // receiver, the same range
  uint64_t iteration = 0;
  uint64_t group = 0;  // Prague's group id (kChunk, kGroupAssign); 0 otherwise
  uint32_t step = 0;   // kChunk: ring step
  uint32_t chunk = 0;  // kChunk: chunk index
  // Dense values: a model (kModel, kAverage*) or a chunk of one (kChunk without compression).
  std::vector<float> values;
  // kChunk with a codec: the common/compress payload of `elements` values; `values` is empty.
  std::string payload;
  uint32_t elements = 0;
  std::vector<uint32_t> members;  // kGroupAssign only

  // Bytes this message puts on a link besides framing: values (4 each), payload, members (4
  // each) and a fixed 32-byte header. The simulator charges transfer time on it.
  uint64_t wireBytes() const;
  bool operator==(const PeerMessage&) const = default;
};

// What the receiver knows, against which it checks a decoded message.
struct PeerMessageLimits {
  uint32_t peers = 0;           // P; ids are 0 .. P (P: the group generator)
  uint64_t model_elements = 0;  // n, the flat model's size: values and elements at most this
};

// Bytes of `message` (Cap'n Proto, one flat message). A field over kMaxFieldBytes aborts.
std::string encodePeerMessage(const PeerMessage& message);

// The message of `bytes`, checked against `limits`. kResourceExhausted over decode.max_bytes;
// kCorrupt for bytes that are not a peer message; kInvalidArgument, naming the field, its value
// and the bound, for a message that decodes but breaks a bound: from or to past P, from == to,
// an unknown kind, values or elements above model_elements, a payload longer than
// 8 * model_elements + 64 bytes, a payload without elements (or elements without a payload),
// both values and a payload, step >= 2 (P - 1) or chunk >= P on a chunk, members on a message
// other than kGroupAssign, members not strictly increasing, past P - 1, or more than P.
// A kind's values are not checked against its meaning here (a kGroupRequest with values is
// refused: only kChunk, kModel and kAverage* carry values). Never throws or aborts.
Result<PeerMessage> decodePeerMessage(std::string_view bytes, const PeerMessageLimits& limits,
                                      const DecodeLimits& decode = {});

// The checks of decodePeerMessage on a struct (what the simulator's driver, which passes
// structs, may use too).
Status checkPeerMessage(const PeerMessage& message, const PeerMessageLimits& limits);

}  // namespace fedfleet::wire
