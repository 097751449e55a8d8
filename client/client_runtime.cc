#include "client/client_runtime.h"

#include <malloc.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <variant>

#include "client/client_session.h"
#include "client/control_variate.h"
#include "client/local_dp.h"
#include "client/masked_upload.h"
#include "client/task_data.h"
#include "client/token_bucket.h"
#include "client/trainer.h"
#include "client/upload_pipeline.h"
#include "common/check.h"
#include "common/compress/codec.h"
#include "common/data/dataset.h"
#include "common/format.h"
#include "common/model/evaluate.h"
#include "common/model/local_part.h"
#include "common/model/model.h"
#include "common/wire/data_split.h"
#include "common/wire/limits.h"
#include "common/wire/messages.h"

namespace fedfleet::client {
namespace {

double steadyNow() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Longest the loop waits for the encoder's next chunk before it polls the socket again (it
// wakes as soon as the chunk is ready; the socket then waits at most this long).
constexpr double kEncoderWaitS = 0.005;
// Longest the loop waits in one receive while a task trains: the upload starts at most this
// long after training ends.
constexpr int kTrainingPollMs = 2;
// Longest the loop sends chunks back to back before it polls the socket again.
constexpr double kSendSliceS = 0.02;

// One task's training, handed from the loop thread to the worker thread and back. The request
// is the session's and read-only; the worker writes the rest, then sets `done`; the loop thread
// reads it only after joining.
struct TrainingJob {
  explicit TrainingJob(std::shared_ptr<const TrainingRequest> r) : request(std::move(r)) {}
  const std::shared_ptr<const TrainingRequest> request;
  std::atomic<bool> stop{false};
  std::atomic<bool> done{false};
  // Written by the worker before `done`.
  TrainingOutcome outcome;
  TrainResult result;            // the delta (the whole update with SCAFFOLD's Dc_k)
  std::vector<ChunkRange> plan;  // the update's chunks
  double trained_at = 0;         // when training ended
  std::thread thread;
};

// A trained update: its delta waiting for its turn, then its encoder and the frame waiting for
// the throttle (loop thread only; the session decides when it goes).
struct UploadJob {
  std::shared_ptr<const TrainingRequest> request;  // task and codec
  double trained_at = 0;
  double started_at = 0;  // when its pipeline started (and its UploadRequest went out)
  TrainResult result;     // delta moved into the pipeline once it starts
  std::vector<ChunkRange> plan;
  bool partial = false;  // stopped by stop_after_s
  bool scaffold = false;
  uint64_t partition_size = 0;
  std::unique_ptr<UploadPipeline> pipeline;  // null until this upload's turn
  bool uses_residual = false;
  std::string frame;      // the next chunk, encoded as a frame, waiting for the throttle
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
  // Carries out what the session asks for, until it asks for nothing more.
  void execute();
  void execute(ClientAction& action);
  void startTraining(std::shared_ptr<const TrainingRequest> request);
  void abandonTraining(const AbandonTraining& a);
  // Joins the finished worker and reports its outcome to the session.
  void finishTraining();
  // Starts the pipeline of the upload the session asks a credit for.
  void startUpload(const SendUploadRequest& ask);
  void abandonUpload(const AbandonUpload& a);
  void sendSummary(wire::Summary s);
  // Sends what the pipeline and the throttle allow now (for at most kSendSliceS).
  void pumpUpload(double now);
  // Milliseconds the next receive may wait without delaying the upload (at most `idle_ms`).
  int receiveTimeoutMs(double now, int idle_ms) const;
  // Runs on the worker thread.
  void train(TrainingJob& job);
  // train() with options_.custom_training.
  Status trainCustom(TrainingJob& job);

  // Constant after init.
  ClientRuntimeOptions options_;
  torch::Device device_{torch::kCPU};
  // Compresses on device_ (set by init when it is a CUDA device and options allow; then never
  // changed). Used by the encoder thread of the active pipeline alone.
  std::unique_ptr<compress::DeviceCompressor> gpu_;

  std::atomic<bool> stop_{false};  // set from any thread

  // Loop thread: the socket, the protocol state and the uploads.
  std::unique_ptr<transport::ClientTransport> transport_;
  std::unique_ptr<ClientSession> session_;
  std::map<uint64_t, std::unique_ptr<UploadJob>> uploads_;  // by token
  std::optional<TokenBucket> bucket_;
  // Error-feedback residual, kept across tasks; the encoder thread of the active pipeline uses
  // it while that pipeline exists, the loop thread otherwise.
  std::unique_ptr<compress::ErrorFeedback> residual_;
  // The same on the GPU, for updates compressed there (one of the two exists at a time).
  std::unique_ptr<compress::DeviceResidual> device_residual_;
  std::string residual_codec_;  // canonical spec the residual belongs to
  uint64_t heartbeat_seq_ = 0;
  uint64_t session_id_ = std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
  double last_hello_ = -1e9;
  std::string last_diagnosis_;  // the transport's diagnosis last logged, its digits left out
  bool finished_ = false;

  // The training in progress: the loop thread creates and joins it, the worker thread runs it.
  std::unique_ptr<TrainingJob> job_;
  // Worker-thread state (touched only while a job runs; the loop thread joins before reuse):
  // the samples tasks name, and the models.
  std::unique_ptr<TaskData> data_;
  std::map<std::string, std::unique_ptr<model::Model>> models_;  // by name|loss
  std::optional<model::LocalState> local_;  // model.local: opened with the first model
};

Status ZmqClient::init(const ClientRuntimeOptions& options) {
  options_ = options;
  data_ = std::make_unique<TaskData>(TaskDataOptions{options_.client_id, options_.own_data,
                                                     options_.own_format, options_.own_test,
                                                     options_.data_dir});
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
  ClientSessionOptions so;
  so.client_id = options_.client_id;
  so.control_storage = options_.scaffold_storage;
  so.load_control = [path = options_.scaffold_state_path, storage = options_.scaffold_storage](
                        size_t n) { return ControlVariate::loadOrZeros(path, n, storage); };
  so.served_model_path = options_.served_model_path;
  so.local_dp_min_noise = options_.local_dp_min_noise;
  if (so.local_dp_min_noise > 0) {
    spdlog::info("client {}: refusing tasks without local DP of noise multiplier >= {:g}",
                 options_.client_id, so.local_dp_min_noise);
  }
  session_ = std::make_unique<ClientSession>(std::move(so));
  return Status::ok();
}

void ZmqClient::send(const wire::Message& m) {
  // The coordinator refuses an Error whose text is over wire::kMaxReasonBytes or holds a
  // control character other than tab and newline (common/wire/limits.h); a long one (a LibTorch
  // message with its backtrace) is cut to fit and such characters become '?', so the
  // coordinator still learns that the task failed.
  if (const auto* error = std::get_if<wire::Error>(&m);
      error != nullptr && !wire::checkClientMessage(m).isOk()) {
    wire::Error fit = *error;
    if (fit.message.size() > wire::kMaxReasonBytes) fit.message.resize(wire::kMaxReasonBytes);
    for (char& c : fit.message) {
      const auto b = static_cast<unsigned char>(c);
      if ((b < 0x20 && c != '\t' && c != '\n') || b == 0x7f) c = '?';
    }
    if (wire::checkClientMessage(fit).isOk()) {
      send(fit);
      return;
    }
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
  h.data_size = data_->trainingSize();
  h.requested_partition = options_.partition;
  h.session = session_id_;
  h.last_coordinator_session = session_->coordinatorSession();
  send(h);
}

Status ZmqClient::trainCustom(TrainingJob& job) {
  const TrainingRequest& req = *job.request;
  const wire::Task& t = req.task;
  TrainingOutcome& out = job.outcome;
  // The model only for its layout: the caller's loop holds the module and the data. (A
  // built-in model has Fashion-MNIST's input here; another input needs the TorchScript file.)
  const std::string model_key = t.model_name;
  auto mit = models_.find(model_key);
  if (mit == models_.end()) {
    FEDFLEET_ASSIGN_OR_RETURN(auto m,
                              model::createModel(t.model_name, 0, options_.torchscript_path));
    if (!local_) {
      FEDFLEET_ASSIGN_OR_RETURN(model::LocalPart part,
                                model::LocalPart::of(m->layout(), options_.local_patterns));
      FEDFLEET_ASSIGN_OR_RETURN(
          local_, model::LocalState::open(std::move(part), options_.local_state_path));
    }
    mit = models_.emplace(model_key, std::move(m)).first;
  }
  const model::Layout layout = mit->second->layout();
  std::vector<float> start = floatsOf(*req.model_bytes);
  if (local_) local_->applyTo(start);
  const double t0 = steadyNow();
  std::vector<float> control_c;
  ScaffoldControls scaffold;
  if (t.hparams.scaffold) {  // c from the task, c_k from the session, as the trainer gets them
    control_c = floatsOf(*req.control_c);
    scaffold = {&control_c, &req.control_ck};
  }
  FEDFLEET_ASSIGN_OR_RETURN(ClientRuntimeOptions::CustomUpdate u,
                            options_.custom_training(t, layout, start, scaffold, job.stop));
  if (u.delta.size() != layout.total) {
    return invalidArgument("the training loop returned " + std::to_string(u.delta.size()) +
                           " values for a model of " + std::to_string(layout.total));
  }
  if (u.samples == 0) return invalidArgument("the training loop reported 0 samples");
  if (t.fed_eval && u.evaluation) out.fed_evaluation = *u.evaluation;
  TrainResult r;
  r.delta = std::move(u.delta);
  r.n_samples = u.samples;
  r.steps = u.steps;
  r.mean_loss = u.mean_loss;
  r.compute_seconds = steadyNow() - t0;
  if (local_) FEDFLEET_RETURN_IF_ERROR(local_->absorb(start, r.delta));
  if (t.hparams.scaffold) {
    if (r.steps == 0) return invalidArgument("a SCAFFOLD task's training loop reported 0 steps");
    r.control_delta =
        scaffoldControlDelta(control_c, r.delta, r.steps, t.hparams.lr, parameterValues(layout));
    out.control_delta = r.control_delta;
    r.delta = takeUpload(r);  // D_k, then Dc_k
  }
  job.trained_at = steadyNow();
  job.plan = planUploadChunks(layout, t.chunk_bytes, t.hparams.scaffold, req.codec->spec());
  out.partition_size = u.samples;
  out.steps = r.steps;
  out.mean_loss = r.mean_loss;
  out.compute_seconds = r.compute_seconds;
  job.result = std::move(r);
  return Status::ok();
}

void ZmqClient::train(TrainingJob& job) {
  if (options_.custom_training) {
    job.outcome.status = trainCustom(job);
    job.done.store(true);
    return;
  }
  const TrainingRequest& req = *job.request;
  const wire::Task& t = req.task;
  TrainingOutcome& out = job.outcome;
  auto run = [&]() -> Status {
    FEDFLEET_ASSIGN_OR_RETURN(const std::vector<uint32_t>* indices, data_->indicesFor(t.data));
    out.partition_size = indices->size();
    // One model per architecture and loss (a new coordinator session may train with another).
    const std::string model_key = t.model_name + "|" + wire::lossName(t.hparams.loss);
    auto mit = models_.find(model_key);
    if (mit == models_.end()) {
      FEDFLEET_ASSIGN_OR_RETURN(
          auto m, model::createModel(t.model_name, 0, options_.torchscript_path,
                                     options_.own_data ? model::inputShapeOf(*options_.own_data)
                                                       : model::InputShape()));
      m->setLoss(t.hparams.loss);
      // Start-up check, before the first training: a model that does not fit this client's
      // data is one clear error (the task fails with it; the model is not kept).
      std::string model_name = "'" + t.model_name + "'";
      if (!options_.torchscript_path.empty()) model_name += " (" + options_.torchscript_path + ")";
      FEDFLEET_RETURN_IF_ERROR(
          model::checkModelFitsData(*m, data_->trainingSet(), model_name,
                                    "'" + t.data.dataset + "' (this client's training set)"));
      if (!local_) {
        FEDFLEET_ASSIGN_OR_RETURN(model::LocalPart part,
                                  model::LocalPart::of(m->layout(), options_.local_patterns));
        FEDFLEET_ASSIGN_OR_RETURN(
            local_, model::LocalState::open(std::move(part), options_.local_state_path));
      }
      m->to(device_);
      mit = models_.emplace(model_key, std::move(m)).first;
    }
    std::vector<float> start = floatsOf(*req.model_bytes);
    if (local_) local_->applyTo(start);
    if (t.fed_eval && !job.stop.load()) {
      // Federated evaluation: the model this client starts from, on its held-out data.
      out.fed_evaluation = [&]() -> Result<ServedEvaluation> {
        FEDFLEET_ASSIGN_OR_RETURN(TaskData::HeldOut held, data_->heldOut(t.data));
        if (held.indices == nullptr || held.indices->empty()) return ServedEvaluation{};
        FEDFLEET_RETURN_IF_ERROR(mit->second->setFlatParameters(start));
        FEDFLEET_ASSIGN_OR_RETURN(
            model::EvalResult e,
            model::evaluateIndices(*mit->second, *held.data, *held.indices, 1000, device_));
        return ServedEvaluation{e.n, e.loss, e.accuracy, model::namedMetrics(e)};
      }();
    }
    TrainOptions o = trainOptionsFrom(t.hparams);
    std::vector<float> control_c;
    if (t.hparams.scaffold) {
      control_c = floatsOf(*req.control_c);
      o.scaffold = {&control_c, &req.control_ck};
    }
    // The trainer ignores it for SCAFFOLD; a local part is taken out of the delta on the host;
    // lowrank is encoded on the host (compress::encodesOnDevice).
    o.delta_on_device = gpu_ != nullptr && (!local_ || local_->part.empty()) &&
                        compress::encodesOnDevice(req.codec->spec());
    Trainer trainer(device_);
    auto result = trainer.train(*mit->second, start, data_->trainingSet(), *indices, o, &job.stop);
    if (result.isOk() && local_) {
      if (Status st = local_->absorb(start, result->delta); !st.isOk()) result = st;
    }
    job.trained_at = steadyNow();
    Status status = result.status();
    if (result.isOk()) {
      const model::Layout layout = mit->second->layout();
      const size_t n = result->device_delta.defined()
                           ? static_cast<size_t>(result->device_delta.numel())
                           : result->delta.size();
      if (t.hparams.scaffold) {
        out.control_delta = result->control_delta;
        result->delta = takeUpload(*result);  // D_k, then Dc_k
      }
      job.plan = planUploadChunks(layout.total == n ? layout : flatLayout(n), t.chunk_bytes,
                                  t.hparams.scaffold, req.codec->spec());
      out.steps = result->steps;
      out.stopped_early = result->stopped_early;
      out.mean_loss = result->mean_loss;
      out.sum_sq_loss = result->sum_sq_loss;
      out.compute_seconds = result->compute_seconds;
      job.result = std::move(result).value();
    }
    if (req.served_to_evaluate && !job.stop.load()) {
      // The served model on the held-out data (once per served model: the session keeps the
      // outcome).
      out.served_evaluation = [&]() -> Result<ServedEvaluation> {
        FEDFLEET_ASSIGN_OR_RETURN(TaskData::HeldOut held, data_->testPartition(t.data));
        FEDFLEET_RETURN_IF_ERROR(mit->second->setFlatParameters(floatsOf(*req.served_to_evaluate)));
        FEDFLEET_ASSIGN_OR_RETURN(
            model::EvalResult e,
            model::evaluateIndices(*mit->second, *held.data, *held.indices, 1000, device_));
        return ServedEvaluation{e.n, e.loss, e.accuracy, model::namedMetrics(e)};
      }();
    }
    return status;
  };
  out.status = run();
  job.done.store(true);
}

void ZmqClient::execute() {
  std::vector<ClientAction> actions;
  while (!(actions = session_->takeActions()).empty()) {
    for (auto& a : actions) execute(a);
  }
}

void ZmqClient::execute(ClientAction& action) {
  std::visit(
      [&](auto& a) {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<T, StartTraining>) {
          startTraining(std::move(a.request));
        } else if constexpr (std::is_same_v<T, StopTraining>) {
          if (job_ && job_->request->task.task_token == a.token) job_->stop.store(true);
        } else if constexpr (std::is_same_v<T, AbandonTraining>) {
          abandonTraining(a);
        } else if constexpr (std::is_same_v<T, SendUploadRequest>) {
          startUpload(a);
          send(a.request);
        } else if constexpr (std::is_same_v<T, SendSecAgg>) {
          send(a.message);
        } else if constexpr (std::is_same_v<T, SendChunk>) {
          UploadJob& u = *uploads_.at(a.chunk.task_token);
          u.frame = wire::encode(a.chunk);
          u.release_at = bucket_->reserve(u.frame.size(), steadyNow());
        } else if constexpr (std::is_same_v<T, SendSummary>) {
          sendSummary(std::move(a.summary));
        } else if constexpr (std::is_same_v<T, SendError>) {
          send(a.error);
        } else if constexpr (std::is_same_v<T, AbandonUpload>) {
          abandonUpload(a);
        } else if constexpr (std::is_same_v<T, PublishServedModel>) {
          if (Status st = session_->servedModel().save(); !st.isOk()) {
            spdlog::warn("client {}: served model not written: {}", options_.client_id,
                         st.toString());
          }
        } else if constexpr (std::is_same_v<T, ControlVariateCommitted>) {
          if (options_.scaffold_state_path.empty()) return;
          Status st = session_->controlVariate()->save(options_.scaffold_state_path);
          if (!st.isOk()) {
            spdlog::warn("client {}: SCAFFOLD control variate not saved: {}", options_.client_id,
                         st.toString());
          }
        }
      },
      action);
}

void ZmqClient::startTraining(std::shared_ptr<const TrainingRequest> request) {
  job_ = std::make_unique<TrainingJob>(std::move(request));
  TrainingJob* job = job_.get();
  job_->thread = std::thread([this, job] { train(*job); });
}

void ZmqClient::abandonTraining(const AbandonTraining& a) {
  if (!job_ || job_->request->task.task_token != a.token) return;
  spdlog::info("client {}: abandoning round {} task: {}", options_.client_id, a.round, a.why);
  job_->stop.store(true);
  job_->thread.join();
  job_.reset();
}

void ZmqClient::finishTraining() {
  job_->thread.join();
  std::unique_ptr<TrainingJob> job = std::move(job_);
  const uint64_t token = job->request->task.task_token;
  if (job->outcome.status.isOk()) {
    auto u = std::make_unique<UploadJob>();
    u->request = job->request;
    u->trained_at = job->trained_at;
    u->result = std::move(job->result);
    u->plan = std::move(job->plan);
    u->partial = job->outcome.stopped_early;
    u->scaffold = !job->outcome.control_delta.empty();
    u->partition_size = job->outcome.partition_size;
    uploads_[token] = std::move(u);
  }
  session_->onTrainingDone(token, std::move(job->outcome), steadyNow());
  execute();
  if (!session_->holdsUpload(token)) uploads_.erase(token);  // nothing of it goes out
}

// A delta trained on the GPU, brought to the host (local DP and secure aggregation work there).
void moveDeltaToHost(TrainResult& r) {
  if (!r.device_delta.defined()) return;
  at::Tensor host = r.device_delta.to(at::kCPU).contiguous();
  r.delta.assign(host.data_ptr<float>(), host.data_ptr<float>() + host.numel());
  r.device_delta = at::Tensor();
}

void ZmqClient::startUpload(const SendUploadRequest& ask) {
  UploadJob& u = *uploads_.at(ask.request.task_token);
  if (u.pipeline) return;  // asked again (after a Hello): it is already encoding
  const compress::Codec& codec = *u.request->codec;
  if (u.request->task.local_dp.on()) {
    // Local DP: clipped and noised before anything of it is encoded (client/local_dp.h).
    moveDeltaToHost(u.result);
    applyLocalDp(u.request->task.local_dp, u.result.delta.data(), u.result.delta.size(),
                 crypto::KeyedStream(crypto::randomStreamKey(), 0, 0));
  }
  if (ask.masker) {
    // Secure aggregation: weighted, quantised and masked on the host; no codec, no residual.
    moveDeltaToHost(u.result);
    u.uses_residual = false;
    u.started_at = steadyNow();
    UploadPipelineOptions po;
    po.queue_depth = options_.upload_queue_chunks;
    po.pipelined = options_.upload_pipelined;
    const double weight = maskedUploadWeight(ask.secagg, ask.secagg_weight, u.result.delta.data(),
                                             u.result.delta.size());
    po.encode_host = [masker = ask.masker, task = ask.secagg, weight](
                         const ChunkRange& r, const float* x, uint64_t seed, std::string* out) {
      return encodeMaskedChunk(*masker, task, weight, seed, r, x, out);
    };
    u.pipeline = std::make_unique<UploadPipeline>(std::move(u.result.delta), std::move(u.plan),
                                                  u.request->codec, nullptr,
                                                  u.request->task.hparams.seed, po);
    return;
  }
  const bool on_gpu = u.result.device_delta.defined();
  const size_t n =
      on_gpu ? static_cast<size_t>(u.result.device_delta.numel()) : u.result.delta.size();
  // The residual belongs to one codec and model size (and lives where the update is
  // compressed): another one of either starts afresh (whether or not the new codec uses error
  // feedback). A new topk ratio (the warm-up's per-round codec) keeps it
  // (compress::residualKey).
  const std::string key = compress::residualKey(codec.spec());
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
  const bool feedback = compress::usesErrorFeedback(codec.spec());
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
  const uint64_t seed = u.request->task.hparams.seed;
  if (on_gpu) {
    DeviceDelta d;
    d.data = u.result.device_delta.data_ptr<float>();
    d.size = n;
    d.owner = std::make_shared<at::Tensor>(std::move(u.result.device_delta));
    d.compressor = gpu_.get();
    d.residual = feedback ? device_residual_.get() : nullptr;
    u.pipeline = std::make_unique<UploadPipeline>(std::move(d), std::move(u.plan), u.request->codec,
                                                  seed, po);
  } else {
    u.pipeline = std::make_unique<UploadPipeline>(std::move(u.result.delta), std::move(u.plan),
                                                  u.request->codec,
                                                  feedback ? residual_.get() : nullptr, seed, po);
  }
}

void ZmqClient::abandonUpload(const AbandonUpload& a) {
  auto it = uploads_.find(a.token);
  if (it == uploads_.end()) return;
  UploadJob& u = *it->second;
  spdlog::info("client {}: abandoning round {} upload after {} of {} chunks: {}",
               options_.client_id, a.round, a.chunks_sent,
               u.pipeline ? u.pipeline->chunkCount() : u.plan.size(), a.why);
  const bool touched_residual = u.pipeline && u.uses_residual;
  u.pipeline.reset();  // joins the encoder: the residual is the loop thread's again
  if (touched_residual && residual_) residual_->reset();
  if (touched_residual && device_residual_) device_residual_->reset();
  uploads_.erase(it);
  ::malloc_trim(0);
}

void ZmqClient::sendSummary(wire::Summary s) {
  auto it = uploads_.find(s.task_token);
  FEDFLEET_CHECK(it != uploads_.end());
  std::unique_ptr<UploadJob> u = std::move(it->second);
  uploads_.erase(it);
  s.encode_seconds = u->pipeline->encodeSeconds();
  send(s);
  session_->onSummaryDelivered(s.task_token);
  const double now = steadyNow();
  const wire::Task& t = u->request->task;
  spdlog::info(
      "client {}: round {} uploaded ({} samples, {} steps, loss {:.4f}, {:.2f} s) codec={} "
      "chunks={} bytes={} encode_s={:.4f} upload_s={:.4f} grant_wait_s={:.4f} "
      "after_training_s={:.4f} mode={} mbps={} burst_bytes={} partial={} scaffold={}",
      options_.client_id, t.round, s.n_samples, s.steps, s.mean_loss, s.compute_seconds,
      compress::toString(u->request->codec->spec()), u->chunks, u->bytes, s.encode_seconds,
      s.upload_seconds, now - s.upload_seconds - u->started_at, now - u->trained_at,
      options_.upload_pipelined ? "pipelined" : "serial", options_.upload_mbps,
      options_.upload_burst_bytes, u->partial ? 1 : 0, u->scaffold ? 1 : 0);
  u.reset();         // joins the finished encoder
  ::malloc_trim(0);  // hand the task's buffers back to the system between rounds
}

int ZmqClient::receiveTimeoutMs(double now, int idle_ms) const {
  // While training, look often: the end of training starts the upload.
  if (job_) idle_ms = std::min(idle_ms, kTrainingPollMs);
  const std::optional<uint64_t> token = session_->activeUpload();
  if (!token || !session_->activeUploadGranted()) {
    return idle_ms;  // waiting for the grant: it arrives as a message
  }
  const UploadJob& u = *uploads_.at(*token);
  if (u.frame.empty()) return 0;  // pumpUpload waits for the encoder instead
  const double wait_ms = (u.release_at - now) * 1e3;
  if (wait_ms <= 0) return 0;
  return std::min(idle_ms, static_cast<int>(std::ceil(wait_ms)));
}

void ZmqClient::pumpUpload(double now) {
  const double slice_end = now + kSendSliceS;
  while (now < slice_end) {
    const std::optional<uint64_t> token = session_->activeUpload();
    if (!token || !session_->activeUploadGranted()) return;  // the encoder fills its queue
    UploadJob& u = *uploads_.at(*token);
    if (u.frame.empty()) {
      if (!session_->wantsChunk(*token)) return;
      std::optional<EncodedChunk> c = u.pipeline->pop(std::min(kEncoderWaitS, slice_end - now));
      if (!c) {
        if (!u.pipeline->failed()) return;  // the encoder is behind: come back after the poll
        const Status st = u.pipeline->status();
        spdlog::error("client {}: round {} update not uploaded: {}", options_.client_id,
                      u.request->task.round, st.toString());
        session_->onEncodingFailed(*token, st);
        execute();
        continue;
      }
      session_->onChunkEncoded(*token, std::move(*c));
      execute();  // SendChunk: the frame waits for the throttle
      now = steadyNow();
      continue;
    }
    if (now < u.release_at) return;  // the throttle holds it: come back after the next poll
    Status st = transport_->send(u.frame);
    if (!st.isOk()) {
      // The frame is lost (the coordinator is away): the update cannot be complete.
      spdlog::warn("client {}: send Chunk: {}", options_.client_id, st.toString());
      session_->onSendFailed(*token);
      execute();
      continue;
    }
    u.bytes += u.frame.size();
    ++u.chunks;
    std::string().swap(u.frame);
    now = steadyNow();
    session_->onChunkSent(*token, now);
    execute();  // the next chunk, or the Summary and the next upload's request
  }
}

void ZmqClient::handle(wire::Message& message, double now) {
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, wire::Task>) {
          session_->onTask(receivedTask(std::move(m)), now);
        } else if constexpr (std::is_same_v<T, wire::UploadGrant>) {
          session_->onUploadGrant(m.task_token, now);
        } else if constexpr (std::is_same_v<T, wire::SecAgg>) {
          session_->onSecAgg(m, now);
        } else if constexpr (std::is_same_v<T, wire::Cancel>) {
          session_->onCancel(m, now);
        } else if constexpr (std::is_same_v<T, wire::Bye>) {
          spdlog::info("client {}: coordinator said goodbye: {}", options_.client_id, m.reason);
          finished_ = true;
        } else if constexpr (std::is_same_v<T, wire::Error>) {
          if (m.code == wire::ErrorCode::kUnknownClient) {
            // The coordinator does not know this connection: it restarted, or it lost this
            // client (its task then counts as dropped). Either way nothing of the earlier
            // session will be taken: drop it now rather than send it to be refused.
            if (session_->trainingToken() || session_->activeUpload()) {
              spdlog::info(
                  "client {}: the coordinator does not know this connection (it restarted or "
                  "lost this client); dropping the work of the earlier session",
                  options_.client_id);
              session_->abandonAll("the coordinator restarted or lost this client");
            }
            if (now - last_hello_ > 1.0) sayHello(now);  // one Hello answers a burst of errors
          } else if (m.code == wire::ErrorCode::kStaleTask) {
            // A task that ended meanwhile (cancelled, late): a race, not a fault.
            spdlog::info("client {}: task {} ended at the coordinator: {}", options_.client_id,
                         m.task_token, m.message);
            session_->onCoordinatorError(m, now);
          } else {
            spdlog::warn("client {}: coordinator error {}: {}", options_.client_id,
                         static_cast<int>(m.code), m.message);
            session_->onCoordinatorError(m, now);
          }
        }
        // Heartbeat replies only refresh liveness.
      },
      message);
  execute();
}

Status ZmqClient::run() {
  torch::set_num_threads(static_cast<int>(options_.threads));
  double now = steadyNow();
  double last_rx = now, last_heartbeat = now;
  auto abandonAll = [this](const std::string& why) {
    session_->abandonAll(why);
    execute();
  };
  sayHello(now);
  while (!finished_) {
    if (stop_.load()) {
      abandonAll("stopping");
      send(wire::Bye{"client stopping"});
      return unavailable("interrupted");
    }
    auto got = transport_->receive(receiveTimeoutMs(now, 20));
    if (!got.isOk()) {
      abandonAll("socket failed");
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
    if (job_ && job_->done.load()) finishTraining();
    session_->onTimePassed(now);  // deadlines, stop_after_s
    execute();
    pumpUpload(now);
    now = steadyNow();
    if (now - last_heartbeat >= options_.heartbeat_s) {
      send(wire::Heartbeat{++heartbeat_seq_});
      last_heartbeat = now;
    }
    if (now - last_rx > options_.liveness_s && now - last_hello_ > options_.liveness_s) {
      // A task in flight goes on: if the coordinator restarted, its upload is answered as stale.
      // A diagnosis (no connection, a refused key, another coordinator key) is a warning the
      // first time it is seen; its repeats every liveness period are info.
      const std::string why = transport_->diagnosis();
      // The same diagnosis with other counts in it ("19 connections closed") is no news.
      std::string kind = why;
      kind.erase(std::remove_if(kind.begin(), kind.end(),
                                [](unsigned char ch) { return std::isdigit(ch); }),
                 kind.end());
      const bool news = !kind.empty() && kind != last_diagnosis_;
      last_diagnosis_ = kind;
      spdlog::log(news ? spdlog::level::warn : spdlog::level::info,
                  "client {}: coordinator silent for {}, saying Hello again{}{}",
                  options_.client_id, formatDuration(now - last_rx), why.empty() ? "" : ": ", why);
      sayHello(now);
      session_->onReconnected(now);
      execute();
    }
    if (options_.exit_idle_s > 0 && now - last_rx > options_.exit_idle_s) {
      abandonAll("coordinator silent");
      const std::string why = transport_->diagnosis();
      return timeoutError("coordinator silent for " + formatDuration(now - last_rx) +
                          (why.empty() ? "" : ": " + why));
    }
  }
  abandonAll("run finished");
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<ClientRuntime>> ClientRuntime::create(const ClientRuntimeOptions& options) {
  auto c = std::make_unique<ZmqClient>();
  FEDFLEET_RETURN_IF_ERROR(c->init(options));
  return std::unique_ptr<ClientRuntime>(std::move(c));
}

}  // namespace fedfleet::client
