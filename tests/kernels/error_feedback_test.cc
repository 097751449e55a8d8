// Error-feedback fuse kernels against element-wise references, for each residual storage.
#include "kernels/error_feedback.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/convert.h"

namespace fedfleet::kernels {
namespace {

uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

std::vector<float> randomFloats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

class ErrorFeedbackKernelTest : public ::testing::TestWithParam<size_t> {};

TEST_P(ErrorFeedbackKernelTest, Fp32IsOneAddAndOneSubtract) {
  const size_t n = GetParam();
  const std::vector<float> x = randomFloats(n, 1), r = randomFloats(n, 2), d = randomFloats(n, 3);
  std::vector<float> p(n), r2(n);
  addResidualFp32(p.data(), x.data(), r.data(), n);
  storeResidualFp32(r2.data(), p.data(), d.data(), n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(bitsOf(p[i]), bitsOf(x[i] + r[i])) << i;
    ASSERT_EQ(bitsOf(r2[i]), bitsOf(p[i] - d[i])) << i;
  }
}

TEST_P(ErrorFeedbackKernelTest, HalfStoragesRoundTheStoredResidualOnly) {
  const size_t n = GetParam();
  const std::vector<float> x = randomFloats(n, 4), p = randomFloats(n, 5), d = randomFloats(n, 6);
  std::vector<float> diff(n);
  for (size_t i = 0; i < n; ++i) diff[i] = p[i] - d[i];
  struct Case {
    void (*store)(uint16_t*, const float*, const float*, size_t);
    void (*add)(float*, const float*, const uint16_t*, size_t);
    void (*encode)(const float*, size_t, void*);
    void (*decode)(const void*, size_t, float*);
  };
  for (const Case& c : {Case{storeResidualBf16, addResidualBf16, floatToBf16, bf16ToFloat},
                        Case{storeResidualFp16, addResidualFp16, floatToFp16, fp16ToFloat}}) {
    std::vector<uint16_t> stored(n), want(n);
    c.store(stored.data(), p.data(), d.data(), n);
    c.encode(diff.data(), n, want.data());
    ASSERT_EQ(stored, want);
    std::vector<float> r(n), compensated(n);
    c.decode(stored.data(), n, r.data());
    c.add(compensated.data(), x.data(), stored.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(bitsOf(compensated[i]), bitsOf(x[i] + r[i])) << i;
  }
}

TEST_P(ErrorFeedbackKernelTest, InPlaceCompensation) {
  const size_t n = GetParam();
  std::vector<float> x = randomFloats(n, 7);
  const std::vector<float> before = x, r = randomFloats(n, 8);
  addResidualFp32(x.data(), x.data(), r.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(bitsOf(x[i]), bitsOf(before[i] + r[i]));
}

INSTANTIATE_TEST_SUITE_P(Sizes, ErrorFeedbackKernelTest,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{17}, size_t{65537}));

}  // namespace
}  // namespace fedfleet::kernels
