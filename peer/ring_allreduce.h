// Ring all-reduce (reduce-scatter, then all-gather) as a sans-I/O state machine over chunk
// messages, and its schedule as pure functions. Used by the allreduce and local algorithms over
// all peers and by Prague's groups over their members (peer/peer_engine.h).
//
// The vector of n values is cut into M chunks (M members; chunk c holds
// [c n / M, (c + 1) n / M)). Member r, at step s:
//   reduce-scatter, s = 0 .. M - 2: sends chunk (r - s) mod M to r + 1, receives chunk
//     (r - s - 1) mod M from r - 1 and adds it to its own; afterwards r holds the full sum of
//     chunk (r + 1) mod M.
//   all-gather, s = M - 1 .. 2 M - 3 (s' = s - (M - 1)): sends chunk (r + 1 - s') mod M,
//     receives chunk (r - s') mod M and keeps it.
// Each member sends 2 (M - 1) chunks, 2 (M - 1) / M of the vector. Every member ends with the
// same values: the sum (within float rounding of the order of additions).
//
// With a codec every chunk travels compressed. Reduce-scatter sends the partial sum through an
// ErrorFeedback residual (what compression dropped is added back the next time this member
// sends those elements: the schedule is the same every iteration, so a residual element always
// belongs to the same chunk position). In the all-gather the owner of a chunk encodes it once
// (through a second residual), replaces its own copy by the decoded values, and the others pass
// the payload on unchanged, so all members hold bit-identical results.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "common/compress/codec.h"
#include "common/compress/error_feedback.h"
#include "common/status.h"
#include "common/wire/peer_message.h"

namespace fedfleet::peer {

struct RingStep {
  uint32_t send_chunk = 0;
  uint32_t recv_chunk = 0;
  bool reduce = true;  // reduce-scatter (add what arrives) or all-gather (keep it)
};

// The schedule above for member `rank` of `members` (>= 2) at step < 2 (members - 1).
RingStep ringStep(uint32_t members, uint32_t rank, uint32_t step);

// Chunk c of n values cut into `members` chunks: [begin, end).
std::pair<size_t, size_t> chunkRange(size_t n, uint32_t members, uint32_t chunk);

// Values one member sends in one all-reduce of n values: the sum of its 2 (M - 1) chunks.
size_t ringValuesSent(size_t n, uint32_t members, uint32_t rank);

// Compression inside the ring, owned by the engine across iterations (the residuals persist).
struct RingCompression {
  const compress::Codec* codec = nullptr;              // null: fp32 values
  compress::ErrorFeedback* reduce_residual = nullptr;  // null: no error feedback
  compress::ErrorFeedback* gather_residual = nullptr;
  uint64_t seed = 0;  // mixed with iteration, step and sender for each chunk's codec seed
};

class RingAllReduce {
 public:
  // The sum over `members` (sorted peer ids, self among them) of each member's `data`; the ring
  // is tagged (group, iteration) in its messages.
  RingAllReduce(std::vector<uint32_t> members, uint32_t self, uint64_t group, uint64_t iteration,
                std::vector<float> data, RingCompression compression = {});

  // The first send (none for a ring of one member, which is done at once).
  std::vector<wire::PeerMessage> start();

  // A chunk of this ring. Appends the sends it allows (the next steps) to *sends. A chunk out
  // of place (a sender that is not the predecessor, a step already received, a chunk index or
  // a size that is not the schedule's, a payload that does not decode) is INVALID_ARGUMENT.
  Status onChunk(wire::PeerMessage message, std::vector<wire::PeerMessage>* sends);

  bool done() const { return next_step_ == total_steps_; }
  // The sum, once done().
  std::vector<float>& values() { return data_; }
  const std::vector<uint32_t>& members() const { return members_; }
  uint32_t received() const { return received_; }

 private:
  Status check(const wire::PeerMessage& m) const;  // schedule and size, before keeping it
  Status apply(const wire::PeerMessage& m);
  wire::PeerMessage makeSend(uint32_t step);

  // Constant after construction.
  std::vector<uint32_t> members_;
  uint32_t self_, rank_, prev_, next_;
  uint64_t group_, iteration_;
  uint32_t total_steps_;
  RingCompression compression_;

  std::vector<float> data_;
  uint32_t next_step_ = 0;  // the step whose chunk is awaited
  uint32_t received_ = 0;
  std::map<uint32_t, wire::PeerMessage> early_;  // chunks of later steps, by step
  std::string forward_;  // all-gather with a codec: the payload received, passed on next step
};

}  // namespace fedfleet::peer
