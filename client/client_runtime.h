// ClientRuntime: a client process's loop. It says Hello, trains the tasks the coordinator
// sends, uploads each delta in chunks followed by a Summary, and keeps the connection alive.
//
// Threads: the calling thread (the loop thread) owns the DEALER socket and does all sends and
// receives; local training runs on one worker thread at a time (LibTorch intra-op threads as
// configured); an upload's chunks are compressed on its UploadPipeline's encoder thread
// (client/upload_pipeline.h) while the loop thread sends the ones already encoded. A Cancel, a
// deadline or a coordinator error about the task sets the worker's stop flag, or cancels the
// upload; a stopped result is discarded, never uploaded, and a cancelled upload sends nothing
// more (the coordinator drops the partial update).
//
// Upload of one update, on the loop thread:
//   1. Training ends (the worker also cuts the delta into chunks, planChunks over the model's
//      layout and the task's chunk_bytes); the update joins the upload queue.
//   2. When no other upload is in flight, an UploadPipeline starts encoding its chunks with
//      the task's codec (wire::Task::codec, a compress::CodecSpec text), through the client's
//      error-feedback residual when the codec is biased (compress::usesErrorFeedback).
//   3. Each loop iteration takes the next encoded chunk, reserves its frame bytes in the token
//      bucket (upload_mbps; client/token_bucket.h) and sends it once the bucket lets it pass.
//      Meanwhile the loop keeps receiving, answering Cancels and sending Heartbeats: it never
//      blocks on the encoder or the throttle for more than a poll slice. Only chunk frames
//      pass through the bucket; Hello, Heartbeat, Summary and Error frames are small and don't.
//   4. After the last chunk, the Summary: upload_seconds = from the start of this upload (step
//      2) to this moment, when the last chunk has passed the throttle (the coordinator divides
//      the bytes by it to estimate the uplink); encode_seconds = the encoder's time. The log
//      line "<id>: round R uploaded (...)" gives both per update, and after_training_s, from
//      the end of training to the Summary (which also counts a wait behind an earlier upload).
//
// A task whose codec text does not parse is answered with Error kRejected and not trained; an
// update that is not finite is answered with Error kInternal before any chunk is sent.
//
// Asynchronous mode: a Task that arrives while an upload drains starts training at once; the
// upload goes on (a Cancel or an Error naming its token stops it), and the new update queues
// behind it. A Task that arrives while another task trains abandons that training, as before.
//
// Error feedback: one residual per client process, kept across tasks and used chunk by chunk;
// it is reset when the codec or the model size changes, and when an upload that used it is
// abandoned part-way (its residual would count chunks the coordinator never aggregated).
//
// Partial work (HyperParams::stop_after_s > 0): the loop thread sets the worker's stop flag
// that many seconds after the task arrived (checked on every loop iteration, which polls at
// least every kTrainingPollMs while a task trains), and the work done so far is uploaded like a
// finished update, with its true step count (Chunk and Summary steps; n_samples stays n_k, the
// samples the client holds). A task stopped before its first step is answered with Error
// kInternal instead (there is nothing to upload). A Cancel or the deadline still abandons it.
//
// SCAFFOLD (HyperParams::scaffold): the task brings the server's c (Task::control_bytes); the
// client's c_k (client/control_variate.h) is zero at first, read from scaffold_state_path at the
// first SCAFFOLD task when that is set (a missing, corrupt or wrong-size file: zero, with a log
// line naming it), and reset to zero when a task's model has another size. The update is the
// delta followed by Dc_k (2P values; wire::Task). Once its Summary is sent, c_k += Dc_k and,
// with a path, the file is rewritten atomically; an abandoned upload leaves c_k as it was, as
// the coordinator aggregated nothing of it. The loop thread owns c_k; the worker trains on a
// copy taken when the task starts (so a task that starts while an earlier SCAFFOLD upload
// drains trains with c_k as it was before that upload's Dc_k).
//
// Block-cyclic serving (Task::served, protocol 5): the task names the model this client serves
// for evaluation and inference; when its bytes come (attached, or the task's own model) they
// are checked against their SHA-256 (a mismatch refuses the task with Error kRejected), kept
// in a ServedModelStore and, with served_model_path, written to that file atomically. The
// worker evaluates each new served model once, after the task's training, on the client's
// held-out data (partition spec.index of the test split, cut as the training split is); every
// Summary then reports the served model held (its SHA-256) and that evaluation.
//
// Reconnection: the coordinator answers every Heartbeat. When it has been silent for
// `liveness_s` (for example it restarted), or answers with "unknown client", the runtime says
// Hello again; ZeroMQ reconnects the socket underneath.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/client_session.h"
#include "client/trainer.h"
#include "common/compress/error_feedback.h"
#include "common/data/dataset.h"
#include "common/model/model.h"
#include "common/status.h"
#include "common/transport/transport.h"
#include "common/wire/messages.h"

namespace fedfleet::client {

struct ClientRuntimeOptions {
  transport::ClientOptions transport;  // endpoint, keys, routing id
  std::string client_id;
  std::string device = "auto";   // auto, cpu, cuda
  std::string data_dir;          // Fashion-MNIST IDX files; empty: the Debian package's
  std::string torchscript_path;  // for tasks naming the "torchscript" model
  uint32_t threads = 1;          // LibTorch intra-op threads
  int32_t partition = -1;        // partition to ask for (-1: any)
  double heartbeat_s = 1;
  double liveness_s = 5;   // coordinator silence before saying Hello again
  double exit_idle_s = 0;  // give up after this much silence (0: never)

  // Uplink emulation: a token bucket of upload_mbps Mbit/s (0: unlimited) holding up to
  // upload_burst_bytes, in front of every chunk frame.
  double upload_mbps = 0;
  size_t upload_burst_bytes = 64 << 10;
  // Upload pipeline: encoded chunks kept ready ahead of the sender; pipelined = false encodes
  // the whole update before sending (the baseline bench/pipeline_overlap.sh compares with).
  size_t upload_queue_chunks = 4;
  bool upload_pipelined = true;
  // A client training on a CUDA device compresses there (compress::DeviceCompressor, a stream
  // of its own, the residual on the device) when this build has the CUDA kernels; SCAFFOLD
  // updates are compressed on the host. false: always on the host.
  bool compress_on_gpu = true;
  // How the error-feedback residual is stored (fp32 exact; bf16/fp16 half the memory).
  compress::ResidualStorage residual_storage = compress::ResidualStorage::kFp32;
  // SCAFFOLD: the file this client's control variate c_k lives in across runs (empty: in memory
  // only, zero at every start), and how c_k is stored in memory.
  std::string scaffold_state_path;
  compress::ResidualStorage scaffold_storage = compress::ResidualStorage::kFp32;
  // model.local: name patterns of the tensors this client keeps to itself (its local part,
  // common/model/local_part.h), and the file that part lives in across runs (empty: memory).
  std::vector<std::string> local_patterns;
  std::string local_state_path;
  // The client's own training data (data.format idx, csv, tensors or image-folder with
  // data.path), trained whole on tasks whose data spec says partition "none" of that format;
  // null: the client trains its partition of fashion-mnist as the task says.
  std::shared_ptr<const data::Dataset> own_data;
  std::string own_format;
  // Its held-out data (data.test_path, or data.holdout_fraction of data.path): what it evaluates
  // the task's model on when a task asks for a federated evaluation (null or empty: none).
  std::shared_ptr<const data::Dataset> own_test;
  // Block-cyclic serving: where the served model is published (client/served_model.h; empty:
  // kept in memory only).
  std::string served_model_path;
  // client.local_dp_min_noise: tasks whose local DP is off or noises with a smaller multiplier
  // are refused (ClientSessionOptions::local_dp_min_noise); 0: off.
  double local_dp_min_noise = 0;

  // A training loop of the caller's own in place of the built-in Trainer (the Python package's
  // fedfleet.Client). Called on the training thread with the task, the model's layout (from
  // model.path or the built-in model's name) and the values the task starts from; `stop` turns
  // true when the coordinator gives up on the task. It returns the update; the client then does
  // all it does with its own (the local part, local DP, the codec and its residual, the upload
  // pipeline and credits, secure aggregation's masking). An error fails the task with its text
  // (cut to what an Error frame carries). Such a client holds no data of its own here: own_data
  // and data_dir are not read. A SCAFFOLD task also hands it c and this client's c_k (`scaffold`;
  // both null otherwise), and the runtime computes the control delta from the steps it reports.
  struct CustomUpdate {
    std::vector<float> delta;  // final - start, in the layout's order
    uint64_t samples = 0;      // the samples it holds (FedAvg's weight), > 0
    uint64_t steps = 0;        // optimiser steps taken
    double mean_loss = 0;      // mean training loss
    // A task with fed_eval: the loop's evaluation of the start values on its held-out data
    // (none: the client reports no evaluation).
    std::optional<ServedEvaluation> evaluation;
  };
  using CustomTraining = std::function<Result<CustomUpdate>(
      const wire::Task& task, const model::Layout& layout, const std::vector<float>& start,
      const ScaffoldControls& scaffold, const std::atomic<bool>& stop)>;
  CustomTraining custom_training;
};

class ClientRuntime {
 public:
  // Connects (asynchronously) and resolves the device. Errors: bad device spec, transport
  // options rejected, upload_mbps < 0 or upload_queue_chunks == 0 (kInvalidArgument).
  static Result<std::unique_ptr<ClientRuntime>> create(const ClientRuntimeOptions& options);
  virtual ~ClientRuntime() = default;

  // Runs until the coordinator says Bye (OK), stop() is called (kUnavailable) or the
  // coordinator stays silent for exit_idle_s (kTimeout).
  virtual Status run() = 0;
  virtual void stop() = 0;  // safe from any thread and from a signal handler
};

}  // namespace fedfleet::client
