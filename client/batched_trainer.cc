#include "client/batched_trainer.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/model/batch.h"

namespace fedfleet::client {
namespace {

// Logs `what` at info level the first time this process sees it: a fallback is said once, not
// once per round.
void logOnce(const std::string& what) {
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mu);
  if (said.insert(what).second) spdlog::info("batched training: {}", what);
}

// The paddings of the convolutions of a built-in model, in order: its Sequential
// (common/model/model.cc) is these convolutions, each followed by ReLU and 2x2 max-pooling, then
// Linear layers with a ReLU between consecutive ones. nullopt: not a model this file batches.
// The name is what says the paddings: the parameters' shapes alone cannot.
std::optional<std::vector<int64_t>> convPaddings(const std::string& name) {
  if (name == "logreg" || name == "mlp") return std::vector<int64_t>{};
  if (name == "cnn") return std::vector<int64_t>{2, 2};
  if (name == "lenet") return std::vector<int64_t>{2, 0};
  return std::nullopt;
}

// Why `model` cannot train batched; empty when it can.
std::string unbatchableModel(model::Model& model) {
  const std::string name = model.name();
  const auto paddings = convPaddings(name);
  if (!paddings) return "model '" + name + "' is not a built-in model";
  if (model.loss() != model::LossKind::kCrossEntropy) {
    return std::string("loss ") + wire::lossName(model.loss()) + " (only cross_entropy batches)";
  }
  if (!model.buffers().empty()) return "model '" + name + "' has buffers";
  const std::vector<at::Tensor> params = model.parameters();
  if (params.empty() || params.size() % 2 != 0) {
    return "model '" + name + "' is not a chain of weights and biases";
  }
  for (size_t i = 0; i < params.size(); i += 2) {
    const bool conv = i / 2 < paddings->size();
    const at::Tensor& w = params[i];
    const at::Tensor& b = params[i + 1];
    if (w.scalar_type() != at::kFloat || b.scalar_type() != at::kFloat || b.dim() != 1 ||
        w.dim() != (conv ? 4 : 2) || b.size(0) != w.size(0)) {
      return "model '" + name + "' has parameters of unexpected shapes or types";
    }
  }
  return "";
}

// Whether job `j` can join a batch for `model`; when it cannot, `log` says why if that is worth
// saying (a job Trainer refuses gets Trainer's error, with nothing to log).
bool batchableJob(model::Model& model, const BatchedJob& j, size_t params, int64_t first_in,
                  bool conv_first, std::string* log) {
  const TrainOptions& o = j.options;
  const data::Dataset& ds = *j.data;
  if (o.optimizer != wire::Optimizer::kSgd) {
    *log = std::string("optimizer ") + wire::optimizerName(o.optimizer) + " (only SGD batches)";
    return false;
  }
  if (o.precision != wire::Precision::kFp32) {  // Trainer's autocast; batches compute in fp32
    *log = std::string("precision ") + wire::precisionName(o.precision) + " (only fp32 batches)";
    return false;
  }
  if (ds.hasTargets()) {
    *log = "regression targets (only class labels batch)";
    return false;
  }
  // What Trainer::train refuses: it says so itself.
  if (j.start->size() != params || j.indices->empty() || o.batch_size == 0 ||
      (o.epochs == 0 && o.max_steps == 0) || !(o.prox_mu >= 0) || !std::isfinite(o.prox_mu)) {
    return false;
  }
  if (o.usesScaffold() &&
      (o.scaffold.c == nullptr || o.scaffold.ck == nullptr || o.scaffold.c->size() != params ||
       o.scaffold.ck->size() != params || o.lr == 0)) {
    return false;
  }
  if (!data::checkSampleStorage(ds).isOk()) return false;
  for (uint32_t i : *j.indices) {
    if (i >= ds.size()) return false;
  }
  const std::vector<int64_t> sample = model::inputShapeOf(ds).sample;
  int64_t values = 1;
  for (int64_t d : sample) values *= d;
  if (conv_first ? sample.size() != 3 || sample[0] != first_in : values != first_in) {
    *log = "inputs of shape that do not fit model '" + model.name() + "'";
    return false;
  }
  return true;
}

// One client in the batch: its data order, progress and result so far.
struct ClientState {
  size_t job = 0;  // index into the jobs
  const BatchedJob* j = nullptr;
  std::unique_ptr<model::BatchBuilder> builder;
  PassOrder order{0, 0};
  std::vector<uint32_t> batch_idx;
  size_t pos = 0;    // position within the current pass
  size_t batch = 0;  // this step's batch size
  uint64_t planned = 0, steps = 0, n_samples = 0;

  const std::vector<uint32_t>& indices() const { return *j->indices; }
};

// The batched training of `rows` (indices into `jobs`, at least one), results into `out`.
// Throws c10::Error when LibTorch fails (a sample shape or label that does not fit the model).
class BatchRun {
 public:
  BatchRun(model::Model& model, const std::vector<BatchedJob>& jobs,
           const std::vector<size_t>& rows, const c10::Device& device,
           std::vector<std::optional<Result<TrainResult>>>& out)
      : device_(device), out_(out), t0_(std::chrono::steady_clock::now()) {
    const std::vector<int64_t> paddings = *convPaddings(model.name());
    const std::vector<at::Tensor> params = model.parameters();
    initial_ = static_cast<int64_t>(rows.size());
    for (size_t r : rows) {
      auto c = std::make_unique<ClientState>();
      c->job = r;
      c->j = &jobs[r];
      c->builder = std::make_unique<model::BatchBuilder>(*c->j->data, c10::Device(c10::kCPU));
      const size_t m = c->j->indices->size(), bsz = c->j->options.batch_size;
      const uint64_t steps_per_pass = (m + bsz - 1) / bsz;
      c->planned = c->j->options.max_steps > 0 ? c->j->options.max_steps
                                               : uint64_t{c->j->options.epochs} * steps_per_pass;
      c->order = PassOrder(c->j->options.seed, m);
      active_.push_back(std::move(c));
    }
    sample_ = model::inputShapeOf(*active_.front()->j->data).sample;

    // The stacked weights, x_t for FedProx and c - c_k for SCAFFOLD: [K, parameter shape...].
    const auto k = static_cast<int64_t>(rows.size());
    for (const auto& c : active_) {
      const TrainOptions& o = c->j->options;
      any_prox_ = any_prox_ || o.prox_mu != 0;
      any_scaffold_ = any_scaffold_ || (o.usesScaffold() && !o.scaffoldAfterStep());
      any_scaffold_after_ = any_scaffold_after_ || o.scaffoldAfterStep();
      any_decay_ = any_decay_ || o.weight_decay != 0;
      any_momentum_ = any_momentum_ || o.momentum != 0;
    }
    const auto column = [&](float TrainOptions::*field) {
      at::Tensor t = at::empty({k}, at::TensorOptions().dtype(at::kFloat));
      for (int64_t r = 0; r < k; ++r) t[r] = active_[r]->j->options.*field;
      return t.to(device_);
    };
    lr_ = column(&TrainOptions::lr);
    mu_ = column(&TrainOptions::prox_mu);
    decay_ = column(&TrainOptions::weight_decay);
    momentum_ = column(&TrainOptions::momentum);
    size_t offset = 0;
    for (const at::Tensor& p : params) {
      const int64_t n = p.numel();
      at::Tensor host = at::empty({k, n}, at::TensorOptions().dtype(at::kFloat));
      // c - c_k of the clients that add it to the gradient (plain SGD), and of those that
      // apply it after the step (momentum: TrainOptions::scaffoldAfterStep); 0 in the other.
      at::Tensor shift = any_scaffold_ ? at::zeros({k, n}, host.options()) : at::Tensor();
      at::Tensor shift_after =
          any_scaffold_after_ ? at::zeros({k, n}, host.options()) : at::Tensor();
      for (int64_t r = 0; r < k; ++r) {
        const TrainOptions& o = active_[r]->j->options;
        std::memcpy(host[r].data_ptr<float>(), active_[r]->j->start->data() + offset,
                    n * sizeof(float));
        if (o.usesScaffold()) {
          float* s = (o.scaffoldAfterStep() ? shift_after : shift)[r].data_ptr<float>();
          const float* c = o.scaffold.c->data() + offset;
          const float* ck = o.scaffold.ck->data() + offset;
          for (int64_t i = 0; i < n; ++i) s[i] = c[i] - ck[i];
        }
      }
      std::vector<int64_t> shape = {k};
      shape.insert(shape.end(), p.sizes().begin(), p.sizes().end());
      // A Linear weight is kept as [K, in, out], W^T: its gradient h^T g then comes out of the
      // batched product contiguous, and autograd takes it over as it is instead of copying a
      // transposed [out, in] gradient every step.
      const bool transposed = p.dim() == 2;
      const auto stacked = [&](const at::Tensor& t) {
        at::Tensor v = t.view(shape);
        if (transposed) v = v.transpose(1, 2);
        return v.contiguous().to(device_, /*non_blocking=*/false, /*copy=*/true);
      };
      at::Tensor w = stacked(host);
      if (any_prox_) start_.push_back(w.clone());
      if (any_scaffold_) shift_.push_back(stacked(shift));
      if (any_scaffold_after_) shift_after_.push_back(stacked(shift_after));
      transposed_.push_back(transposed);
      weights_.push_back(w.requires_grad_(true));
      buffers_.emplace_back();
      offsets_.push_back(offset);
      offset += static_cast<size_t>(n);
    }
    for (size_t l = 0; l < params.size() / 2; ++l) {
      layers_.push_back({l < paddings.size(), l < paddings.size() ? paddings[l] : 0});
    }
    const at::TensorOptions dbl = at::TensorOptions().dtype(at::kDouble).device(device_);
    loss_sum_ = at::zeros({k}, dbl);
    loss_sq_ = at::zeros({k}, dbl);
  }

  void run() {
    while (true) {
      leave();
      if (active_.empty()) return;
      step();
    }
  }

 private:
  struct Layer {
    bool conv = false;
    int64_t padding = 0;
  };

  // Reads out and drops the clients whose steps are done or whose stop flag is set.
  void leave() {
    std::vector<int64_t> keep;
    for (size_t r = 0; r < active_.size(); ++r) {
      const ClientState& c = *active_[r];
      const bool done = c.steps == c.planned;
      const bool stopped =
          !done && c.j->stop != nullptr && c.j->stop->load(std::memory_order_acquire);
      if (done || stopped) {
        readOut(static_cast<int64_t>(r), stopped);
      } else {
        keep.push_back(static_cast<int64_t>(r));
      }
    }
    if (keep.size() == active_.size()) return;
    std::vector<std::unique_ptr<ClientState>> still;
    for (int64_t r : keep) still.push_back(std::move(active_[r]));
    active_ = std::move(still);
    if (active_.empty()) return;
    const at::Tensor idx =
        at::tensor(keep, at::TensorOptions().dtype(at::kLong)).to(device_, /*non_blocking=*/false);
    const auto shrink = [&](at::Tensor& t) {
      if (t.defined()) t = t.index_select(0, idx);
    };
    for (size_t i = 0; i < weights_.size(); ++i) {
      weights_[i] = weights_[i].detach().index_select(0, idx).requires_grad_(true);
      if (!start_.empty()) shrink(start_[i]);
      if (!shift_.empty()) shrink(shift_[i]);
      if (!shift_after_.empty()) shrink(shift_after_[i]);
      shrink(buffers_[i]);
    }
    for (at::Tensor* t : {&lr_, &mu_, &decay_, &momentum_, &loss_sum_, &loss_sq_}) shrink(*t);
  }

  // Client r's result, from its row of the stacked tensors.
  void readOut(int64_t r, bool stopped) {
    const ClientState& c = *active_[r];
    const std::vector<float>& start = *c.j->start;
    TrainResult result;
    result.n_samples = c.n_samples;
    result.steps = c.steps;
    result.stopped_early = stopped;
    result.delta.resize(start.size());
    for (size_t i = 0; i < weights_.size(); ++i) {
      at::Tensor row = weights_[i].detach().select(0, r);
      if (transposed_[i]) row = row.t();
      row = row.contiguous().to(at::kCPU).reshape({-1});
      std::memcpy(result.delta.data() + offsets_[i], row.data_ptr<float>(),
                  row.numel() * sizeof(float));
    }
    for (size_t i = 0; i < start.size(); ++i) result.delta[i] -= start[i];
    if (c.n_samples > 0) {
      const double sum = loss_sum_[r].item<double>();
      result.mean_loss = sum / static_cast<double>(c.n_samples);
      result.sum_sq_loss = loss_sq_[r].item<double>();
    }
    const TrainOptions& o = c.j->options;
    if (o.usesScaffold()) {  // as Trainer::train: Dc_k = -c - delta / (K lr); 0 when K = 0
      const std::vector<float>& cv = *o.scaffold.c;
      result.control_delta.assign(result.delta.size(), 0.0f);
      if (result.steps > 0) {
        const double inv = 1.0 / (static_cast<double>(result.steps) * o.lr);
        for (size_t i = 0; i < result.delta.size(); ++i) {
          result.control_delta[i] = static_cast<float>(-static_cast<double>(cv[i]) -
                                                       static_cast<double>(result.delta[i]) * inv);
        }
      }
    }
    result.compute_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count() /
        static_cast<double>(initial_);
    out_[c.job] = std::move(result);
  }

  // One SGD step of every client in the batch.
  void step() {
    const auto k = static_cast<int64_t>(active_.size());
    size_t widest = 0;
    for (auto& c : active_) {
      const size_t m = c->indices().size();
      if (c->pos == 0) {
        c->order.next();
      }
      c->batch = std::min<size_t>(c->j->options.batch_size, m - c->pos);
      widest = std::max(widest, c->batch);
    }
    const auto b_max = static_cast<int64_t>(widest);
    // The step's samples [K, B, sample...], zero-padded; labels; each sample's weight in its
    // client's mean (1 / its batch size, 0 for padding) and whether it is real (1 or 0).
    std::vector<int64_t> x_shape = {k, b_max};
    x_shape.insert(x_shape.end(), sample_.begin(), sample_.end());
    at::Tensor x = at::zeros(x_shape, at::TensorOptions().dtype(at::kFloat));
    at::Tensor y = at::zeros({k, b_max}, at::TensorOptions().dtype(at::kLong));
    at::Tensor weight = at::zeros({k, b_max}, at::TensorOptions().dtype(at::kFloat));
    at::Tensor real = at::zeros({k, b_max}, at::TensorOptions().dtype(at::kFloat));
    for (int64_t r = 0; r < k; ++r) {
      ClientState& c = *active_[r];
      const auto b = static_cast<int64_t>(c.batch);
      c.batch_idx.resize(c.batch);
      for (size_t i = 0; i < c.batch; ++i)
        c.batch_idx[i] = c.indices()[c.order.current()[c.pos + i]];
      auto [xs, ys] = c.builder->build(c.batch_idx.data(), c.batch);
      x[r].narrow(0, 0, b).view(xs.sizes()).copy_(xs);
      y[r].narrow(0, 0, b).copy_(ys);
      weight[r].narrow(0, 0, b).fill_(1.0f / static_cast<float>(b));
      real[r].narrow(0, 0, b).fill_(1.0f);
    }
    if (!device_.is_cpu()) {
      x = x.to(device_);
      y = y.to(device_);
      weight = weight.to(device_);
      real = real.to(device_);
    }

    const at::Tensor per_sample = perSampleLoss(forward(x), y);
    (per_sample * weight).sum().backward();
    {
      torch::NoGradGuard no_grad;
      update();
      const at::Tensor seen = (per_sample.detach() * real).to(at::kDouble);
      loss_sum_.add_(seen.sum(1));
      loss_sq_.add_(seen.square().sum(1));
    }
    for (auto& c : active_) {
      c->steps += 1;
      c->n_samples += c->batch;
      c->pos += c->batch;
      if (c->pos == c->indices().size()) c->pos = 0;
    }
  }

  // Logits [K, B, classes] of the samples x [K, B, sample...].
  at::Tensor forward(const at::Tensor& x) {
    const int64_t k = x.size(0), b = x.size(1);
    at::Tensor h;
    size_t l = 0;
    if (layers_.front().conv) {
      // Client k's channels are k C .. (k + 1) C - 1 of one [B, K C, H, W] input, and
      // groups = K gives each group of channels its own client's kernels.
      h = x.transpose(0, 1).reshape({b, k * x.size(2), x.size(3), x.size(4)});
      for (; l < layers_.size() && layers_[l].conv; ++l) {
        const at::Tensor& w = weights_[2 * l];
        const at::Tensor& bias = weights_[2 * l + 1];
        const int64_t pad = layers_[l].padding;
        h = at::conv2d(h, w.reshape({k * w.size(1), w.size(2), w.size(3), w.size(4)}),
                       bias.reshape({-1}), {1, 1}, {pad, pad}, {1, 1}, k);
        h = at::max_pool2d(at::relu(h), {2, 2}, {2, 2});
      }
      // [B, K C, H, W] -> [K, B, C H W]: each client's features flattened as nn::Flatten does.
      h = h.reshape({b, k, -1}).transpose(0, 1);
    } else {
      h = x.reshape({k, b, -1});
    }
    for (; l < layers_.size(); ++l) {
      const at::Tensor& w = weights_[2 * l];
      const at::Tensor& bias = weights_[2 * l + 1];
      h = at::baddbmm(bias.unsqueeze(1), h, w);  // w: [K, in, out]
      if (l + 1 < layers_.size()) h = at::relu(h);
    }
    return h;
  }

  // The cross-entropy of every sample [K, B] (as at::cross_entropy_loss computes it:
  // -log_softmax(z)[y]). Throws c10::Error for a label outside [0, classes).
  static at::Tensor perSampleLoss(const at::Tensor& logits, const at::Tensor& y) {
    return -at::log_softmax(logits, 2).gather(2, y.unsqueeze(2)).squeeze(2);
  }

  // torch::optim::SGD's update (dampening 0, no Nesterov) with each client's own rates, every
  // gradient first corrected by mu (w - x_t) + (c - c_k), as Trainer::train does:
  //   d = grad + weight_decay w; buf = d on the first step, momentum buf + d after;
  //   w -= lr buf (lr d without momentum; a client with momentum 0 has buf = d every step).
  // A SCAFFOLD client with momentum takes c - c_k after the step instead: w -= lr (c - c_k).
  void update() {
    const auto k = static_cast<int64_t>(active_.size());
    for (size_t i = 0; i < weights_.size(); ++i) {
      at::Tensor& w = weights_[i];
      std::vector<int64_t> col_shape(static_cast<size_t>(w.dim()), 1);
      col_shape[0] = k;
      const auto col = [&](const at::Tensor& v) { return v.view(col_shape); };
      at::Tensor g = w.grad();
      if (any_prox_) g.add_((w.detach() - start_[i]) * col(mu_));
      if (any_scaffold_) g.add_(shift_[i]);
      if (any_decay_) g.add_(w.detach() * col(decay_));
      at::Tensor d = g;
      if (any_momentum_) {
        if (!buffers_[i].defined()) {
          buffers_[i] = g.clone();
        } else {
          buffers_[i].mul_(col(momentum_)).add_(g);
        }
        d = buffers_[i];
      }
      w.detach().addcmul_(d, col(lr_), -1);
      if (any_scaffold_after_) w.detach().addcmul_(shift_after_[i], col(lr_), -1);
      // Dropped rather than zeroed: the next backward pass then hands its fresh gradient over
      // instead of adding it to zeros (two passes less over K weight sets).
      w.mutable_grad().reset();
    }
  }

  c10::Device device_;
  std::vector<std::optional<Result<TrainResult>>>& out_;
  std::chrono::steady_clock::time_point t0_;
  int64_t initial_ = 0;
  std::vector<int64_t> sample_;
  std::vector<Layer> layers_;
  std::vector<size_t> offsets_;  // each parameter's offset in the flat layout

  // One row per client still in the batch, in the order of active_.
  std::vector<std::unique_ptr<ClientState>> active_;
  std::vector<at::Tensor> weights_;        // leaves [K, shape...], parameters() order
  std::vector<bool> transposed_;           // a Linear weight, kept as [K, in, out]
  std::vector<at::Tensor> start_;          // x_t, when some client has prox_mu > 0
  std::vector<at::Tensor> shift_;          // c - c_k (0 for a client without SCAFFOLD)
  std::vector<at::Tensor> shift_after_;    // c - c_k applied after the step (with momentum)
  std::vector<at::Tensor> buffers_;        // momentum buffers (undefined before the first step)
  at::Tensor lr_, mu_, decay_, momentum_;  // [K] each client's
  at::Tensor loss_sum_, loss_sq_;          // [K] double: sums of per-sample losses and squares
  bool any_prox_ = false, any_scaffold_ = false, any_decay_ = false, any_momentum_ = false;
  bool any_scaffold_after_ = false;
};

}  // namespace

BatchedTrainer::BatchedTrainer(c10::Device device) : device_(device) {}

bool BatchedTrainer::supportsModel(model::Model& model) { return unbatchableModel(model).empty(); }

std::vector<Result<TrainResult>> BatchedTrainer::train(model::Model& model,
                                                       const std::vector<BatchedJob>& jobs) {
  std::vector<std::optional<Result<TrainResult>>> out(jobs.size());
  std::vector<size_t> batched, single;
  const std::string why = unbatchableModel(model);
  if (!why.empty()) {
    logOnce(why + ": its clients train one at a time");
    single.resize(jobs.size());
    std::iota(single.begin(), single.end(), size_t{0});
  } else {
    const std::vector<at::Tensor> params = model.parameters();
    const bool conv_first = params.front().dim() == 4;
    const int64_t first_in = params.front().size(1);
    const size_t n_params = model.numParameters();
    std::optional<std::vector<int64_t>> sample;
    for (size_t i = 0; i < jobs.size(); ++i) {
      std::string log;
      bool ok = batchableJob(model, jobs[i], n_params, first_in, conv_first, &log);
      if (ok) {  // one batch takes one sample shape
        const std::vector<int64_t> s = model::inputShapeOf(*jobs[i].data).sample;
        if (!sample) sample = s;
        ok = s == *sample;
        if (!ok) log = "clients whose samples differ in shape";
      }
      if (!log.empty()) logOnce(log + ": those clients train one at a time");
      (ok ? batched : single).push_back(i);
    }
    if (batched.size() == 1) {  // nothing to batch with
      single.push_back(batched.front());
      batched.clear();
    }
  }
  if (!batched.empty()) {
    try {
      BatchRun(model, jobs, batched, device_, out).run();
    } catch (const std::exception& e) {  // c10::Error and the like: each client on its own
      logOnce(std::string("a batch failed (") + model::errorCause(e.what()) +
              "): its clients train one at a time");
      for (size_t i : batched) out[i].reset();
      single.insert(single.end(), batched.begin(), batched.end());
    }
  }
  Trainer trainer(device_);
  for (size_t i : single) {
    const BatchedJob& j = jobs[i];
    out[i] = trainer.train(model, *j.start, *j.data, *j.indices, j.options, j.stop);
  }
  std::vector<Result<TrainResult>> results;
  results.reserve(jobs.size());
  for (auto& r : out) results.push_back(std::move(*r));
  return results;
}

}  // namespace fedfleet::client
