// Training by train.loss = "mse": one SGD step against the gradient computed by hand, and a
// regression that learns its line.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "client/trainer.h"
#include "common/data/dataset.h"
#include "common/model/evaluate.h"
#include "common/model/model.h"
#include "tests/common/model/regression_set.h"

namespace fedfleet::client {
namespace {

using model::createModel;
using model::InputShape;
using model::LossKind;

using fedfleet::testing::regressionSet;

TEST(Loss, OneSgdStepOnMseIsTheHandComputedGradientStep) {
  auto m = createModel("logreg", 5, "", InputShape{{2}, 1});
  ASSERT_TRUE(m.isOk());
  (*m)->setLoss(LossKind::kMse);
  const std::vector<float> start = (*m)->flatParameters();  // w0, w1, b
  ASSERT_EQ(start.size(), 3u);
  const data::Dataset ds = regressionSet({{1, 0}, {0, 1}, {1, 1}, {2, -1}}, {1, 2, 5, -3});
  Trainer trainer(c10::kCPU);
  TrainOptions opts;
  opts.epochs = 1;
  opts.batch_size = 4;  // one step over every sample: the order does not matter
  opts.lr = 0.1f;
  auto r = trainer.train(**m, start, ds, {0, 1, 2, 3}, opts);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  // L = 1/N sum (w.x + b - y)^2: dL/dw = 2/N sum e x, dL/db = 2/N sum e.
  double gw0 = 0, gw1 = 0, gb = 0, loss = 0;
  for (size_t i = 0; i < 4; ++i) {
    const double x0 = ds.feature(i)[0], x1 = ds.feature(i)[1];
    const double e = start[0] * x0 + start[1] * x1 + start[2] - ds.targets[i];
    gw0 += 2 * e * x0 / 4;
    gw1 += 2 * e * x1 / 4;
    gb += 2 * e / 4;
    loss += e * e / 4;
  }
  ASSERT_EQ(r->delta.size(), 3u);
  EXPECT_NEAR(r->delta[0], -0.1 * gw0, 1e-5);
  EXPECT_NEAR(r->delta[1], -0.1 * gw1, 1e-5);
  EXPECT_NEAR(r->delta[2], -0.1 * gb, 1e-5);
  EXPECT_NEAR(r->mean_loss, loss, 1e-4);
}

TEST(Loss, TrainingARegressionLowersItsError) {
  // y = 2 x0 - x1 + 0.5 on a grid.
  std::vector<std::array<float, 2>> x;
  std::vector<float> y;
  for (int i = 0; i < 10; ++i) {
    for (int j = 0; j < 10; ++j) {
      x.push_back({i / 10.0f, j / 10.0f});
      y.push_back(2 * (i / 10.0f) - j / 10.0f + 0.5f);
    }
  }
  const data::Dataset ds = regressionSet(x, y);
  auto m = createModel("mlp", 2, "", InputShape{{2}, 1});
  ASSERT_TRUE(m.isOk());
  (*m)->setLoss(LossKind::kMse);
  auto before = model::evaluate(**m, ds);
  ASSERT_TRUE(before.isOk());
  std::vector<uint32_t> all(ds.size());
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  Trainer trainer(c10::kCPU);
  TrainOptions opts;
  opts.epochs = 30;
  opts.batch_size = 10;
  opts.lr = 0.05f;
  std::vector<float> params = (*m)->flatParameters();
  auto r = trainer.train(**m, params, ds, all, opts);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  for (size_t i = 0; i < params.size(); ++i) params[i] += r->delta[i];
  ASSERT_TRUE((*m)->setFlatParameters(params).isOk());
  auto after = model::evaluate(**m, ds);
  ASSERT_TRUE(after.isOk());
  EXPECT_LT(*after->mse, 0.05 * *before->mse) << *before->mse << " -> " << *after->mse;
}

}  // namespace
}  // namespace fedfleet::client
