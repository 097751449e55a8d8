// Fuzzes the wire decoders of common/wire/messages.h: decode() of one frame, and decodeFrames()
// of a frame with an optional model frame, as the transport delivers them; and, from the same
// frame, the simulator's job decoders of common/wire/sim_job.h. Whatever decodes must
// encode and decode again, and the second encoding must be the bytes of the first (the decoded
// message loses nothing encode() writes). Any input must come back as a Status, never a crash.
// Whatever decodes also goes through checkClientMessage() (common/wire/limits.h), as the
// coordinator's does: OK or kInvalidArgument, and the same answer for the re-decoded message.
// The same frame also goes to the peers' decoder (common/wire/peer_message.h) and to the
// decoder of the peers' control messages with their coordinator (common/wire/peer_control.h),
// both under small receiver limits (16 peers, 4096 model elements).
//
// Input layout: byte 0 is a control byte.
//   bit 0  a model frame follows: bytes 1-4 (little endian) are the frame's length, taken modulo
//          the bytes left + 1; the frame follows, and the rest of the input is the model frame.
//          Without bit 0 the rest of the input is the frame.
//   bit 1  decode under tight DecodeLimits (a 1 KiB frame limit, 64 words of traversal, nesting
//          4), so the limit checks run too.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "common/wire/limits.h"
#include "common/wire/messages.h"
#include "common/wire/peer_control.h"
#include "common/wire/peer_message.h"
#include "common/wire/sim_job.h"
#include "fuzz/fuzz_input.h"

namespace fedfleet::wire {
namespace {

// A message as the transport carries it: the frame, and a Task's model frame (the training
// model, then the served model when it is attached).
struct Frames {
  std::string frame;
  std::optional<std::string> model;
};

Frames toFrames(Message message) {
  Frames out;
  if (auto* task = std::get_if<Task>(&message)) {
    std::string model = std::move(task->model_bytes);
    task->model_bytes.clear();
    if (task->served.source == ServedSource::kAttached) model += task->served.bytes;
    task->served.bytes.clear();
    out.model = std::move(model);
  }
  out.frame = encode(message);
  return out;
}

// checkClientMessage() of a decoded message: OK or kInvalidArgument, never anything else.
Status checkLimits(const Message& message) {
  Status st = checkClientMessage(message);
  FUZZ_CHECK(st.isOk() || st.code() == StatusCode::kInvalidArgument, st.toString().c_str());
  return st;
}

// decode() path: the message re-encoded as one frame decodes again to the same bytes, and the
// limits give the same answer.
void checkSingleFrameRoundTrip(const Message& first) {
  const std::string bytes = encode(first);
  Result<Message> again = decode(bytes);
  FUZZ_CHECK(again.isOk(), again.status().toString().c_str());
  FUZZ_CHECK(again->index() == first.index(), "decode changed the message kind");
  FUZZ_CHECK(encode(*again) == bytes, messageName(first));
  FUZZ_CHECK(checkLimits(first).isOk() == checkLimits(*again).isOk(),
             "checkClientMessage changed its answer after a round trip");
}

// decodeFrames() path: the message re-encoded as frames decodes again to the same frames.
void checkFramesRoundTrip(const Message& first) {
  const Frames frames = toFrames(first);
  Result<Message> again = decodeFrames(frames.frame, frames.model);
  FUZZ_CHECK(again.isOk(), again.status().toString().c_str());
  FUZZ_CHECK(again->index() == first.index(), "decodeFrames changed the message kind");
  const Frames second = toFrames(*again);
  FUZZ_CHECK(second.frame == frames.frame, messageName(first));
  FUZZ_CHECK(second.model == frames.model, "the model frame changed");
}

// The simulator's worker jobs and results (common/wire/sim_job.h) from the same bytes: refused
// as kCorrupt or kResourceExhausted, or decoded, and then what encodes again decodes to the
// same bytes.
void checkSimJobs(std::string_view bytes, const DecodeLimits& limits) {
  const auto refusedWell = [](const Status& st) {
    FUZZ_CHECK(st.code() == StatusCode::kCorrupt || st.code() == StatusCode::kResourceExhausted,
               st.toString().c_str());
  };
  Result<SimJob> job = decodeSimJob(bytes, limits);
  if (job.isOk()) {
    const std::string once = encodeSimJob(*job);
    Result<SimJob> again = decodeSimJob(once);
    FUZZ_CHECK(again.isOk(), again.status().toString().c_str());
    FUZZ_CHECK(encodeSimJob(*again) == once, "a simulator job changed in a round trip");
  } else {
    refusedWell(job.status());
  }
  Result<SimJobResult> result = decodeSimJobResult(bytes, limits);
  if (result.isOk()) {
    const std::string once = encodeSimJobResult(*result);
    Result<SimJobResult> again = decodeSimJobResult(once);
    FUZZ_CHECK(again.isOk(), again.status().toString().c_str());
    FUZZ_CHECK(encodeSimJobResult(*again) == once, "a simulator result changed in a round trip");
  } else {
    refusedWell(result.status());
  }
}

// The refusals a peer decoder may give: kCorrupt, kResourceExhausted or kInvalidArgument.
void refusedAsAPeerMessage(const Status& st) {
  const StatusCode code = st.code();
  FUZZ_CHECK(code == StatusCode::kCorrupt || code == StatusCode::kResourceExhausted ||
                 code == StatusCode::kInvalidArgument,
             st.toString().c_str());
}

// decodePeerMessage: one of those refusals, or a message that passes its own checks and
// round-trips to the same bytes.
void checkPeerMessages(std::string_view bytes, const DecodeLimits& limits) {
  const PeerMessageLimits peer_limits{16, 4096};
  Result<PeerMessage> m = decodePeerMessage(bytes, peer_limits, limits);
  if (!m.isOk()) return refusedAsAPeerMessage(m.status());
  FUZZ_CHECK(checkPeerMessage(*m, peer_limits).isOk(), "a decoded peer message fails its checks");
  const std::string once = encodePeerMessage(*m);
  Result<PeerMessage> again = decodePeerMessage(once, peer_limits);
  FUZZ_CHECK(again.isOk(), again.status().toString().c_str());
  FUZZ_CHECK(encodePeerMessage(*again) == once, "a peer message changed in a round trip");
}

// decodePeerControl: the same three refusals, or a message that round-trips to the same bytes.
void checkPeerControl(std::string_view bytes, const DecodeLimits& limits) {
  const PeerControlLimits control_limits{16, 4096};
  Result<PeerControl> m = decodePeerControl(bytes, control_limits, limits);
  if (!m.isOk()) return refusedAsAPeerMessage(m.status());
  const std::string once = encodePeerControl(*m);
  Result<PeerControl> again = decodePeerControl(once, control_limits);
  FUZZ_CHECK(again.isOk(), again.status().toString().c_str());
  FUZZ_CHECK(encodePeerControl(*again) == once, "a peer control message changed in a round trip");
}

}  // namespace
}  // namespace fedfleet::wire

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using fedfleet::Result;
  using namespace fedfleet::wire;
  fedfleet::fuzz::FuzzInput in(data, size);
  const uint8_t control = in.u8();
  DecodeLimits limits;
  if (control & 2) {
    limits.max_bytes = 1024;
    limits.traversal_limit_words = 64;
    limits.nesting_limit = 4;
  }
  std::string_view frame;
  std::optional<std::string> model_frame;
  if (control & 1) {
    const uint32_t len = in.u32();
    frame = in.take(len % (in.left() + 1));
    model_frame = std::string(in.rest());
  } else {
    frame = in.rest();
  }

  Result<Message> single = decode(frame, limits);
  if (single.isOk()) {
    (void)messageName(*single);
    checkSingleFrameRoundTrip(*single);
  } else {
    FUZZ_CHECK(single.status().code() == fedfleet::StatusCode::kCorrupt ||
                   single.status().code() == fedfleet::StatusCode::kResourceExhausted,
               single.status().toString().c_str());
  }

  checkSimJobs(frame, limits);
  checkPeerMessages(frame, limits);
  checkPeerControl(frame, limits);

  Result<Message> framed = decodeFrames(frame, std::move(model_frame), limits);
  if (framed.isOk()) {
    checkFramesRoundTrip(*framed);
  } else {
    FUZZ_CHECK(framed.status().code() == fedfleet::StatusCode::kCorrupt ||
                   framed.status().code() == fedfleet::StatusCode::kResourceExhausted,
               framed.status().toString().c_str());
  }
  return 0;
}
