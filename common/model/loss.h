// The training objective (train.loss) and the metrics computed beside it.
//
// A batch's target is what common/model/batch.h builds: int64 class labels [B] for a
// classification set, float targets [B, T] for a regression set. Each loss gives one value per
// sample, so that training logs per-sample losses and evaluation adds them over samples:
//   cross_entropy  logits [B, C] against labels (softmax cross-entropy)
//   mse            outputs against float targets, the squared error averaged over the T outputs
//   bce            logits against 0/1 labels (output [B] or [B, 1]) or against float targets in
//                  [0, 1] (output of the targets' shape): binary cross-entropy with logits,
//                  averaged over the outputs
//   module         the TorchScript module's own loss(output, target): a per-sample [B] tensor,
//                  or one number (the batch's mean, which every sample of the batch is given)
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/data/dataset.h"
#include "common/model/model.h"
#include "common/status.h"

namespace fedfleet::model {

using wire::lossName;
using wire::parseLoss;

// Whether `loss` can train on `ds`'s targets: cross_entropy needs class labels, mse float
// targets; bce takes either (labels only with two classes); module either. kInvalidArgument
// naming `data_name` and what to change otherwise.
Status checkLossFitsData(LossKind loss, const data::Dataset& ds, const std::string& data_name);

// Per-sample losses [B] (float) of `output` against `target`, differentiable. Throws c10::Error
// when the shapes do not fit (an output that is not [B, C] for cross-entropy, another number of
// outputs than targets) or `model` has no loss method for kModule.
at::Tensor perSampleLoss(LossKind loss, Model& model, const at::Tensor& output,
                         const at::Tensor& target);

// A custom metric's name: 1 to 64 of [A-Za-z0-9_.-], not one of the built-in loss, accuracy, mse,
// mae. A module may report at most kMaxCustomMetrics of them.
bool validMetricName(std::string_view name);
inline constexpr size_t kMaxCustomMetrics = 16;

// What an evaluation found: MetricSums' totals, and evaluate()'s result.
struct EvalResult {
  double loss = 0;  // mean per-sample loss (the model's loss())
  // Fraction predicted correctly: argmax of [n, C] logits against class labels; for bce, the
  // outputs whose sign matches the 0/1 target. None for a regression by mse.
  std::optional<double> accuracy;
  std::optional<double> mse, mae;  // float targets: mean squared and absolute error per output
  // The module's metrics(output, target): each its batch sums added up, over n.
  std::vector<std::pair<std::string, double>> custom;
  uint64_t n = 0;  // samples evaluated
};

// Running sums of the evaluation metrics over batches, on the device (read once, at the end).
class MetricSums {
 public:
  // `model` is asked for its custom metrics when it has a metrics(output, target) method.
  MetricSums(LossKind loss, Model& model);

  // Adds one batch (no-grad). Throws c10::Error as perSampleLoss does, or when the module's
  // metrics have names validMetricName refuses, are too many, or change between batches.
  void add(const at::Tensor& output, const at::Tensor& target);

  using Totals = EvalResult;
  // Reads the device once. Precondition: at least one add().
  Totals totals() const;

 private:
  LossKind loss_;
  Model& model_;
  bool custom_;
  at::Tensor loss_sum_, correct_, sq_sum_, abs_sum_;
  uint64_t elements_ = 0;  // the samples (labels) or target values the accuracy is over
  bool has_accuracy_ = false, regression_ = false;
  std::vector<std::string> custom_names_;
  std::vector<at::Tensor> custom_sums_;
  uint64_t n_ = 0;
};

}  // namespace fedfleet::model
