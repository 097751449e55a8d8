#include "common/model/tensor_data.h"

#include <torch/serialize.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/atomic_file.h"

namespace fedfleet::model {
namespace {

std::string shapeText(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

constexpr const char* kHowToWrite =
    "; write it in Python with torch.save({\"x\": X, \"y\": Y}, path), X of shape "
    "[samples, ...] and Y of shape [samples] holding integer class ids (or float targets, "
    "[samples] or [samples, outputs], for regression)";

}  // namespace

Result<data::Dataset> loadTensorFile(const std::string& path, size_t limit) {
  FEDFLEET_ASSIGN_OR_RETURN(std::string bytes, readWholeFile(path));
  at::Tensor x, y;
  try {
    const c10::IValue v = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
    if (!v.isGenericDict()) {
      return corrupt(path + " holds a " + v.tagKind() + ", not a dictionary" + kHowToWrite);
    }
    for (const auto& entry : v.toGenericDict()) {
      if (!entry.key().isString()) continue;
      const std::string& key = entry.key().toStringRef();
      if (key != "x" && key != "y") continue;
      if (!entry.value().isTensor()) {
        return corrupt(path + ": \"" + key + "\" is a " + entry.value().tagKind() +
                       ", not a tensor" + kHowToWrite);
      }
      (key == "x" ? x : y) = entry.value().toTensor();
    }
  } catch (const c10::Error& e) {
    return corrupt(path + " is not a readable torch.save file (truncated or damaged?): " +
                   e.what_without_backtrace() + kHowToWrite);
  }
  if (!x.defined() || !y.defined()) {
    return corrupt(path + " has no \"" + std::string(x.defined() ? "y" : "x") + "\" tensor" +
                   kHowToWrite);
  }
  if (x.dim() < 2 || x.size(0) == 0) {
    return corrupt(path + ": \"x\" has shape " + shapeText(x) +
                   "; it needs a first dimension of samples (at least one) and a sample shape");
  }
  const bool regression = at::isFloatingType(y.scalar_type());
  if (!(y.dim() == 1 || (regression && y.dim() == 2 && y.size(1) > 0)) || y.size(0) != x.size(0)) {
    return corrupt(path + ": \"y\" has shape " + shapeText(y) + " for " +
                   std::to_string(x.size(0)) + " samples in \"x\"; it must be [" +
                   std::to_string(x.size(0)) + "]" +
                   (regression ? " or [" + std::to_string(x.size(0)) + ", outputs]" : ""));
  }
  if (at::isComplexType(y.scalar_type()) || y.scalar_type() == at::kBool) {
    return corrupt(path + ": \"y\" is of type " + std::string(c10::toString(y.scalar_type())) +
                   "; class ids must be integers (y.long() in Python), regression targets "
                   "floats");
  }
  if (at::isComplexType(x.scalar_type())) {
    return corrupt(path + ": \"x\" is complex; samples must be real numbers");
  }
  int64_t n = x.size(0);
  if (limit > 0 && static_cast<int64_t>(limit) < n) n = static_cast<int64_t>(limit);
  const at::Tensor xs = x.narrow(0, 0, n).to(at::kFloat).contiguous();
  const at::Tensor ys = y.narrow(0, 0, n).to(regression ? at::kFloat : at::kLong).contiguous();

  data::Dataset ds;
  for (int64_t d = 1; d < xs.dim(); ++d) {
    if (xs.size(d) == 0 || xs.size(d) > UINT32_MAX) {
      return corrupt(path + ": \"x\" has shape " + shapeText(x) + ", a sample dimension of 0");
    }
    ds.sample_shape.push_back(static_cast<uint32_t>(xs.size(d)));
  }
  const int64_t dim = xs.numel() / n;
  if (dim > UINT32_MAX) return corrupt(path + ": a sample of \"x\" has more than 2^32 values");
  ds.feature_dim = static_cast<uint32_t>(dim);
  const float* xp = xs.data_ptr<float>();
  int64_t largest = 0;
  if (regression) {
    ds.target_dim = y.dim() == 2 ? static_cast<uint32_t>(y.size(1)) : 1;
    const float* tp = ys.data_ptr<float>();
    ds.targets.assign(tp, tp + ys.numel());
    for (size_t k = 0; k < ds.targets.size(); ++k) {
      if (!std::isfinite(ds.targets[k])) {
        return corrupt(path + ": sample " + std::to_string(k / ds.target_dim) +
                       " of \"y\" holds a target that is not finite");
      }
    }
  } else {
    const int64_t* yp = ys.data_ptr<int64_t>();
    ds.labels.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      if (yp[i] < 0 || yp[i] >= data::kMaxClasses) {
        return corrupt(path + ": sample " + std::to_string(i) + " has label " +
                       std::to_string(yp[i]) + "; class ids must be 0 to " +
                       std::to_string(data::kMaxClasses - 1));
      }
      ds.labels[static_cast<size_t>(i)] = yp[i];
      largest = std::max(largest, yp[i]);
    }
  }
  const size_t values = static_cast<size_t>(n) * static_cast<size_t>(dim);
  for (size_t k = 0; k < values; ++k) {
    if (!std::isfinite(xp[k])) {
      return corrupt(path + ": sample " + std::to_string(k / static_cast<size_t>(dim)) +
                     " of \"x\" holds a value that is not finite (" + std::to_string(xp[k]) + ")");
    }
  }
  ds.features.assign(xp, xp + values);
  ds.num_classes = regression ? 0 : static_cast<uint32_t>(std::max<int64_t>(2, largest + 1));
  return ds;
}

}  // namespace fedfleet::model
