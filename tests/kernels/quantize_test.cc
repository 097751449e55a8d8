// QSGD and scaled-sign kernels: scales are exactly the documented reductions (the GPU must
// reproduce them, so the order of summation is part of the contract), levels stay within one
// quantisation step of the input, stochastic rounding is unbiased over seeds and reproducible
// for one seed, and the fused decode-and-fold equals decode then weightedAccumulate.
#include "kernels/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/accumulate.h"

namespace fedfleet::kernels {
namespace {

uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

std::vector<float> randomFloats(size_t n, uint32_t seed, float range = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, range);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// The documented bucket reduction, written independently: 32 lanes in double, lane j takes
// elements j, j + 32, ..., then lane j += lane j + h for h = 16, 8, 4, 2, 1.
double laneSum(const float* x, size_t len, bool squares) {
  double lanes[32] = {};
  for (size_t i = 0; i < len; ++i) {
    const double v = x[i];
    lanes[i % 32] += squares ? v * v : std::fabs(v);
  }
  for (int h = 16; h >= 1; h /= 2) {
    for (int j = 0; j < h; ++j) lanes[j] += lanes[j + h];
  }
  return lanes[0];
}

float scaleAt(const std::vector<unsigned char>& scales, size_t b) {
  float s;
  std::memcpy(&s, scales.data() + 4 * b, 4);
  return s;
}

int levelAt(const std::vector<unsigned char>& levels, size_t i, uint32_t bits) {
  if (bits == 8) return static_cast<signed char>(levels[i]);
  const unsigned char byte = levels[i / 2];
  const int nibble = (i % 2 == 0) ? (byte & 0xf) : (byte >> 4);
  return nibble >= 8 ? nibble - 16 : nibble;
}

struct Quantised {
  std::vector<unsigned char> scales, levels;
};

Quantised quantise(const std::vector<float>& x, uint32_t bits, uint32_t bucket, uint64_t seed) {
  Quantised q;
  q.scales.resize(4 * bucketCount(x.size(), bucket));
  q.levels.resize(qsgdLevelBytes(x.size(), bits));
  qsgdQuantize(x.data(), x.size(), bits, bucket, seed, q.scales.data(), q.levels.data());
  return q;
}

// (bits, bucket, n)
class QsgdTest : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t, size_t>> {};

TEST_P(QsgdTest, ScalesAreTheDocumentedNormsAndLevelsStayWithinOneStep) {
  const auto [bits, bucket, n] = GetParam();
  const std::vector<float> x = randomFloats(n, 11);
  const Quantised q = quantise(x, bits, bucket, 42);
  const int s = qsgdLevels(bits);
  std::vector<float> decoded(n);
  qsgdDequantize(q.scales.data(), q.levels.data(), n, bits, bucket, decoded.data());
  for (size_t b = 0; b * bucket < n; ++b) {
    const size_t start = b * bucket, len = std::min<size_t>(bucket, n - start);
    const float norm = static_cast<float>(std::sqrt(laneSum(x.data() + start, len, true)));
    const float scale = scaleAt(q.scales, b);
    ASSERT_EQ(bitsOf(scale), bitsOf(norm / static_cast<float>(s))) << "bucket " << b;
    for (size_t i = start; i < start + len; ++i) {
      const int l = levelAt(q.levels, i, bits);
      ASSERT_LE(std::abs(l), s);
      ASSERT_TRUE(l == 0 || (l < 0) == (x[i] < 0)) << i;
      ASSERT_EQ(bitsOf(decoded[i]), bitsOf(scale * static_cast<float>(l))) << i;
      // Within one level of the input (plus float rounding).
      ASSERT_LE(std::fabs(decoded[i] - x[i]), scale * 1.0001f) << i;
    }
  }
  if (bits == 4 && n % 2 == 1) {
    EXPECT_EQ(q.levels.back() >> 4, 0) << "padding nibble";
  }
}

TEST_P(QsgdTest, SameSeedSameBytesOtherSeedOtherBytes) {
  const auto [bits, bucket, n] = GetParam();
  const std::vector<float> x = randomFloats(n, 12);
  const Quantised a = quantise(x, bits, bucket, 7), b = quantise(x, bits, bucket, 7);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.levels, b.levels);
  if (n >= 64) {
    const Quantised c = quantise(x, bits, bucket, 8);
    EXPECT_EQ(a.scales, c.scales);  // scales do not depend on the seed
    EXPECT_NE(a.levels, c.levels);
  }
}

TEST_P(QsgdTest, FusedAccumulateEqualsDequantizeThenWeightedAccumulate) {
  const auto [bits, bucket, n] = GetParam();
  const std::vector<float> x = randomFloats(n, 13);
  const std::vector<float> acc0 = randomFloats(n, 14);
  const Quantised q = quantise(x, bits, bucket, 3);
  std::vector<float> fused = acc0, plain = acc0, dense(n);
  qsgdDequantizeAccumulate(fused.data(), q.scales.data(), q.levels.data(), n, bits, bucket, -0.7f);
  qsgdDequantize(q.scales.data(), q.levels.data(), n, bits, bucket, dense.data());
  weightedAccumulate(plain.data(), dense.data(), -0.7f, n);
  size_t mismatches = 0;
  for (size_t i = 0; i < n; ++i) mismatches += bitsOf(fused[i]) != bitsOf(plain[i]);
  EXPECT_EQ(mismatches, 0u);
}

INSTANTIATE_TEST_SUITE_P(Shapes, QsgdTest,
                         ::testing::Combine(::testing::Values(8u, 4u), ::testing::Values(8u, 512u),
                                            ::testing::Values(size_t{0}, size_t{1}, size_t{7},
                                                              size_t{512}, size_t{1025},
                                                              size_t{100003})));

TEST(Qsgd, UnbiasedOverSeeds) {
  // E[decoded] = x: the mean over many seeds converges to x at the rate the per-element
  // variance allows (at most scale^2 / 4 for one draw).
  for (uint32_t bits : {8u, 4u}) {
    const size_t n = 64;
    const std::vector<float> x = randomFloats(n, 21);
    const int seeds = 20000;
    std::vector<double> sum(n, 0.0);
    std::vector<float> decoded(n);
    float scale = 0;
    for (int s = 0; s < seeds; ++s) {
      const Quantised q = quantise(x, bits, 64, static_cast<uint64_t>(s));
      qsgdDequantize(q.scales.data(), q.levels.data(), n, bits, 64, decoded.data());
      for (size_t i = 0; i < n; ++i) sum[i] += decoded[i];
      scale = scaleAt(q.scales, 0);
    }
    // Five standard errors of the mean, with the worst-case variance scale^2 / 4.
    const double tolerance = 5.0 * (scale / 2.0) / std::sqrt(static_cast<double>(seeds));
    for (size_t i = 0; i < n; ++i) {
      EXPECT_NEAR(sum[i] / seeds, x[i], tolerance) << "bits " << bits << " element " << i;
    }
  }
}

TEST(Qsgd, ValuesOnALevelAreExactAndAZeroBucketIsZero) {
  // A bucket with one non-zero element: |v| s / ||v|| = s exactly, so that element gets level
  // -s for every seed, and the zeros stay 0.
  std::vector<float> x(8, 0.0f);
  x[0] = -2.5f;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const Quantised q = quantise(x, 8, 8, seed);
    EXPECT_EQ(levelAt(q.levels, 0, 8), -127);
    for (size_t i = 1; i < 8; ++i) EXPECT_EQ(levelAt(q.levels, i, 8), 0);
  }
  const std::vector<float> zeros(16, 0.0f);
  const Quantised z = quantise(zeros, 4, 8, 1);
  EXPECT_EQ(scaleAt(z.scales, 0), 0.0f);
  EXPECT_EQ(scaleAt(z.scales, 1), 0.0f);
  for (unsigned char c : z.levels) EXPECT_EQ(c, 0);
}

TEST(Qsgd, NonFiniteInputGivesANonFiniteScale) {
  std::vector<float> x = randomFloats(16, 22);
  x[3] = std::nanf("");
  const Quantised q = quantise(x, 8, 8, 1);
  EXPECT_TRUE(std::isnan(scaleAt(q.scales, 0)));
  EXPECT_TRUE(std::isfinite(scaleAt(q.scales, 1)));
  x[3] = INFINITY;
  EXPECT_FALSE(std::isfinite(scaleAt(quantise(x, 8, 8, 1).scales, 0)));
}

class SignTest : public ::testing::TestWithParam<std::tuple<uint32_t, size_t>> {};

TEST_P(SignTest, ScaleIsMeanAbsolutePerBucketAndBitsAreSigns) {
  const auto [bucket, n] = GetParam();
  std::vector<float> x = randomFloats(n, 31);
  if (n > 2) x[1] = 0.0f, x[2] = -0.0f;
  std::vector<unsigned char> scales(4 * bucketCount(n, bucket)), signs(signBytes(n));
  signQuantize(x.data(), n, bucket, scales.data(), signs.data());
  std::vector<float> decoded(n), acc = randomFloats(n, 32), plain = acc;
  signDequantize(scales.data(), signs.data(), n, bucket, decoded.data());
  signDequantizeAccumulate(acc.data(), scales.data(), signs.data(), n, bucket, 0.25f);
  weightedAccumulate(plain.data(), decoded.data(), 0.25f, n);
  for (size_t b = 0; b * bucket < n; ++b) {
    const size_t start = b * bucket, len = std::min<size_t>(bucket, n - start);
    const float want = static_cast<float>(laneSum(x.data() + start, len, false) / len);
    const float scale = scaleAt(scales, b);
    ASSERT_EQ(bitsOf(scale), bitsOf(want)) << "bucket " << b;
    for (size_t i = start; i < start + len; ++i) {
      const bool negative = (signs[i / 8] >> (i % 8)) & 1;
      ASSERT_EQ(negative, x[i] < 0.0f) << i;  // +-0 count as non-negative
      ASSERT_EQ(decoded[i], negative ? -scale : scale) << i;
      ASSERT_EQ(bitsOf(acc[i]), bitsOf(plain[i])) << i;
    }
  }
  if (n % 8 != 0) {
    EXPECT_EQ(signs.back() >> (n % 8), 0) << "padding bits";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SignTest,
                         ::testing::Combine(::testing::Values(8u, 512u),
                                            ::testing::Values(size_t{0}, size_t{1}, size_t{13},
                                                              size_t{512}, size_t{100003})));

}  // namespace
}  // namespace fedfleet::kernels
