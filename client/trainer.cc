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

#include "common/check.h"
#include "common/model/batch.h"
#include "common/model/loss.h"

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

// One Linear layer of a fully connected model: y = x weight^T + bias.
struct LinearLayer {
  at::Tensor weight;  // [out, in], fp32, contiguous
  at::Tensor bias;    // [out]
  int64_t in = 0, out = 0;
};

// The Linear layers of `model` if it is a built-in fully connected model whose parameters() form
// a chain weight [out, in], bias [out], weight [out', out], ... of fp32 tensors ("logreg": one
// layer; "mlp": two or more, with a ReLU between consecutive ones, as common/model/model.cc
// builds them); empty otherwise. The name is what says where the ReLUs are: the shapes alone
// cannot.
std::vector<LinearLayer> linearChain(model::Model& model) {
  const std::string name = model.name();
  if (name != "logreg" && name != "mlp") return {};
  const std::vector<at::Tensor> params = model.parameters();
  if (params.empty() || params.size() % 2 != 0) return {};
  std::vector<LinearLayer> layers;
  for (size_t i = 0; i < params.size(); i += 2) {
    const at::Tensor& w = params[i];
    const at::Tensor& b = params[i + 1];
    if (w.dim() != 2 || b.dim() != 1 || b.size(0) != w.size(0)) return {};
    if (w.scalar_type() != at::kFloat || b.scalar_type() != at::kFloat) return {};
    if (!w.is_contiguous() || !b.is_contiguous()) return {};
    if (!layers.empty() && w.size(1) != layers.back().out) return {};
    layers.push_back({w, b, w.size(1), w.size(0)});
  }
  if ((name == "logreg") != (layers.size() == 1)) return {};
  return layers;
}

// The per-step gradient correction of FedProx and SCAFFOLD: e(w) = mu (w - x_t) + (c - c_k),
// over the flat parameters (x_t: the start of training), added to every gradient before weight
// decay and momentum (FedProx's term is part of the objective, so momentum sees it, as in the
// FedProx and NIID-Bench code). SCAFFOLD's c - c_k goes there only with plain SGD; with momentum
// or Adam it is applied to the weights after each step instead (TrainOptions::
// scaffoldAfterStep) and is not part of e. Built only when mu > 0 or SCAFFOLD is on: without
// either, training does no extra work.
class GradientCorrection {
 public:
  // x_t, c and c_k: start.size() values each (c and c_k: both or neither). `shift_in_gradient`:
  // c - c_k is part of e (plain SGD), else it is only kept for scaffoldShift().
  GradientCorrection(const std::vector<float>& start, float mu, const std::vector<float>* c,
                     const std::vector<float>* ck, bool shift_in_gradient = true)
      : x0_(start.data()), n_(start.size()), mu_(mu), shift_in_gradient_(shift_in_gradient) {
    if (c != nullptr) {
      c_minus_ck_.resize(start.size());
      for (size_t i = 0; i < start.size(); ++i) c_minus_ck_[i] = (*c)[i] - (*ck)[i];
    }
  }

  static bool needed(const TrainOptions& opts) { return opts.prox_mu != 0 || opts.usesScaffold(); }
  // Whether e(w) holds anything to add to a gradient.
  bool inGradient() const { return mu_ != 0 || (shift_in_gradient_ && !c_minus_ck_.empty()); }

  // g[i] += e(w)[offset + i] for i in [0, n), w being the parameter's values at flat `offset`.
  void add(float* g, const float* w, size_t offset, int64_t n) const {
    const float* x0 = x0_ + offset;
    const float mu = mu_;
    if (c_minus_ck_.empty() || !shift_in_gradient_) {
      if (mu == 0) return;
      for (int64_t i = 0; i < n; ++i) g[i] += mu * (w[i] - x0[i]);
      return;
    }
    const float* d = c_minus_ck_.data() + offset;
    if (mu == 0) {
      for (int64_t i = 0; i < n; ++i) g[i] += d[i];
    } else {
      for (int64_t i = 0; i < n; ++i) g[i] += mu * (w[i] - x0[i]) + d[i];
    }
  }

  // SCAFFOLD after the optimiser's step (scaffoldAfterStep): w[i] -= lr (c - c_k)[offset + i].
  void shiftAfterStep(float* w, size_t offset, int64_t n, float lr) const {
    if (shift_in_gradient_ || c_minus_ck_.empty()) return;
    const float* d = c_minus_ck_.data() + offset;
    for (int64_t i = 0; i < n; ++i) w[i] -= lr * d[i];
  }

  // w[i] += scale * e(w)[offset + i] for i in [0, n) (e from the values before the update).
  void step(float* w, size_t offset, int64_t n, float scale) const {
    const float* x0 = x0_ + offset;
    const float mu = mu_;
    const float* d =
        c_minus_ck_.empty() || !shift_in_gradient_ ? nullptr : c_minus_ck_.data() + offset;
    for (int64_t i = 0; i < n; ++i) {
      float e = mu * (w[i] - x0[i]);
      if (d != nullptr) e += d[i];
      w[i] += scale * e;
    }
  }

  size_t size() const { return n_; }
  // c - c_k over the flat parameters; empty without SCAFFOLD.
  const std::vector<float>& scaffoldShift() const { return c_minus_ck_; }
  bool shiftInGradient() const { return shift_in_gradient_; }

 private:
  const float* x0_;
  size_t n_;
  float mu_;
  bool shift_in_gradient_;
  std::vector<float> c_minus_ck_;
};

// SGD on a chain of Linear layers with a ReLU between consecutive ones, with hand-written
// gradients: the manual path of Trainer::train. One step on a batch of B samples:
//   forward   a_0 = x (flattened); a_l = relu(a_{l-1} W_l^T + b_l), no relu on the last layer,
//             whose output is the logits z
//   loss      l_i = -log_softmax(z_i)[y_i], the per-sample cross-entropy
//   backward  of the batch mean: g_L = (softmax(z) - onehot(y)) / B; dW_l = g_l^T a_{l-1};
//             db_l = column sums of g_l; g_{l-1} = (g_l W_l) masked where a_{l-1} <= 0 (ReLU)
//   update    torch::optim::SGD's (dampening 0, no Nesterov) on every parameter:
//             d = grad + weight_decay * w; buf = d on the first step, momentum * buf + d after;
//             w -= lr * buf (w -= lr * d without momentum), where grad is the gradient plus,
//             when asked, the correction e = prox_mu (w - x_t) + (c - c_k) (FedProx, SCAFFOLD)
// The matrix products are ATen out= calls into buffers allocated on first use for each batch
// size (a call sees at most two: the full one and a short last batch of a pass). A weight's
// gradient goes straight into what consumes it: without momentum and weight decay the update is
// itself one product, w += -lr g_l^T a_{l-1}; with momentum, buf = momentum buf + g_l^T a_{l-1}
// is; the correction e, which needs the weights before the step, is then added to buf (or to the
// gradient) first, or, in the plain case, applied as w -= lr e before the product. Everything
// else is plain loops over the fp32 storage. No autograd, no allocation of data per step; the
// same inputs give the same bits. The parameters are updated in place, so the model
// holds the trained weights afterwards. Not thread-safe.
class FullyConnectedSgd {
 public:
  // `correction`: the gradient correction of every step (see GradientCorrection), or null.
  FullyConnectedSgd(std::vector<LinearLayer> layers, const TrainOptions& opts,
                    const GradientCorrection* correction)
      : layers_(std::move(layers)),
        lr_(opts.lr),
        momentum_(opts.momentum),
        weight_decay_(opts.weight_decay),
        plain_(momentum_ == 0 && weight_decay_ == 0),
        correction_(correction) {
    size_t offset = 0;  // parameters() order is the flat layout's: w_0, b_0, w_1, b_1, ...
    for (const auto& layer : layers_) {
      weight_offset_.push_back(offset);
      offset += static_cast<size_t>(layer.weight.numel());
      bias_offset_.push_back(offset);
      offset += static_cast<size_t>(layer.bias.numel());
      weight_t_.push_back(layer.weight.t());
      if (momentum_ != 0) {
        weight_buf_.push_back(at::empty({layer.out, layer.in}, layer.weight.options()));
        bias_buf_.emplace_back(static_cast<size_t>(layer.out));
      } else if (!plain_) {
        weight_grad_.push_back(at::empty({layer.out, layer.in}, layer.weight.options()));
      }
      bias_grad_.emplace_back(static_cast<size_t>(layer.out));
    }
    FEDFLEET_CHECK_MSG(correction_ == nullptr || correction_->size() == offset,
                       "the gradient correction does not cover the layer chain's parameters");
  }

  // One step on x ([B, ...] fp32 on the CPU, in values per sample) and y ([B] int64): updates
  // the parameters and writes the B per-sample losses to losses[0, B). Throws c10::Error when a
  // sample does not hold in values or a label is outside [0, classes).
  void step(const at::Tensor& x, const at::Tensor& y, float* losses) {
    const int64_t rows = x.size(0);
    const int64_t in = layers_.front().in, classes = layers_.back().out;
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_cpu() && x.numel() == rows * in,
                "the model takes ", in, " fp32 inputs per sample, the batch is ", x.sizes());
    TORCH_CHECK(y.scalar_type() == at::kLong && y.numel() == rows, "labels ", y.sizes(),
                " for a batch of ", rows);
    BatchBuffers& buf = buffersFor(rows);
    const size_t n_layers = layers_.size();

    const at::Tensor input = x.reshape({rows, in});
    for (size_t l = 0; l < n_layers; ++l) {
      at::addmm_out(buf.act[l], layers_[l].bias, l == 0 ? input : buf.act[l - 1], weight_t_[l]);
      if (l + 1 < n_layers) {
        float* a = buf.act[l].data_ptr<float>();
        const int64_t n = buf.act[l].numel();
        for (int64_t i = 0; i < n; ++i) a[i] = a[i] > 0 ? a[i] : 0.0f;
      }
    }
    lossAndOutputGradient(buf.act[n_layers - 1].data_ptr<float>(), y.data_ptr<int64_t>(), rows,
                          classes, losses, buf.grad[n_layers - 1].data_ptr<float>());

    const bool first = steps_ == 0;
    for (size_t l = n_layers; l-- > 0;) {
      LinearLayer& layer = layers_[l];
      const at::Tensor& below = l == 0 ? input : buf.act[l - 1];
      if (l > 0) {  // the gradient below, with this layer's weights before their update
        at::mm_out(buf.grad[l - 1], buf.grad[l], layer.weight);
        float* gb = buf.grad[l - 1].data_ptr<float>();
        const float* a = buf.act[l - 1].data_ptr<float>();
        const int64_t n = buf.grad[l - 1].numel();
        for (int64_t i = 0; i < n; ++i) gb[i] = a[i] > 0 ? gb[i] : 0.0f;
      }
      // The weights' gradient is g_l^T a_{l-1}; it goes straight into what consumes it.
      float* w = layer.weight.data_ptr<float>();
      const int64_t w_n = layer.weight.numel();
      if (plain_) {  // w += -lr dW, one product into w (after w += -lr e, from the weights before)
        if (correction_ != nullptr) correction_->step(w, weight_offset_[l], w_n, -lr_);
        layer.weight.addmm_(buf.grad_t[l], below, /*beta=*/1, /*alpha=*/-lr_);
      } else if (momentum_ != 0) {  // buf = dW, then momentum buf + dW: one product into buf
        if (first) {
          at::mm_out(weight_buf_[l], buf.grad_t[l], below);
        } else {
          weight_buf_[l].addmm_(buf.grad_t[l], below, /*beta=*/momentum_, /*alpha=*/1);
        }
        float* wb = weight_buf_[l].data_ptr<float>();
        if (correction_ != nullptr) correction_->add(wb, w, weight_offset_[l], w_n);
        applyMomentumBuffer(w, wb, w_n);
        if (correction_ != nullptr) correction_->shiftAfterStep(w, weight_offset_[l], w_n, lr_);
      } else {
        at::mm_out(weight_grad_[l], buf.grad_t[l], below);
        float* wg = weight_grad_[l].data_ptr<float>();
        if (correction_ != nullptr) correction_->add(wg, w, weight_offset_[l], w_n);
        update(w, wg, nullptr, w_n, first);
      }
      const float* g = buf.grad[l].data_ptr<float>();
      std::vector<float>& db = bias_grad_[l];
      std::fill(db.begin(), db.end(), 0.0f);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t c = 0; c < layer.out; ++c) db[c] += g[i * layer.out + c];
      }
      if (correction_ != nullptr) {
        correction_->add(db.data(), layer.bias.data_ptr<float>(), bias_offset_[l], layer.out);
      }
      update(layer.bias.data_ptr<float>(), db.data(),
             momentum_ != 0 ? bias_buf_[l].data() : nullptr, layer.out, first);
      if (correction_ != nullptr) {
        correction_->shiftAfterStep(layer.bias.data_ptr<float>(), bias_offset_[l], layer.out, lr_);
      }
    }
    ++steps_;
  }

 private:
  // Activations and gradients of one batch size, and the views the products take.
  struct BatchBuffers {
    int64_t rows = 0;
    std::vector<at::Tensor> act;     // [rows, out_l]: a_l (the last one: the logits)
    std::vector<at::Tensor> grad;    // [rows, out_l]: the loss's gradient with respect to act
    std::vector<at::Tensor> grad_t;  // grad[l].t()
  };

  BatchBuffers& buffersFor(int64_t rows) {
    for (auto& b : buffers_) {
      if (b.rows == rows) return b;
    }
    BatchBuffers b;
    b.rows = rows;
    for (const auto& layer : layers_) {
      b.act.push_back(at::empty({rows, layer.out}, layer.weight.options()));
      b.grad.push_back(at::empty({rows, layer.out}, layer.weight.options()));
      b.grad_t.push_back(b.grad.back().t());
    }
    buffers_.push_back(std::move(b));
    return buffers_.back();
  }

  // From logits z [rows, classes]: losses[i] = -log_softmax(z_i)[y_i] (as ATen computes it:
  // z - max - log(sum exp(z - max))), and g = (softmax(z) - onehot(y)) / rows.
  static void lossAndOutputGradient(const float* z, const int64_t* y, int64_t rows, int64_t classes,
                                    float* losses, float* g) {
    const float inv_rows = 1.0f / static_cast<float>(rows);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t label = y[i];
      TORCH_CHECK(label >= 0 && label < classes, "label ", label, " outside [0, ", classes, ")");
      const float* zi = z + i * classes;
      float* gi = g + i * classes;
      const float max = *std::max_element(zi, zi + classes);
      float sum = 0;
      for (int64_t c = 0; c < classes; ++c) {
        gi[c] = std::exp(zi[c] - max);
        sum += gi[c];
      }
      losses[i] = -((zi[label] - max) - std::log(sum));
      const float inv_sum = 1.0f / sum;
      for (int64_t c = 0; c < classes; ++c) gi[c] = gi[c] * inv_sum * inv_rows;
      gi[label] -= inv_rows;
    }
  }

  // torch::optim::SGD's update of one parameter w[0, n) with gradient g, which it overwrites
  // (buf: the parameter's momentum buffer, null without momentum).
  void update(float* w, float* g, float* buf, int64_t n, bool first) const {
    const float neg_lr = -lr_, m = momentum_;
    if (weight_decay_ != 0) {
      const float wd = weight_decay_;
      for (int64_t i = 0; i < n; ++i) g[i] += wd * w[i];
    }
    if (buf == nullptr) {
      for (int64_t i = 0; i < n; ++i) w[i] += neg_lr * g[i];
    } else if (first) {
      std::copy_n(g, n, buf);
      for (int64_t i = 0; i < n; ++i) w[i] += neg_lr * buf[i];
    } else {
      for (int64_t i = 0; i < n; ++i) {
        buf[i] = m * buf[i] + g[i];
        w[i] += neg_lr * buf[i];
      }
    }
  }

  // With buf = momentum * buf + dW already formed: buf += weight_decay * w (completing
  // torch::optim::SGD's momentum * buf + (dW + weight_decay * w), in another order of rounding),
  // then w += -lr * buf.
  void applyMomentumBuffer(float* w, float* buf, int64_t n) const {
    const float neg_lr = -lr_, wd = weight_decay_;
    if (wd != 0) {
      for (int64_t i = 0; i < n; ++i) {
        buf[i] += wd * w[i];
        w[i] += neg_lr * buf[i];
      }
    } else {
      for (int64_t i = 0; i < n; ++i) w[i] += neg_lr * buf[i];
    }
  }

  std::vector<LinearLayer> layers_;
  float lr_, momentum_, weight_decay_;
  bool plain_;  // no momentum, no weight decay: the weights' update is w += -lr dW
  const GradientCorrection* correction_;             // null: none
  std::vector<size_t> weight_offset_, bias_offset_;  // each parameter's flat offset
  std::vector<at::Tensor> weight_t_;                 // layers_[l].weight.t()
  std::vector<at::Tensor> weight_grad_;  // [out, in]: only with weight decay and no momentum
  std::vector<std::vector<float>> bias_grad_;
  std::vector<at::Tensor> weight_buf_;        // momentum buffers [out, in]
  std::vector<std::vector<float>> bias_buf_;  // momentum buffers [out]
  std::vector<BatchBuffers> buffers_;         // at most two
  uint64_t steps_ = 0;
};

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
      // Dc_k = c_k_new - c_k = -c + (x_t - y) / (K lr) = -c - delta / (K lr); 0 when K = 0
      // (option II, with either placement of the correction: scaffoldAfterStep).
      // Buffers (after the parameters in the flat layout) get no gradient and no correction:
      // their control variates stay 0.
      const std::vector<float>& c = *opts.scaffold.c;
      result.control_delta.assign(result.delta.size(), 0.0f);
      size_t parameter_values = 0;
      for (const auto& p : params) parameter_values += static_cast<size_t>(p.numel());
      if (result.steps > 0) {
        const double inv = 1.0 / (static_cast<double>(result.steps) * opts.lr);
        for (size_t i = 0; i < parameter_values; ++i) {
          result.control_delta[i] = static_cast<float>(-static_cast<double>(c[i]) -
                                                       static_cast<double>(result.delta[i]) * inv);
        }
      }
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
  o.epochs = hp.epochs;
  o.max_steps = hp.max_steps;
  o.batch_size = hp.batch_size;
  o.lr = hp.lr;
  o.momentum = hp.momentum;
  o.weight_decay = hp.weight_decay;
  o.optimizer = hp.optimizer;
  o.seed = hp.seed;
  o.prox_mu = hp.prox_mu;
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
