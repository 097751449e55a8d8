// DeviceCompressor against the host codecs and ErrorFeedback: the same payload bytes for every
// codec, and the same residual after rounds of error feedback. Skipped, with the reason, on a
// machine without a CUDA device; built wherever nvcc is found.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/compress/codec.h"
#include "common/compress/device_compressor.h"
#include "common/compress/error_feedback.h"
#include "tests/kernels/gpu_test_util.h"

namespace fedfleet::compress {
namespace {

using kernels::DeviceArray;
using kernels::gaussian;

std::unique_ptr<Codec> codecFor(const std::string& text) {
  auto spec = parseCodecSpec(text);
  EXPECT_TRUE(spec.isOk()) << text;
  auto codec = makeCodec(*spec);
  EXPECT_TRUE(codec.isOk()) << text;
  return std::move(codec).value();
}

class DeviceCompressorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!DeviceCompressor::available()) GTEST_SKIP() << "no CUDA device";
    auto c = DeviceCompressor::create(0);
    ASSERT_TRUE(c.isOk()) << c.status().message();
    compressor_ = std::move(c).value();
  }

  // The device's payload for x must be the host codec's, byte for byte.
  void expectSameBytes(const std::string& codec_text, const std::vector<float>& x, uint64_t seed) {
    SCOPED_TRACE(codec_text + ", n = " + std::to_string(x.size()));
    auto codec = codecFor(codec_text);
    std::string host = "prefix", device = "prefix";  // appends, keeping what was there
    codec->encode(x.data(), x.size(), seed, &host);
    DeviceArray<float> d_x(x);
    const Status st = compressor_->encode(*codec, d_x.get(), x.size(), seed, &device);
    ASSERT_TRUE(st.isOk()) << st.message();
    ASSERT_EQ(device.size(), host.size());
    EXPECT_TRUE(device == host);
  }

  std::unique_ptr<DeviceCompressor> compressor_;
};

TEST_F(DeviceCompressorTest, EveryCodecGivesTheHostBytes) {
  const std::vector<std::string> codecs = {
      "none",      "fp16",     "bf16",    "qsgd8", "qsgd4,bucket=64", "sign", "sign,bucket=128",
      "topk:0.01", "topk:0.3", "topk:1.0"};
  for (size_t n : {1ul, 7ul, 1000ul, 100003ul, (1ul << 20) + 3}) {
    const std::vector<float> x = gaussian(n, static_cast<uint32_t>(n));
    for (const auto& c : codecs) expectSameBytes(c, x, 0x1234 + n);
  }
}

TEST_F(DeviceCompressorTest, TopkTiesGoToTheLowerIndexAsOnTheHost) {
  // Three magnitudes only, so the k-th largest is shared by thousands of elements.
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> pick(0, 5);
  const float levels[] = {-1.0f, 1.0f, -0.5f, 0.5f, 0.25f, -0.25f};
  std::vector<float> x(300000);
  for (float& v : x) v = levels[pick(gen)];
  for (const char* c : {"topk:0.01", "topk:0.2", "topk:0.5"}) expectSameBytes(c, x, 3);
}

TEST_F(DeviceCompressorTest, TopkFallsBackWhenTheSampleOverestimatesTheThreshold) {
  // The strided sample (every n / m-th element) sees only the large values, which are fewer
  // than k: the device path must fall back to an exact selection and still match the host.
  const size_t n = 200000;  // m = 2000, stride 100
  std::vector<float> x = gaussian(n, 11);
  for (float& v : x) v *= 0.01f;
  for (size_t i = 0; i < n; i += 100) x[i] = 10.0f + static_cast<float>(i % 7);
  expectSameBytes("topk:0.05", x, 5);  // k = 10000 > 2000 large values
}

TEST_F(DeviceCompressorTest, CountsNonFiniteValues) {
  std::vector<float> x = gaussian(5000, 2);
  x[10] = std::numeric_limits<float>::infinity();
  x[4000] = -std::numeric_limits<float>::infinity();
  x[4999] = std::numeric_limits<float>::quiet_NaN();
  DeviceArray<float> d_x(x);
  auto count = compressor_->countNonFinite(d_x.get(), x.size());
  ASSERT_TRUE(count.isOk()) << count.status().message();
  EXPECT_EQ(*count, 3u);
  auto none = compressor_->countNonFinite(d_x.get(), 10);
  ASSERT_TRUE(none.isOk());
  EXPECT_EQ(*none, 0u);
}

TEST_F(DeviceCompressorTest, ErrorFeedbackMatchesTheHostOverRounds) {
  const size_t n = 70001;
  const size_t split = 30011;  // two chunks, as an upload pipeline encodes them
  for (ResidualStorage storage :
       {ResidualStorage::kFp32, ResidualStorage::kBf16, ResidualStorage::kFp16}) {
    for (const char* text : {"topk:0.01", "sign", "qsgd8"}) {
      SCOPED_TRACE(std::string(text) + ", " + residualStorageName(storage));
      auto codec = codecFor(text);
      ErrorFeedback host(n, storage);
      DeviceResidual device(n, storage, compressor_->device());
      for (uint32_t round = 0; round < 3; ++round) {
        const std::vector<float> x = gaussian(n, 100 + round);
        DeviceArray<float> d_x(x);
        for (const auto& [offset, len] :
             {std::pair<size_t, size_t>{0, split}, std::pair<size_t, size_t>{split, n - split}}) {
          const uint64_t seed = 17 * round + offset;
          std::string h, d;
          ASSERT_TRUE(host.encode(*codec, offset, x.data() + offset, len, seed, &h).isOk());
          const Status st =
              compressor_->encode(*codec, &device, offset, d_x.get() + offset, len, seed, &d);
          ASSERT_TRUE(st.isOk()) << st.message();
          ASSERT_TRUE(d == h) << "round " << round << ", offset " << offset;
        }
        std::vector<float> rh(n), rd(n);
        host.residual(0, n, rh.data());
        ASSERT_TRUE(device.residual(0, n, rd.data()).isOk());
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(rd[i]), std::bit_cast<uint32_t>(rh[i]))
              << "round " << round << ", element " << i;
        }
      }
      EXPECT_EQ(device.memoryBytes(), host.memoryBytes());
    }
  }
}

TEST_F(DeviceCompressorTest, NonFiniteUpdateIsRefusedAndChangesNothing) {
  const size_t n = 4096;
  auto codec = codecFor("topk:0.1");
  DeviceResidual residual(n, ResidualStorage::kFp32, compressor_->device());
  std::vector<float> x = gaussian(n, 9);
  DeviceArray<float> d_x(x);
  std::string out;
  ASSERT_TRUE(compressor_->encode(*codec, &residual, 0, d_x.get(), n, 1, &out).isOk());
  std::vector<float> before(n), after(n);
  ASSERT_TRUE(residual.residual(0, n, before.data()).isOk());

  x[77] = std::numeric_limits<float>::quiet_NaN();
  DeviceArray<float> d_bad(x);
  std::string bad = "kept";
  const Status st = compressor_->encode(*codec, &residual, 0, d_bad.get(), n, 2, &bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_EQ(bad, "kept");
  ASSERT_TRUE(residual.residual(0, n, after.data()).isOk());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(after[i], before[i]) << i;
}

TEST_F(DeviceCompressorTest, ResetFreesTheResidual) {
  DeviceResidual residual(1000, ResidualStorage::kBf16, compressor_->device());
  EXPECT_EQ(residual.memoryBytes(), 0u);
  const std::vector<float> x = gaussian(1000, 4);
  DeviceArray<float> d_x(x);
  std::string out;
  auto codec = codecFor("sign");
  ASSERT_TRUE(compressor_->encode(*codec, &residual, 0, d_x.get(), 1000, 1, &out).isOk());
  EXPECT_EQ(residual.memoryBytes(), 2000u);
  residual.reset();
  EXPECT_EQ(residual.memoryBytes(), 0u);
  std::vector<float> r(1000, 1.0f);
  ASSERT_TRUE(residual.residual(0, 1000, r.data()).isOk());
  for (float v : r) ASSERT_EQ(v, 0.0f);
}

TEST_F(DeviceCompressorTest, AnUnknownDeviceIsUnavailable) {
  auto c = DeviceCompressor::create(4096);
  ASSERT_FALSE(c.isOk());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status().message();
}

}  // namespace
}  // namespace fedfleet::compress
