#include "client/local_dp.h"

#include <cmath>

#include "common/privacy/gaussian_noise.h"

namespace fedfleet::client {

void applyLocalDp(const wire::LocalDpTask& dp, float* delta, size_t n, crypto::KeyedStream noise) {
  double sq = 0;
  for (size_t i = 0; i < n; ++i) sq += static_cast<double>(delta[i]) * delta[i];
  const double norm = std::sqrt(sq);
  if (norm > dp.clip) {
    const double scale = dp.clip / norm;
    for (size_t i = 0; i < n; ++i) delta[i] = static_cast<float>(delta[i] * scale);
  }
  privacy::GaussianStream gauss(std::move(noise));
  gauss.addTo(delta, n, dp.noise_multiplier * dp.clip);
}

}  // namespace fedfleet::client
