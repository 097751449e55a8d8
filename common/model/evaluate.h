// Evaluation: mean loss (the model's train.loss) and metrics of a model on (part of) a data set.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/data/dataset.h"
#include "common/model/batch.h"
#include "common/model/loss.h"
#include "common/model/model.h"
#include "common/status.h"

namespace fedfleet::model {

// The metrics of `r` beside loss and accuracy, by name: "mse" and "mae" when set, then r.custom.
std::vector<std::pair<std::string, double>> namedMetrics(const EvalResult& r);

// Evaluates `model` on the first `limit` samples of `ds` (0 = all) in batches of `batch_size`,
// in eval mode under a no-grad guard, with batches on `device`. If the model's parameters live
// on another device it is moved to `device` for the evaluation and back afterwards. Restores the
// previous train/eval mode. Reads the device once at the end (no per-batch sync).
// Works on image and feature-vector data sets alike (batches as common/model/batch.h builds them).
// Failures: batch_size == 0, no samples, or sample storage that does not match the labels
// (data::checkSampleStorage) -> kInvalidArgument; LibTorch failure (wrong input shape for the
// model, out of memory) -> kInternal with LibTorch's message.
Result<EvalResult> evaluate(Model& model, const data::Dataset& ds, size_t limit = 0,
                            size_t batch_size = 1000, const c10::Device& device = c10::kCPU);

// As evaluate(), over the samples `indices` of `ds` (each must be < ds.size(), else
// kInvalidArgument).
Result<EvalResult> evaluateIndices(Model& model, const data::Dataset& ds,
                                   const std::vector<uint32_t>& indices, size_t batch_size = 1000,
                                   const c10::Device& device = c10::kCPU);

// The start-up check: one batch (the first min(batch_size, size) samples) of `ds` goes through
// `model` in eval mode under a no-grad guard, on the model's device (weights, buffers and mode
// unchanged afterwards), before any round trains. OK when the model's loss fits the data's
// targets (checkLossFitsData), the model takes the input and returns what its loss needs
// (cross-entropy: logits [n, C] with every label of `ds`, all of them scanned, below C; mse and
// bce: one output per target), and the loss and the module's metrics run on the batch. Otherwise
// kInvalidArgument naming `model_name`, `data_name` and the shapes: the input shape the model
// rejected (with the first line of LibTorch's message), an output of another shape, the largest
// label and the model's C, or the loss's error. An empty `ds` passes (nothing to check).
Status checkModelFitsData(Model& model, const data::Dataset& ds, const std::string& model_name,
                          const std::string& data_name, size_t batch_size = 8);

}  // namespace fedfleet::model
