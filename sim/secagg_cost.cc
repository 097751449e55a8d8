#include "sim/secagg_cost.h"

namespace fedfleet::sim {

double secAggStepSeconds(const wire::SecAgg& m) {
  switch (m.step) {
    case wire::SecAggStep::kAdvert:
      return 2 * kX25519KeygenS;
    case wire::SecAggStep::kShares: {
      const double n = static_cast<double>(m.shares.size());
      return n * (2 * kX25519AgreeS + 2 * kHkdfS + kSealS) + 2 * (n + 1) * kShareS;
    }
    default:
      return 0;  // revealing is copying shares it holds
  }
}

double secAggOpenSeconds(size_t partners) {
  return static_cast<double>(partners) * (kX25519AgreeS + kHkdfS + kSealS);
}

double secAggMaskSeconds(size_t values, size_t partners) {
  return static_cast<double>(values) *
         (kQuantizeValueS + static_cast<double>(partners + 1) * kMaskValueS);
}

}  // namespace fedfleet::sim
