// The upload pipeline on the GPU: a delta in device memory, encoded by a DeviceCompressor on its
// own stream, gives the host pipeline's chunks byte for byte (codecs, dense fp16 chunks, error
// feedback across uploads), and a non-finite delta fails before any chunk. Skipped, with the
// reason, on a machine without a CUDA device; built wherever nvcc is found.
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "client/upload_pipeline.h"
#include "common/compress/device_compressor.h"
#include "common/compress/error_feedback.h"
#include "tests/client/pipeline_helpers.h"
#include "tests/kernels/gpu_test_util.h"

namespace fedfleet::client {
namespace {

using kernels::DeviceArray;

class GpuUploadPipeline : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!compress::DeviceCompressor::available()) GTEST_SKIP() << "no CUDA device";
    auto c = compress::DeviceCompressor::create(0);
    ASSERT_TRUE(c.isOk()) << c.status().message();
    gpu_ = std::move(c).value();
  }

  // A pipeline over a device copy of x (which `keep` holds until the pipeline is gone).
  std::unique_ptr<UploadPipeline> onDevice(const std::vector<float>& x,
                                           std::shared_ptr<DeviceArray<float>>* keep,
                                           const std::vector<ChunkRange>& plan,
                                           std::shared_ptr<const compress::Codec> codec,
                                           compress::DeviceResidual* residual, uint64_t seed) {
    *keep = std::make_shared<DeviceArray<float>>(x);
    DeviceDelta d;
    d.owner = *keep;
    d.data = (*keep)->get();
    d.size = x.size();
    d.compressor = gpu_.get();
    d.residual = residual;
    return std::make_unique<UploadPipeline>(std::move(d), plan, std::move(codec), seed);
  }

  std::unique_ptr<compress::DeviceCompressor> gpu_;
};

void expectSameChunks(const std::vector<EncodedChunk>& device,
                      const std::vector<EncodedChunk>& host) {
  ASSERT_EQ(device.size(), host.size());
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_EQ(device[i].range, host[i].range) << "chunk " << i;
    EXPECT_EQ(device[i].last, host[i].last) << "chunk " << i;
    EXPECT_TRUE(device[i].payload == host[i].payload) << "chunk " << i;
  }
}

TEST_F(GpuUploadPipeline, EveryCodecGivesTheHostChunks) {
  // The CNN's shapes: conv1, its bias, conv2, its bias, fc1, its bias, fc2, its bias.
  const model::Layout layout = layoutOf({800, 32, 51200, 64, 1605632, 512, 5120, 10});
  const std::vector<float> x = randomDelta(layout.total, 5);
  for (const char* text :
       {"none", "fp16", "qsgd8", "qsgd4", "sign", "topk:0.01", "topk:0.01,dense_below=10000"}) {
    SCOPED_TRACE(text);
    auto codec = codecFor(text);
    const auto plan = planUploadChunks(layout, 1 << 20, false, codec->spec());
    UploadPipeline host(x, plan, codec, nullptr, 77);
    std::shared_ptr<DeviceArray<float>> keep;
    auto device = onDevice(x, &keep, plan, codec, nullptr, 77);
    expectSameChunks(drain(*device), drain(host));
    EXPECT_TRUE(device->status().isOk()) << device->status().message();
  }
}

TEST_F(GpuUploadPipeline, ErrorFeedbackMatchesTheHostAcrossUploads) {
  const model::Layout layout = layoutOf({3000, 20, 250000, 100});
  auto codec = codecFor("topk:0.01,dense_below=1000");
  const auto plan = planUploadChunks(layout, 256 << 10, false, codec->spec());
  compress::ErrorFeedback host_residual(layout.total, compress::ResidualStorage::kBf16);
  compress::DeviceResidual device_residual(layout.total, compress::ResidualStorage::kBf16,
                                           gpu_->device());
  for (uint64_t round = 0; round < 3; ++round) {
    SCOPED_TRACE("upload " + std::to_string(round));
    const std::vector<float> x = randomDelta(layout.total, 40 + round);
    UploadPipeline host(x, plan, codec, &host_residual, round);
    std::shared_ptr<DeviceArray<float>> keep;
    auto device = onDevice(x, &keep, plan, codec, &device_residual, round);
    expectSameChunks(drain(*device), drain(host));
    device.reset();  // the residual is the test's again
    std::vector<float> rh(layout.total), rd(layout.total);
    host_residual.residual(0, layout.total, rh.data());
    ASSERT_TRUE(device_residual.residual(0, layout.total, rd.data()).isOk());
    for (size_t i = 0; i < rh.size(); ++i) ASSERT_EQ(rd[i], rh[i]) << i;
  }
}

TEST_F(GpuUploadPipeline, NonFiniteDeltaFailsBeforeAnyChunk) {
  const model::Layout layout = layoutOf({1000, 5000});
  std::vector<float> x = randomDelta(layout.total, 3);
  x[4321] = std::numeric_limits<float>::infinity();
  auto codec = codecFor("qsgd8");
  std::shared_ptr<DeviceArray<float>> keep;
  auto p = onDevice(x, &keep, planUploadChunks(layout, 1 << 20, false, codec->spec()), codec,
                    nullptr, 1);
  EXPECT_FALSE(p->pop(30).has_value());
  EXPECT_TRUE(p->failed());
  EXPECT_EQ(p->status().code(), StatusCode::kInvalidArgument) << p->status().message();
}

}  // namespace
}  // namespace fedfleet::client
