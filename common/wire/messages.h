// Plain message structs of the fedfleet protocol, and their byte encoding.
//
// Everything outside common/wire/ works with these structs; only common/wire/codec.cc sees the
// Cap'n Proto schema (common/wire/fedfleet.capnp). decode() never throws and never aborts on
// bad input: truncated, oversized or garbled bytes come back as a kCorrupt / kResourceExhausted
// Status.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "common/status.h"

namespace fedfleet::wire {

constexpr uint32_t kProtocolVersion = 2;  // 2: chunks carry elements and weights

enum class DeviceKind : uint8_t { kCpu = 0, kCuda = 1 };
const char* deviceKindName(DeviceKind kind);  // "cpu" or "cuda"

using Sha256 = std::array<uint8_t, 32>;

// Client -> coordinator, first message on a connection (and again after a coordinator restart).
struct Hello {
  std::string client_id;
  std::string public_key;  // Z85 CURVE public key; empty when insecure
  DeviceKind device_kind = DeviceKind::kCpu;
  std::string device_name;
  uint32_t cores = 0;
  uint64_t memory_bytes = 0;
  uint64_t data_size = 0;  // samples the client can train on (0: uses the partition it is given)
  uint32_t protocol_version = kProtocolVersion;
  int32_t requested_partition = -1;  // -1: let the coordinator assign one
  uint64_t session = 0;  // random per client process start; a repeated Hello keeps it, so the
                         // coordinator can tell a restarted client from a repeated greeting
};

// Local training hyper-parameters.
struct HyperParams {
  uint32_t epochs = 1;
  uint32_t max_steps = 0;  // 0: run `epochs` full passes; otherwise stop after this many steps
  uint32_t batch_size = 32;
  float lr = 0.05f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  uint64_t seed = 0;  // seeds shuffling and any client-side randomness for this task
  float prox_mu = 0.0f;     // FedProx proximal coefficient (0: off)
  bool scaffold = false;    // SCAFFOLD: correct gradients with the task's control variates
  double stop_after_s = 0;  // partial work: stop training this long after receipt (0: off)
};

// Which samples the client trains on: partition `index` of the data set split `scheme` ways.
// The client recomputes the partition from this spec; no data crosses the wire.
struct DataSpec {
  std::string dataset = "fashion-mnist";
  std::string scheme = "iid";  // "iid", "dirichlet", "labels"
  double alpha = 0.5;          // Dirichlet concentration
  uint32_t labels_per_client = 2;
  uint32_t num_partitions = 1;
  uint32_t index = 0;
  uint64_t seed = 0;
  uint32_t subset = 0;  // use only the first `subset` training samples (0: all)
};

// Coordinator -> client: train this model on this data and upload the delta.
struct Task {
  uint64_t run_id = 0;
  uint32_t round = 0;
  uint64_t model_version = 0;
  std::string model_name;   // built-in model name, or "torchscript"
  std::string model_bytes;  // flat fp32 parameters, little endian
  Sha256 model_sha256{};
  HyperParams hparams;
  DataSpec data;
  double deadline_s = 0;  // seconds from receipt by which the update must be uploaded
  std::string codec = "none";
  uint64_t task_token = 0;  // echoed by every Chunk and Summary of this task
  uint32_t chunk_bytes = 1 << 20;
  std::string control_bytes;  // SCAFFOLD server control variate c (fp32), empty otherwise
};

// Client -> coordinator: one piece of the update. `offset` is the element offset of the first
// value of `payload` in the flat parameter buffer; `tensor_index` is the tensor it starts in.
struct Chunk {
  uint64_t task_token = 0;
  uint32_t tensor_index = 0;
  uint64_t offset = 0;
  std::string payload;  // encoded by the task's codec ("none": fp32 little endian)
  bool last = false;
  uint64_t elements = 0;   // values the payload decodes to (offset .. offset + elements)
  uint64_t n_samples = 0;  // the update's sample count and local steps, the same on every
  uint64_t steps = 0;      // chunk and in the Summary: the coordinator weights each chunk by
                           // them as it arrives (streaming aggregation)
};

// Client -> coordinator, after the last chunk: what the local work was.
struct Summary {
  uint64_t task_token = 0;
  uint64_t n_samples = 0;
  uint64_t steps = 0;
  double mean_loss = 0;
  double sum_sq_loss = 0;
  double compute_seconds = 0;
  double upload_seconds = 0;
  double encode_seconds = 0;  // time spent compressing the chunks
};

struct Cancel {
  uint64_t task_token = 0;
  std::string reason;
};

struct Heartbeat {
  uint64_t seq = 0;
};

struct Bye {
  std::string reason;
};

enum class ErrorCode : uint16_t {
  kUnknown = 0,
  kMalformed = 1,      // the frame did not decode
  kUnknownClient = 2,  // no Hello seen for this connection: send Hello again
  kStaleTask = 3,      // task token unknown, cancelled or of an earlier round
  kBadVersion = 4,     // protocol version not supported
  kRejected = 5,       // update rejected (non-finite values, wrong size)
  kInternal = 6,
};

struct Error {
  ErrorCode code = ErrorCode::kUnknown;
  std::string message;
  uint64_t task_token = 0;
};

using Message = std::variant<Hello, Task, Chunk, Summary, Cancel, Heartbeat, Bye, Error>;

// Name of the message kind ("Hello", "Task", ...).
const char* messageName(const Message& message);

struct DecodeLimits {
  uint64_t max_bytes = 256ull << 20;             // frames above this are refused
  uint64_t traversal_limit_words = 40ull << 20;  // Cap'n Proto traversal limit (8-byte words)
  uint32_t nesting_limit = 16;
};

// Largest bytes/text field Cap'n Proto can hold (its list size limit, 2^29 - 1 elements).
constexpr uint64_t kMaxFieldBytes = (1ull << 29) - 1;

// Serialises `message` to bytes (Cap'n Proto, unpacked framing; one segment, plus one per large
// word-aligned bytes field, which is copied only once).
// A field longer than kMaxFieldBytes is a caller bug and aborts (FEDFLEET_CHECK).
std::string encode(const Message& message);

// Parses bytes produced by encode(). Any malformed input, including truncation, an unknown
// union tag, a frame over `limits.max_bytes` or a traversal-limit violation, returns a non-OK
// Status; it never throws or aborts.
Result<Message> decode(std::string_view bytes, const DecodeLimits& limits = {});

}  // namespace fedfleet::wire
