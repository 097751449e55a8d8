#include "common/model/evaluate.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "common/model/export.h"
#include "common/model/loss.h"

namespace fedfleet::model {
namespace {

// Puts a model in eval mode on a device for the life of the guard, then restores both.
class EvalScope {
 public:
  EvalScope(Model& model, const c10::Device& device)
      : model_(model), was_training_(model.isTraining()), old_device_(model.device()) {
    model_.train(false);
    if (old_device_ != device) model_.to(device);
  }
  ~EvalScope() {
    try {
      if (model_.device() != old_device_) model_.to(old_device_);
      model_.train(was_training_);
    } catch (...) {  // a destructor must not throw; the evaluation's own error is reported
    }
  }

 private:
  Model& model_;
  bool was_training_;
  c10::Device old_device_;
};

Result<EvalResult> evaluateSamples(Model& model, const data::Dataset& ds, const uint32_t* indices,
                                   size_t n, size_t batch_size, const c10::Device& device) {
  if (batch_size == 0) return invalidArgument("evaluate: batch_size must be > 0");
  if (n == 0) return invalidArgument("evaluate: no samples to evaluate");
  if (Status st = data::checkSampleStorage(ds); !st.isOk()) {
    return invalidArgument("evaluate: " + st.message());
  }
  try {
    EvalScope scope(model, device);
    c10::NoGradGuard no_grad;
    BatchBuilder builder(ds, device);
    MetricSums sums(model.loss(), model);
    for (size_t pos = 0; pos < n; pos += batch_size) {
      const size_t b = std::min(batch_size, n - pos);
      auto [x, y] = builder.build(indices + pos, b);
      sums.add(model.forward(x), y);
    }
    EvalResult r = sums.totals();
    r.n = n;
    return r;
  } catch (const c10::Error& e) {
    return internalError(std::string("evaluate: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internalError(std::string("evaluate: ") + e.what());
  }
}

}  // namespace

Status checkModelFitsData(Model& model, const data::Dataset& ds, const std::string& model_name,
                          const std::string& data_name, size_t batch_size) {
  if (ds.size() == 0) return Status::ok();
  if (Status st = data::checkSampleStorage(ds); !st.isOk()) {
    return invalidArgument(data_name + ": " + st.message());
  }
  FEDFLEET_RETURN_IF_ERROR(checkLossFitsData(model.loss(), ds, data_name));
  const size_t n = std::min(std::max<size_t>(batch_size, 1), ds.size());
  std::vector<uint32_t> indices(n);
  std::iota(indices.begin(), indices.end(), 0u);
  std::vector<int64_t> input_shape{static_cast<int64_t>(n)};
  for (int64_t d : inputShapeOf(ds).sample) input_shape.push_back(d);
  const std::string what = "model " + model_name + " and data " + data_name;
  const auto rejects = [&](const std::string& message) {
    return invalidArgument(what + " do not fit: the model rejects a batch of shape " +
                           shapeText(input_shape) + ": " + errorCause(message));
  };
  at::Tensor logits;
  try {
    const c10::Device device = model.device();
    EvalScope scope(model, device);
    c10::NoGradGuard no_grad;
    BatchBuilder builder(ds, device);
    auto [x, y] = builder.build(indices.data(), n);
    try {
      logits = model.forward(x);
    } catch (const c10::Error& e) {
      return rejects(e.what_without_backtrace());
    } catch (const std::exception& e) {  // the TorchScript interpreter throws runtime_error
      return rejects(e.what());
    }
  } catch (const c10::Error& e) {
    return internalError("start-up check of " + what + ": " + e.what_without_backtrace());
  }
  const std::vector<int64_t> out = logits.defined() ? logits.sizes().vec() : std::vector<int64_t>{};
  const auto badOutput = [&](const std::string& wanted) {
    return invalidArgument(what + " do not fit: a batch of shape " + shapeText(input_shape) +
                           " gives an output of shape " + shapeText(out) + ", not " + wanted);
  };
  const LossKind loss = model.loss();
  const auto rows = static_cast<int64_t>(n);
  if (loss == LossKind::kCrossEntropy) {
    if (!logits.defined() || logits.dim() != 2 || logits.size(0) != rows) {
      return badOutput("[" + std::to_string(n) + ", classes]");
    }
    const int64_t classes = logits.size(1);
    const data::Label top = *std::max_element(ds.labels.begin(), ds.labels.end());
    if (top >= classes) {
      return invalidArgument(what + " do not fit: the data has label " + std::to_string(top) +
                             " but the model has " + std::to_string(classes) +
                             " outputs (labels 0.." + std::to_string(classes - 1) +
                             "): give the model at least " + std::to_string(top + 1) +
                             " outputs, or check the labels");
    }
  } else if (loss != LossKind::kModule) {
    const int64_t per = ds.hasTargets() ? ds.target_dim : 1;
    if (!logits.defined() || logits.dim() < 1 || logits.size(0) != rows ||
        logits.numel() != rows * per) {
      return badOutput("[" + std::to_string(n) + ", " + std::to_string(per) + "] (" +
                       std::to_string(per) + " output(s) per sample for train.loss = \"" +
                       lossName(loss) + "\")");
    }
  }
  try {  // the loss (a module's own), the metrics and the module's metrics on this batch
    c10::NoGradGuard no_grad;
    BatchBuilder builder(ds, logits.device());
    auto [x, y] = builder.build(indices.data(), n);
    MetricSums sums(loss, model);
    sums.add(logits, y);
    (void)sums.totals();
  } catch (const c10::Error& e) {
    return invalidArgument(what + " do not fit: train.loss = \"" + std::string(lossName(loss)) +
                           "\" on the model's output " + shapeText(out) + ": " +
                           errorCause(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return invalidArgument(what + " do not fit: train.loss = \"" + std::string(lossName(loss)) +
                           "\" on the model's output " + shapeText(out) + ": " +
                           errorCause(e.what()));
  }
  return Status::ok();
}

std::vector<std::pair<std::string, double>> namedMetrics(const EvalResult& r) {
  std::vector<std::pair<std::string, double>> out;
  if (r.mse) out.emplace_back("mse", *r.mse);
  if (r.mae) out.emplace_back("mae", *r.mae);
  out.insert(out.end(), r.custom.begin(), r.custom.end());
  return out;
}

Result<EvalResult> evaluate(Model& model, const data::Dataset& ds, size_t limit, size_t batch_size,
                            const c10::Device& device) {
  const size_t n = limit == 0 ? ds.size() : std::min(limit, ds.size());
  std::vector<uint32_t> indices(n);
  std::iota(indices.begin(), indices.end(), 0u);
  return evaluateSamples(model, ds, indices.data(), n, batch_size, device);
}

Result<EvalResult> evaluateIndices(Model& model, const data::Dataset& ds,
                                   const std::vector<uint32_t>& indices, size_t batch_size,
                                   const c10::Device& device) {
  for (uint32_t i : indices) {
    if (i >= ds.size()) {
      return invalidArgument("evaluate: index " + std::to_string(i) + " outside the " +
                             std::to_string(ds.size()) + "-sample data set");
    }
  }
  return evaluateSamples(model, ds, indices.data(), indices.size(), batch_size, device);
}

}  // namespace fedfleet::model
