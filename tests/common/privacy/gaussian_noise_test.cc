// Gaussian noise from the keyed stream: its moments, its distribution (Kolmogorov-Smirnov
// against the normal CDF), its scale, and that the same key gives the same noise.
#include "common/privacy/gaussian_noise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace fedfleet::privacy {
namespace {

GaussianStream streamOf(uint64_t seed, uint64_t id = 0) {
  return GaussianStream(crypto::KeyedStream(crypto::streamKeyFromSeed("noise test", seed), id, 0));
}

TEST(GaussianNoise, DrawsHaveTheStandardNormalsMomentsAndDistribution) {
  constexpr int kN = 200000;
  GaussianStream g = streamOf(1);
  std::vector<double> x(kN);
  double sum = 0, sq = 0, fourth = 0;
  int within_one = 0;
  for (double& v : x) {
    v = g.next();
    sum += v;
    sq += v * v;
    fourth += v * v * v * v;
    within_one += std::abs(v) < 1;
  }
  const double mean = sum / kN;
  const double var = sq / kN - mean * mean;
  // Standard errors: mean 1/sqrt(n) = 0.0022, variance sqrt(2/n) = 0.0032, fourth moment
  // sqrt(96/n) = 0.022; five of them each.
  EXPECT_NEAR(mean, 0, 0.011);
  EXPECT_NEAR(var, 1, 0.016);
  EXPECT_NEAR(fourth / kN, 3, 0.11);
  EXPECT_NEAR(static_cast<double>(within_one) / kN, std::erf(1 / std::sqrt(2.0)), 0.005);
  // Kolmogorov-Smirnov: sqrt(n) D below 1.95 (the 0.001 critical value).
  std::sort(x.begin(), x.end());
  double d = 0;
  for (int i = 0; i < kN; ++i) {
    const double cdf = 0.5 * std::erfc(-x[i] / std::sqrt(2.0));
    d = std::max({d, cdf - static_cast<double>(i) / kN, static_cast<double>(i + 1) / kN - cdf});
  }
  EXPECT_LT(std::sqrt(static_cast<double>(kN)) * d, 1.95) << "D = " << d;
}

TEST(GaussianNoise, AddToScalesTheDrawsAndRepeatsUnderTheSameKey) {
  constexpr size_t kN = 100000;
  std::vector<float> a(kN, 1.0f), b(kN, 1.0f), c(kN, 1.0f);
  streamOf(2).addTo(a.data(), kN, 2.5);
  streamOf(2).addTo(b.data(), kN, 2.5);
  streamOf(2, 1).addTo(c.data(), kN, 2.5);
  EXPECT_EQ(a, b);
  double sum = 0, sq = 0, cross = 0;
  for (size_t i = 0; i < kN; ++i) {
    sum += a[i] - 1;
    sq += (a[i] - 1) * (a[i] - 1);
    cross += (a[i] - 1) * (c[i] - 1);
  }
  EXPECT_NEAR(sum / kN, 0, 5 * 2.5 / std::sqrt(kN));
  EXPECT_NEAR(std::sqrt(sq / kN), 2.5, 2.5 * 0.012);
  // Another stream id: uncorrelated (standard error of the correlation 1/sqrt(n) = 0.003).
  EXPECT_NEAR(cross / sq, 0, 0.016);
}

}  // namespace
}  // namespace fedfleet::privacy
