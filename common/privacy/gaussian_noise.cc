#include "common/privacy/gaussian_noise.h"

#include <cmath>
#include <numbers>

namespace fedfleet::privacy {

double GaussianStream::next() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double u1 = stream_.nextOpenUnit();
  const double u2 = stream_.nextOpenUnit();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * std::numbers::pi * u2;
  spare_ = r * std::sin(angle);
  has_spare_ = true;
  return r * std::cos(angle);
}

void GaussianStream::addTo(float* values, size_t n, double stddev) {
  for (size_t i = 0; i < n; ++i) {
    values[i] = static_cast<float>(values[i] + stddev * next());
  }
}

}  // namespace fedfleet::privacy
