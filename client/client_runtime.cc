#include "client/client_runtime.h"

#include <malloc.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "client/trainer.h"
#include "common/crypto/sha256.h"
#include "common/data/dataset.h"
#include "common/data/partition.h"
#include "common/model/model.h"
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
         std::to_string(d.seed) + "|" + std::to_string(d.subset);
}

// One task in progress on the worker thread.
struct Job {
  wire::Task task;
  double received_at = 0;
  std::atomic<bool> stop{false};
  std::atomic<bool> done{false};
  Result<TrainResult> result{internalError("not run")};
  uint64_t partition_size = 0;  // n_k: the samples the client holds for this task
  std::thread thread;
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
  // Runs on the worker thread.
  void train(Job& job);
  Result<const std::vector<uint32_t>*> indicesFor(const wire::DataSpec& spec);

  ClientRuntimeOptions options_;
  std::unique_ptr<transport::ClientTransport> transport_;
  torch::Device device_{torch::kCPU};
  std::atomic<bool> stop_{false};
  std::unique_ptr<Job> job_;

  // Worker-thread state (touched only while a job runs; the loop thread joins before reuse).
  std::optional<data::Dataset> train_set_;
  uint32_t train_set_limit_ = 0;
  std::map<std::string, std::vector<std::vector<uint32_t>>> partitions_;
  std::map<std::string, std::unique_ptr<model::Model>> models_;

  uint64_t heartbeat_seq_ = 0;
  uint64_t session_ = std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
  double last_hello_ = -1e9;
  bool finished_ = false;
};

Status ZmqClient::init(const ClientRuntimeOptions& options) {
  options_ = options;
  FEDFLEET_ASSIGN_OR_RETURN(device_, model::resolveDevice(options_.device));
  FEDFLEET_ASSIGN_OR_RETURN(transport_, transport::createClient(options_.transport));
  return Status::ok();
}

void ZmqClient::send(const wire::Message& m) {
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
  const std::string key = partitionKey(spec);
  auto it = partitions_.find(key);
  if (it == partitions_.end()) {
    data::PartitionSpec ps;
    ps.scheme = spec.scheme;
    ps.alpha = spec.alpha;
    ps.labels_per_client = spec.labels_per_client;
    ps.num_partitions = spec.num_partitions;
    ps.seed = spec.seed;
    FEDFLEET_ASSIGN_OR_RETURN(
        auto parts, data::partitionIndices(train_set_->labels, train_set_->num_classes, ps));
    it = partitions_.emplace(key, std::move(parts)).first;
  }
  if (spec.index >= it->second.size()) {
    return invalidArgument("partition " + std::to_string(spec.index) + " of " +
                           std::to_string(it->second.size()));
  }
  return &it->second[spec.index];
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
    TrainOptions o;
    o.epochs = t.hparams.epochs;
    o.max_steps = t.hparams.max_steps;
    o.batch_size = t.hparams.batch_size;
    o.lr = t.hparams.lr;
    o.momentum = t.hparams.momentum;
    o.weight_decay = t.hparams.weight_decay;
    o.seed = t.hparams.seed;
    Trainer trainer(device_);
    return trainer.train(*mit->second, start, *train_set_, *indices, o, &job.stop);
  };
  job.result = run();
  job.done.store(true);
}

void ZmqClient::startJob(wire::Task task, double now) {
  if (job_) abandonJob("a new task arrived");
  if (task.model_bytes.size() % sizeof(float) != 0 ||
      crypto::sha256(task.model_bytes) != task.model_sha256) {
    send(wire::Error{wire::ErrorCode::kRejected, "model bytes do not match their SHA-256",
                     task.task_token});
    return;
  }
  spdlog::info("client {}: round {} task, partition {}", options_.client_id, task.round,
               task.data.index);
  job_ = std::make_unique<Job>();
  job_->task = std::move(task);
  job_->received_at = now;
  Job* job = job_.get();
  job_->thread = std::thread([this, job] { train(*job); });
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
  if (!job->result.isOk()) {
    spdlog::error("client {}: training failed: {}", options_.client_id,
                  job->result.status().toString());
    send(wire::Error{wire::ErrorCode::kInternal, job->result.status().message(), t.task_token});
    return;
  }
  const TrainResult& r = job->result.value();
  if (r.stopped_early) return;  // cancelled or past the deadline: nothing is uploaded

  const double t0 = steadyNow();
  const size_t total = r.delta.size();
  const size_t per_chunk = std::max<size_t>(1, t.chunk_bytes / sizeof(float));
  size_t offset = 0;
  do {
    const size_t n = std::min(per_chunk, total - offset);
    wire::Chunk c;
    c.task_token = t.task_token;
    c.tensor_index = 0;
    c.offset = offset;
    c.payload.assign(reinterpret_cast<const char*>(r.delta.data() + offset), n * sizeof(float));
    offset += n;
    c.last = offset == total;
    send(c);
  } while (offset < total);
  wire::Summary s;
  s.task_token = t.task_token;
  s.n_samples = job->partition_size;  // FedAvg weighs by the data held, not by samples seen
  s.steps = r.steps;
  s.mean_loss = r.mean_loss;
  s.sum_sq_loss = r.sum_sq_loss;
  s.compute_seconds = r.compute_seconds;
  s.upload_seconds = steadyNow() - t0;
  send(s);
  ::malloc_trim(0);  // hand the task's buffers back to the system between rounds
  spdlog::info("client {}: round {} uploaded ({} samples, {} steps, loss {:.4f}, {:.2f} s)",
               options_.client_id, t.round, job->partition_size, r.steps, r.mean_loss,
               r.compute_seconds);
}

void ZmqClient::handle(wire::Message& message, double now) {
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, wire::Task>) {
          startJob(std::move(m), now);
        } else if constexpr (std::is_same_v<T, wire::Cancel>) {
          if (job_ && job_->task.task_token == m.task_token) abandonJob("cancelled: " + m.reason);
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
      send(wire::Bye{"client stopping"});
      return unavailable("interrupted");
    }
    auto got = transport_->receive(20);
    if (!got.isOk()) {
      abandonJob("socket failed");
      return got.status();
    }
    now = steadyNow();
    if (got->has_value()) {
      last_rx = now;
      auto decoded = wire::decode(**got);
      if (decoded.isOk()) {
        handle(decoded.value(), now);
      } else {
        spdlog::warn("client {}: malformed frame from coordinator: {}", options_.client_id,
                     decoded.status().toString());
      }
    }
    if (job_ && job_->done.load()) finishJob();
    if (job_ && now - job_->received_at > job_->task.deadline_s) abandonJob("deadline passed");
    if (now - last_heartbeat >= options_.heartbeat_s) {
      send(wire::Heartbeat{++heartbeat_seq_});
      last_heartbeat = now;
    }
    if (now - last_rx > options_.liveness_s && now - last_hello_ > options_.liveness_s) {
      // A task in flight goes on: if the coordinator restarted, its upload is answered as stale.
      spdlog::info("client {}: coordinator silent for {:.1f} s, saying Hello again",
                   options_.client_id, now - last_rx);
      sayHello(now);
    }
    if (options_.exit_idle_s > 0 && now - last_rx > options_.exit_idle_s) {
      abandonJob("coordinator silent");
      return timeoutError("coordinator silent for " + std::to_string(now - last_rx) + " s");
    }
  }
  abandonJob("run finished");
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<ClientRuntime>> ClientRuntime::create(const ClientRuntimeOptions& options) {
  auto c = std::make_unique<ZmqClient>();
  FEDFLEET_RETURN_IF_ERROR(c->init(options));
  return std::unique_ptr<ClientRuntime>(std::move(c));
}

}  // namespace fedfleet::client
