#include "client/masked_upload.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/fednova.h"
#include "common/privacy/gaussian_noise.h"
#include "common/secagg/quantizer.h"

namespace fedfleet::client {

double secAggWeight(const wire::SecAggTask& task, uint64_t n_samples, uint64_t steps) {
  const double scale = task.weight_scale > 0 ? task.weight_scale : 1.0;
  const double w = std::min(1.0, static_cast<double>(n_samples) / scale);
  if (!task.fednova) return w;
  if (steps == 0) return 0.0;
  return w / fedNovaNormaliser(steps, task.fednova_momentum);
}

double maskedUploadWeight(const wire::SecAggTask& task, double session_weight, const float* delta,
                          size_t n) {
  if (!(task.dp_clip > 0)) return session_weight;
  double sq = 0;
  for (size_t i = 0; i < n; ++i) sq += static_cast<double>(delta[i]) * delta[i];
  const double norm = std::sqrt(sq);
  return norm > task.dp_clip ? task.dp_clip / norm : 1.0;
}

Status encodeMaskedChunk(const secagg::SecAggClient& masker, const wire::SecAggTask& task,
                         double weight, uint64_t seed, const ChunkRange& r, const float* x,
                         std::string* payload) {
  std::vector<float> weighted(r.elements);
  for (uint64_t i = 0; i < r.elements; ++i) {
    if (!std::isfinite(x[i])) {
      return invalidArgument("update value " + std::to_string(r.offset + i) + " is not finite");
    }
    weighted[i] = static_cast<float>(weight * x[i]);
  }
  if (task.dp_noise_stddev > 0) {
    privacy::GaussianStream noise(masker.privateStream(r.offset));
    noise.addTo(weighted.data(), weighted.size(), task.dp_noise_stddev);
  }
  std::vector<uint32_t> values(r.elements);
  crypto::KeyedStream rounding(crypto::streamKeyFromSeed("fedfleet secagg rounding", seed), 0,
                               r.offset);
  secagg::quantize({task.clip_range, task.quant_range}, weighted.data(), weighted.size(), rounding,
                   values.data());
  masker.mask(r.offset, values.data(), values.size());
  payload->resize(values.size() * sizeof(uint32_t));
  std::memcpy(payload->data(), values.data(), payload->size());  // little-endian hosts
  return Status::ok();
}

}  // namespace fedfleet::client
