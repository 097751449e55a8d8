#include "client/client_runtime.h"

#include <malloc.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <variant>

#include "client/control_variate.h"
#include "client/served_model.h"
#include "client/token_bucket.h"
#include "client/trainer.h"
#include "client/upload_pipeline.h"
#include "common/compress/codec.h"
#include "common/crypto/sha256.h"
#include "common/data/dataset.h"
#include "common/data/split.h"
#include "common/format.h"
#include "common/model/evaluate.h"
#include "common/model/model.h"
#include "common/wire/limits.h"
#include "common/wire/messages.h"

namespace fedfleet::client {
namespace {

double steadyNow() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string partitionKey(const wire::DataSpec& d) {
  return d.dataset + "|" + d.scheme + "|" + std::to_string(d.alpha) + "|" +
         std::to_string(d.labels_per_client) + "|" + std::to_string(d.num_partitions) + "|" +
         std::to_string(d.seed) + "|" + std::to_string(d.subset) + "|" + std::to_string(d.blocks) +
         "|" + std::to_string(d.skew);
}

}  // namespace

Result<std::vector<std::vector<uint32_t>>> splitFor(const std::vector<uint8_t>& labels,
                                                    uint32_t num_classes,
                                                    const wire::DataSpec& spec) {
  return data::splitBySpec(labels, num_classes, spec);
}

namespace {

// Partition spec.index of `ds` split as `spec` says, computed once per split into `cache`.
Result<const std::vector<uint32_t>*> partitionOf(
    const data::Dataset& ds, const wire::DataSpec& spec,
    std::map<std::string, std::vector<std::vector<uint32_t>>>* cache) {
  const std::string key = partitionKey(spec);
  auto it = cache->find(key);
  if (it == cache->end()) {
    FEDFLEET_ASSIGN_OR_RETURN(auto parts, splitFor(ds.labels, ds.num_classes, spec));
    it = cache->emplace(key, std::move(parts)).first;
  }
  if (spec.index >= it->second.size()) {
    return invalidArgument("partition " + std::to_string(spec.index) + " of " +
                           std::to_string(it->second.size()));
  }
  return &it->second[spec.index];
}

// Longest the loop waits for the encoder's next chunk before it polls the socket again (it
// wakes as soon as the chunk is ready; the socket then waits at most this long).
constexpr double kEncoderWaitS = 0.005;
// Longest the loop waits in one receive while a task trains: the upload starts at most this
// long after training ends.
constexpr int kTrainingPollMs = 2;
// Longest the loop sends chunks back to back before it polls the socket again.
constexpr double kSendSliceS = 0.02;

// One task in progress on the worker thread.
struct Job {
  wire::Task task;
  std::shared_ptr<const compress::Codec> codec;
  double received_at = 0;
  std::atomic<bool> stop{false};
  std::atomic<bool> done{false};
  bool partial = false;  // stop was set by stop_after_s: the work done is uploaded (loop thread)
  Result<TrainResult> result{internalError("not run")};
  uint64_t partition_size = 0;   // n_k: the samples the client holds for this task
  std::vector<ChunkRange> plan;  // the update's chunks (set by the worker after training)
  // SCAFFOLD: c (from the task) and a copy of c_k, which the worker trains with; then Dc_k
  // (also at the end of result->delta, which holds the whole update).
  std::vector<float> control_c, control_ck, control_delta;
  double trained_at = 0;  // when training ended
  // Block-cyclic serving: the served model to evaluate on the held-out data (empty: none, or
  // its evaluation is known), and the outcome (set by the worker).
  std::vector<float> served_params;
  wire::Sha256 served_sha{};
  std::optional<Result<model::EvalResult>> served_eval;
  std::thread thread;
};

// A trained update on its way out (loop thread only).
struct Upload {
  wire::Task task;  // model_bytes dropped
  std::shared_ptr<const compress::Codec> codec;
  double received_at = 0;
  double trained_at = 0;
  double started_at = 0;  // when its pipeline started (and its UploadRequest went out)
  bool granted = false;   // the coordinator's UploadGrant arrived: chunks may go
  double granted_at = 0;
  uint64_t partition_size = 0;
  TrainResult result;  // delta (the whole update) moved into the pipeline once it starts
  std::vector<ChunkRange> plan;
  bool partial = false;              // stopped by stop_after_s
  std::vector<float> control_delta;  // SCAFFOLD: Dc_k, added to c_k once the Summary is sent
  bool serves = false;               // the task named a served model
  std::unique_ptr<UploadPipeline> pipeline;  // null until this upload's turn
  bool uses_residual = false;
  std::string frame;  // the next chunk, encoded as a frame, waiting for the throttle
  bool frame_last = false;
  double release_at = 0;  // when `frame` may pass the throttle
  uint64_t bytes = 0;     // chunk frame bytes sent
  size_t chunks = 0;
};

class ZmqClient final : public ClientRuntime {
 public:
  Status init(const ClientRuntimeOptions& options);
  Status run() override;
  void stop() override { stop_.store(true); }

 private:
  void sayHello(double now);
  void send(const wire::Message& m);
  void handle(wire::Message& message, double now);
  void startJob(wire::Task task, double now);
  void abandonJob(const std::string& why);
  void finishJob();
  // Abandons the upload (active or queued) of `token`; true if there was one.
  bool abandonUpload(uint64_t token, const std::string& why);
  void abandonAllUploads(const std::string& why);
  // Starts the next queued upload's pipeline when none is active.
  void startUpload();
  // Sends what the pipeline and the throttle allow now (for at most kSendSliceS); finishes the
  // upload with its Summary after the last chunk.
  void pumpUpload(double now);
  // Milliseconds the next receive may wait without delaying the upload (at most `idle_ms`).
  int receiveTimeoutMs(double now, int idle_ms) const;
  Result<std::shared_ptr<const compress::Codec>> codecFor(const std::string& text);
  // The SCAFFOLD control variate c_k for a model of n parameters: loaded (or zero) on first use,
  // zero again when n changes.
  ControlVariate& controlVariate(size_t n);
  // c_k += delta, then the state file is rewritten (when configured).
  void commitControlDelta(const std::vector<float>& delta);
  // Runs on the worker thread.
  void train(Job& job);
  Result<const std::vector<uint32_t>*> indicesFor(const wire::DataSpec& spec);
  // The client's held-out samples: partition spec.index of the test split, cut as the
  // training split is (worker thread).
  Result<const std::vector<uint32_t>*> heldOutFor(const wire::DataSpec& spec);
  // Takes the served model a task names (the store, its files, what the job evaluates); false
  // when the task must be refused (an Error was sent).
  bool takeServed(const wire::Task& task, Job& job);
  // The served-model fields of a Summary: what the store holds and its evaluation.
  void fillServed(wire::Summary& s) const;

  ClientRuntimeOptions options_;
  std::unique_ptr<transport::ClientTransport> transport_;
  torch::Device device_{torch::kCPU};
  std::atomic<bool> stop_{false};
  std::unique_ptr<Job> job_;

  // Uploads: the front one is in flight once its pipeline exists; the others wait.
  std::deque<std::unique_ptr<Upload>> uploads_;
  std::optional<TokenBucket> bucket_;
  std::map<std::string, std::shared_ptr<const compress::Codec>> codecs_;
  // Error-feedback residual, kept across tasks; the encoder thread of the active pipeline uses
  // it while that pipeline exists, the loop thread otherwise.
  std::unique_ptr<compress::ErrorFeedback> residual_;
  // The same on the GPU, for updates compressed there (one of the two exists at a time).
  std::unique_ptr<compress::DeviceResidual> device_residual_;
  std::string residual_codec_;  // canonical spec the residual belongs to
  // Compresses on device_ (set by init when it is a CUDA device and options allow; then never
  // changed). Used by the encoder thread of the active pipeline alone.
  std::unique_ptr<compress::DeviceCompressor> gpu_;
  // SCAFFOLD control variate c_k (loop thread), created at the first SCAFFOLD task.
  std::optional<ControlVariate> control_;
  // Block-cyclic serving (loop thread): the served model, and its evaluation on the held-out
  // data (for the model with that SHA-256).
  ServedModelStore served_{""};
  std::optional<std::pair<wire::Sha256, model::EvalResult>> served_eval_;

  // Worker-thread state (touched only while a job runs; the loop thread joins before reuse).
  std::optional<data::Dataset> train_set_;
  uint32_t train_set_limit_ = 0;
  std::map<std::string, std::vector<std::vector<uint32_t>>> partitions_;
  std::optional<data::Dataset> test_set_;  // held-out data for the served model
  std::map<std::string, std::vector<std::vector<uint32_t>>> held_out_;
  std::map<std::string, std::unique_ptr<model::Model>> models_;

  uint64_t heartbeat_seq_ = 0;
  uint64_t coordinator_session_ = 0;  // of the last task (0: none yet)
  uint64_t session_ = std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
  double last_hello_ = -1e9;
  bool finished_ = false;
};

Status ZmqClient::init(const ClientRuntimeOptions& options) {
  options_ = options;
  if (!(options_.upload_mbps >= 0)) return invalidArgument("upload_mbps must be >= 0");
  if (options_.upload_queue_chunks == 0) return invalidArgument("upload_queue_chunks must be >= 1");
  bucket_.emplace(TokenBucket::bytesPerSecond(options_.upload_mbps),
                  static_cast<double>(options_.upload_burst_bytes), steadyNow());
  FEDFLEET_ASSIGN_OR_RETURN(device_, model::resolveDevice(options_.device));
  if (device_.is_cuda() && options_.compress_on_gpu) {
    auto gpu = compress::DeviceCompressor::create(device_.has_index() ? device_.index() : 0);
    if (gpu.isOk()) {
      gpu_ = std::move(gpu).value();
      spdlog::info("client {}: compressing updates on the GPU (device {})", options_.client_id,
                   gpu_->device());
    } else {
      spdlog::warn("client {}: compressing updates on the host: {}", options_.client_id,
                   gpu.status().message());
    }
  }
  FEDFLEET_ASSIGN_OR_RETURN(transport_, transport::createClient(options_.transport));
  served_ = ServedModelStore(options_.served_model_path);
  return Status::ok();
}

void ZmqClient::send(const wire::Message& m) {
  // The coordinator refuses an Error whose text is over wire::kMaxReasonBytes
  // (common/wire/limits.h); a long one (a LibTorch message with its backtrace) is cut to fit, so
  // the coordinator still learns that the task failed.
  if (const auto* error = std::get_if<wire::Error>(&m);
      error != nullptr && error->message.size() > wire::kMaxReasonBytes) {
    wire::Error cut = *error;
    cut.message.resize(wire::kMaxReasonBytes);
    send(cut);
    return;
  }
  Status st = transport_->send(wire::encode(m));
  if (!st.isOk())
    spdlog::warn("client {}: send {}: {}", options_.client_id, wire::messageName(m), st.toString());
}

void ZmqClient::sayHello(double now) {
  last_hello_ = now;
  wire::Hello h;
  h.client_id = options_.client_id;
  h.public_key = options_.transport.insecure ? "" : options_.transport.client_keys.public_key;
  h.device_kind = device_.is_cuda() ? wire::DeviceKind::kCuda : wire::DeviceKind::kCpu;
  h.device_name = model::deviceName(device_);
  h.cores = std::thread::hardware_concurrency();
  h.memory_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  h.data_size = train_set_ ? train_set_->size() : 0;
  h.requested_partition = options_.partition;
  h.session = session_;
  send(h);
}

Result<const std::vector<uint32_t>*> ZmqClient::indicesFor(const wire::DataSpec& spec) {
  if (spec.dataset != "fashion-mnist") {
    return invalidArgument("unsupported dataset '" + spec.dataset + "'");
  }
  if (!train_set_ || train_set_limit_ != spec.subset) {
    const std::string dir =
        options_.data_dir.empty() ? data::defaultFashionMnistDir() : options_.data_dir;
    FEDFLEET_ASSIGN_OR_RETURN(auto ds, data::loadFashionMnist(dir, /*train=*/true, spec.subset));
    // Client processes on one host share one copy of the pixels (a read-only mapped file).
    const std::string key = "fashion-mnist-train-" + std::to_string(ds.size()) + "-" +
                            std::to_string(std::hash<std::string>{}(dir));
    if (Status st = data::shareImages(ds, data::defaultCacheDir(), key); !st.isOk()) {
      spdlog::warn("client {}: keeping a private copy of the training images: {}",
                   options_.client_id, st.toString());
    }
    train_set_ = std::move(ds);
    train_set_limit_ = spec.subset;
    partitions_.clear();
  }
  return partitionOf(*train_set_, spec, &partitions_);
}

Result<const std::vector<uint32_t>*> ZmqClient::heldOutFor(const wire::DataSpec& spec) {
  if (spec.dataset != "fashion-mnist") {
    return invalidArgument("unsupported dataset '" + spec.dataset + "'");
  }
  if (!test_set_) {
    const std::string dir =
        options_.data_dir.empty() ? data::defaultFashionMnistDir() : options_.data_dir;
    FEDFLEET_ASSIGN_OR_RETURN(test_set_, data::loadFashionMnist(dir, /*train=*/false, 0));
  }
  return partitionOf(*test_set_, spec, &held_out_);
}

void ZmqClient::train(Job& job) {
  const wire::Task& t = job.task;
  auto run = [&]() -> Result<TrainResult> {
    FEDFLEET_ASSIGN_OR_RETURN(const std::vector<uint32_t>* indices, indicesFor(t.data));
    job.partition_size = indices->size();
    auto mit = models_.find(t.model_name);
    if (mit == models_.end()) {
      FEDFLEET_ASSIGN_OR_RETURN(auto m,
                                model::createModel(t.model_name, 0, options_.torchscript_path));
      m->to(device_);
      mit = models_.emplace(t.model_name, std::move(m)).first;
    }
    std::vector<float> start(t.model_bytes.size() / sizeof(float));
    std::memcpy(start.data(), t.model_bytes.data(), start.size() * sizeof(float));
    TrainOptions o = trainOptionsFrom(t.hparams);
    if (t.hparams.scaffold) o.scaffold = {&job.control_c, &job.control_ck};
    o.delta_on_device = gpu_ != nullptr;  // the trainer ignores it for SCAFFOLD
    Trainer trainer(device_);
    auto result = trainer.train(*mit->second, start, *train_set_, *indices, o, &job.stop);
    job.trained_at = steadyNow();
    if (result.isOk()) {
      const model::Layout layout = mit->second->layout();
      const size_t n = result->device_delta.defined()
                           ? static_cast<size_t>(result->device_delta.numel())
                           : result->delta.size();
      if (t.hparams.scaffold) {
        job.control_delta = result->control_delta;
        result->delta = takeUpload(*result);  // D_k, then Dc_k
      }
      job.plan = planUploadChunks(layout.total == n ? layout : flatLayout(n), t.chunk_bytes,
                                  t.hparams.scaffold, job.codec->spec());
    }
    if (!job.served_params.empty() && !job.stop.load()) {
      // The served model on the held-out data (once per served model: the loop thread keeps
      // the outcome).
      job.served_eval = [&]() -> Result<model::EvalResult> {
        FEDFLEET_ASSIGN_OR_RETURN(const std::vector<uint32_t>* held, heldOutFor(t.data));
        FEDFLEET_RETURN_IF_ERROR(mit->second->setFlatParameters(job.served_params));
        return model::evaluateIndices(*mit->second, *test_set_, *held, 1000, device_);
      }();
    }
    return result;
  };
  job.result = run();
  job.done.store(true);
}

ControlVariate& ZmqClient::controlVariate(size_t n) {
  if (!control_) {
    control_ =
        ControlVariate::loadOrZeros(options_.scaffold_state_path, n, options_.scaffold_storage);
  } else if (control_->size() != n) {
    spdlog::info("client {}: SCAFFOLD control variate reset to zero ({} -> {} values)",
                 options_.client_id, control_->size(), n);
    control_->reset(n);
  }
  return *control_;
}

void ZmqClient::commitControlDelta(const std::vector<float>& delta) {
  if (!control_ || control_->size() != delta.size()) {
    // A later task of another model size reset c_k meanwhile: this Dc_k belongs to no c_k now.
    spdlog::warn("client {}: SCAFFOLD control delta of {} values dropped (c_k has {})",
                 options_.client_id, delta.size(), control_ ? control_->size() : 0);
    return;
  }
  control_->apply(delta);
  if (options_.scaffold_state_path.empty()) return;
  if (Status st = control_->save(options_.scaffold_state_path); !st.isOk()) {
    spdlog::warn("client {}: SCAFFOLD control variate not saved: {}", options_.client_id,
                 st.toString());
  }
}

Result<std::shared_ptr<const compress::Codec>> ZmqClient::codecFor(const std::string& text) {
  auto it = codecs_.find(text);
  if (it != codecs_.end()) return it->second;
  FEDFLEET_ASSIGN_OR_RETURN(compress::CodecSpec spec, compress::parseCodecSpec(text));
  FEDFLEET_ASSIGN_OR_RETURN(std::unique_ptr<compress::Codec> codec, compress::makeCodec(spec));
  std::shared_ptr<const compress::Codec> shared = std::move(codec);
  codecs_.emplace(text, shared);
  return shared;
}

void ZmqClient::startJob(wire::Task task, double now) {
  if (task.coordinator_session != 0) {
    if (coordinator_session_ != 0 && task.coordinator_session != coordinator_session_) {
      // The coordinator restarted: nothing of the old session will be taken any more.
      spdlog::info(
          "client {}: the coordinator restarted (new session); dropping the old "
          "session's work",
          options_.client_id);
      abandonJob("the coordinator restarted");
      abandonAllUploads("the coordinator restarted");
    }
    coordinator_session_ = task.coordinator_session;
  }
  if (job_) abandonJob("a new task arrived");
  if (task.model_bytes.size() % sizeof(float) != 0 ||
      crypto::sha256(task.model_bytes) != task.model_sha256) {
    send(wire::Error{wire::ErrorCode::kRejected, "model bytes do not match their SHA-256",
                     task.task_token});
    return;
  }
  auto codec = codecFor(task.codec);
  if (!codec.isOk()) {
    send(wire::Error{wire::ErrorCode::kRejected, "codec: " + codec.status().message(),
                     task.task_token});
    return;
  }
  if (task.hparams.scaffold && task.control_bytes.size() != task.model_bytes.size()) {
    send(wire::Error{wire::ErrorCode::kRejected,
                     "SCAFFOLD task with " + std::to_string(task.control_bytes.size()) +
                         " bytes of control variate for " +
                         std::to_string(task.model_bytes.size()) + " bytes of model",
                     task.task_token});
    return;
  }
  spdlog::info("client {}: round {} task, partition {}, codec {}{}", options_.client_id, task.round,
               task.data.index, compress::toString((*codec)->spec()),
               uploads_.empty() ? "" : " (an upload is still draining)");
  job_ = std::make_unique<Job>();
  if (!takeServed(task, *job_)) {
    job_.reset();
    return;
  }
  std::string().swap(task.served.bytes);  // the store has them
  if (task.hparams.scaffold) {
    const size_t n = task.model_bytes.size() / sizeof(float);
    job_->control_c.resize(n);
    std::memcpy(job_->control_c.data(), task.control_bytes.data(), n * sizeof(float));
    std::string().swap(task.control_bytes);
    job_->control_ck = controlVariate(n).values();
  }
  job_->task = std::move(task);
  job_->codec = std::move(codec).value();
  job_->received_at = now;
  Job* job = job_.get();
  job_->thread = std::thread([this, job] { train(*job); });
}

bool ZmqClient::takeServed(const wire::Task& task, Job& job) {
  const wire::ServedModel& s = task.served;
  if (s.source == wire::ServedSource::kNone) return true;
  auto changed = served_.take(task);
  if (!changed.isOk()) {
    send(wire::Error{wire::ErrorCode::kRejected, changed.status().message(), task.task_token});
    return false;
  }
  if (*changed) {
    spdlog::info("client {}: serving block {} model {} (version {}, {})", options_.client_id,
                 s.block, s.model, s.version, crypto::toHex(s.sha256).substr(0, 12));
    if (Status st = served_.save(); !st.isOk()) {
      spdlog::warn("client {}: served model not written: {}", options_.client_id, st.toString());
    }
  } else if (!served_.holds(s.sha256)) {
    // Its summary says what it holds; the coordinator sends the model with the next task.
    spdlog::warn("client {}: the task names served model {}, which this client does not hold",
                 options_.client_id, crypto::toHex(s.sha256).substr(0, 12));
  }
  if (!served_.empty() && !(served_eval_ && served_eval_->first == served_.sha256())) {
    job.served_sha = served_.sha256();
    job.served_params.resize(served_.bytes().size() / sizeof(float));
    std::memcpy(job.served_params.data(), served_.bytes().data(), served_.bytes().size());
  }
  return true;
}

void ZmqClient::fillServed(wire::Summary& s) const {
  if (served_.empty()) return;
  s.served_sha256 = served_.sha256();
  if (served_eval_ && served_eval_->first == served_.sha256()) {
    s.served_samples = served_eval_->second.n;
    s.served_loss = served_eval_->second.loss;
    s.served_accuracy = served_eval_->second.accuracy;
  }
}

void ZmqClient::abandonJob(const std::string& why) {
  if (!job_) return;
  spdlog::info("client {}: abandoning round {} task: {}", options_.client_id, job_->task.round,
               why);
  job_->stop.store(true);
  job_->thread.join();
  job_.reset();
}

void ZmqClient::finishJob() {
  job_->thread.join();
  std::unique_ptr<Job> job = std::move(job_);
  const wire::Task& t = job->task;
  if (job->served_eval) {
    if (job->served_eval->isOk()) {
      served_eval_.emplace(job->served_sha, job->served_eval->value());
      spdlog::info(
          "client {}: served model {}: accuracy {:.4f}, loss {:.4f} on {} held-out samples",
          options_.client_id, crypto::toHex(job->served_sha).substr(0, 12),
          served_eval_->second.accuracy, served_eval_->second.loss, served_eval_->second.n);
    } else {
      spdlog::warn("client {}: served model not evaluated: {}", options_.client_id,
                   job->served_eval->status().toString());
    }
  }
  if (!job->result.isOk()) {
    spdlog::error("client {}: training failed: {}", options_.client_id,
                  job->result.status().toString());
    send(wire::Error{wire::ErrorCode::kInternal, job->result.status().message(), t.task_token});
    return;
  }
  // Cancelled or past the deadline: nothing is uploaded. Stopped by stop_after_s: the work done
  // is, unless there is none.
  if (job->result->stopped_early && !job->partial) return;
  if (job->result->steps == 0) {
    spdlog::warn("client {}: round {} stopped after {:.3f} s before its first step",
                 options_.client_id, t.round, t.hparams.stop_after_s);
    send(wire::Error{wire::ErrorCode::kInternal, "stop_after_s passed before the first local step",
                     t.task_token});
    return;
  }
  auto u = std::make_unique<Upload>();
  u->task = std::move(job->task);
  std::string().swap(u->task.model_bytes);
  u->codec = std::move(job->codec);
  u->received_at = job->received_at;
  u->trained_at = job->trained_at;
  u->partition_size = job->partition_size;
  u->result = std::move(job->result).value();
  u->plan = std::move(job->plan);
  u->partial = job->partial && job->result->stopped_early;
  u->control_delta = std::move(job->control_delta);
  u->serves = u->task.served.source != wire::ServedSource::kNone;
  uploads_.push_back(std::move(u));
  startUpload();
}

void ZmqClient::startUpload() {
  if (uploads_.empty() || uploads_.front()->pipeline) return;
  Upload& u = *uploads_.front();
  const bool on_gpu = u.result.device_delta.defined();
  const size_t n =
      on_gpu ? static_cast<size_t>(u.result.device_delta.numel()) : u.result.delta.size();
  // The residual belongs to one codec and model size (and lives where the update is
  // compressed): another one of either starts afresh (whether or not the new codec uses error
  // feedback). A new topk ratio (the warm-up's per-round codec) keeps it
  // (compress::residualKey).
  const std::string key = compress::residualKey(u.codec->spec());
  const size_t held = residual_          ? residual_->size()
                      : device_residual_ ? device_residual_->size()
                                         : 0;
  if ((residual_ || device_residual_) &&
      (held != n || residual_codec_ != key || on_gpu != (device_residual_ != nullptr))) {
    spdlog::info("client {}: error-feedback residual dropped ({} -> {}, {} -> {} elements, {})",
                 options_.client_id, residual_codec_, key, held, n, on_gpu ? "GPU" : "host");
    residual_.reset();
    device_residual_.reset();
  }
  const bool feedback = compress::usesErrorFeedback(u.codec->spec());
  if (feedback && !residual_ && !device_residual_) {
    if (on_gpu) {
      device_residual_ =
          std::make_unique<compress::DeviceResidual>(n, options_.residual_storage, gpu_->device());
    } else {
      residual_ = std::make_unique<compress::ErrorFeedback>(n, options_.residual_storage);
    }
    residual_codec_ = key;
  }
  u.uses_residual = feedback;
  u.started_at = steadyNow();
  UploadPipelineOptions po;
  po.queue_depth = options_.upload_queue_chunks;
  po.pipelined = options_.upload_pipelined;
  if (on_gpu) {
    DeviceDelta d;
    d.data = u.result.device_delta.data_ptr<float>();
    d.size = n;
    d.owner = std::make_shared<at::Tensor>(std::move(u.result.device_delta));
    d.compressor = gpu_.get();
    d.residual = feedback ? device_residual_.get() : nullptr;
    u.pipeline = std::make_unique<UploadPipeline>(std::move(d), std::move(u.plan), u.codec,
                                                  u.task.hparams.seed, po);
  } else {
    u.pipeline = std::make_unique<UploadPipeline>(std::move(u.result.delta), std::move(u.plan),
                                                  u.codec, feedback ? residual_.get() : nullptr,
                                                  u.task.hparams.seed, po);
  }
  // Upload credits: encoding starts now, the chunks go once the coordinator grants.
  send(wire::UploadRequest{u.task.task_token});
}

bool ZmqClient::abandonUpload(uint64_t token, const std::string& why) {
  for (auto it = uploads_.begin(); it != uploads_.end(); ++it) {
    Upload& u = **it;
    if (u.task.task_token != token) continue;
    spdlog::info("client {}: abandoning round {} upload after {} of {} chunks: {}",
                 options_.client_id, u.task.round, u.chunks,
                 u.pipeline ? u.pipeline->chunkCount() : u.plan.size(), why);
    const bool touched_residual = u.pipeline && u.uses_residual;
    u.pipeline.reset();  // joins the encoder: the residual is the loop thread's again
    if (touched_residual && residual_) residual_->reset();
    if (touched_residual && device_residual_) device_residual_->reset();
    uploads_.erase(it);
    ::malloc_trim(0);
    startUpload();
    return true;
  }
  return false;
}

void ZmqClient::abandonAllUploads(const std::string& why) {
  while (!uploads_.empty()) abandonUpload(uploads_.front()->task.task_token, why);
}

int ZmqClient::receiveTimeoutMs(double now, int idle_ms) const {
  // While training, look often: the end of training starts the upload.
  if (job_) idle_ms = std::min(idle_ms, kTrainingPollMs);
  if (uploads_.empty() || !uploads_.front()->pipeline || !uploads_.front()->granted) {
    return idle_ms;  // waiting for the grant: it arrives as a message
  }
  const Upload& u = *uploads_.front();
  if (u.frame.empty()) return 0;  // pumpUpload waits for the encoder instead
  const double wait_ms = (u.release_at - now) * 1e3;
  if (wait_ms <= 0) return 0;
  return std::min(idle_ms, static_cast<int>(std::ceil(wait_ms)));
}

void ZmqClient::pumpUpload(double now) {
  const double slice_end = now + kSendSliceS;
  while (!uploads_.empty() && uploads_.front()->pipeline && now < slice_end) {
    Upload& u = *uploads_.front();
    const wire::Task& t = u.task;
    if (!u.granted) return;  // the encoder fills its queue meanwhile
    if (u.frame.empty()) {
      std::optional<EncodedChunk> c = u.pipeline->pop(std::min(kEncoderWaitS, slice_end - now));
      if (!c) {
        if (u.pipeline->failed()) {
          const Status st = u.pipeline->status();
          spdlog::error("client {}: round {} update not uploaded: {}", options_.client_id, t.round,
                        st.toString());
          send(wire::Error{wire::ErrorCode::kInternal, st.message(), t.task_token});
          abandonUpload(t.task_token, "encoding failed");
          continue;
        }
        return;  // the encoder is behind: come back after the next poll
      }
      now = steadyNow();
      wire::Chunk m;
      m.task_token = t.task_token;
      m.tensor_index = c->range.tensor_index;
      m.offset = c->range.offset;
      m.elements = c->range.elements;
      m.payload = std::move(c->payload);
      m.last = c->last;
      m.n_samples = u.partition_size;
      m.steps = u.result.steps;
      u.frame = wire::encode(m);
      u.frame_last = c->last;
      u.release_at = bucket_->reserve(u.frame.size(), now);
    }
    if (now < u.release_at) return;  // the throttle holds it: come back after the next poll
    Status st = transport_->send(u.frame);
    if (!st.isOk()) {
      // The frame is lost (the coordinator is away): the update cannot be complete.
      spdlog::warn("client {}: send Chunk: {}", options_.client_id, st.toString());
      abandonUpload(t.task_token, "a chunk could not be sent");
      continue;
    }
    u.bytes += u.frame.size();
    ++u.chunks;
    std::string().swap(u.frame);
    now = steadyNow();
    if (!u.frame_last) continue;

    wire::Summary s;
    s.task_token = t.task_token;
    s.n_samples = u.partition_size;  // FedAvg weighs by the data held, not by samples seen
    s.steps = u.result.steps;
    s.mean_loss = u.result.mean_loss;
    s.sum_sq_loss = u.result.sum_sq_loss;
    s.compute_seconds = u.result.compute_seconds;
    s.upload_seconds = now - u.granted_at;  // the uplink's time, not the wait for a credit
    s.encode_seconds = u.pipeline->encodeSeconds();
    if (u.serves) fillServed(s);
    send(s);
    if (!u.control_delta.empty()) commitControlDelta(u.control_delta);
    spdlog::info(
        "client {}: round {} uploaded ({} samples, {} steps, loss {:.4f}, {:.2f} s) codec={} "
        "chunks={} bytes={} encode_s={:.4f} upload_s={:.4f} grant_wait_s={:.4f} "
        "after_training_s={:.4f} mode={} mbps={} burst_bytes={} partial={} scaffold={}",
        options_.client_id, t.round, u.partition_size, u.result.steps, u.result.mean_loss,
        u.result.compute_seconds, compress::toString(u.codec->spec()), u.chunks, u.bytes,
        s.encode_seconds, s.upload_seconds, u.granted_at - u.started_at, now - u.trained_at,
        options_.upload_pipelined ? "pipelined" : "serial", options_.upload_mbps,
        options_.upload_burst_bytes, u.partial ? 1 : 0, u.control_delta.empty() ? 0 : 1);
    uploads_.pop_front();  // joins the finished encoder
    ::malloc_trim(0);      // hand the task's buffers back to the system between rounds
    startUpload();
  }
}

void ZmqClient::handle(wire::Message& message, double now) {
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, wire::Task>) {
          startJob(std::move(m), now);
        } else if constexpr (std::is_same_v<T, wire::UploadGrant>) {
          // Only an upload that asked (the front one) can be granted; a grant for an upload
          // abandoned meanwhile finds none, and the coordinator takes the credit back when the
          // task ends on its side.
          if (!uploads_.empty() && uploads_.front()->pipeline &&
              uploads_.front()->task.task_token == m.task_token && !uploads_.front()->granted) {
            uploads_.front()->granted = true;
            uploads_.front()->granted_at = now;
          }
        } else if constexpr (std::is_same_v<T, wire::Cancel>) {
          if (job_ && job_->task.task_token == m.task_token) abandonJob("cancelled: " + m.reason);
          abandonUpload(m.task_token, "cancelled: " + m.reason);
        } else if constexpr (std::is_same_v<T, wire::Bye>) {
          spdlog::info("client {}: coordinator said goodbye: {}", options_.client_id, m.reason);
          finished_ = true;
        } else if constexpr (std::is_same_v<T, wire::Error>) {
          if (m.code == wire::ErrorCode::kUnknownClient) {
            if (now - last_hello_ > 1.0) sayHello(now);  // one Hello answers a burst of errors
          } else {
            spdlog::warn("client {}: coordinator error {}: {}", options_.client_id,
                         static_cast<int>(m.code), m.message);
            if (job_ && m.task_token == job_->task.task_token) abandonJob(m.message);
            abandonUpload(m.task_token, m.message);
          }
        }
        // Heartbeat replies only refresh liveness.
      },
      message);
}

Status ZmqClient::run() {
  torch::set_num_threads(static_cast<int>(options_.threads));
  double now = steadyNow();
  double last_rx = now, last_heartbeat = now;
  sayHello(now);
  while (!finished_) {
    if (stop_.load()) {
      abandonJob("stopping");
      abandonAllUploads("stopping");
      send(wire::Bye{"client stopping"});
      return unavailable("interrupted");
    }
    auto got = transport_->receive(receiveTimeoutMs(now, 20));
    if (!got.isOk()) {
      abandonJob("socket failed");
      abandonAllUploads("socket failed");
      return got.status();
    }
    now = steadyNow();
    if (got->has_value()) {
      last_rx = now;
      auto decoded = wire::decodeFrames((*got)->payload, std::move((*got)->attachment));
      if (decoded.isOk()) {
        handle(decoded.value(), now);
      } else {
        spdlog::warn("client {}: malformed frame from coordinator: {}", options_.client_id,
                     decoded.status().toString());
      }
    }
    if (job_ && job_->done.load()) finishJob();
    if (job_ && now - job_->received_at > job_->task.deadline_s) abandonJob("deadline passed");
    if (job_ && !job_->partial && job_->task.hparams.stop_after_s > 0 &&
        now - job_->received_at >= job_->task.hparams.stop_after_s) {
      job_->partial = true;  // training ends after its current step; finishJob uploads it
      job_->stop.store(true);
    }
    for (size_t i = 0; i < uploads_.size(); ++i) {
      if (now - uploads_[i]->received_at > uploads_[i]->task.deadline_s) {
        abandonUpload(uploads_[i]->task.task_token, "deadline passed");
        break;  // the rest is looked at in the next iteration
      }
    }
    pumpUpload(now);
    now = steadyNow();
    if (now - last_heartbeat >= options_.heartbeat_s) {
      send(wire::Heartbeat{++heartbeat_seq_});
      last_heartbeat = now;
    }
    if (now - last_rx > options_.liveness_s && now - last_hello_ > options_.liveness_s) {
      // A task in flight goes on: if the coordinator restarted, its upload is answered as stale.
      const std::string why = transport_->diagnosis();
      spdlog::info("client {}: coordinator silent for {}, saying Hello again{}{}",
                   options_.client_id, formatDuration(now - last_rx), why.empty() ? "" : ": ", why);
      sayHello(now);
    }
    if (options_.exit_idle_s > 0 && now - last_rx > options_.exit_idle_s) {
      abandonJob("coordinator silent");
      abandonAllUploads("coordinator silent");
      const std::string why = transport_->diagnosis();
      return timeoutError("coordinator silent for " + formatDuration(now - last_rx) +
                          (why.empty() ? "" : ": " + why));
    }
  }
  abandonJob("run finished");
  abandonAllUploads("run finished");
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<ClientRuntime>> ClientRuntime::create(const ClientRuntimeOptions& options) {
  auto c = std::make_unique<ZmqClient>();
  FEDFLEET_RETURN_IF_ERROR(c->init(options));
  return std::unique_ptr<ClientRuntime>(std::move(c));
}

}  // namespace fedfleet::client
