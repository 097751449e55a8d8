#include "engine/update_weights.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"
#include "kernels/accumulate.h"

namespace fedfleet::engine {

double stalenessWeight(uint64_t staleness) {
  return 1.0 / std::sqrt(1.0 + static_cast<double>(staleness));
}

double clipScale(double norm, double clip) {
  if (!(clip > 0.0)) return 1.0;
  if (!std::isfinite(norm)) return 0.0;
  if (norm <= clip) return 1.0;
  return clip / norm;
}

double l2Norm(const float* x, size_t n) { return std::sqrt(kernels::squaredNorm(x, n)); }

double lowerMedian(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const size_t m = (values.size() - 1) / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(m), values.end());
  return values[m];
}

uint64_t plannedSteps(uint32_t epochs, uint32_t max_steps, uint32_t batch_size, uint64_t samples) {
  if (max_steps > 0) return max_steps;
  const uint64_t b = std::max<uint32_t>(batch_size, 1);
  return uint64_t{epochs} * ((samples + b - 1) / b);
}

double FedNovaAccumulator::foldWeight(double n_k, double a_k) const {
  FEDFLEET_CHECK_MSG(n_k >= 0.0 && a_k > 0.0 && std::isfinite(n_k) && std::isfinite(a_k),
                     "FedNova: an update needs n_k >= 0 and a normaliser a_k > 0");
  return n_k / a_k;
}

void FedNovaAccumulator::add(double n_k, double a_k) {
  FEDFLEET_CHECK_MSG(n_k >= 0.0 && a_k > 0.0 && std::isfinite(n_k) && std::isfinite(a_k),
                     "FedNova: an update needs n_k >= 0 and a normaliser a_k > 0");
  sum_n_ += n_k;
  sum_na_ += n_k * a_k;
  ++count_;
}

double FedNovaAccumulator::effectiveSteps() const { return sum_n_ > 0.0 ? sum_na_ / sum_n_ : 0.0; }

double FedNovaAccumulator::finalScale() const {
  return sum_n_ > 0.0 ? effectiveSteps() / sum_n_ : 0.0;
}

}  // namespace fedfleet::engine
