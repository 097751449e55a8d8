// Trainer's FedProx and SCAFFOLD corrections: against a hand-written double-precision reference
// on a tiny logistic regression, on both gradient paths, the exact shift each correction adds to
// a step and the SCAFFOLD control update's formula. (trainer_gradients_test compares the paths
// with the corrections on, with momentum and weight decay too.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

#include "client/trainer.h"
#include "common/data/dataset.h"
#include "common/model/model.h"

namespace fedfleet::client {
namespace {

using GradientPath = Trainer::GradientPath;

// ----- a tiny logistic regression, by hand ---------------------------------------------------

constexpr int kDim = 3, kClasses = 2, kSamples = 3;
constexpr size_t kParams = kClasses * kDim + kClasses;  // weight [2, 3], then bias [2]

data::Dataset tinyData() {
  data::Dataset ds;
  ds.feature_dim = kDim;
  ds.num_classes = kClasses;
  ds.features = {1.0f,   -2.0f, 0.5f,   //
                 0.25f,  1.5f,  -1.0f,  //
                 -0.75f, 0.5f,  2.0f};
  ds.labels = {0, 1, 1};
  return ds;
}

std::vector<float> tinyStart() { return {0.2f, -0.1f, 0.3f, -0.4f, 0.25f, 0.05f, 0.1f, -0.2f}; }

// The gradient of the mean cross-entropy over all three samples at flat parameters w.
std::vector<double> referenceGradient(const std::vector<double>& w) {
  const data::Dataset ds = tinyData();
  std::vector<double> g(kParams, 0.0);
  for (int i = 0; i < kSamples; ++i) {
    const float* x = ds.feature(i);
    double z[kClasses];
    for (int c = 0; c < kClasses; ++c) {
      z[c] = w[kClasses * kDim + c];
      for (int j = 0; j < kDim; ++j) z[c] += w[c * kDim + j] * x[j];
    }
    const double m = std::max(z[0], z[1]);
    const double sum = std::exp(z[0] - m) + std::exp(z[1] - m);
    for (int c = 0; c < kClasses; ++c) {
      const double d = (std::exp(z[c] - m) / sum - (ds.labels[i] == c ? 1.0 : 0.0)) / kSamples;
      for (int j = 0; j < kDim; ++j) g[c * kDim + j] += d * x[j];
      g[kClasses * kDim + c] += d;
    }
  }
  return g;
}

// `steps` full-batch SGD steps of rate lr from start, each gradient corrected by
// mu (w - start) + (c - ck) (c, ck: null for none). Returns the final parameters - start.
std::vector<double> referenceDelta(int steps, double lr, double mu, const std::vector<float>* c,
                                   const std::vector<float>* ck) {
  const std::vector<float> start = tinyStart();
  std::vector<double> w(start.begin(), start.end());
  for (int s = 0; s < steps; ++s) {
    const std::vector<double> g = referenceGradient(w);
    std::vector<double> next = w;
    for (size_t i = 0; i < kParams; ++i) {
      double gi = g[i] + mu * (w[i] - start[i]);
      if (c != nullptr) gi += double((*c)[i]) - (*ck)[i];
      next[i] = w[i] - lr * gi;
    }
    w = next;
  }
  for (size_t i = 0; i < kParams; ++i) w[i] -= start[i];
  return w;
}

const std::vector<float> kC = {0.05f, -0.02f, 0.1f, 0.03f, -0.07f, 0.2f, -0.15f, 0.04f};
const std::vector<float> kCk = {-0.03f, 0.06f, 0.01f, -0.12f, 0.02f, 0.05f, 0.08f, -0.1f};

class TinyLogregTest : public ::testing::TestWithParam<GradientPath> {
 protected:
  TrainResult train(int steps, float mu, bool scaffold) {
    auto m = model::createModel("logreg", 0, "", model::inputShapeOf(ds_));
    EXPECT_TRUE(m.isOk()) << m.status().toString();
    TrainOptions o;
    o.max_steps = static_cast<uint32_t>(steps);
    o.batch_size = kSamples;  // every step is the full batch: the shuffle does not matter
    o.lr = kLr;
    o.prox_mu = mu;
    if (scaffold) o.scaffold = {&kC, &kCk};
    Trainer trainer(torch::kCPU, Trainer::BatchSource::kAuto, GetParam());
    auto r = trainer.train(**m, tinyStart(), ds_, {0, 1, 2}, o);
    EXPECT_TRUE(r.isOk()) << r.status().toString();
    if (!r.isOk()) return {};
    EXPECT_EQ(r->steps, static_cast<uint64_t>(steps));
    EXPECT_EQ(r->delta.size(), kParams);
    EXPECT_EQ(r->control_delta.size(), scaffold ? kParams : 0u);
    return std::move(r).value();
  }

  static constexpr float kLr = 0.5f;
  const data::Dataset ds_ = tinyData();
};

TEST_P(TinyLogregTest, PlainStepsMatchTheReference) {
  const TrainResult r = train(2, 0, false);
  const std::vector<double> ref = referenceDelta(2, kLr, 0, nullptr, nullptr);
  for (size_t i = 0; i < kParams; ++i) EXPECT_NEAR(r.delta[i], ref[i], 1e-6) << i;
  EXPECT_GT(std::abs(ref[0]), 1e-2);  // a step that could be wrong
}

// FedProx's term is zero on the first step (w = x_t there) and, on the second, moves the step
// by exactly -lr mu (w_1 - x_t), w_1 - x_t being the first step's delta.
TEST_P(TinyLogregTest, FedProxShiftsTheSecondStepByLrMuTimesTheDistanceFromStart) {
  constexpr float kMu = 0.3f;
  const TrainResult plain1 = train(1, 0, false);
  const TrainResult prox1 = train(1, kMu, false);
  EXPECT_EQ(prox1.delta, plain1.delta);

  const TrainResult plain2 = train(2, 0, false);
  const TrainResult prox2 = train(2, kMu, false);
  double largest = 0;
  for (size_t i = 0; i < kParams; ++i) {
    const double expected = -double(kLr) * kMu * plain1.delta[i];
    EXPECT_NEAR(double(prox2.delta[i]) - plain2.delta[i], expected, 1e-7) << i;
    largest = std::max(largest, std::abs(expected));
  }
  EXPECT_GT(largest, 1e-2);

  const std::vector<double> ref = referenceDelta(3, kLr, kMu, nullptr, nullptr);
  const TrainResult prox3 = train(3, kMu, false);
  for (size_t i = 0; i < kParams; ++i) EXPECT_NEAR(prox3.delta[i], ref[i], 1e-6) << i;
}

// SCAFFOLD's first step is the plain one shifted by -lr (c - c_k); later steps follow the
// reference, and Dc_k = c_k_new - c_k = -c + (x_t - y) / (K lr).
TEST_P(TinyLogregTest, ScaffoldShiftsEachStepByLrTimesCMinusCk) {
  const TrainResult plain1 = train(1, 0, false);
  const TrainResult s1 = train(1, 0, true);
  for (size_t i = 0; i < kParams; ++i) {
    EXPECT_NEAR(double(s1.delta[i]) - plain1.delta[i], -double(kLr) * (double(kC[i]) - kCk[i]),
                1e-7)
        << i;
  }

  constexpr int kSteps = 3;
  const TrainResult s3 = train(kSteps, 0, true);
  const std::vector<double> ref = referenceDelta(kSteps, kLr, 0, &kC, &kCk);
  const std::vector<double> ref_plain = referenceDelta(kSteps, kLr, 0, nullptr, nullptr);
  double moved = 0;
  for (size_t i = 0; i < kParams; ++i) {
    EXPECT_NEAR(s3.delta[i], ref[i], 1e-6) << i;
    moved = std::max(moved, std::abs(ref[i] - ref_plain[i]));
    // c_k_new = c_k - c + (x_t - y) / (K lr); Dc_k = c_k_new - c_k.
    const double ck_new = double(kCk[i]) - kC[i] - ref[i] / (kSteps * double(kLr));
    EXPECT_NEAR(s3.control_delta[i], ck_new - kCk[i], 1e-6) << i;
    EXPECT_NEAR(s3.control_delta[i], -double(kC[i]) - double(s3.delta[i]) / (kSteps * kLr), 1e-7)
        << i;
  }
  EXPECT_GT(moved, 1e-2);  // the correction made a difference the test can see
}

TEST_P(TinyLogregTest, FedProxAndScaffoldTogetherMatchTheReference) {
  constexpr float kMu = 0.2f;
  const TrainResult r = train(4, kMu, true);
  const std::vector<double> ref = referenceDelta(4, kLr, kMu, &kC, &kCk);
  for (size_t i = 0; i < kParams; ++i) {
    EXPECT_NEAR(r.delta[i], ref[i], 1e-6) << i;
    EXPECT_NEAR(r.control_delta[i], -double(kC[i]) - ref[i] / (4 * double(kLr)), 1e-6) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, TinyLogregTest,
                         ::testing::Values(GradientPath::kManual, GradientPath::kAutograd),
                         [](const auto& info) {
                           return info.param == GradientPath::kManual ? "manual" : "autograd";
                         });

// ----- edges ---------------------------------------------------------------------------------

TEST(TrainerCorrectionsTest, BadOptionsAreInvalidArguments) {
  const data::Dataset ds = tinyData();
  auto m = model::createModel("logreg", 0, "", model::inputShapeOf(ds));
  ASSERT_TRUE(m.isOk());
  Trainer trainer(torch::kCPU);
  const std::vector<float> short_c(kParams - 1, 0.0f);
  std::vector<TrainOptions> bad(5);
  bad[0].prox_mu = -0.1f;
  bad[1].prox_mu = std::nanf("");
  bad[2].scaffold = {&kC, nullptr};
  bad[3].scaffold = {&short_c, &kCk};
  bad[4].scaffold = {&kC, &kCk};
  bad[4].lr = 0;
  for (size_t i = 0; i < bad.size(); ++i) {
    bad[i].max_steps = 1;
    auto r = trainer.train(**m, tinyStart(), ds, {0, 1, 2}, bad[i]);
    ASSERT_FALSE(r.isOk()) << i;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().toString();
  }
}

// Stopped before its first step, a SCAFFOLD client has nothing to say about c_k: Dc_k = 0.
TEST(TrainerCorrectionsTest, ScaffoldWithoutStepsLeavesTheControlVariate) {
  const data::Dataset ds = tinyData();
  auto m = model::createModel("logreg", 0, "", model::inputShapeOf(ds));
  ASSERT_TRUE(m.isOk());
  TrainOptions o;
  o.max_steps = 5;
  o.scaffold = {&kC, &kCk};
  const std::atomic<bool> stop{true};
  auto r = Trainer(torch::kCPU).train(**m, tinyStart(), ds, {0, 1, 2}, o, &stop);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->steps, 0u);
  EXPECT_TRUE(r->stopped_early);
  EXPECT_EQ(r->control_delta, std::vector<float>(kParams, 0.0f));
}

TEST(TrainerCorrectionsTest, TakeUploadAppendsTheControlDelta) {
  TrainResult r;
  r.delta = {1, 2, 3};
  EXPECT_EQ(takeUpload(r), (std::vector<float>{1, 2, 3}));
  r.delta = {1, 2, 3};
  r.control_delta = {-4, 5, -6};
  EXPECT_EQ(takeUpload(r), (std::vector<float>{1, 2, 3, -4, 5, -6}));
  EXPECT_TRUE(r.delta.empty());
  EXPECT_TRUE(r.control_delta.empty());
}

TEST(TrainerCorrectionsTest, TrainOptionsFromCarriesProxMu) {
  wire::HyperParams hp;
  hp.prox_mu = 0.125f;
  hp.scaffold = true;
  const TrainOptions o = trainOptionsFrom(hp);
  EXPECT_EQ(o.prox_mu, 0.125f);
  EXPECT_FALSE(o.usesScaffold());  // the caller points the controls at its c and c_k
}

}  // namespace
}  // namespace fedfleet::client
