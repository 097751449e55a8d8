#include "client/trainer.h"

#include <ATen/autocast_mode.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "client/fully_connected_sgd.h"
#include "common/check.h"
#include "common/model/batch.h"
#include "common/model/loss.h"

namespace fedfleet::client {
namespace {

using internal::FullyConnectedSgd;
using internal::GradientCorrection;
using internal::linearChain;
using internal::LinearLayer;

// The batches of one train() call, gathered on the host (CPU) or from a device-resident copy of
// the shard. Both produce identical values: float(v) * scale - shift for image bytes, the stored
// floats for feature vectors.
class ShardBatches {
 public:
  ShardBatches(const data::Dataset& ds, const std::vector<uint32_t>& indices,
               const c10::Device& device, bool device_shard)
      : ds_(ds),
        indices_(indices),
        device_(device),
        device_shard_(device_shard),
        builder_(ds, device) {
    if (!device_shard_) return;
    const auto m = static_cast<int64_t>(indices.size());
    at::Tensor x;
    if (ds.hasFeatures()) {
      const size_t dim = ds.feature_dim;
      x = at::empty({m, static_cast<int64_t>(dim)}, at::TensorOptions().dtype(at::kFloat));
      float* xp = x.data_ptr<float>();
      for (size_t i = 0; i < indices.size(); ++i) {
        std::copy_n(ds.feature(indices[i]), dim, xp + i * dim);
      }
      if (!ds.sample_shape.empty()) {
        std::vector<int64_t> shape = {m};
        shape.insert(shape.end(), ds.sample_shape.begin(), ds.sample_shape.end());
        x = x.view(shape);
      }
    } else {
      const size_t pixels = ds.imageBytes();
      x = at::empty({m, 1, ds.rows, ds.cols}, at::TensorOptions().dtype(at::kByte));
      uint8_t* xp = x.data_ptr<uint8_t>();
      for (size_t i = 0; i < indices.size(); ++i) {
        std::copy_n(ds.image(indices[i]), pixels, xp + i * pixels);
      }
    }
    at::Tensor y;
    if (ds.hasTargets()) {
      const size_t t_dim = ds.target_dim;
      y = at::empty({m, static_cast<int64_t>(t_dim)}, at::TensorOptions().dtype(at::kFloat));
      float* yp = y.data_ptr<float>();
      for (size_t i = 0; i < indices.size(); ++i) {
        std::copy_n(ds.target(indices[i]), t_dim, yp + i * t_dim);
      }
    } else {
      y = at::empty({m}, at::TensorOptions().dtype(at::kLong));
      int64_t* yp = y.data_ptr<int64_t>();
      for (size_t i = 0; i < indices.size(); ++i) yp[i] = ds.labels[indices[i]];
    }
    shard_x_ = x.to(device);
    shard_y_ = y.to(device);
  }

  // Called once per pass with the pass's order of shard positions.
  void startPass(const std::vector<int64_t>& order) {
    if (!device_shard_) {
      order_ = &order;
      return;
    }
    perm_ = at::from_blob(const_cast<int64_t*>(order.data()), {static_cast<int64_t>(order.size())},
                          at::TensorOptions().dtype(at::kLong))
                .to(device_, /*non_blocking=*/false, /*copy=*/true);
  }

  // Samples at positions [pos, pos + n) of the current pass.
  std::pair<at::Tensor, at::Tensor> batch(size_t pos, size_t n) {
    if (!device_shard_) {
      batch_idx_.resize(n);
      for (size_t i = 0; i < n; ++i) batch_idx_[i] = indices_[(*order_)[pos + i]];
      return builder_.build(batch_idx_.data(), n);
    }
    const at::Tensor idx = perm_.narrow(0, static_cast<int64_t>(pos), static_cast<int64_t>(n));
    at::Tensor x = shard_x_.index_select(0, idx);
    if (!ds_.hasFeatures()) {
      x = x.to(at::kFloat);
      x.mul_(norm_.scale).sub_(norm_.shift);
    }
    return {x, shard_y_.index_select(0, idx)};
  }

 private:
  const data::Dataset& ds_;
  const std::vector<uint32_t>& indices_;
  c10::Device device_;
  bool device_shard_;
  model::BatchBuilder builder_;
  model::PixelNormalization norm_;
  const std::vector<int64_t>* order_ = nullptr;
  std::vector<uint32_t> batch_idx_;
  at::Tensor shard_x_, shard_y_, perm_;
};

// Per-sample losses on the device. The buffer holds at most one pass; when full it is folded
// into running double sums (still on the device), so memory stays O(shard) whatever max_steps is
// and the host reads the device once, at the end.
class LossLog {
 public:
  LossLog(size_t capacity, const c10::Device& device)
      : buf_(at::empty({static_cast<int64_t>(std::max<size_t>(capacity, 1))},
                       at::TensorOptions().dtype(at::kFloat).device(device))),
        sums_(at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(device))) {}

  // Precondition: per_sample.size(0) <= capacity.
  void add(const at::Tensor& per_sample) {
    const int64_t b = per_sample.size(0);
    if (fill_ + b > buf_.size(0)) flush();
    buf_.narrow(0, fill_, b).copy_(per_sample);
    fill_ += b;
  }

  // Room for the next b per-sample losses, to be written by the caller before the next call.
  // Preconditions: the log lives on the CPU, b <= capacity.
  float* appendOnHost(int64_t b) {
    if (fill_ + b > buf_.size(0)) flush();
    float* out = buf_.data_ptr<float>() + fill_;
    fill_ += b;
    return out;
  }

  // {sum of losses, sum of squared losses}.
  std::pair<double, double> totals() {
    flush();
    const at::Tensor host = sums_.to(at::kCPU);
    return {host[0].item<double>(), host[1].item<double>()};
  }

 private:
  void flush() {
    if (fill_ == 0) return;
    const at::Tensor seen = buf_.narrow(0, 0, fill_).to(at::kDouble);
    sums_.add_(at::stack({seen.sum(), seen.square().sum()}));
    fill_ = 0;
  }

  at::Tensor buf_, sums_;
  int64_t fill_ = 0;
};

// Autocast to bf16 on the calling thread for the device's type (CPU, or CUDA) while alive: the
// mixed precision of TrainOptions::precision = kBf16. In LibTorch 1.13 autocast's flags (dispatch
// keys of the thread's local key set), dtypes and cast cache are thread-local
// (tests/client/trainer_precision_test.cc checks the flags and dtypes), so training on other
// threads is untouched. The destructor, on every way out of the scope, clears the cache (it
// holds bf16 copies of the fp32 weights, which the next optimiser step makes stale) and
// restores the thread's previous flag and dtype. It cannot throw: the dtype is set back only
// when it was not bf16, which CPU autocast never is (1.13 refuses any other CPU dtype).
class Bf16Autocast {
 public:
  explicit Bf16Autocast(const c10::Device& device) : cuda_(device.is_cuda()) {
    if (cuda_) {
      was_enabled_ = at::autocast::is_enabled();
      was_dtype_ = at::autocast::get_autocast_gpu_dtype();
      at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
      at::autocast::set_enabled(true);
    } else {
      was_enabled_ = at::autocast::is_cpu_enabled();
      was_dtype_ = at::autocast::get_autocast_cpu_dtype();
      at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
      at::autocast::set_cpu_enabled(true);
    }
  }
  ~Bf16Autocast() {
    at::autocast::clear_cache();
    if (cuda_) {
      at::autocast::set_enabled(was_enabled_);
      if (was_dtype_ != at::kBFloat16) at::autocast::set_autocast_gpu_dtype(was_dtype_);
    } else {
      at::autocast::set_cpu_enabled(was_enabled_);
      if (was_dtype_ != at::kBFloat16) at::autocast::set_autocast_cpu_dtype(was_dtype_);
    }
  }
  Bf16Autocast(const Bf16Autocast&) = delete;
  Bf16Autocast& operator=(const Bf16Autocast&) = delete;

 private:
  bool cuda_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

// The checks of Trainer::train's arguments.
Status validate(model::Model& model, const std::vector<float>& start, const data::Dataset& ds,
                const std::vector<uint32_t>& indices, const TrainOptions& opts) {
  const size_t expected = model.numParameters();
  if (start.size() != expected) {
    return invalidArgument(
        "train: the task's model has " + std::to_string(start.size()) +
        " values, this "
        "client's model '" +
        model.name() + "' for its data has " + std::to_string(expected) +
        ": client and coordinator must build the same model (the same model.name and "
        "model.path, and for a built-in model on their own files the same "
        "data.feature_columns or data.image_size and data.num_classes)");
  }
  if (indices.empty()) return invalidArgument("train: no sample indices");
  if (opts.batch_size == 0) return invalidArgument("train: batch_size must be > 0");
  if (opts.epochs == 0 && opts.max_steps == 0) {
    return invalidArgument("train: epochs and max_steps are both 0");
  }
  if (!(opts.prox_mu >= 0) || !std::isfinite(opts.prox_mu)) {
    return invalidArgument("train: prox_mu " + std::to_string(opts.prox_mu) +
                           " is not a finite value >= 0");
  }
  if (opts.usesScaffold()) {
    const std::vector<float>* c = opts.scaffold.c;
    const std::vector<float>* ck = opts.scaffold.ck;
    if (c == nullptr || ck == nullptr) {
      return invalidArgument("train: SCAFFOLD needs both control variates, c and c_k");
    }
    if (c->size() != expected || ck->size() != expected) {
      return invalidArgument("train: SCAFFOLD control variates have " + std::to_string(c->size()) +
                             " (c) and " + std::to_string(ck->size()) + " (c_k) values, model '" +
                             model.name() + "' has " + std::to_string(expected));
    }
    if (opts.lr == 0) return invalidArgument("train: SCAFFOLD with lr 0");
  }
  if (Status st = data::checkSampleStorage(ds); !st.isOk()) {
    return invalidArgument("train: " + st.message());
  }
  for (uint32_t i : indices) {
    if (i >= ds.size()) {
      return invalidArgument("train: index " + std::to_string(i) + " outside the " +
                             std::to_string(ds.size()) + "-sample data set");
    }
  }
  return Status::ok();
}

}  // namespace

size_t parameterValues(const model::Layout& layout) {
  size_t n = 0;
  for (const auto& t : layout.tensors) {
    if (!t.buffer) n = std::max(n, t.offset + t.numel);
  }
  return n;
}

std::vector<float> scaffoldControlDelta(const std::vector<float>& c,
                                        const std::vector<float>& delta, uint64_t steps, float lr,
                                        size_t parameter_values) {
  // Dc_k = c_k_new - c_k = -c + (x_t - y) / (K lr) = -c - delta / (K lr); 0 when K = 0
  // (option II, with either placement of the correction: scaffoldAfterStep). Buffers (after
  // the parameters in the flat layout) get no gradient and no correction: their control
  // variates stay 0.
  std::vector<float> out(delta.size(), 0.0f);
  if (steps == 0) return out;
  const double inv = 1.0 / (static_cast<double>(steps) * lr);
  const size_t n = std::min({parameter_values, delta.size(), c.size()});
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(-static_cast<double>(c[i]) - static_cast<double>(delta[i]) * inv);
  }
  return out;
}

Trainer::Trainer(c10::Device device, BatchSource source, GradientPath gradients)
    : device_(device), source_(source), gradients_(gradients) {}

bool Trainer::supportsManualGradients(model::Model& model) const {
  return device_.is_cpu() && model.loss() == model::LossKind::kCrossEntropy &&
         !linearChain(model).empty();
}

Result<TrainResult> Trainer::train(model::Model& model, const std::vector<float>& start,
                                   const data::Dataset& ds, const std::vector<uint32_t>& indices,
                                   const TrainOptions& opts, const std::atomic<bool>* stop) {
  const auto t0 = std::chrono::steady_clock::now();
  FEDFLEET_RETURN_IF_ERROR(validate(model, start, ds, indices, opts));
  bool was_training = true;
  try {
    const bool sgd_only = opts.optimizer == wire::Optimizer::kSgd;
    const bool bf16 = opts.precision == wire::Precision::kBf16;
    const bool manual = gradients_ != GradientPath::kAutograd && sgd_only && !bf16 &&
                        supportsManualGradients(model);
    if (gradients_ == GradientPath::kManual && !manual) {
      return invalidArgument(
          "train: no manual gradients for model '" + model.name() + "' on " + device_.str() +
          " with optimizer " + wire::optimizerName(opts.optimizer) + ", loss " +
          model::lossName(model.loss()) + " and precision " + wire::precisionName(opts.precision) +
          " (only SGD with cross_entropy in fp32 on the built-in logreg and "
          "mlp on the CPU)");
    }
    was_training = model.isTraining();
    if (model.device() != device_) model.to(device_);
    FEDFLEET_RETURN_IF_ERROR(model.setFlatParameters(start));
    model.train(true);

    std::vector<at::Tensor> params = model.parameters();
    std::optional<GradientCorrection> correction;
    if (GradientCorrection::needed(opts)) {
      correction.emplace(start, opts.prox_mu, opts.scaffold.c, opts.scaffold.ck,
                         /*shift_in_gradient=*/!opts.scaffoldAfterStep());
    }
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    std::optional<FullyConnectedSgd> fc;
    // Autograd path with a correction: x_t and c - c_k per parameter on the device, and a
    // buffer per parameter for w - x_t.
    std::vector<at::Tensor> start_of, shift_of, diff_of;
    if (manual) {
      std::vector<LinearLayer> chain = linearChain(model);  // the parameters after the move
      FEDFLEET_CHECK_MSG(!chain.empty(), "a model's layer chain changed when it moved");
      fc.emplace(std::move(chain), opts, correction ? &*correction : nullptr);
    } else {
      switch (opts.optimizer) {
        case wire::Optimizer::kSgd:
          optimizer =
              std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(opts.lr)
                                                              .momentum(opts.momentum)
                                                              .weight_decay(opts.weight_decay));
          break;
        case wire::Optimizer::kAdam:
          optimizer = std::make_unique<torch::optim::Adam>(
              params, torch::optim::AdamOptions(opts.lr).weight_decay(opts.weight_decay));
          break;
        case wire::Optimizer::kAdamW:
          optimizer = std::make_unique<torch::optim::AdamW>(
              params, torch::optim::AdamWOptions(opts.lr).weight_decay(opts.weight_decay));
          break;
      }
      if (correction) {
        const auto flat = [&](const std::vector<float>& v) {
          return at::from_blob(const_cast<float*>(v.data()), {static_cast<int64_t>(v.size())},
                               at::TensorOptions().dtype(at::kFloat))
              .to(device_, /*non_blocking=*/false, /*copy=*/true);
        };
        const at::Tensor x0 = flat(start);
        const bool scaffold = !correction->scaffoldShift().empty();
        const at::Tensor shift = scaffold ? flat(correction->scaffoldShift()) : at::Tensor();
        int64_t offset = 0;
        for (const auto& p : params) {
          const int64_t n = p.numel();
          start_of.push_back(x0.narrow(0, offset, n).view(p.sizes()));
          if (scaffold) shift_of.push_back(shift.narrow(0, offset, n).view(p.sizes()));
          if (opts.prox_mu != 0) diff_of.push_back(at::empty_like(p, at::MemoryFormat::Contiguous));
          offset += n;
        }
      }
    }
    std::optional<torch::NoGradGuard> no_grad;
    if (manual) no_grad.emplace();

    const size_t m = indices.size(), bsz = opts.batch_size;
    // A batch norm cannot train on a batch of one sample (PyTorch refuses it): for a model with
    // buffers, a pass's last batch of one joins the batch before it (bsz + 1 samples).
    const bool fold_single = !model.buffers().empty() && m > bsz && m % bsz == 1;
    const uint64_t steps_per_pass = (m + bsz - 1) / bsz - (fold_single ? 1 : 0);
    const uint64_t planned_steps =
        opts.max_steps > 0 ? opts.max_steps : uint64_t{opts.epochs} * steps_per_pass;
    const uint64_t planned_samples =
        (planned_steps / steps_per_pass) * m + (planned_steps % steps_per_pass) * bsz;

    const bool device_shard = source_ == BatchSource::kDeviceShard ||
                              (source_ == BatchSource::kAuto && !device_.is_cpu());
    ShardBatches batches(ds, indices, device_, device_shard);
    LossLog losses(std::min<uint64_t>(planned_samples, m), device_);

    PassOrder order(opts.seed, m);
    TrainResult result;
    size_t pos = 0;  // position within the current pass
    for (uint64_t step = 0; step < planned_steps; ++step) {
      if (stop != nullptr && stop->load(std::memory_order_acquire)) {
        result.stopped_early = true;
        break;
      }
      if (pos == 0) {
        batches.startPass(order.next());
      }
      const size_t b = fold_single && m - pos == bsz + 1 ? bsz + 1 : std::min(bsz, m - pos);
      auto [x, y] = batches.batch(pos, b);
      if (fc) {
        fc->step(x, y, losses.appendOnHost(static_cast<int64_t>(b)));
      } else {
        for (auto& p : params) {  // keep the gradient buffers: re-allocating them costs more
          if (p.grad().defined()) p.mutable_grad().zero_();
        }
        at::Tensor logits;
        if (bf16) {  // bf16 products and convolutions; the loss in fp32 on fp32 logits
          {
            Bf16Autocast autocast(device_);
            logits = model.forward(x);
          }
          logits = logits.to(at::kFloat);
        } else {
          logits = model.forward(x);
        }
        const at::Tensor per_sample = model::perSampleLoss(model.loss(), model, logits, y);
        per_sample.mean().backward();
        if (correction && correction->inGradient()) {
          // g += mu (w - x_t) (+ c - c_k with plain SGD), before the optimiser's weight decay
          // and momentum
          torch::NoGradGuard guard;
          for (size_t i = 0; i < params.size(); ++i) {
            at::Tensor& p = params[i];
            if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
            at::Tensor& g = p.mutable_grad();
            if (opts.prox_mu != 0) {
              at::sub_out(diff_of[i], p.detach(), start_of[i]);
              g.add_(diff_of[i], opts.prox_mu);
            }
            if (!shift_of.empty() && correction->shiftInGradient()) g.add_(shift_of[i]);
          }
        }
        optimizer->step();
        if (!shift_of.empty() && !correction->shiftInGradient()) {
          // SCAFFOLD with momentum or Adam: y <- y - lr (c - c_k) after the step, outside the
          // optimiser's state (TrainOptions::scaffoldAfterStep).
          torch::NoGradGuard guard;
          for (size_t i = 0; i < params.size(); ++i) {
            params[i].detach().sub_(shift_of[i], opts.lr);
          }
        }
        losses.add(per_sample.detach());
      }
      result.n_samples += b;
      result.steps += 1;
      pos += b;
      if (pos == m) pos = 0;
    }
    for (auto& p : params) {  // release gradient memory
      if (p.grad().defined()) p.mutable_grad().reset();
    }

    if (result.n_samples > 0) {
      const auto [sum, sum_sq] = losses.totals();
      result.mean_loss = sum / static_cast<double>(result.n_samples);
      result.sum_sq_loss = sum_sq;
    }
    if (opts.delta_on_device && device_.is_cuda() && !opts.usesScaffold()) {
      torch::NoGradGuard no_grad;
      const at::Tensor x_t = torch::from_blob(const_cast<float*>(start.data()),
                                              {static_cast<int64_t>(start.size())}, torch::kFloat)
                                 .to(device_);
      result.device_delta = (model.flatParametersOnDevice() - x_t).contiguous();
      // A compressor's own stream does not wait for LibTorch's: finish here.
      torch::cuda::synchronize(device_.index());
    } else {
      model.flatParameters(result.delta);
      for (size_t i = 0; i < result.delta.size(); ++i) result.delta[i] -= start[i];
    }
    if (opts.usesScaffold()) {
      size_t parameter_values = 0;
      for (const auto& p : params) parameter_values += static_cast<size_t>(p.numel());
      result.control_delta = scaffoldControlDelta(*opts.scaffold.c, result.delta, result.steps,
                                                  opts.lr, parameter_values);
    }
    model.train(was_training);
    result.compute_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return result;
  } catch (const c10::Error& e) {
    model.train(was_training);
    return internalError(std::string("train: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {  // the TorchScript interpreter's: its cause, one line
    model.train(was_training);
    return internalError("train: " + model::errorCause(e.what()));
  }
}

TrainOptions trainOptionsFrom(const wire::HyperParams& hp) {
  TrainOptions o;
  static_cast<wire::LocalSgd&>(o) = hp;
  return o;
}

std::vector<float> takeUpload(TrainResult& result) {
  std::vector<float> out = std::move(result.delta);
  result.delta.clear();
  if (result.control_delta.empty()) return out;
  FEDFLEET_CHECK_MSG(result.control_delta.size() == out.size(),
                     "a SCAFFOLD result's control delta and delta differ in size");
  out.insert(out.end(), result.control_delta.begin(), result.control_delta.end());
  std::vector<float>().swap(result.control_delta);
  return out;
}

}  // namespace fedfleet::client
