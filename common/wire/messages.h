// Plain message structs of the fedfleet protocol, and their byte encoding.
//
// Everything outside common/wire/ works with these structs; only common/wire/messages.cc sees the
// Cap'n Proto schema (common/wire/fedfleet.capnp). decode() never throws and never aborts on
// bad input: truncated, oversized or garbled bytes come back as a kCorrupt / kResourceExhausted
// Status.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"
#include "common/wire/secagg_messages.h"

namespace fedfleet::wire {

// 2: chunks carry elements and weights. 3: FedProx, SCAFFOLD and partial work (HyperParams
// prox_mu, scaffold, stop_after_s; Task control_bytes; a SCAFFOLD update is 2P values long).
// 4: a Task travels as two parts, its frame with model_bytes empty and then the model frame
// (see decodeFrames). A version-3 client would drop such a message and wait for a task that never
// comes, so the version changes: the coordinator refuses a version-3 Hello with kBadVersion.
// 5: block-cyclic serving and upload credits. A Task names the model the client serves
// (Task::served) and may carry it after the training model in the model frame; a Summary reports
// the served model's loss and accuracy on the client's held-out data; DataSpec has the
// "block-cyclic" scheme. A client sends UploadRequest when its update is ready and its chunks
// only after the coordinator's UploadGrant; the coordinator rejects a chunk sent without a grant.
// A version-4 client would read a model frame with a served model as one model of twice the
// size and would send its chunks unasked, so the coordinator refuses a version-4 Hello with
// kBadVersion.
constexpr uint32_t kProtocolVersion = 5;

enum class DeviceKind : uint8_t { kCpu = 0, kCuda = 1 };
const char* deviceKindName(DeviceKind kind);  // "cpu" or "cuda"

// The client's local optimiser (train.optimizer).
enum class Optimizer : uint8_t { kSgd = 0, kAdam = 1, kAdamW = 2 };
const char* optimizerName(Optimizer o);  // "sgd", "adam" or "adamw"
// The optimiser of that name; kInvalidArgument listing the names otherwise.
Result<Optimizer> parseOptimizer(std::string_view name);

// The arithmetic of the simulator's local training (sim.precision): fp32 throughout, or bf16
// mixed precision (bf16 matrix products and convolutions, fp32 weights and optimiser).
enum class Precision : uint8_t { kFp32 = 0, kBf16 = 1 };
const char* precisionName(Precision p);  // "fp32" or "bf16"
// The precision of that name; kInvalidArgument listing the names otherwise.
Result<Precision> parsePrecision(std::string_view name);

// The training loss (train.loss; common/model/loss.h computes each).
enum class Loss : uint8_t { kCrossEntropy = 0, kMse = 1, kBce = 2, kModule = 3 };
const char* lossName(Loss loss);  // "cross_entropy", "mse", "bce" or "module"
// The loss of that name; kInvalidArgument listing the names otherwise.
Result<Loss> parseLoss(std::string_view name);

using Sha256 = std::array<uint8_t, 32>;

// What a Hello says besides its strings: the part the coordinator keeps of every client it
// knows (engine::ClientHello adds the strings, interned).
struct HelloNumbers {
  DeviceKind device_kind = DeviceKind::kCpu;
  uint32_t cores = 0;
  uint64_t memory_bytes = 0;
  uint64_t data_size = 0;  // samples the client can train on (0: uses the partition it is given)
  uint32_t protocol_version = kProtocolVersion;
  int32_t requested_partition = -1;  // -1: let the coordinator assign one
  uint64_t session = 0;  // random per client process start; a repeated Hello keeps it, so the
                         // coordinator can tell a restarted client from a repeated greeting
  // Task::coordinator_session of the last task it took (0: none yet): a client greeting a
  // restarted coordinator may still have frames of the earlier process's task on their way.
  uint64_t last_coordinator_session = 0;
};

// Client -> coordinator, first message on a connection (and again after a coordinator restart).
struct Hello : HelloNumbers {
  std::string client_id;
  std::string public_key;  // Z85 CURVE public key; empty when insecure
  std::string device_name;
};

// Local SGD's settings, the part of a task's hyper-parameters that the trainer
// (client::TrainOptions) and a simulator job (SimTrainJob) carry too.
struct LocalSgd {
  uint32_t epochs = 1;
  uint32_t max_steps = 0;  // 0: run `epochs` full passes; otherwise stop after this many steps
  uint32_t batch_size = 32;
  float lr = 0.05f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  uint64_t seed = 0;  // seeds shuffling and any client-side randomness for this task
  // FedProx: mu of the proximal term mu/2 ||w - x_t||^2, i.e. mu (w - x_t) added to every
  // gradient (0: off).
  float prox_mu = 0.0f;
  // The local optimiser: SGD (with momentum and weight_decay), Adam (weight_decay as L2 added
  // to the gradient) or AdamW (decoupled weight decay); Adam's betas are (0.9, 0.999), eps 1e-8,
  // and its moments start from zero at every task.
  Optimizer optimizer = Optimizer::kSgd;
};

// Local training hyper-parameters.
struct HyperParams : LocalSgd {
  // SCAFFOLD (option II): every step is corrected by c - c_k (Task::control_bytes holds c, the
  // client keeps c_k), and the update the client uploads is 2P values long (see Task).
  bool scaffold = false;
  // Partial work: the client stops local training this many seconds after it received the
  // task and uploads what it did, with its true step count and samples (0: off; train all the
  // planned steps). Unlike deadline_s, which abandons the task, this yields an update.
  double stop_after_s = 0;
  Loss loss = Loss::kCrossEntropy;  // what local training minimises
};

// Which samples the client trains on: partition `index` of the data set split `scheme` ways.
// The client recomputes the partition from this spec; no data crosses the wire.
struct DataSpec {
  std::string dataset = "fashion-mnist";
  std::string scheme = "iid";  // iid, dirichlet, labels, shards, quantity, block-cyclic, none
  double alpha = 0.5;          // Dirichlet concentration
  uint32_t labels_per_client = 2;
  uint32_t shards_per_client = 2;  // scheme "shards" (0 on the wire from an older sender: 2)
  uint32_t num_partitions = 1;
  uint32_t index = 0;
  uint64_t seed = 0;
  uint32_t subset = 0;  // use only the first `subset` training samples (0: all)
  // scheme "block-cyclic" (common/data/block_cyclic.h, partitionBlockCyclic): partition p holds
  // block p mod `blocks` data, a fraction `skew` of it from that block's class group. The
  // client's held-out data (for the served model) is partition p of the test split, cut the
  // same way.
  uint32_t blocks = 0;
  double skew = 0;
};

// Where the served model of a Task is (block-cyclic runs; wire protocol 5).
enum class ServedSource : uint8_t {
  kNone = 0,       // nothing served (no blocks): the other ServedModel fields mean nothing
  kUnchanged = 1,  // the model the client got in an earlier task (sha256 names it)
  kTaskModel = 2,  // the task's own training model (model_bytes) is the served model
  kAttached = 3,   // the served model follows the training model in the model frame
};

// The model a client in block `block` is given for evaluation and inference: the block's
// served model (engine/block_models.h), sent only when it differs from what the client
// last received.
struct ServedModel {
  ServedSource source = ServedSource::kNone;
  uint32_t block = 0;
  std::string model;     // "shared", "pluralistic" or "chain"
  uint64_t version = 0;  // the coordinator's model version when this served model was first sent
  Sha256 sha256{};       // of the served model's bytes
  // kAttached: the served model's bytes (flat fp32, little endian). Never in the Task frame:
  // the model frame holds the training model and then these, each model_bytes.size() long;
  // decodeFrames() splits them.
  std::string bytes;
};

// Coordinator -> client: train this model on this data and upload the delta.
//
// The update the client uploads, in the chunks of this task (planChunks over its elements,
// offsets 0 .. elements, each chunk encoded by `codec`), is:
//   - without SCAFFOLD: the delta D_k = y - x_t, P values (P = model_bytes.size() / 4), in the
//     model's layout;
//   - with hparams.scaffold: 2P values, the delta D_k (P values, in the model's layout) followed
//     by the control-variate update Dc_k = c_k_new - c_k (P values, the same layout again),
//     where c_k_new = c_k - c + (x_t - y) / (K eta_l) after K local steps of rate eta_l. The
//     chunks cover [0, 2P): the delta's chunks as without SCAFFOLD, then the same ranges again
//     shifted by P elements, so no chunk holds values of both halves. Chunk and Summary steps are
//     K, as for any update.
// Secure aggregation (SecAgg+, common/secagg/secagg_server.h) of a task's update: its client's
// place in the round and what it must quantise by. `clients` = 0: the update goes in the clear.
// With it, the update is (n_samples / weight_scale) x delta (FedNova: also / a_k), clipped to
// [-clip_range, clip_range], quantised to 0 .. quant_range and masked, sent as Chunks whose
// payloads are little-endian uint32 values (no codec header); the client first takes part in the
// round's key stages (SecAgg messages).
struct SecAggTask {
  uint32_t index = 0;
  uint32_t clients = 0;
  uint32_t neighbours = 0;
  uint32_t threshold = 0;
  uint64_t graph_seed = 0;
  double clip_range = 0;
  uint32_t quant_range = 0;
  double weight_scale = 1;
  // Central or distributed DP (dp.mode = "central" / "distributed"): the update is clipped to
  // L2 norm dp_clip with weight 1 (weight_scale is 1), and N(0, dp_noise_stddev^2) is added to
  // every value before it is quantised (0 under central DP: the coordinator noises the sum).
  // dp_clip 0: off.
  double dp_clip = 0;
  double dp_noise_stddev = 0;
  // FedNova (aggregation.method = "fednova"): the weight is also divided by
  // fedNovaNormaliser(steps, fednova_momentum) (common/fednova.h) for the update's local steps,
  // so that the masked sum is FedNova's sum_k n_k D_k / a_k (over weight_scale).
  bool fednova = false;
  double fednova_momentum = 0;
  bool on() const { return clients > 0; }
};

// Local differential privacy (dp.mode = "local"): the client clips its update to L2 norm
// `clip` and adds N(0, (noise_multiplier clip)^2) to every value before it leaves, from a
// stream the coordinator cannot predict, and accounts its own releases at `delta`. clip = 0:
// off.
struct LocalDpTask {
  double clip = 0;
  double noise_multiplier = 0;
  double delta = 0;
  bool on() const { return clip > 0; }
};

struct Task {
  uint64_t run_id = 0;
  uint32_t round = 0;
  uint64_t model_version = 0;
  std::string model_name;  // built-in model name, or "torchscript"
  // Flat fp32 parameters, little endian. On the wire (protocol 4) this field of the Task frame
  // is empty and the bytes follow as the model frame (transport attachment), so the coordinator
  // can send one shared buffer to every client; decodeFrames() puts them back here.
  std::string model_bytes;
  Sha256 model_sha256{};
  HyperParams hparams;
  DataSpec data;
  double deadline_s = 0;  // seconds from receipt by which the update must be uploaded
  std::string codec = "none";
  uint64_t task_token = 0;  // echoed by every Chunk and Summary of this task
  uint32_t chunk_bytes = 1 << 20;
  // A random id of the coordinator process that sent the task (0: none, e.g. the simulator).
  // A client that gets a task of a new session knows the coordinator restarted and drops what
  // it still holds of the old one (its training, queued uploads and grants) at once.
  uint64_t coordinator_session = 0;
  // SCAFFOLD: the server control variate c, flat fp32 little endian in the model's layout, as
  // long as model_bytes; empty unless hparams.scaffold (decode() refuses any other length).
  std::string control_bytes;
  ServedModel served;  // protocol 5
  // Federated evaluation: before training, evaluate the task's model (with the client's local
  // part, model.local) on the client's held-out data and report it in the Summary's eval_*.
  bool fed_eval = false;
  SecAggTask secagg;
  LocalDpTask local_dp;
};

// Client -> coordinator: one piece of the update. `offset` is the element offset of the first
// value of `payload` in the flat parameter buffer; it alone places the chunk. (The schema's
// retired tensorIndex, the tensor a chunk starts in, is neither written nor read: nothing
// checked it.) The coordinator checks every field against the task: docs/ERRORS.md, "Limits on
// what a client sends".
struct Chunk {
  uint64_t task_token = 0;
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
  // The served model (Task::served) evaluated on the client's held-out data: the samples, mean
  // loss and accuracy, and the SHA-256 of the model evaluated. served_samples == 0: none was
  // (no served model, no held-out data, or the client lacks the model an "unchanged" names).
  uint64_t served_samples = 0;
  double served_loss = 0;
  double served_accuracy = 0;
  Sha256 served_sha256{};
  // Federated evaluation (Task::fed_eval): the task's model on the client's held-out data,
  // before training: the samples, mean loss and accuracy. eval_samples == 0: not evaluated (not
  // asked, or the client holds no held-out data).
  uint64_t eval_samples = 0;
  double eval_loss = 0;
  double eval_accuracy = 0;
  bool eval_has_accuracy = true;  // false: the model has none (a regression); eval_accuracy 0
  // Further metrics of that evaluation, each a mean over the held-out samples: "mse" and "mae"
  // for float targets, then the model's own metrics(). Names are 1 to kMaxMetricName of
  // [A-Za-z0-9_.-], distinct; at most kMaxEvalMetrics (decode() refuses others).
  std::vector<std::pair<std::string, double>> eval_metrics;
};

inline constexpr size_t kMaxEvalMetrics = 18;  // mse, mae and 16 of the model's own
inline constexpr size_t kMaxMetricName = 64;

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

// Client -> coordinator: the update of task `task_token` is ready; may it send its chunks?
// Sent once per upload, when it is the client's next upload to go out (encoding may already
// run). Asking again for a task already granted or waiting changes nothing.
struct UploadRequest {
  uint64_t task_token = 0;
};

// Coordinator -> client: send the chunks of `task_token` now. The coordinator grants at most
// coordinator.max_concurrent_uploads at once, in the order asked; the credit comes back when
// that upload completes, is rejected or cancelled, the client is lost or the task's deadline
// passes.
struct UploadGrant {
  uint64_t task_token = 0;
};

// One step of a SecAgg+ round (common/secagg/secagg_server.h), for task `task_token`:
//   kAdvert     client -> coordinator: its keys (adverts, one)
//   kKeys       coordinator -> client: its neighbours' keys (adverts)
//   kShares     client -> coordinator: its sealed shares, one per neighbour (shares)
//   kForwarded  coordinator -> client: the shares sealed for it (shares)
//   kUnmask     coordinator -> client: whose shares to reveal (survivors, dropped)
//   kReveal     client -> coordinator: the shares (revealed)
enum class SecAggStep : uint8_t {
  kAdvert = 1,
  kKeys = 2,
  kShares = 3,
  kForwarded = 4,
  kUnmask = 5,
  kReveal = 6
};
const char* secAggStepName(SecAggStep step);

struct SecAgg {
  uint64_t task_token = 0;
  SecAggStep step = SecAggStep::kAdvert;
  std::vector<secagg::KeyAdvert> adverts;
  std::vector<secagg::SealedShares> shares;
  secagg::UnmaskRequest request;
  std::vector<secagg::RevealedShare> revealed;
};

using Message = std::variant<Hello, Task, Chunk, Summary, Cancel, Heartbeat, Bye, Error,
                             UploadRequest, UploadGrant, SecAgg>;

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

// The size of encode(Message(chunk)), known without encoding it (the simulator's virtual
// network times every chunk by it): a Chunk's fixed part, and its payload padded to whole words
// in the first segment, or (a payload encode references in place) as a segment of its own.
size_t encodedSize(const Chunk& chunk);

// Parses bytes produced by encode(). Any malformed input, including truncation, an unknown
// union tag, a frame over `limits.max_bytes` or a traversal-limit violation, returns a non-OK
// Status; it never throws or aborts.
Result<Message> decode(std::string_view bytes, const DecodeLimits& limits = {});

// Parses a message as it arrives over the transport: `frame` (bytes produced by encode()) and,
// for a Task and only for a Task, `model_frame`, the model bytes sent after it. A Task frame
// must have model_bytes empty; the decoded Task gets the model frame as its model_bytes (moved,
// not copied). kCorrupt, never an abort, for: a Task without a model frame, a Task with model
// bytes in both places, any other message followed by a model frame, control_bytes of another
// length than the model frame, and everything decode() refuses. A Task whose served model is
// kAttached has a model frame of two equal halves: the training model (model_bytes) and the
// served model (served.bytes); an odd length is kCorrupt.
Result<Message> decodeFrames(std::string_view frame, std::optional<std::string> model_frame,
                             const DecodeLimits& limits = {});

}  // namespace fedfleet::wire
