#include "common/model/batch.h"

#include <ATen/ATen.h>

#include <cstring>
#include <vector>

#include "common/check.h"

namespace fedfleet::model {

BatchBuilder::BatchBuilder(const data::Dataset& ds, const c10::Device& device,
                           PixelNormalization norm)
    : ds_(ds), device_(device), norm_(norm) {
  FEDFLEET_CHECK_MSG(!ds.hasFeatures() || ds.features.size() >= ds.size() * ds.feature_dim,
                     "feature data set holds fewer floats than size() * feature_dim");
  for (int v = 0; v < 256; ++v) lut_[v] = norm_.apply(static_cast<uint8_t>(v));
}

void BatchBuilder::reserve(size_t n) {
  if (n <= capacity_) return;
  const int64_t rows = ds_.rows, cols = ds_.cols, cap = static_cast<int64_t>(n);
  if (ds_.hasFeatures()) {
    x_host_ = at::empty({cap, static_cast<int64_t>(ds_.feature_dim)},
                        at::TensorOptions().dtype(at::kFloat));
  } else {
    const auto dtype = device_.is_cpu() ? at::kFloat : at::kByte;
    x_host_ = at::empty({cap, 1, rows, cols}, at::TensorOptions().dtype(dtype));
  }
  y_host_ = ds_.hasTargets() ? at::empty({cap, static_cast<int64_t>(ds_.target_dim)},
                                         at::TensorOptions().dtype(at::kFloat))
                             : at::empty({cap}, at::TensorOptions().dtype(at::kLong));
  capacity_ = n;
}

std::pair<at::Tensor, at::Tensor> BatchBuilder::build(const uint32_t* indices, size_t n) {
  FEDFLEET_CHECK_MSG(n > 0, "empty batch");
  reserve(n);
  const size_t ds_size = ds_.size();
  const auto len = static_cast<int64_t>(n);
  if (ds_.hasFeatures()) {
    const size_t dim = ds_.feature_dim, t_dim = ds_.target_dim;
    float* x = x_host_.data_ptr<float>();
    float* targets = t_dim > 0 ? y_host_.data_ptr<float>() : nullptr;
    int64_t* labels = t_dim > 0 ? nullptr : y_host_.data_ptr<int64_t>();
    for (size_t i = 0; i < n; ++i) {
      const uint32_t s = indices[i];
      FEDFLEET_CHECK_MSG(s < ds_size, "batch index out of range");
      std::memcpy(x + i * dim, ds_.feature(s), dim * sizeof(float));
      if (targets != nullptr) {
        std::memcpy(targets + i * t_dim, ds_.target(s), t_dim * sizeof(float));
      } else {
        labels[i] = ds_.labels[s];
      }
    }
    at::Tensor xs = x_host_.narrow(0, 0, len), ys = y_host_.narrow(0, 0, len);
    if (!ds_.sample_shape.empty()) {
      std::vector<int64_t> shape = {len};
      shape.insert(shape.end(), ds_.sample_shape.begin(), ds_.sample_shape.end());
      xs = xs.view(shape);
    }
    if (device_.is_cpu()) return {xs, ys};
    return {xs.to(device_), ys.to(device_)};
  }
  const size_t pixels = ds_.imageBytes();
  int64_t* y = y_host_.data_ptr<int64_t>();
  if (device_.is_cpu()) {
    float* x = x_host_.data_ptr<float>();
    for (size_t i = 0; i < n; ++i) {
      const uint32_t s = indices[i];
      FEDFLEET_CHECK_MSG(s < ds_size, "batch index out of range");
      const uint8_t* src = ds_.image(s);
      float* dst = x + i * pixels;
      for (size_t j = 0; j < pixels; ++j) dst[j] = lut_[src[j]];
      y[i] = ds_.labels[s];
    }
    return {x_host_.narrow(0, 0, len), y_host_.narrow(0, 0, len)};
  }
  uint8_t* x = x_host_.data_ptr<uint8_t>();
  for (size_t i = 0; i < n; ++i) {
    const uint32_t s = indices[i];
    FEDFLEET_CHECK_MSG(s < ds_size, "batch index out of range");
    std::memcpy(x + i * pixels, ds_.image(s), pixels);
    y[i] = ds_.labels[s];
  }
  at::Tensor xd = x_host_.narrow(0, 0, len).to(device_).to(at::kFloat);
  xd.mul_(norm_.scale).sub_(norm_.shift);
  return {xd, y_host_.narrow(0, 0, len).to(device_)};
}

std::pair<at::Tensor, at::Tensor> makeBatch(const data::Dataset& ds, const uint32_t* indices,
                                            size_t n, const c10::Device& device, float mean,
                                            float std) {
  try {
    // A fresh builder: its buffers become the returned tensors' own storage.
    BatchBuilder builder(ds, device, PixelNormalization::fromMeanStd(mean, std));
    return builder.build(indices, n);
  } catch (const std::exception&) {
    return {at::Tensor(), at::Tensor()};
  }
}

}  // namespace fedfleet::model
