// Trainer with TrainOptions::precision = kBf16 (client/trainer.h): bf16 autocast really changes
// the computation yet stays close to fp32, the weights stay fp32, the mlp goes through autograd,
// and the calling thread's autocast state is what it was once train() returns, failed or not.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "client/trainer.h"
#include "common/data/dataset.h"
#include "common/model/model.h"

namespace fedfleet::client {
namespace {

std::vector<uint32_t> range(uint32_t n) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), 0u);
  return v;
}

// |a - b| / |b| over the flat values.
double relativeL2(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

class TrainerPrecisionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto train = data::loadFashionMnist(data::defaultFashionMnistDir(), true, 128);
    if (train.isOk()) train_ = new data::Dataset(std::move(train).value());
  }
  static void TearDownTestSuite() {
    delete train_;
    train_ = nullptr;
  }
  void SetUp() override {
    if (train_ == nullptr) GTEST_SKIP() << "Fashion-MNIST not installed";
    ASSERT_FALSE(at::autocast::is_cpu_enabled());
  }

  // The delta of `steps` steps of batch 32 from the model's seeded initial weights.
  static std::vector<float> delta(const std::string& name, wire::Precision precision,
                                  Trainer::GradientPath path = Trainer::GradientPath::kAuto) {
    auto m = model::createModel(name, 3).value();
    const std::vector<float> start = m->flatParameters();
    Trainer trainer(torch::kCPU, Trainer::BatchSource::kAuto, path);
    TrainOptions opts;
    opts.max_steps = 4;
    opts.lr = 0.05f;
    opts.seed = 11;
    opts.precision = precision;
    auto r = trainer.train(*m, start, *train_, range(128), opts);
    EXPECT_TRUE(r.isOk()) << r.status().toString();
    EXPECT_FALSE(at::autocast::is_cpu_enabled());
    for (const at::Tensor& p : m->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);
    return r.isOk() ? r->delta : std::vector<float>(start.size(), 0.0f);
  }

  static data::Dataset* train_;
};
data::Dataset* TrainerPrecisionTest::train_ = nullptr;

// Relative L2 differences between the bf16 and fp32 deltas of these 4 steps, measured on an
// AVX2 CPU without native bf16: 0.119 (cnn) and 0.043 (mlp). (fp32 against itself is 0, and
// fp32 with another shuffle seed differs by 0.32 and 0.19.) There LibTorch 1.13's fallback bf16
// matrix product also sums in bf16 (a row of 1024 ones sums to 256), which is most of the
// difference; oneDNN's bf16 kernels on AVX-512 hardware sum in fp32 and should land closer.
// The upper bounds leave a factor of about 2.5 of margin, the lower one a factor of 100.
constexpr double kMaxCnnDifference = 0.3;
constexpr double kMaxMlpDifference = 0.12;
constexpr double kMinDifference = 1e-3;

TEST_F(TrainerPrecisionTest, CnnInBf16IsCloseToFp32ButNotEqual) {
  const std::vector<float> fp32 = delta("cnn", wire::Precision::kFp32);
  const std::vector<float> bf16 = delta("cnn", wire::Precision::kBf16);
  ASSERT_EQ(fp32.size(), bf16.size());
  const double rel = relativeL2(bf16, fp32);
  RecordProperty("relative_l2", std::to_string(rel));
  EXPECT_GT(rel, kMinDifference);
  EXPECT_LT(rel, kMaxCnnDifference);
}

TEST_F(TrainerPrecisionTest, MlpInBf16GoesThroughAutogradAndIsCloseToFp32) {
  const std::vector<float> fp32 = delta("mlp", wire::Precision::kFp32);
  const std::vector<float> bf16 = delta("mlp", wire::Precision::kBf16);
  const double rel = relativeL2(bf16, fp32);
  RecordProperty("relative_l2", std::to_string(rel));
  EXPECT_GT(rel, kMinDifference);
  EXPECT_LT(rel, kMaxMlpDifference);
  // kAuto in bf16 is the autograd path, bit for bit.
  EXPECT_EQ(delta("mlp", wire::Precision::kBf16, Trainer::GradientPath::kAutograd), bf16);

  // The manual path has no bf16: asking for both is refused.
  auto m = model::createModel("mlp", 3).value();
  Trainer manual(torch::kCPU, Trainer::BatchSource::kAuto, Trainer::GradientPath::kManual);
  TrainOptions opts;
  opts.max_steps = 1;
  opts.precision = wire::Precision::kBf16;
  auto r = manual.train(*m, m->flatParameters(), *train_, range(32), opts);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("bf16"), std::string::npos) << r.status().message();
}

TEST_F(TrainerPrecisionTest, TheCallersAutocastStateIsRestoredAfterSuccessAndFailure) {
  auto m = model::createModel("cnn", 3).value();
  const std::vector<float> start = m->flatParameters();
  Trainer trainer(torch::kCPU);
  TrainOptions opts;
  opts.max_steps = 1;
  opts.precision = wire::Precision::kBf16;

  // 5x5 images pass the convolutions but not the fully connected layer: LibTorch throws inside
  // the autocast scope.
  data::Dataset tiny;
  tiny.rows = tiny.cols = 5;
  tiny.images.assign(4 * 25, 100);
  tiny.labels = {0, 1, 2, 3};
  auto bad = trainer.train(*m, start, tiny, range(4), opts);
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
  EXPECT_EQ(at::autocast::get_autocast_cpu_dtype(), at::kBFloat16);

  // A caller's own state (here: CPU autocast on) comes back as it was. (LibTorch 1.13's CPU
  // autocast takes no dtype but bf16, so there is no other dtype to restore.)
  at::autocast::set_cpu_enabled(true);
  const bool ok = trainer.train(*m, start, *train_, range(32), opts).isOk();
  const bool failed = !trainer.train(*m, start, tiny, range(4), opts).isOk();
  const bool enabled_after = at::autocast::is_cpu_enabled();
  at::autocast::set_cpu_enabled(false);
  EXPECT_TRUE(ok);
  EXPECT_TRUE(failed);
  EXPECT_TRUE(enabled_after);
  EXPECT_FALSE(at::autocast::is_enabled());  // CUDA's flag was never touched on the CPU
}

// What lets several worker threads train at once, some in bf16 and some not: LibTorch 1.13
// keeps the autocast flags and dtypes per thread (a CUDA trainer sets the GPU dtype: the
// thread below sets it without needing a GPU).
TEST(AutocastState, IsPerThread) {
  const at::ScalarType gpu_dtype = at::autocast::get_autocast_gpu_dtype();
  ASSERT_NE(gpu_dtype, at::kBFloat16);  // LibTorch's default is fp16
  bool other_cpu = false, other_gpu = false;
  at::ScalarType other_dtype = gpu_dtype;
  std::thread t([&] {
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    other_cpu = at::autocast::is_cpu_enabled();
    other_gpu = at::autocast::is_enabled();
    other_dtype = at::autocast::get_autocast_gpu_dtype();
  });
  t.join();
  EXPECT_TRUE(other_cpu);
  EXPECT_TRUE(other_gpu);
  EXPECT_EQ(other_dtype, at::kBFloat16);
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
  EXPECT_FALSE(at::autocast::is_enabled());
  EXPECT_EQ(at::autocast::get_autocast_gpu_dtype(), gpu_dtype);
}

}  // namespace
}  // namespace fedfleet::client
