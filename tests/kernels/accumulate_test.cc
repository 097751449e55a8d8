// The CPU kernels against naive loops: element-wise results must be the correctly rounded
// value (std::fmaf, x * s), sums must match a double loop.
#include "kernels/accumulate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace fedfleet::kernels {
namespace {

std::vector<float> randomFloats(size_t n, uint32_t seed, float lo = -4.0f, float hi = 4.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

// Distance in units in the last place between two finite floats of the same sign.
uint32_t ulpDistance(float a, float b) {
  const uint32_t x = bitsOf(a), y = bitsOf(b);
  return x > y ? x - y : y - x;
}

class AccumulateSizeTest : public ::testing::TestWithParam<size_t> {};

TEST_P(AccumulateSizeTest, WeightedAccumulateIsOneFmaPerElement) {
  const size_t n = GetParam();
  const float w = 0.3183099f;
  // One element of slack on each side, and a start that is not 32-byte aligned, to catch a
  // vector loop that writes past its range or assumes alignment.
  std::vector<float> acc_storage = randomFloats(n + 2, 1);
  const std::vector<float> x_storage = randomFloats(n + 2, 2);
  const std::vector<float> before = acc_storage;
  float* acc = acc_storage.data() + 1;
  const float* x = x_storage.data() + 1;

  weightedAccumulate(acc, x, w, n);

  size_t not_fma = 0, far_from_double = 0, first_bad = n;
  for (size_t i = 0; i < n; ++i) {
    const float a0 = before[i + 1];
    const float want = std::fma(w, x[i], a0);  // correctly rounded
    if (bitsOf(acc[i]) != bitsOf(want)) {
      ++not_fma;
      first_bad = std::min(first_bad, i);
    }
    // The naive double loop agrees to within one float ulp (it rounds twice: to double, then
    // to float).
    const float naive = static_cast<float>(static_cast<double>(a0) +
                                           static_cast<double>(w) * static_cast<double>(x[i]));
    if (ulpDistance(acc[i], naive) > 1 && std::signbit(acc[i]) == std::signbit(naive)) {
      ++far_from_double;
    }
  }
  EXPECT_EQ(not_fma, 0u) << "first mismatch at " << first_bad;
  EXPECT_EQ(far_from_double, 0u);
  EXPECT_EQ(bitsOf(acc_storage.front()), bitsOf(before.front())) << "wrote before the range";
  EXPECT_EQ(bitsOf(acc_storage.back()), bitsOf(before.back())) << "wrote past the range";
}

TEST_P(AccumulateSizeTest, ScaleIsOneMultiplyPerElement) {
  const size_t n = GetParam();
  std::vector<float> v = randomFloats(n + 1, 3);
  const std::vector<float> before = v;
  scale(v.data(), -1.7f, n);
  size_t mismatches = 0;
  for (size_t i = 0; i < n; ++i) mismatches += bitsOf(v[i]) != bitsOf(before[i] * -1.7f);
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(bitsOf(v[n]), bitsOf(before[n])) << "wrote past the range";
}

TEST_P(AccumulateSizeTest, SquaredNormMatchesDoubleLoop) {
  const size_t n = GetParam();
  const std::vector<float> v = randomFloats(n, 4);
  double naive = 0;
  for (float f : v) naive += static_cast<double>(f) * static_cast<double>(f);
  const double got = squaredNorm(v.data(), n);
  // Both sums add positive terms, so each is within (n-1) * 2^-53 relative of the exact sum;
  // in practice far closer. 1e-12 relative fails on a lost or doubled element.
  EXPECT_NEAR(got, naive, 1e-12 * naive) << "n = " << n;
  if (n == 0) {
    EXPECT_EQ(got, 0.0);
  }
}

TEST_P(AccumulateSizeTest, AllFiniteOnFiniteData) {
  const size_t n = GetParam();
  std::vector<float> v = randomFloats(n, 5, -1e30f, 1e30f);
  if (n > 0) v[0] = std::numeric_limits<float>::max();
  if (n > 1) v[1] = std::numeric_limits<float>::denorm_min();
  if (n > 2) v[2] = -std::numeric_limits<float>::max();
  if (n > 3) v[3] = -0.0f;
  EXPECT_TRUE(allFinite(v.data(), n));
}

INSTANTIATE_TEST_SUITE_P(Sizes, AccumulateSizeTest,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9},
                                           size_t{33}, size_t{4097}, size_t{1000003}));

TEST(Accumulate, WeightedAccumulateRoundsOnceUnderCancellation) {
  // acc = -round(w * x): a multiply-then-add gives exactly 0, an fma gives the rounding error
  // of w * x, which is what the contract (and the GPU) produce.
  const float w = 1.0f / 3.0f;
  std::vector<float> x(37, 3.0f);
  std::vector<float> acc(37, -(w * 3.0f));
  weightedAccumulate(acc.data(), x.data(), w, acc.size());
  const float want = std::fma(w, 3.0f, -(w * 3.0f));
  ASSERT_NE(want, 0.0f);
  for (float a : acc) EXPECT_EQ(bitsOf(a), bitsOf(want));
}

TEST(Accumulate, WeightedAccumulateInPlace) {
  std::vector<float> v = {1.0f, -2.0f, 0.5f, 8.0f, 3.0f, 1e-3f, -7.25f, 2.0f, 6.0f};
  const std::vector<float> before = v;
  weightedAccumulate(v.data(), v.data(), 0.5f, v.size());  // v += 0.5 v
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], std::fma(0.5f, before[i], before[i]));
}

TEST(Accumulate, NullPointersWithZeroLength) {
  weightedAccumulate(nullptr, nullptr, 1.0f, 0);
  scale(nullptr, 2.0f, 0);
  EXPECT_TRUE(allFinite(nullptr, 0));
  EXPECT_EQ(squaredNorm(nullptr, 0), 0.0);
}

TEST(Accumulate, AllFiniteFindsNanAndInfAtEveryPosition) {
  const float bad_values[] = {
      std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
      std::numeric_limits<float>::signaling_NaN(), std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity()};
  const size_t n = 37;  // vector body plus a scalar tail
  for (float bad : bad_values) {
    for (size_t pos = 0; pos < n; ++pos) {
      std::vector<float> v(n, 1.0f);
      v[pos] = bad;
      EXPECT_FALSE(allFinite(v.data(), n)) << "value " << bad << " at " << pos;
      EXPECT_TRUE(allFinite(v.data(), pos)) << "value " << bad << " just past the range";
    }
  }
}

TEST(Accumulate, AllFiniteFindsOneBadValueInALargeArray) {
  const size_t n = 1000003;
  std::vector<float> v = randomFloats(n, 6);
  for (size_t pos : {size_t{0}, size_t{4095}, size_t{4096}, size_t{500001}, n - 8, n - 1}) {
    const float saved = v[pos];
    v[pos] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_FALSE(allFinite(v.data(), n)) << "NaN at " << pos;
    v[pos] = std::numeric_limits<float>::infinity();
    EXPECT_FALSE(allFinite(v.data(), n)) << "Inf at " << pos;
    v[pos] = saved;
  }
  EXPECT_TRUE(allFinite(v.data(), n));
}

TEST(Accumulate, SquaredNormOfHandComputedVectors) {
  const float a[] = {3.0f, 4.0f};
  EXPECT_EQ(squaredNorm(a, 2), 25.0);
  const float b[] = {1, -2, 3, -4, 5, -6, 7, -8, 9};  // crosses the 8-lane body into the tail
  EXPECT_EQ(squaredNorm(b, 9), 285.0);
  const float c[] = {0.5f, 0.25f, -0.125f};
  EXPECT_EQ(squaredNorm(c, 3), 0.328125);
  // 2 * (2^70)^2 = 2^141: would overflow a float sum (max ~2^128), exact in double.
  const float d[] = {0x1p70f, -0x1p70f};
  EXPECT_EQ(squaredNorm(d, 2), 0x1p141);
  // The smallest subnormal float squared is 2^-298: representable in double, 0 in float.
  const float e[] = {std::numeric_limits<float>::denorm_min()};
  EXPECT_EQ(squaredNorm(e, 1), 0x1p-298);
  std::vector<float> ones(1000003, 1.0f);
  EXPECT_EQ(squaredNorm(ones.data(), ones.size()), 1000003.0);
}

TEST(Accumulate, SquaredNormPropagatesNanAndInf) {
  std::vector<float> v(20, 1.0f);
  v[13] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(squaredNorm(v.data(), v.size()), std::numeric_limits<double>::infinity());
  v[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(squaredNorm(v.data(), v.size())));
}

}  // namespace
}  // namespace fedfleet::kernels
