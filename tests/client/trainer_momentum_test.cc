// Local training's algorithms under momentum and weight decay, as their reference code runs them
// (FedProx's and NIID-Bench's: torch.optim.SGD with momentum and weight decay):
//  - FedProx: mu (w - x_t) is part of the gradient, so momentum and weight decay see it;
//  - SCAFFOLD: the optimiser's step sees the plain gradient, and after it the weights move by
//    -lr (c - c_k), outside the momentum buffer; c_k_new = c_k - c + (x_t - y) / (K lr);
//  - FedNova's normaliser a(tau, rho) is how far tau steps of momentum SGD move, in steps.
// Each against a double-precision reference written out here, on both gradient paths; and a
// small non-IID federation in which SCAFFOLD with momentum 0.9 converges, where the form that
// adds c - c_k to the gradient before momentum diverges.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "client/trainer.h"
#include "common/data/dataset.h"
#include "common/fednova.h"
#include "common/model/model.h"

namespace fedfleet::client {
namespace {

using GradientPath = Trainer::GradientPath;

// A logistic regression of 2 classes on 3 features: weight [2, 3], then bias [2].
constexpr int kDim = 3, kClasses = 2;
constexpr size_t kParams = kClasses * kDim + kClasses;

data::Dataset dataOf(const std::vector<std::vector<float>>& x, const std::vector<int>& y) {
  data::Dataset ds;
  ds.feature_dim = kDim;
  ds.num_classes = kClasses;
  for (const auto& row : x) ds.features.insert(ds.features.end(), row.begin(), row.end());
  for (int label : y) ds.labels.push_back(static_cast<data::Label>(label));
  return ds;
}

const data::Dataset& tinyData() {
  static const data::Dataset ds =
      dataOf({{1.0f, -2.0f, 0.5f}, {0.25f, 1.5f, -1.0f}, {-0.75f, 0.5f, 2.0f}}, {0, 1, 1});
  return ds;
}

std::vector<float> tinyStart() { return {0.2f, -0.1f, 0.3f, -0.4f, 0.25f, 0.05f, 0.1f, -0.2f}; }

// The gradient of the mean cross-entropy of `ds` at flat parameters w, and that loss.
std::vector<double> gradient(const data::Dataset& ds, const std::vector<double>& w,
                             double* loss = nullptr) {
  std::vector<double> g(kParams, 0.0);
  const size_t n = ds.size();
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    const float* x = ds.feature(i);
    double z[kClasses];
    for (int c = 0; c < kClasses; ++c) {
      z[c] = w[kClasses * kDim + c];
      for (int j = 0; j < kDim; ++j) z[c] += w[c * kDim + j] * x[j];
    }
    const double m = std::max(z[0], z[1]);
    const double sum = std::exp(z[0] - m) + std::exp(z[1] - m);
    total += -(z[ds.labels[i]] - m - std::log(sum));
    for (int c = 0; c < kClasses; ++c) {
      const double d = (std::exp(z[c] - m) / sum - (ds.labels[i] == c ? 1.0 : 0.0)) / n;
      for (int j = 0; j < kDim; ++j) g[c * kDim + j] += d * x[j];
      g[kClasses * kDim + c] += d;
    }
  }
  if (loss != nullptr) *loss = total / n;
  return g;
}

struct Hyper {
  double lr = 0.5, momentum = 0, weight_decay = 0, mu = 0;
  const std::vector<float>* c = nullptr;  // SCAFFOLD's c and c_k (null: off)
  const std::vector<float>* ck = nullptr;
  bool shift_in_gradient = false;  // SCAFFOLD's c - c_k through momentum (the form refused)
};

// `steps` full-batch steps of torch.optim.SGD (dampening 0, no Nesterov) from `start`:
//   d = g + mu (w - x_t) [+ (c - c_k) when shift_in_gradient] + weight_decay w
//   buf = d (first step), momentum buf + d (later); w -= lr buf
//   SCAFFOLD after the step (unless shift_in_gradient): w -= lr (c - c_k).
// Returns w - start.
std::vector<double> reference(const data::Dataset& ds, const std::vector<float>& start, int steps,
                              const Hyper& h) {
  std::vector<double> w(start.begin(), start.end()), buf(kParams, 0.0);
  for (int s = 0; s < steps; ++s) {
    const std::vector<double> g = gradient(ds, w);
    for (size_t i = 0; i < kParams; ++i) {
      const double shift = h.c != nullptr ? double((*h.c)[i]) - (*h.ck)[i] : 0.0;
      double d = g[i] + h.mu * (w[i] - start[i]) + h.weight_decay * w[i];
      if (h.shift_in_gradient) d += shift;
      buf[i] = s == 0 ? d : h.momentum * buf[i] + d;
      w[i] -= h.lr * (h.momentum != 0 ? buf[i] : d);
      if (!h.shift_in_gradient) w[i] -= h.lr * shift;
    }
  }
  for (size_t i = 0; i < kParams; ++i) w[i] -= start[i];
  return w;
}

TrainResult trainOnce(const data::Dataset& ds, const std::vector<float>& start, int steps,
                      const Hyper& h, GradientPath path) {
  auto m = model::createModel("logreg", 0, "", model::inputShapeOf(ds));
  EXPECT_TRUE(m.isOk()) << m.status().toString();
  TrainOptions o;
  o.max_steps = static_cast<uint32_t>(steps);
  o.batch_size = static_cast<uint32_t>(ds.size());  // full batches: the order does not matter
  o.lr = static_cast<float>(h.lr);
  o.momentum = static_cast<float>(h.momentum);
  o.weight_decay = static_cast<float>(h.weight_decay);
  o.prox_mu = static_cast<float>(h.mu);
  if (h.c != nullptr) o.scaffold = {h.c, h.ck};
  std::vector<uint32_t> all(ds.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint32_t>(i);
  auto r = Trainer(torch::kCPU, Trainer::BatchSource::kAuto, path).train(**m, start, ds, all, o);
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  return r.isOk() ? std::move(r).value() : TrainResult{};
}

const std::vector<float> kC = {0.05f, -0.02f, 0.1f, 0.03f, -0.07f, 0.2f, -0.15f, 0.04f};
const std::vector<float> kCk = {-0.03f, 0.06f, 0.01f, -0.12f, 0.02f, 0.05f, 0.08f, -0.1f};

class MomentumTest : public ::testing::TestWithParam<GradientPath> {};

TEST_P(MomentumTest, PlainMomentumAndWeightDecayMatchTheReference) {
  Hyper h;
  h.momentum = 0.9;
  h.weight_decay = 0.01;
  const TrainResult r = trainOnce(tinyData(), tinyStart(), 4, h, GetParam());
  const std::vector<double> ref = reference(tinyData(), tinyStart(), 4, h);
  ASSERT_EQ(r.delta.size(), kParams);
  for (size_t i = 0; i < kParams; ++i) EXPECT_NEAR(r.delta[i], ref[i], 2e-6) << i;
}

// FedProx: mu (w - x_t) enters the gradient, so it goes through momentum and weight decay.
TEST_P(MomentumTest, FedProxTermGoesThroughMomentumAndWeightDecay) {
  Hyper h;
  h.momentum = 0.9;
  h.weight_decay = 0.01;
  h.mu = 0.3;
  const TrainResult r = trainOnce(tinyData(), tinyStart(), 4, h, GetParam());
  const std::vector<double> ref = reference(tinyData(), tinyStart(), 4, h);
  Hyper plain = h;
  plain.mu = 0;
  const std::vector<double> without = reference(tinyData(), tinyStart(), 4, plain);
  double moved = 0;
  for (size_t i = 0; i < kParams; ++i) {
    EXPECT_NEAR(r.delta[i], ref[i], 2e-6) << i;
    moved = std::max(moved, std::abs(ref[i] - without[i]));
  }
  EXPECT_GT(moved, 1e-3);  // the term made a difference the test can see
}

// SCAFFOLD with momentum: the correction after the step, not through the momentum buffer. By
// hand on the first two steps (g_0, g_1 the plain gradients, s = c - c_k, rho = 0.9):
//   w_1 = w_0 - lr (g_0 + wd w_0) - lr s
//   w_2 = w_1 - lr (rho (g_0 + wd w_0) + g_1 + wd w_1) - lr s
// where adding s to the gradient would give w_2 another -lr rho s.
TEST_P(MomentumTest, ScaffoldCorrectionIsAppliedAfterTheOptimisersStep) {
  Hyper h;
  h.momentum = 0.9;
  h.weight_decay = 0.01;
  h.c = &kC;
  h.ck = &kCk;
  const std::vector<float> start = tinyStart();
  // Two steps, written out.
  std::vector<double> w0(start.begin(), start.end());
  const std::vector<double> g0 = gradient(tinyData(), w0);
  std::vector<double> w1(kParams), w2(kParams);
  for (size_t i = 0; i < kParams; ++i) {
    w1[i] = w0[i] - h.lr * (g0[i] + h.weight_decay * w0[i]) - h.lr * (kC[i] - double(kCk[i]));
  }
  const std::vector<double> g1 = gradient(tinyData(), w1);
  for (size_t i = 0; i < kParams; ++i) {
    const double buf =
        h.momentum * (g0[i] + h.weight_decay * w0[i]) + g1[i] + h.weight_decay * w1[i];
    w2[i] = w1[i] - h.lr * buf - h.lr * (kC[i] - double(kCk[i]));
  }
  const TrainResult two = trainOnce(tinyData(), start, 2, h, GetParam());
  ASSERT_EQ(two.delta.size(), kParams);
  Hyper through = h;
  through.shift_in_gradient = true;
  const std::vector<double> refused = reference(tinyData(), start, 2, through);
  double apart = 0;
  for (size_t i = 0; i < kParams; ++i) {
    EXPECT_NEAR(two.delta[i], w2[i] - w0[i], 2e-6) << i;
    apart = std::max(apart, std::abs(refused[i] - (w2[i] - w0[i])));
  }
  EXPECT_GT(apart, 1e-2);  // the two forms differ by lr rho s: visible
  // Longer runs follow the reference; Dc_k = c_k_new - c_k = -c + (x_t - y) / (K lr).
  const TrainResult six = trainOnce(tinyData(), start, 6, h, GetParam());
  const std::vector<double> ref = reference(tinyData(), start, 6, h);
  for (size_t i = 0; i < kParams; ++i) {
    EXPECT_NEAR(six.delta[i], ref[i], 5e-6) << i;
    const double ck_new = double(kCk[i]) - kC[i] - ref[i] / (6 * h.lr);
    EXPECT_NEAR(six.control_delta[i], ck_new - kCk[i], 1e-5) << i;
  }
}

// Without momentum the correction stays in the gradient (the paper's step): the same step, and
// the same bits as before the momentum form existed.
TEST_P(MomentumTest, ScaffoldWithPlainSgdKeepsThePapersStep) {
  Hyper h;
  h.weight_decay = 0.01;
  h.c = &kC;
  h.ck = &kCk;
  const TrainResult r = trainOnce(tinyData(), tinyStart(), 3, h, GetParam());
  Hyper through = h;
  through.shift_in_gradient = true;
  const std::vector<double> ref = reference(tinyData(), tinyStart(), 3, through);
  for (size_t i = 0; i < kParams; ++i) EXPECT_NEAR(r.delta[i], ref[i], 2e-6) << i;
}

INSTANTIATE_TEST_SUITE_P(Paths, MomentumTest,
                         ::testing::Values(GradientPath::kManual, GradientPath::kAutograd),
                         [](const auto& info) {
                           return info.param == GradientPath::kManual ? "manual" : "autograd";
                         });

// FedNova's normaliser a(tau, rho) = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho) is how
// many plain steps tau steps of momentum SGD move under a constant gradient: a TorchScript model
// whose loss is linear in its weight has one, and its delta is exactly -lr a g.
TEST(MomentumFedNova, TheNormaliserIsTheDistanceMomentumSgdMoves) {
  torch::jit::Module m("Linear");
  m.register_parameter("w", torch::zeros({3}).requires_grad_(true), false);
  m.define(R"(
def forward(self, x):
    return (x * self.w).sum(1, keepdim=True)

def loss(self, output, target):
    return output.squeeze(1)
)");
  const std::string path = std::string(FEDFLEET_TEST_TMP) + "/linear_loss.pt";
  m.save(path);
  data::Dataset ds;
  ds.feature_dim = 3;
  ds.num_classes = 2;
  ds.features = {1, 2, -1, 3, 0, 1};  // mean (2, 1, 0): the loss's gradient, always
  ds.labels = {0, 1};
  for (const double rho : {0.0, 0.5, 0.9}) {
    for (const uint32_t tau : {1u, 4u, 10u}) {
      auto model = model::createModel("torchscript", 0, path, model::inputShapeOf(ds));
      ASSERT_TRUE(model.isOk()) << model.status().toString();
      (*model)->setLoss(model::LossKind::kModule);
      TrainOptions o;
      o.max_steps = tau;
      o.batch_size = 2;
      o.lr = 0.1f;
      o.momentum = static_cast<float>(rho);
      auto r = Trainer(torch::kCPU).train(**model, {0, 0, 0}, ds, {0, 1}, o);
      ASSERT_TRUE(r.isOk()) << r.status().toString();
      const double a = fedNovaNormaliser(tau, rho);
      EXPECT_NEAR(r->delta[0], -0.1 * a * 2, 1e-5) << "rho " << rho << " tau " << tau;
      EXPECT_NEAR(r->delta[1], -0.1 * a * 1, 1e-5) << "rho " << rho << " tau " << tau;
      EXPECT_NEAR(r->delta[2], 0.0, 1e-7);
    }
  }
}

// A federation of two clients that each hold one class (label skew at its extreme), trained
// with SCAFFOLD option II, momentum 0.9 and 10 local steps a round. In the form of the
// reference code the loss on all data falls; adding c - c_k to the gradient before momentum
// (the form this trainer had) feeds the control variates ~1 / (1 - rho) times too much each
// round, and they and the model blow up.
struct Federation {
  double loss = 0;
  bool finite = true;
};

Federation federate(bool shift_in_gradient, int rounds) {
  const data::Dataset a =
      dataOf({{1.0f, 0.5f, -0.2f}, {1.5f, -0.5f, 0.3f}, {0.8f, 0.2f, 0.1f}}, {0, 0, 0});
  const data::Dataset b =
      dataOf({{-1.0f, 0.3f, 0.2f}, {-0.6f, -0.4f, -0.1f}, {-1.2f, 0.1f, 0.4f}}, {1, 1, 1});
  data::Dataset all = a;
  all.features.insert(all.features.end(), b.features.begin(), b.features.end());
  all.labels.insert(all.labels.end(), b.labels.begin(), b.labels.end());
  constexpr int kSteps = 10;
  std::vector<float> x(kParams, 0.0f), c(kParams, 0.0f);
  std::vector<std::vector<float>> ck(2, std::vector<float>(kParams, 0.0f));
  Hyper h;
  h.lr = 0.1;
  h.momentum = 0.9;
  for (int round = 0; round < rounds; ++round) {
    std::vector<double> mean_delta(kParams, 0.0), sum_dc(kParams, 0.0);
    for (int k = 0; k < 2; ++k) {
      const data::Dataset& ds = k == 0 ? a : b;
      Hyper hk = h;
      hk.c = &c;
      hk.ck = &ck[k];
      std::vector<double> delta(kParams), dc(kParams);
      if (shift_in_gradient) {
        hk.shift_in_gradient = true;
        delta = reference(ds, x, kSteps, hk);
        for (size_t i = 0; i < kParams; ++i) dc[i] = -double(c[i]) - delta[i] / (kSteps * h.lr);
      } else {
        const TrainResult r = trainOnce(ds, x, kSteps, hk, GradientPath::kAutograd);
        if (r.delta.size() != kParams) return {0, false};
        for (size_t i = 0; i < kParams; ++i) delta[i] = r.delta[i], dc[i] = r.control_delta[i];
      }
      for (size_t i = 0; i < kParams; ++i) {
        mean_delta[i] += delta[i] / 2;
        sum_dc[i] += dc[i];
        ck[k][i] = static_cast<float>(ck[k][i] + dc[i]);
      }
    }
    for (size_t i = 0; i < kParams; ++i) {
      x[i] = static_cast<float>(x[i] + mean_delta[i]);  // eta_g = 1
      c[i] = static_cast<float>(c[i] + sum_dc[i] / 2);  // |S| / N = 1
    }
  }
  Federation f;
  std::vector<double> w(x.begin(), x.end());
  gradient(all, w, &f.loss);
  for (float v : x) f.finite = f.finite && std::isfinite(v) && std::abs(v) < 1e6;
  f.finite = f.finite && std::isfinite(f.loss);
  return f;
}

TEST(MomentumScaffold, ConvergesWhereTheCorrectionThroughMomentumDiverges) {
  const double initial = std::log(2.0);  // x = 0: both classes equally likely
  const Federation fixed = federate(/*shift_in_gradient=*/false, 20);
  ASSERT_TRUE(fixed.finite);
  EXPECT_LT(fixed.loss, 0.25 * initial) << "the reference form should learn this problem";
  const Federation through = federate(/*shift_in_gradient=*/true, 20);
  EXPECT_TRUE(!through.finite || through.loss > initial)
      << "the form through momentum was expected to diverge; loss " << through.loss;
}

}  // namespace
}  // namespace fedfleet::client
