// ClientSession: the client's side of the round protocol as a state machine, without I/O.
//
// It opens no socket, reads no clock and starts no thread. A driver feeds it events (a task
// arrived, training ended, the coordinator granted an upload, a chunk was encoded or has gone
// out, a Cancel or an Error came, time passed, the connection was made again), each with the
// current time where time matters, and carries out the actions it emits, in order (start or stop
// training, ask for an upload credit, send a chunk, the Summary or an Error, abandon an upload,
// publish the served model, persist c_k). Two drivers share it: the ZeroMQ client process
// (client/client_runtime.h: socket messages, the system clock, a worker thread and an encoder
// thread) and the fleet simulator (sim/fleet_simulator.h: one session per virtual client, virtual
// time). Given the same events at the same times it emits the same actions.
//
// What it owns, on the driver's loop thread alone:
//  - the task in training (its token, receipt time, deadline and partial-work stop), and the
//    checks a task passes before it is trained: the model's SHA-256, the codec text, SCAFFOLD's
//    control variate size, the client's local DP floor and the served model
//    (client/served_model.h; a mismatch refuses the task with Error kRejected, nothing is
//    trained);
//  - the uploads: trained updates in the order they finished. Only the front one is on its way:
//    it asks for a credit (SendUploadRequest; the driver starts encoding it then), its encoded
//    chunks wait for the grant and then go one at a time (SendChunk; the driver reports each
//    with onChunkSent once it has passed the uplink), and the Summary follows the last. A Cancel,
//    an Error naming the token or its deadline abandons an upload, queued or on its way;
//  - SCAFFOLD's c_k (client/control_variate.h): a task trains on a copy taken when it starts;
//    an upload's Dc_k is added once its Summary has reached the coordinator (onSummaryDelivered)
//    without an Error or Cancel for the task before, never for an abandoned or rejected upload;
//  - the served model held and its evaluation on the client's held-out data.
//
// What the drivers keep: the training itself, the delta and its encoding (the error-feedback
// residual: the driver resets it when an abandoned upload had started encoding), the uplink
// throttle and the transport. Heartbeats and Hello are the driver's too.
#pragma once

#include <spdlog/spdlog.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "client/control_variate.h"
#include "client/served_model.h"
#include "client/upload_pipeline.h"
#include "common/compress/codec.h"
#include "common/secagg/secagg_client.h"
#include "common/status.h"
#include "common/wire/messages.h"

namespace fedfleet::client {

// A Task as it arrived, its large buffers shared: the simulator hands every virtual client the
// coordinator's own. task.model_bytes, task.control_bytes and task.served.bytes are not read.
struct ReceivedTask {
  wire::Task task;
  std::shared_ptr<const std::string> model_bytes;    // flat fp32 (checked against model_sha256)
  std::shared_ptr<const std::string> control_bytes;  // SCAFFOLD's c; else null
  std::shared_ptr<const std::string> served_bytes;   // task.served.source == kAttached; else null
};
// A Task decoded from the wire, its buffers moved into shared ones (no copy).
ReceivedTask receivedTask(wire::Task task);

// The held-out evaluation of a served model.
struct ServedEvaluation {
  uint64_t n = 0;
  double loss = 0;
  std::optional<double> accuracy;                       // none: a regression
  std::vector<std::pair<std::string, double>> metrics;  // model::namedMetrics
};

// What the driver trains: the session hands it over when training starts and never touches it
// again, so the worker may read it while the session goes on.
struct TrainingRequest {
  wire::Task task;  // model_bytes, control_bytes and served.bytes emptied: they are below
  std::shared_ptr<const std::string> model_bytes;
  std::shared_ptr<const compress::Codec> codec;
  // SCAFFOLD (task.hparams.scaffold): the server's c (the task's control bytes) and a copy of
  // c_k as it was when the task arrived; empty otherwise.
  std::shared_ptr<const std::string> control_c;
  std::vector<float> control_ck;
  // A served model to evaluate on the held-out data after training (null: none, or its
  // evaluation is known), and its SHA-256.
  std::shared_ptr<const std::string> served_to_evaluate;
  wire::Sha256 served_sha{};
};

// What the driver hands back when training ended. The delta itself stays with the driver,
// which encodes it; the session needs only what the Chunks and the Summary say.
struct TrainingOutcome {
  Status status;                // not OK: training failed (answered with Error kInternal)
  uint64_t partition_size = 0;  // n_k, the samples the client holds (Chunk and Summary n_samples)
  uint64_t steps = 0;
  bool stopped_early = false;  // the stop flag ended it before the planned steps
  double mean_loss = 0;
  double sum_sq_loss = 0;
  double compute_seconds = 0;
  std::vector<float> control_delta;  // SCAFFOLD's Dc_k (empty otherwise)
  // The served model of the request evaluated (unset: none was asked, or it was not run).
  std::optional<Result<ServedEvaluation>> served_evaluation;
  // Federated evaluation (task.fed_eval): the task's model, with the client's local part, on
  // its held-out data before training (unset: not asked; n == 0: no held-out data).
  std::optional<Result<ServedEvaluation>> fed_evaluation;
};

// Flat fp32 values from little-endian bytes (a model or a control variate as the wire has it).
std::vector<float> floatsOf(const std::string& bytes);

// Actions, in the order emitted.
struct StartTraining {
  std::shared_ptr<const TrainingRequest> request;
};
// Partial work: stop training after its current step and report the work done (onTrainingDone).
struct StopTraining {
  uint64_t token = 0;
};
// Stop training and discard it: nothing of it is reported or uploaded.
struct AbandonTraining {
  uint64_t token = 0;
  uint32_t round = 0;
  std::string why;
};
// Ask the coordinator for the upload credit of `token`; the driver starts encoding that update
// now and reports its chunks in order with onChunkEncoded.
struct SendUploadRequest {
  wire::UploadRequest request;
  // Secure aggregation (task.secagg): the chunks are encoded with encodeMaskedChunk
  // (client/masked_upload.h) by this masker, at this weight, instead of the codec.
  std::shared_ptr<const secagg::SecAggClient> masker;
  wire::SecAggTask secagg;
  double secagg_weight = 0;
};
// Send this step of the task's secure aggregation.
struct SendSecAgg {
  wire::SecAgg message;
};
// Send this chunk (through the uplink throttle); then onChunkSent, or onSendFailed.
struct SendChunk {
  wire::Chunk chunk;
};
// Send the Summary (the driver adds encode_seconds, its encoder's time); then
// onSummaryDelivered once the coordinator has it.
struct SendSummary {
  wire::Summary summary;
};
struct SendError {
  wire::Error error;
};
// Drop the update of `token`: its encoder and delta; encoding_started says whether it had asked
// for its credit (its encoding then ran, and touched the error-feedback residual).
struct AbandonUpload {
  uint64_t token = 0;
  uint32_t round = 0;
  std::string why;
  bool encoding_started = false;
  size_t chunks_sent = 0;
};
// The served model held changed: write servedModel() where it is published (ServedModelStore
// ::save).
struct PublishServedModel {};
// c_k changed (an upload's Dc_k was added): persist controlVariate() where it is kept.
struct ControlVariateCommitted {};

using ClientAction = std::variant<StartTraining, StopTraining, AbandonTraining, SendUploadRequest,
                                  SendChunk, SendSummary, SendError, AbandonUpload,
                                  PublishServedModel, ControlVariateCommitted, SendSecAgg>;

struct ClientSessionOptions {
  std::string client_id;  // for log lines
  // SCAFFOLD: what c_k is at the first SCAFFOLD task, for a model of n parameters (the runtime
  // reads its state file; null: zeros), and the storage of a c_k that starts from zero or is
  // reset when the model size changes.
  std::function<ControlVariate(size_t n)> load_control;
  compress::ResidualStorage control_storage = compress::ResidualStorage::kFp32;
  // Where the served model is published (PublishServedModel; empty: kept in memory only).
  std::string served_model_path;
  // When a served model is evaluated on the held-out data:
  //  kUntilEvaluated (the client process): after the training of every task while the model
  //    held has no evaluation, so an evaluation lost with an abandoned task is made again;
  //  kWhenBytesArrive (the simulator, whose histories were recorded so): only after the
  //    training of a task that brought the model's bytes, and only if it has none.
  enum class ServedEvaluationPolicy { kUntilEvaluated, kWhenBytesArrive };
  ServedEvaluationPolicy served_evaluation = ServedEvaluationPolicy::kUntilEvaluated;
  // Secure aggregation: the 32-byte key a task's SecAgg+ secrets come from (null: a fresh key
  // from the CSPRNG each task; the simulator derives one from its seed). The task's
  // distributed-DP noise key is never one of those secrets: with null, a second fresh key; with
  // a key given, HKDF of it under a label of its own (the self-mask seed and mask key that the
  // coordinator may rebuild come from another derivation of it and do not reveal the noise).
  std::function<std::string(uint64_t token)> secagg_key;
  // The local differential privacy this client insists on (client.local_dp_min_noise): a task
  // whose local DP is off, or noises with a multiplier z below this, is refused (Error kRejected
  // naming the key) and not trained, so that the client's guarantee does not rest on the
  // coordinator asking for it. 0: off (the task's local DP is taken as it comes).
  double local_dp_min_noise = 0;
  // The level of the session's progress lines (a task arrived, shares sealed, ...): info for a
  // client process; debug in the simulator, whose thousands of virtual clients would otherwise
  // bury its progress. Warnings and errors keep their own levels.
  spdlog::level::level_enum progress_level = spdlog::level::info;
};

class ClientSession {
 public:
  explicit ClientSession(ClientSessionOptions options);

  // Events. `now` is seconds on the driver's clock (monotonic; virtual in the simulator).

  // A task arrived. A task of a new coordinator session abandons everything of the old one; a
  // task in training is abandoned for it. A task that fails a check (model SHA-256, codec,
  // SCAFFOLD control size, the local DP floor, served model) is answered with Error kRejected
  // and not trained. A task whose token this session holds (in training or upload) is a resend
  // and is ignored.
  void onTask(ReceivedTask received, double now);
  // Training of `token` ended (the driver's worker finished). A failure is answered with Error
  // kInternal; a stopped task uploads its work done when it was stopped by stop_after_s and did
  // at least one step (none: Error kInternal), else nothing. Otherwise its upload is queued.
  // A token that is not the task in training is ignored.
  void onTrainingDone(uint64_t token, TrainingOutcome outcome, double now);
  // The coordinator granted the upload of `token`: its chunks may go. A grant for an upload
  // that did not ask (or was abandoned meanwhile) changes nothing.
  void onUploadGrant(uint64_t token, double now);
  // The driver encoded the next chunk of the upload of `token` (in plan order). Ignored unless
  // that upload is on its way.
  void onChunkEncoded(uint64_t token, EncodedChunk chunk);
  // Encoding the update failed (a value that is not finite, a device error): Error kInternal,
  // and the upload is abandoned.
  void onEncodingFailed(uint64_t token, const Status& status);
  // The last SendChunk of `token` has passed the uplink at `now`. After the last chunk: the
  // Summary (upload_seconds = now - the grant's time), and the next upload asks for its credit.
  void onChunkSent(uint64_t token, double now);
  // The last SendChunk could not be sent (the coordinator is away): the upload is abandoned.
  void onSendFailed(uint64_t token);
  // The Summary of `token` reached the coordinator: c_k += its Dc_k (ControlVariateCommitted),
  // unless a Cancel or Error for the task came first.
  void onSummaryDelivered(uint64_t token);
  // The coordinator cancelled task `cancel.task_token`: its training or upload is abandoned.
  void onCancel(const wire::Cancel& cancel, double now);
  // The coordinator answered with an Error about a task (kUnknownClient is the driver's: it
  // says Hello): that task's training or upload is abandoned, its Dc_k never committed.
  void onCoordinatorError(const wire::Error& error, double now);
  // Time passed: a task past its deadline (from receipt) is abandoned, in training or in upload;
  // a task training stop_after_s after receipt is stopped (StopTraining) to upload its work done.
  void onTimePassed(double now);
  // A step of a task's secure aggregation from the coordinator: its neighbours' keys (answered
  // with this client's sealed shares), the shares sealed for it (its upload may then ask for
  // its credit: it can mask), or whose shares to reveal (answered once). A step it cannot take
  // (too few neighbours, a share that does not open) leaves the task out of the round; the
  // coordinator then rejects it.
  void onSecAgg(const wire::SecAgg& message, double now);
  // The driver said Hello again (the coordinator was silent, or forgot this client): an upload
  // waiting for its grant asks again (the coordinator answers a grant it gave again, and a task
  // it no longer knows with an Error, which abandons it).
  void onReconnected(double now);
  // Task::coordinator_session of the last task taken (0: none yet), for the next Hello.
  uint64_t coordinatorSession() const { return coordinator_session_; }
  // The driver stops (or its connection failed): everything in progress is abandoned.
  void abandonAll(const std::string& why);

  // The actions emitted since the last call, in order.
  std::vector<ClientAction> takeActions();

  // State, for the driver's loop.
  // The token of the task in training.
  std::optional<uint64_t> trainingToken() const;
  // The upload on its way (asked for its credit), if any, and whether it holds its grant.
  std::optional<uint64_t> activeUpload() const;
  bool activeUploadGranted() const;
  // Whether the driver should hand over the next encoded chunk of `token` now: it is the upload
  // on its way, granted, and its previous chunk has gone out.
  bool wantsChunk(uint64_t token) const;
  // Whether the update of `token` is queued or on its way.
  bool holdsUpload(uint64_t token) const;
  size_t uploadsQueued() const { return uploads_.size(); }
  // Earliest time at which onTimePassed has something to do (a deadline or a stop_after_s);
  // unset when nothing waits on time.
  std::optional<double> nextWakeup() const;

  const ServedModelStore& servedModel() const { return served_; }
  // c_k (null before the first SCAFFOLD task).
  const ControlVariate* controlVariate() const { return control_ ? &*control_ : nullptr; }

 private:
  // What a task in hand, training or uploading, keeps of its Task.
  struct TaskInHand {
    uint64_t token = 0;
    uint32_t round = 0;
    double received_at = 0;
    double deadline_s = 0;
    bool serves = false;  // the task named a served model
    wire::LocalDpTask local_dp;
  };
  struct Training : TaskInHand {
    double stop_after_s = 0;
    bool partial = false;       // stopped by stop_after_s: the work done is uploaded
    wire::Sha256 evaluating{};  // the served model its training evaluates (request's)
  };
  struct Upload : TaskInHand {
    bool released = false;    // local DP: its first chunk went out (counted)
    TrainingOutcome outcome;  // control_delta moved out once the Summary is sent
    bool asked = false;       // SendUploadRequest emitted
    bool granted = false;
    double granted_at = 0;
    std::deque<wire::Chunk> ready;  // encoded, waiting for the grant or the previous chunk
    bool chunk_out = false;         // a SendChunk waits for onChunkSent
    bool last_out = false;          // ... and it is the last chunk
    size_t chunks_sent = 0;
  };

  void emit(ClientAction a) { actions_.push_back(std::move(a)); }
  // A task's secure aggregation: its client state, and whether it can mask (shares received).
  struct SecAggRound {
    std::shared_ptr<secagg::SecAggClient> client;
    wire::SecAggTask task;
    uint32_t round = 0;
    bool ready = false;
  };
  // The SendUploadRequest of `u` (with its masker under secure aggregation).
  SendUploadRequest uploadRequestFor(const Upload& u) const;
  // Starts the secure aggregation of `task` (its advert); false when it must be refused (done).
  bool startSecAgg(const wire::Task& task, size_t n_values);
  void refuse(const wire::Task& task, std::string why);
  // Why `task` falls short of options_.local_dp_min_noise; empty when it does not.
  std::string localDpShortfall(const wire::Task& task) const;
  void abandonTraining(const std::string& why);
  // Abandons the upload of `token` (queued or on its way); true if there was one.
  bool abandonUpload(uint64_t token, const std::string& why);
  // Asks for the front upload's credit when it has not yet.
  void startUpload();
  // Emits the front upload's next chunk when it may go.
  void pumpChunks();
  // Takes the served model `received` names; false when the task must be refused (done).
  bool takeServed(const ReceivedTask& received, TrainingRequest* request);
  void fillServed(wire::Summary* s) const;
  Result<std::shared_ptr<const compress::Codec>> codecFor(const std::string& text);
  ControlVariate& controlVariateFor(size_t n);

  // Constant after construction.
  const ClientSessionOptions options_;

  // Protocol state (the driver's loop thread).
  std::optional<Training> training_;
  std::deque<Upload> uploads_;  // the front one is on its way once it asked
  // Summaries sent whose Dc_k waits for onSummaryDelivered (SCAFFOLD), by token.
  std::map<uint64_t, std::vector<float>> delivering_;
  uint64_t coordinator_session_ = 0;  // of the last task (0: none yet)
  std::map<std::string, std::shared_ptr<const compress::Codec>> codecs_;
  std::optional<ControlVariate> control_;
  ServedModelStore served_;
  std::optional<std::pair<wire::Sha256, ServedEvaluation>> served_eval_;
  std::map<uint64_t, SecAggRound> secagg_;  // by task token, until its shares are revealed
  uint64_t local_dp_releases_ = 0;          // local DP: updates of this client that went out
  std::vector<ClientAction> actions_;
};

}  // namespace fedfleet::client
