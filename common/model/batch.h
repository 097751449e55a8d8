// Batches: samples of a Dataset turned into tensors.
//
// Images: the gather is one pass: on the CPU each pixel byte goes straight through a 256-entry
// lookup table into the float batch; for another device the bytes are gathered into one
// contiguous uint8 block, copied over, and converted there (a quarter of the bytes on the bus).
// Every path computes float(v) * scale - shift with scale = 1 / (255 std) and shift = mean / std,
// so all of them produce the same bits.
// Feature vectors (ds.hasFeatures()): the rows are copied as they are (no normalisation) into a
// float [n, feature_dim] block, which for another device is then copied over.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "common/data/dataset.h"

namespace fedfleet::model {

// Fashion-MNIST pixel statistics over the training set, for (x / 255 - mean) / std.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// The normalisation every batch path applies to a pixel byte v: float(v) * scale - shift.
struct PixelNormalization {
  float scale = 1.0f / (255.0f * kFashionMnistStd);
  float shift = kFashionMnistMean / kFashionMnistStd;

  static PixelNormalization fromMeanStd(float mean, float std) {
    return {1.0f / (255.0f * std), mean / std};
  }
  float apply(uint8_t v) const { return static_cast<float>(v) * scale - shift; }
};

// Gathers samples indices[0..n) of `ds` into a float tensor, [n, 1, rows, cols] normalised with
// (mean, std) for images or [n, feature_dim] as stored for feature vectors (mean and std unused),
// and the targets: int64 labels [n], or for a regression set float [n, target_dim], both on
// `device` and owning their memory.
// Preconditions (checked, abort): every index < ds.size(), n > 0, and a feature-vector set holds
// size() * feature_dim floats. On a LibTorch failure (out of device memory, say) returns a pair
// of undefined tensors; test with .defined().
std::pair<at::Tensor, at::Tensor> makeBatch(const data::Dataset& ds, const uint32_t* indices,
                                            size_t n, const c10::Device& device,
                                            float mean = kFashionMnistMean,
                                            float std = kFashionMnistStd);

// Builds batch after batch from one data set, reusing its buffers: no allocation per batch on
// the CPU. `ds` must outlive the builder. Not thread-safe.
class BatchBuilder {
 public:
  // `norm` applies to image data sets only. Precondition (checked, abort): a feature-vector set
  // holds size() * feature_dim floats.
  BatchBuilder(const data::Dataset& ds, const c10::Device& device,
               PixelNormalization norm = PixelNormalization());

  // As makeBatch, but the returned tensors may share the builder's buffers: they stay valid
  // until the next build() call (clone() to keep them). May throw c10::Error.
  // Preconditions (checked, abort): every index < ds.size(), n > 0.
  std::pair<at::Tensor, at::Tensor> build(const uint32_t* indices, size_t n);

 private:
  void reserve(size_t n);

  const data::Dataset& ds_;
  c10::Device device_;
  PixelNormalization norm_;
  std::array<float, 256> lut_{};
  size_t capacity_ = 0;
  at::Tensor x_host_;  // images: float [capacity, 1, rows, cols] on the CPU device, else uint8;
                       // feature vectors: float [capacity, feature_dim]
  at::Tensor y_host_;  // int64 [capacity], or float [capacity, target_dim]
};

}  // namespace fedfleet::model
