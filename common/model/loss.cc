#include "common/model/loss.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

namespace fedfleet::model {
namespace {

// `output` as [B, k] for `rows` samples; throws unless it holds `outputs` values per sample.
at::Tensor outputsPerSample(const at::Tensor& output, int64_t rows, int64_t outputs,
                            const char* loss) {
  TORCH_CHECK(output.dim() >= 1 && output.size(0) == rows && output.numel() == rows * outputs, loss,
              ": the model's output ", output.sizes(), " does not hold ", outputs,
              " value(s) for each of the batch's ", rows, " samples");
  return output.reshape({rows, outputs});
}

bool isLabels(const at::Tensor& target) { return target.scalar_type() == at::kLong; }

}  // namespace

bool validMetricName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return name != "loss" && name != "accuracy" && name != "mse" && name != "mae";
}

Status checkLossFitsData(LossKind loss, const data::Dataset& ds, const std::string& data_name) {
  if (ds.size() == 0) return Status::ok();
  if (loss == LossKind::kCrossEntropy && ds.hasTargets()) {
    return invalidArgument("train.loss = \"cross_entropy\" needs class labels, but " + data_name +
                           " holds float targets (data.task = \"regression\"): use train.loss "
                           "= \"mse\" (or \"bce\" for targets in [0, 1])");
  }
  if (loss == LossKind::kMse && !ds.hasTargets()) {
    return invalidArgument("train.loss = \"mse\" needs float targets, but " + data_name +
                           " holds class labels: set data.task = \"regression\" (csv, tensors "
                           "with a float \"y\") or use train.loss = \"cross_entropy\"");
  }
  if (loss == LossKind::kBce) {
    if (ds.hasTargets()) {
      for (size_t i = 0; i < ds.targets.size(); ++i) {
        const float t = ds.targets[i];
        if (!(t >= 0.0f && t <= 1.0f)) {
          return invalidArgument("train.loss = \"bce\" needs targets in [0, 1], but sample " +
                                 std::to_string(i / ds.target_dim) + " of " + data_name + " has " +
                                 std::to_string(t));
        }
      }
    } else if (ds.num_classes != 2) {
      return invalidArgument(
          "train.loss = \"bce\" on class labels needs two classes (0 and 1), "
          "but " +
          data_name + " has " + std::to_string(ds.num_classes) +
          ": use train.loss = \"cross_entropy\"");
    }
  }
  return Status::ok();
}

at::Tensor perSampleLoss(LossKind loss, Model& model, const at::Tensor& output,
                         const at::Tensor& target) {
  const int64_t rows = target.size(0);
  switch (loss) {
    case LossKind::kCrossEntropy:
      TORCH_CHECK(isLabels(target),
                  "cross_entropy needs class labels, the batch has float "
                  "targets");
      TORCH_CHECK(output.dim() == 2 && output.size(0) == rows, "cross_entropy: the model's output ",
                  output.sizes(), " is not [batch, classes] for a batch of ", rows);
      return at::cross_entropy_loss(output, target, {}, at::Reduction::None);
    case LossKind::kMse: {
      TORCH_CHECK(!isLabels(target), "mse needs float targets, the batch has class labels");
      const at::Tensor o = outputsPerSample(output, rows, target.size(1), "mse");
      return (o - target).square().mean(1);
    }
    case LossKind::kBce: {
      const bool labels = isLabels(target);
      const at::Tensor o = outputsPerSample(output, rows, labels ? 1 : target.size(1), "bce");
      const at::Tensor t = labels ? target.to(o.scalar_type()).reshape({rows, 1}) : target;
      return at::binary_cross_entropy_with_logits(o, t, {}, {}, at::Reduction::None).mean(1);
    }
    case LossKind::kModule: {
      const at::Tensor v = model.callLoss(output, target);
      TORCH_CHECK(v.is_floating_point(), "the module's loss(output, target) returned ",
                  v.scalar_type(), " values, not floats");
      if (v.numel() == 1) return v.reshape({}).expand({rows});
      TORCH_CHECK(v.numel() == rows, "the module's loss(output, target) returned ", v.sizes(),
                  ": one value (the batch's mean) or one per sample [", rows, "]");
      return v.reshape({rows});
    }
  }
  TORCH_CHECK(false, "unknown loss");
  return {};
}

MetricSums::MetricSums(LossKind loss, Model& model)
    : loss_(loss), model_(model), custom_(model.hasMethod("metrics")) {}

void MetricSums::add(const at::Tensor& output, const at::Tensor& target) {
  torch::NoGradGuard no_grad;
  const int64_t rows = target.size(0);
  const auto dbl = [](const at::Tensor& t) { return t.to(at::kDouble); };
  const auto acc = [](at::Tensor& sum, const at::Tensor& v) { sum = sum.defined() ? sum + v : v; };
  if (loss_ == LossKind::kCrossEntropy) {
    // LibTorch's own sum (the figures every earlier history recorded, to the bit).
    TORCH_CHECK(isLabels(target) && output.dim() == 2 && output.size(0) == rows,
                "cross_entropy: the model's output ", output.sizes(),
                " is not [batch, classes] for a batch of ", rows, " class labels");
    acc(loss_sum_, dbl(at::cross_entropy_loss(output, target, {}, at::Reduction::Sum)));
  } else {
    acc(loss_sum_, dbl(perSampleLoss(loss_, model_, output, target).sum()));
  }
  if (isLabels(target)) {
    if (loss_ == LossKind::kBce) {
      const at::Tensor o = outputsPerSample(output, rows, 1, "bce").reshape({rows});
      acc(correct_, o.gt(0).eq(target.to(at::kBool)).sum());
      has_accuracy_ = true;
    } else if (output.dim() == 2 && output.size(0) == rows && output.size(1) >= 2) {
      acc(correct_, output.argmax(1).eq(target).sum());
      has_accuracy_ = true;
    }
    elements_ += static_cast<uint64_t>(rows);
  } else if (output.numel() == target.numel() && output.size(0) == rows) {
    const at::Tensor o = output.reshape(target.sizes());
    const at::Tensor err = o - target;
    acc(sq_sum_, dbl(err.square().sum()));
    acc(abs_sum_, dbl(err.abs().sum()));
    if (loss_ == LossKind::kBce) {
      acc(correct_, o.gt(0).eq(target.ge(0.5)).sum());
      has_accuracy_ = true;
    }
    elements_ += static_cast<uint64_t>(target.numel());
    regression_ = true;
  }
  if (custom_) {
    auto metrics = model_.callMetrics(output, target);
    if (custom_names_.empty() && custom_sums_.empty()) {
      TORCH_CHECK(metrics.size() <= kMaxCustomMetrics,
                  "the module's metrics(output, target) "
                  "returned ",
                  metrics.size(), " metrics; at most ", kMaxCustomMetrics);
      for (auto& [name, value] : metrics) {
        TORCH_CHECK(validMetricName(name), "the module's metric '", name,
                    "' needs another name: 1 to 64 letters, digits, '_', '.' or '-', and not "
                    "loss, accuracy, mse or mae");
        custom_names_.push_back(name);
        custom_sums_.push_back(dbl(value));
      }
    } else {
      TORCH_CHECK(metrics.size() == custom_names_.size(),
                  "the module's metrics(output, target) returned other names than for the "
                  "first batch");
      for (size_t i = 0; i < metrics.size(); ++i) {
        TORCH_CHECK(metrics[i].first == custom_names_[i], "the module's metrics returned '",
                    metrics[i].first, "' where the first batch had '", custom_names_[i], "'");
        custom_sums_[i] = custom_sums_[i] + dbl(metrics[i].second);
      }
    }
  }
  n_ += static_cast<uint64_t>(rows);
}

MetricSums::Totals MetricSums::totals() const {
  Totals t;
  t.n = n_;
  if (n_ == 0) return t;
  const double n = static_cast<double>(n_);
  t.loss = loss_sum_.item<double>() / n;
  const auto elements = static_cast<double>(elements_);
  if (has_accuracy_ && elements > 0)
    t.accuracy = correct_.to(at::kDouble).item<double>() / elements;
  if (regression_ && elements > 0) {
    t.mse = sq_sum_.item<double>() / elements;
    t.mae = abs_sum_.item<double>() / elements;
  }
  for (size_t i = 0; i < custom_names_.size(); ++i) {
    t.custom.emplace_back(custom_names_[i], custom_sums_[i].item<double>() / n);
  }
  return t;
}

}  // namespace fedfleet::model
