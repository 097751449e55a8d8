#include "common/fednova.h"

#include <cmath>

#include "common/check.h"

namespace fedfleet {

bool fedNovaMomentumValid(double momentum) {
  return std::isfinite(momentum) && momentum >= 0.0 && momentum < 1.0;
}

double fedNovaNormaliser(uint64_t tau, double momentum) {
  FEDFLEET_CHECK_MSG(fedNovaMomentumValid(momentum), "FedNova: client momentum must be in [0, 1)");
  const double t = static_cast<double>(tau);
  if (momentum == 0.0) return t;
  const double rho = momentum;
  return (t - rho * (1.0 - std::pow(rho, t)) / (1.0 - rho)) / (1.0 - rho);
}

}  // namespace fedfleet
