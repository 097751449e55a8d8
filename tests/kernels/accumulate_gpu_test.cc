// The CUDA weightedAccumulate against the CPU reference. Both compute one fma per element
// (single rounding), so the test demands bit-for-bit equality, not a tolerance.
// Skipped, with the reason, on a machine without a CUDA device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/accumulate.h"
#include "kernels/accumulate_cuda.h"

namespace fedfleet::kernels {
namespace {

uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

class GpuAccumulateTest : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    if (!cuda::deviceAvailable()) GTEST_SKIP() << "no CUDA device visible to the CUDA runtime";
  }
};

TEST_P(GpuAccumulateTest, MatchesCpuReferenceBitForBit) {
  const size_t n = GetParam();
  std::mt19937 gen(static_cast<uint32_t>(n) + 11);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<float> x(n), acc(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = dist(gen);
    // Every fourth element cancels: the fma result is then the product's rounding error,
    // which a multiply-then-add would lose.
    acc[i] = (i % 4 == 0) ? -(0.3183099f * x[i]) : dist(gen);
  }
  std::vector<float> cpu = acc;
  weightedAccumulate(cpu.data(), x.data(), 0.3183099f, n);

  std::vector<float> gpu = acc;
  std::string error;
  ASSERT_TRUE(cuda::weightedAccumulateHost(gpu.data(), x.data(), 0.3183099f, n, &error)) << error;

  size_t mismatches = 0, first = n;
  for (size_t i = 0; i < n; ++i) {
    if (bitsOf(gpu[i]) != bitsOf(cpu[i])) {
      ++mismatches;
      if (first == n) first = i;
    }
  }
  EXPECT_EQ(mismatches, 0u) << "first at " << first << ": gpu " << gpu[first] << " cpu "
                            << cpu[first];
}

// 3000017 is past one grid's worth of threads (4096 blocks x 256), so the grid-stride loop
// runs more than once.
INSTANTIATE_TEST_SUITE_P(Sizes, GpuAccumulateTest,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{7}, size_t{1000003},
                                           size_t{3000017}));

TEST(GpuAccumulate, RejectsNullDevicePointers) {
  if (!cuda::deviceAvailable()) GTEST_SKIP() << "no CUDA device visible to the CUDA runtime";
  EXPECT_NE(cuda::weightedAccumulateDevice(nullptr, nullptr, 1.0f, 16, nullptr), 0);
  EXPECT_EQ(cuda::weightedAccumulateDevice(nullptr, nullptr, 1.0f, 0, nullptr), 0);
  std::string error;
  EXPECT_FALSE(cuda::weightedAccumulateHost(nullptr, nullptr, 1.0f, 16, &error));
  EXPECT_FALSE(error.empty());
}

TEST(GpuAccumulate, DeviceProbeNeverFails) {
  // Runs everywhere: without a GPU the probe must answer false, not crash or leave an error
  // behind that a later CUDA call would report.
  const bool available = cuda::deviceAvailable();
  EXPECT_EQ(cuda::deviceAvailable(), available);
  std::string error;
  const float x = 2.0f;
  float acc = 1.0f;
  const bool ran = cuda::weightedAccumulateHost(&acc, &x, 0.5f, 1, &error);
  if (available) {
    EXPECT_TRUE(ran) << error;
    EXPECT_EQ(acc, 2.0f);
  } else {
    EXPECT_FALSE(ran);
    EXPECT_FALSE(error.empty());
    EXPECT_EQ(acc, 1.0f);
    std::printf("without a device, weightedAccumulateHost reports: %s\n", error.c_str());
  }
}

}  // namespace
}  // namespace fedfleet::kernels
