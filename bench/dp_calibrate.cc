// The noise multiplier z that spends exactly epsilon over `steps` rounds of sampling rate q at
// delta (RDP accountant, common/privacy/rdp_accountant.h), by bisection: epsilon falls as z
// grows. Usage: bench_dp_calibrate Q STEPS DELTA EPSILON. Prints z with 4 significant digits,
// rounded up (so the run spends at most epsilon).
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/privacy/rdp_accountant.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: bench_dp_calibrate Q STEPS DELTA EPSILON\n");
    return 2;
  }
  const double q = std::atof(argv[1]), delta = std::atof(argv[3]), target = std::atof(argv[4]);
  const uint64_t steps = std::strtoull(argv[2], nullptr, 10);
  auto eps = [&](double z) {
    auto r = fedfleet::privacy::epsilonOf(q, z, steps, delta);
    return r.isOk() ? r->epsilon : INFINITY;
  };
  double lo = 0.05, hi = 100;
  if (eps(hi) > target) {
    std::fprintf(stderr, "epsilon %g is out of reach below z = 100\n", target);
    return 1;
  }
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (eps(mid) > target ? lo : hi) = mid;
  }
  const double scale = std::pow(10.0, std::floor(std::log10(hi)) - 3);
  const double z = std::ceil(hi / scale) * scale;
  std::printf("%.6g %.6g\n", z, eps(z));
  return 0;
}
