#include "client/trainer.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <string>

#include "common/model/batch.h"

namespace fedfleet::client {
namespace {

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
    } else {
      const size_t pixels = ds.imageBytes();
      x = at::empty({m, 1, ds.rows, ds.cols}, at::TensorOptions().dtype(at::kByte));
      uint8_t* xp = x.data_ptr<uint8_t>();
      for (size_t i = 0; i < indices.size(); ++i) {
        std::copy_n(ds.image(indices[i]), pixels, xp + i * pixels);
      }
    }
    at::Tensor y = at::empty({m}, at::TensorOptions().dtype(at::kLong));
    int64_t* yp = y.data_ptr<int64_t>();
    for (size_t i = 0; i < indices.size(); ++i) yp[i] = ds.labels[indices[i]];
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

Status validate(model::Model& model, const std::vector<float>& start, const data::Dataset& ds,
                const std::vector<uint32_t>& indices, const TrainOptions& opts) {
  const size_t expected = model.numParameters();
  if (start.size() != expected) {
    return invalidArgument("train: start has " + std::to_string(start.size()) + " values, model '" +
                           model.name() + "' has " + std::to_string(expected));
  }
  if (indices.empty()) return invalidArgument("train: no sample indices");
  if (opts.batch_size == 0) return invalidArgument("train: batch_size must be > 0");
  if (opts.epochs == 0 && opts.max_steps == 0) {
    return invalidArgument("train: epochs and max_steps are both 0");
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

Trainer::Trainer(c10::Device device, BatchSource source) : device_(device), source_(source) {}

Result<TrainResult> Trainer::train(model::Model& model, const std::vector<float>& start,
                                   const data::Dataset& ds, const std::vector<uint32_t>& indices,
                                   const TrainOptions& opts, const std::atomic<bool>* stop) {
  const auto t0 = std::chrono::steady_clock::now();
  FEDFLEET_RETURN_IF_ERROR(validate(model, start, ds, indices, opts));
  bool was_training = true;
  try {
    was_training = model.isTraining();
    if (model.device() != device_) model.to(device_);
    FEDFLEET_RETURN_IF_ERROR(model.setFlatParameters(start));
    model.train(true);

    std::vector<at::Tensor> params = model.parameters();
    torch::optim::SGD sgd(
        params,
        torch::optim::SGDOptions(opts.lr).momentum(opts.momentum).weight_decay(opts.weight_decay));

    const size_t m = indices.size(), bsz = opts.batch_size;
    const uint64_t steps_per_pass = (m + bsz - 1) / bsz;
    const uint64_t planned_steps =
        opts.max_steps > 0 ? opts.max_steps : uint64_t{opts.epochs} * steps_per_pass;
    const uint64_t planned_samples =
        (planned_steps / steps_per_pass) * m + (planned_steps % steps_per_pass) * bsz;

    const bool device_shard = source_ == BatchSource::kDeviceShard ||
                              (source_ == BatchSource::kAuto && !device_.is_cpu());
    ShardBatches batches(ds, indices, device_, device_shard);
    LossLog losses(std::min<uint64_t>(planned_samples, m), device_);

    std::mt19937_64 rng(opts.seed);
    std::vector<int64_t> order(m);
    TrainResult result;
    size_t pos = 0;  // position within the current pass
    for (uint64_t step = 0; step < planned_steps; ++step) {
      if (stop != nullptr && stop->load(std::memory_order_acquire)) {
        result.stopped_early = true;
        break;
      }
      if (pos == 0) {
        std::iota(order.begin(), order.end(), int64_t{0});
        std::shuffle(order.begin(), order.end(), rng);
        batches.startPass(order);
      }
      const size_t b = std::min(bsz, m - pos);
      auto [x, y] = batches.batch(pos, b);
      for (auto& p : params) {  // keep the gradient buffers: re-allocating them costs more
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
      const at::Tensor logits = model.forward(x);
      const at::Tensor per_sample = at::cross_entropy_loss(logits, y, {}, at::Reduction::None);
      per_sample.mean().backward();
      sgd.step();
      losses.add(per_sample.detach());
      result.n_samples += b;
      result.steps += 1;
      pos += b;
      if (pos == m) pos = 0;
    }
    for (auto& p : params) p.mutable_grad().reset();  // release gradient memory

    if (result.n_samples > 0) {
      const auto [sum, sum_sq] = losses.totals();
      result.mean_loss = sum / static_cast<double>(result.n_samples);
      result.sum_sq_loss = sum_sq;
    }
    model.flatParameters(result.delta);
    for (size_t i = 0; i < result.delta.size(); ++i) result.delta[i] -= start[i];
    model.train(was_training);
    result.compute_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return result;
  } catch (const c10::Error& e) {
    model.train(was_training);
    return internalError(std::string("train: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    model.train(was_training);
    return internalError(std::string("train: ") + e.what());
  }
}

}  // namespace fedfleet::client
