// Bounds on what a client may put in a message, checked once a frame has decoded.
//
// decode() (common/wire/messages.h) only refuses bytes that are not a message; a frame within
// DecodeLimits may still carry a 20 MiB device name or error text that the coordinator would
// keep in memory, write to its history and repeat in its logs. checkClientMessage() refuses
// such a message before anything else looks at it. The limits are constants of the protocol,
// far above what fedfleet's own client sends, so an honest client never meets them.
//
// Every field of every message a client sends is checked somewhere, or not on the wire at all
// (Chunk's retired tensor index); docs/ERRORS.md, "Limits on what a client sends", lists each
// field with its check. What is not bounded here, and why: a Chunk's payload is bounded by the
// frame limit (DecodeLimits::max_bytes) and checked against its task (size, elements, codec
// header) by the coordinator (common/compress/payload.h), which alone knows the task's
// chunk_bytes and model size; likewise offset, elements, the sample counts and every figure of
// a Summary (engine/update_assembler.h); a Hello's requested partition and data size are checked
// against the run (the coordinator's handleHello, the engine). decode() checks what a message's
// own structure decides: enum values, a Summary's served and evaluation figures only with their
// sample counts, SHA-256 sizes, metric names. A SecAgg message is the one client message with
// lists, bounded below.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "common/wire/messages.h"

namespace fedfleet::wire {

// Hello::client_id: 1 to kMaxClientIdBytes characters of [A-Za-z0-9._@-]. The id names the
// client in the history, the logs and the metrics, so it is short and needs no escaping.
constexpr size_t kMaxClientIdBytes = 128;

// Hello::public_key: empty (an insecure coordinator) or exactly kPublicKeyChars characters of
// the Z85 alphabet (a CURVE public key, 32 bytes). A secure coordinator also compares it with
// the key the connection authenticated with.
constexpr size_t kPublicKeyChars = 40;

// Hello::device_name: at most kMaxDeviceNameBytes bytes of printable ASCII (0x20-0x7e), as a CPU
// model or CUDA device name is. It is stored in the history's clients table.
constexpr size_t kMaxDeviceNameBytes = 128;

// Hello::cores: at most kMaxCores (Linux builds for at most 8192 CPUs; this leaves room).
constexpr uint32_t kMaxCores = 1u << 16;

// Hello::memory_bytes: at most kMaxMemoryBytes (1 PiB, far above any host; the history's
// clients table keeps it in a signed 64-bit column).
constexpr uint64_t kMaxMemoryBytes = 1ull << 50;

// Free text a client sends: Bye::reason and Error::message, at most kMaxReasonBytes bytes each,
// without control characters other than tab and newline (no terminal escapes into the logs or
// `fedfleet history events`). The coordinator records the text in its events table and logs it.
constexpr size_t kMaxReasonBytes = 1024;

// Error::code from a client: what a client reports is kRejected (it refuses a task) or
// kInternal (its training failed); the other codes are the coordinator's.
bool isClientErrorCode(ErrorCode code);

// SecAgg from a client: only its own steps (advert, shares, reveal), each with only the list of
// its step (adverts, shares, revealed; never the coordinator's survivors and dropped), at most
// this many entries (a client's neighbours and itself), each of the size its kind has (32-byte
// keys, sealed shares and shares of common/secagg's sizes).
constexpr size_t kMaxSecAggEntries = secagg::kMaxNeighbours + 1;

// OK when `message` is one a client may send (Hello, Chunk, Summary, UploadRequest, Heartbeat,
// Bye, Error, SecAgg) and every field above is within its bound. Otherwise kInvalidArgument, with a
// message naming the field, its size (or the offending byte and its position) and the limit,
// e.g. "Hello.device_name is 20971520 bytes, limit 128". A Task, Cancel or UploadGrant (sent by
// the coordinator only) is kInvalidArgument too: "Task is not a message a client sends".
// Reads the message only; never aborts.
Status checkClientMessage(const Message& message);

}  // namespace fedfleet::wire
