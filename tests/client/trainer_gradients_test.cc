// Trainer's manual gradient path (hand-written backward pass and SGD for "logreg" and "mlp" on
// the CPU) against its autograd path, on images and on feature vectors, and with FedProx's and
// SCAFFOLD's gradient corrections on.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>

#include "client/trainer.h"
#include "common/data/dataset.h"
#include "common/model/model.h"
#include "tests/client/test_data.h"

namespace fedfleet::client {
namespace {

using GradientPath = Trainer::GradientPath;

std::vector<uint32_t> range(uint32_t n) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), 0u);
  return v;
}

// 400 Fashion-MNIST training images, or null when the data set is not installed.
const data::Dataset* images() {
  static const std::unique_ptr<data::Dataset> ds = [] {
    auto r = data::loadFashionMnist(data::defaultFashionMnistDir(), true, 400);
    return r.isOk() ? std::make_unique<data::Dataset>(std::move(r).value()) : nullptr;
  }();
  return ds.get();
}

const data::Dataset* features() { return syntheticFeatures(); }

std::unique_ptr<model::Model> mustCreateFor(const std::string& name, uint64_t seed,
                                            const data::Dataset& ds) {
  auto m = model::createModel(name, seed, "", model::inputShapeOf(ds));
  EXPECT_TRUE(m.isOk()) << m.status().toString();
  return m.isOk() ? std::move(m).value() : nullptr;
}

// Two passes over 150 scattered samples in batches of 32: 10 steps.
TrainOptions twoPassOptions(bool momentum) {
  TrainOptions opts;
  opts.epochs = 2;
  opts.batch_size = 32;
  opts.lr = 0.05f;
  opts.seed = 11;
  if (momentum) {
    opts.momentum = 0.9f;
    opts.weight_decay = 1e-2f;
  }
  return opts;
}

std::vector<uint32_t> scatteredIndices() {
  std::vector<uint32_t> idx;
  for (uint32_t i = 0; idx.size() < 150; i += 2) idx.push_back(i);
  return idx;
}

TrainResult mustTrain(GradientPath path, const std::string& name, const data::Dataset& ds,
                      const std::vector<uint32_t>& idx, const TrainOptions& opts) {
  auto m = mustCreateFor(name, 6, ds);
  Trainer trainer(torch::kCPU, Trainer::BatchSource::kAuto, path);
  auto r = trainer.train(*m, m->flatParameters(), ds, idx, opts);
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  return r.isOk() ? std::move(r).value() : TrainResult();
}

double maxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double out = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    out = std::max(out, std::abs(double(a[i]) - b[i]));
  }
  return out;
}

// (model, images or feature vectors, momentum and weight decay or plain SGD).
class ManualGradientsTest : public ::testing::TestWithParam<std::tuple<std::string, bool, bool>> {
 protected:
  void SetUp() override {
    ds_ = std::get<1>(GetParam()) ? images() : features();
    if (ds_ == nullptr) GTEST_SKIP() << "Fashion-MNIST not installed";
  }
  const data::Dataset* ds_ = nullptr;
};

// Two passes over 150 scattered samples in batches of 32 (4 full batches and one of 22 each
// pass): the two paths compute the same function in a different order of float operations, so
// they differ by rounding only. The deltas here reach 0.02 to 1.5; the paths' results differ by
// 1e-8 to 1.2e-7 (a few float ulp of the weights) and their losses by < 2e-8 relative. We allow
// 1e-6 on the deltas and 1e-6 relative on the losses; a wrong gradient (a missing 1/B, a missing
// ReLU mask, weight decay or momentum left out) is off by 1e-3 or more. The losses are fp32
// sums whose rounding depends on the SIMD width LibTorch picks for the CPU: on an AVX-512
// machine running the AVX2 kernels the sum of squared losses of logreg with momentum differed
// by 1.3e-7 relative, so 1e-7 was a test of the CPU, not of the gradient.
TEST_P(ManualGradientsTest, MatchesAutograd) {
  const auto& [name, on_images, momentum] = GetParam();
  const TrainOptions opts = twoPassOptions(momentum);
  const std::vector<uint32_t> idx = scatteredIndices();

  const TrainResult manual = mustTrain(GradientPath::kManual, name, *ds_, idx, opts);
  const TrainResult autograd = mustTrain(GradientPath::kAutograd, name, *ds_, idx, opts);
  EXPECT_EQ(manual.steps, 10u);
  EXPECT_EQ(manual.steps, autograd.steps);
  EXPECT_EQ(manual.n_samples, 300u);
  EXPECT_EQ(manual.n_samples, autograd.n_samples);
  EXPECT_LT(maxAbsDiff(manual.delta, autograd.delta), 1e-6);
  EXPECT_GT(maxAbsDiff(autograd.delta, std::vector<float>(autograd.delta.size(), 0.0f)), 1e-3);
  EXPECT_NEAR(manual.mean_loss, autograd.mean_loss, 1e-6 * autograd.mean_loss);
  EXPECT_NEAR(manual.sum_sq_loss, autograd.sum_sq_loss, 1e-6 * autograd.sum_sq_loss);

  // Same inputs, same bits; and kAuto takes the manual path for these models.
  const TrainResult again = mustTrain(GradientPath::kManual, name, *ds_, idx, opts);
  EXPECT_EQ(manual.delta, again.delta);
  EXPECT_EQ(manual.mean_loss, again.mean_loss);
  EXPECT_EQ(manual.sum_sq_loss, again.sum_sq_loss);
  const TrainResult by_default = mustTrain(GradientPath::kAuto, name, *ds_, idx, opts);
  EXPECT_EQ(manual.delta, by_default.delta);
}

INSTANTIATE_TEST_SUITE_P(Models, ManualGradientsTest,
                         ::testing::Combine(::testing::Values("logreg", "mlp"), ::testing::Bool(),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) ? "_images" : "_features") +
                                  (std::get<2>(info.param) ? "_momentum_wd" : "_plain");
                         });

// (model, momentum and weight decay, which corrections: "prox", "scaffold", "both").
class CorrectedGradientsTest
    : public ::testing::TestWithParam<std::tuple<std::string, bool, std::string>> {};

// The budget of MatchesAutograd on feature vectors, with FedProx's mu (w - x_t) and SCAFFOLD's
// c - c_k added to every gradient: the paths still differ by rounding only (the control delta,
// -c - delta / (K lr) with K lr = 0.5, by at most twice the deltas' difference), while the
// corrections move the result by 1e-3 or more.
TEST_P(CorrectedGradientsTest, ManualMatchesAutograd) {
  const auto& [name, momentum, which] = GetParam();
  const data::Dataset& ds = *features();
  const size_t n = mustCreateFor(name, 6, ds)->numParameters();
  const std::vector<float> c = uniformFloats(n, 1, 0.05f), ck = uniformFloats(n, 2, 0.05f);
  TrainOptions opts = twoPassOptions(momentum);
  if (which != "scaffold") opts.prox_mu = 0.5f;
  if (which != "prox") opts.scaffold = {&c, &ck};
  const std::vector<uint32_t> idx = scatteredIndices();

  const TrainResult manual = mustTrain(GradientPath::kManual, name, ds, idx, opts);
  const TrainResult autograd = mustTrain(GradientPath::kAutograd, name, ds, idx, opts);
  EXPECT_EQ(manual.steps, 10u);
  EXPECT_LT(maxAbsDiff(manual.delta, autograd.delta), 1e-6);
  EXPECT_NEAR(manual.mean_loss, autograd.mean_loss, 1e-6 * autograd.mean_loss);
  EXPECT_EQ(manual.control_delta.size(), which == "prox" ? 0u : n);
  EXPECT_EQ(autograd.control_delta.size(), manual.control_delta.size());
  if (!manual.control_delta.empty()) {
    EXPECT_LT(maxAbsDiff(manual.control_delta, autograd.control_delta), 1e-6);
  }

  TrainOptions off = opts;
  off.prox_mu = 0;
  off.scaffold = {};
  const TrainResult uncorrected = mustTrain(GradientPath::kManual, name, ds, idx, off);
  EXPECT_GT(maxAbsDiff(manual.delta, uncorrected.delta), 1e-3);
  EXPECT_TRUE(uncorrected.control_delta.empty());
}

INSTANTIATE_TEST_SUITE_P(Corrections, CorrectedGradientsTest,
                         ::testing::Combine(::testing::Values("logreg", "mlp"), ::testing::Bool(),
                                            ::testing::Values("prox", "scaffold", "both")),
                         [](const auto& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) ? "_momentum_wd_" : "_plain_") +
                                  std::get<2>(info.param);
                         });

TEST(ManualGradientsSupportTest, OnlyFullyConnectedBuiltinsOnTheCpu) {
  const data::Dataset& ds = *features();
  Trainer cpu(torch::kCPU, Trainer::BatchSource::kAuto, GradientPath::kManual);
  for (const std::string name : {"logreg", "mlp"}) {
    auto m = mustCreateFor(name, 0, ds);
    EXPECT_TRUE(cpu.supportsManualGradients(*m)) << name;
    auto fm = model::createModel(name, 0);  // Fashion-MNIST's shape: flattened 1x28x28
    ASSERT_TRUE(fm.isOk());
    EXPECT_TRUE(cpu.supportsManualGradients(**fm)) << name;
  }
  TrainOptions opts;
  opts.max_steps = 2;
  for (const std::string name : {"cnn", "lenet"}) {
    auto m = model::createModel(name, 0);
    ASSERT_TRUE(m.isOk());
    EXPECT_FALSE(cpu.supportsManualGradients(**m)) << name;
    if (images() == nullptr) continue;
    auto r = cpu.train(**m, (*m)->flatParameters(), *images(), range(40), opts);
    ASSERT_FALSE(r.isOk()) << name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().toString();
    // kAuto falls back to autograd for them.
    Trainer automatic(torch::kCPU);
    EXPECT_TRUE(automatic.train(**m, (*m)->flatParameters(), *images(), range(40), opts).isOk());
  }
  // The device decides too: a trainer for a GPU never takes the manual path.
  auto m = mustCreateFor("logreg", 0, ds);
  EXPECT_FALSE(Trainer(c10::Device(c10::kCUDA, 0)).supportsManualGradients(*m));
}

TEST(ManualGradientsSupportTest, BadLabelsAndWidthsAreErrorsNotMemoryFaults) {
  // A 3-class model on data labelled 0..9: LibTorch's nll_loss rejects the labels, and so must
  // the manual path (it indexes the logits with them).
  data::Dataset ds = *features();
  std::fill(ds.labels.begin(), ds.labels.end(), 5);
  model::InputShape three = model::inputShapeOf(ds);
  three.classes = 3;
  TrainOptions opts;
  opts.max_steps = 3;
  for (auto path : {GradientPath::kManual, GradientPath::kAutograd}) {
    auto m = model::createModel("logreg", 0, "", three);
    ASSERT_TRUE(m.isOk());
    Trainer trainer(torch::kCPU, Trainer::BatchSource::kAuto, path);
    auto r = trainer.train(**m, (*m)->flatParameters(), ds, range(200), opts);
    ASSERT_FALSE(r.isOk());
    EXPECT_EQ(r.status().code(), StatusCode::kInternal) << r.status().toString();

    // A model for 784 inputs on 60 features.
    auto wide = model::createModel("mlp", 0);
    ASSERT_TRUE(wide.isOk());
    r = trainer.train(**wide, (*wide)->flatParameters(), ds, range(200), opts);
    ASSERT_FALSE(r.isOk());
    EXPECT_EQ(r.status().code(), StatusCode::kInternal) << r.status().toString();
  }
}

}  // namespace
}  // namespace fedfleet::client
