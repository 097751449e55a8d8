// DeviceCompressor where no GPU can be used (this build without CUDA, or no device): it says
// so instead of failing later, and a DeviceResidual that was never used reads as zeros.
#include "common/compress/device_compressor.h"

#include <gtest/gtest.h>

#include <vector>

namespace fedfleet::compress {
namespace {

TEST(DeviceCompressorWithoutDevice, CreateIsUnavailableAndSaysWhy) {
  if (DeviceCompressor::available()) GTEST_SKIP() << "a CUDA device is present";
  auto c = DeviceCompressor::create(0);
  ASSERT_FALSE(c.isOk());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("compress on the GPU"), std::string::npos)
      << c.status().message();
}

TEST(DeviceCompressorWithoutDevice, AnUnusedResidualHoldsNothingAndReadsZero) {
  DeviceResidual r(16, ResidualStorage::kFp16, 0);
  EXPECT_EQ(r.size(), 16u);
  EXPECT_EQ(r.memoryBytes(), 0u);
  std::vector<float> out(4, 5.0f);
  ASSERT_TRUE(r.residual(12, 4, out.data()).isOk());
  for (float v : out) EXPECT_EQ(v, 0.0f);
  r.reset();
  EXPECT_EQ(r.memoryBytes(), 0u);
}

}  // namespace
}  // namespace fedfleet::compress
