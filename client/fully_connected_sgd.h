// Local training's hand-written paths, for client/trainer.cc alone: the per-step gradient
// correction of FedProx and SCAFFOLD (GradientCorrection, used by every path), and SGD with
// hand-written gradients on the built-in fully connected models (FullyConnectedSgd over
// linearChain's layers), the manual path of Trainer::train. Header-only so that trainer.cc
// compiles them into its own unit, as before they moved here.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "client/trainer.h"
#include "common/check.h"
#include "common/model/model.h"

namespace fedfleet::client::internal {

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
inline std::vector<LinearLayer> linearChain(model::Model& model) {
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

}  // namespace fedfleet::client::internal
