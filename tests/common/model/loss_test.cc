// train.loss and the metrics beside it: each loss's per-sample values, the evaluation's MSE, MAE
// and accuracy, a module's own loss() and metrics(), the start-up checks of a loss against the
// data (training by these losses: tests/client/trainer_regression_test.cc).
#include "common/model/loss.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/data/dataset.h"
#include "common/model/evaluate.h"
#include "common/model/model.h"
#include "tests/common/model/regression_set.h"

namespace fedfleet::model {
namespace {

using ::testing::HasSubstr;

// Feature vectors of two values, one float target each.
using fedfleet::testing::regressionSet;

data::Dataset labelledSet(const std::vector<std::array<float, 2>>& x,
                          const std::vector<data::Label>& y, uint32_t classes) {
  data::Dataset ds;
  ds.feature_dim = 2;
  ds.num_classes = classes;
  for (const auto& row : x) ds.features.insert(ds.features.end(), row.begin(), row.end());
  ds.labels = y;
  return ds;
}

// A TorchScript module with parameter w = [1] and forward x.sum(1, keepdim=True) * w (one
// output a sample), plus the extra methods given; saved from C++ (no Python needed).
std::unique_ptr<Model> sumModule(const std::string& name, const std::string& extra = "") {
  torch::jit::Module m("SumModule");
  m.register_parameter("w", torch::ones({1}), /*is_buffer=*/false);
  m.define("def forward(self, x):\n    return x.sum(1, keepdim=True) * self.w\n" + extra);
  const std::string path =
      std::string(FEDFLEET_TEST_TMP) + "/loss_" + name + "." + std::to_string(::getpid()) + ".pt";
  m.save(path);
  auto model = createModel("torchscript", 0, path);
  EXPECT_TRUE(model.isOk()) << model.status().toString();
  return model.isOk() ? std::move(*model) : nullptr;
}

// Outputs 1, 1, 2 against targets 1, 2, 5: errors 0, -1, -3.
const data::Dataset kRegression = regressionSet({{1, 0}, {0, 1}, {1, 1}}, {1, 2, 5});

TEST(Loss, MseEvaluationGivesTheHandComputedMseAndMaeAndNoAccuracy) {
  auto m = sumModule("mse");
  ASSERT_NE(m, nullptr);
  m->setLoss(LossKind::kMse);
  for (size_t batch : {1, 2, 3}) {
    auto r = evaluate(*m, kRegression, 0, batch);
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    EXPECT_EQ(r->n, 3u);
    EXPECT_NEAR(r->loss, 10.0 / 3, 1e-6) << batch;
    ASSERT_TRUE(r->mse && r->mae);
    EXPECT_NEAR(*r->mse, 10.0 / 3, 1e-6);
    EXPECT_NEAR(*r->mae, 4.0 / 3, 1e-6);
    EXPECT_FALSE(r->accuracy) << "a regression by mse has no accuracy";
    EXPECT_TRUE(r->custom.empty());
  }
}

TEST(Loss, BceOnZeroOneLabelsIsTheLogisticLossAndCountsSignsAsPredictions) {
  auto m = sumModule("bce");
  ASSERT_NE(m, nullptr);
  m->setLoss(LossKind::kBce);
  // Logits 2, -1, 0.5 against labels 1, 1, 0.
  const data::Dataset ds = labelledSet({{2, 0}, {-1, 0}, {0.5f, 0}}, {1, 1, 0}, 2);
  auto r = evaluate(*m, ds, 0, 2);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  const double expected =
      (std::log1p(std::exp(-2.0)) + std::log1p(std::exp(1.0)) + std::log1p(std::exp(0.5))) / 3;
  EXPECT_NEAR(r->loss, expected, 1e-6);
  ASSERT_TRUE(r->accuracy);
  EXPECT_NEAR(*r->accuracy, 1.0 / 3, 1e-9) << "only 2 > 0 with label 1 is right";
  EXPECT_FALSE(r->mse);
}

TEST(Loss, AModulesOwnLossAndMetricsAreUsedAndTheMetricSumsAddUpOverBatches) {
  auto m = sumModule("module",
                     "def loss(self, output, target):\n"
                     "    return 0.5 * ((output - target) ** 2).sum(1)\n"
                     "def metrics(self, output, target):\n"
                     "    return {'abs_err': (output - target).abs().sum(),\n"
                     "            'big': ((output - target).abs() > 2.0).sum().float()}\n");
  ASSERT_NE(m, nullptr);
  m->setLoss(LossKind::kModule);
  for (size_t batch : {1, 2, 3}) {
    auto r = evaluate(*m, kRegression, 0, batch);
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    EXPECT_NEAR(r->loss, 5.0 / 3, 1e-6) << "half the mean squared error";
    ASSERT_EQ(r->custom.size(), 2u);
    EXPECT_EQ(r->custom[0].first, "abs_err");
    EXPECT_NEAR(r->custom[0].second, 4.0 / 3, 1e-6) << batch;
    EXPECT_EQ(r->custom[1].first, "big");
    EXPECT_NEAR(r->custom[1].second, 1.0 / 3, 1e-6) << "one sample of three errs by > 2";
  }
  // A loss that gives the batch's mean: every sample of a batch is given it.
  auto mean = sumModule("mean",
                        "def loss(self, output, target):\n"
                        "    return ((output - target) ** 2).mean()\n");
  ASSERT_NE(mean, nullptr);
  mean->setLoss(LossKind::kModule);
  auto r = evaluate(*mean, kRegression, 0, 2);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_NEAR(r->loss, (2 * 0.5 + 9.0) / 3, 1e-6) << "batches {0, -1} and {-3}";
}

TEST(Loss, PerSampleLossesMatchTheirDefinitions) {
  auto m = sumModule("per_sample");
  ASSERT_NE(m, nullptr);
  const at::Tensor logits = torch::tensor({{2.0f, 0.0f}, {0.0f, 1.0f}});
  const at::Tensor labels = torch::tensor({0, 0}, torch::kLong);
  const at::Tensor ce = perSampleLoss(LossKind::kCrossEntropy, *m, logits, labels);
  EXPECT_NEAR(ce[0].item<float>(), std::log(1 + std::exp(-2.0)), 1e-6);
  EXPECT_NEAR(ce[1].item<float>(), std::log(1 + std::exp(1.0)), 1e-6);
  const at::Tensor targets = torch::tensor({{1.0f, 1.0f}, {0.5f, 0.0f}});
  const at::Tensor mse = perSampleLoss(LossKind::kMse, *m, logits, targets);
  EXPECT_NEAR(mse[0].item<float>(), (1.0 + 1.0) / 2, 1e-6) << "averaged over the outputs";
  EXPECT_NEAR(mse[1].item<float>(), (0.25 + 1.0) / 2, 1e-6);
  // Shapes that do not fit throw, naming them.
  EXPECT_THROW(perSampleLoss(LossKind::kMse, *m, logits, torch::ones({2, 3})), c10::Error);
  EXPECT_THROW(perSampleLoss(LossKind::kCrossEntropy, *m, logits, targets), c10::Error);
  EXPECT_THROW(perSampleLoss(LossKind::kModule, *m, logits, labels), c10::Error)
      << "a built-in-like module without loss()";
}

TEST(Loss, TheStartUpCheckRefusesALossThatDoesNotFitTheData) {
  auto mlp = createModel("mlp", 1, "", InputShape{{2}, 1});
  ASSERT_TRUE(mlp.isOk());
  (*mlp)->setLoss(LossKind::kCrossEntropy);
  Status ce = checkModelFitsData(**mlp, kRegression, "'mlp'", "'r.csv'");
  EXPECT_THAT(ce.message(), HasSubstr("needs class labels, but 'r.csv' holds float targets"));
  (*mlp)->setLoss(LossKind::kMse);
  EXPECT_TRUE(checkModelFitsData(**mlp, kRegression, "'mlp'", "'r.csv'").isOk());

  auto two = createModel("mlp", 1, "", InputShape{{2}, 2});
  ASSERT_TRUE(two.isOk());
  (*two)->setLoss(LossKind::kMse);
  Status outputs = checkModelFitsData(**two, kRegression, "'mlp'", "'r.csv'");
  EXPECT_THAT(outputs.message(), HasSubstr("gives an output of shape [3, 2], not [3, 1]"));

  (*two)->setLoss(LossKind::kBce);
  const data::Dataset three = labelledSet({{1, 0}, {0, 1}, {1, 1}}, {0, 1, 2}, 3);
  EXPECT_THAT(checkModelFitsData(**two, three, "'mlp'", "'c.csv'").message(),
              HasSubstr("needs two classes (0 and 1), but 'c.csv' has 3"));
  (*mlp)->setLoss(LossKind::kBce);
  EXPECT_THAT(checkModelFitsData(**mlp, kRegression, "'mlp'", "'r.csv'").message(),
              HasSubstr("needs targets in [0, 1], but sample 1 of 'r.csv' has 2"));
  (*mlp)->setLoss(LossKind::kMse);
  EXPECT_THAT(checkModelFitsData(**mlp, three, "'mlp'", "'c.csv'").message(),
              HasSubstr("\"mse\" needs float targets, but 'c.csv' holds class labels"));

  auto bad = sumModule("bad_loss",
                       "def loss(self, output, target):\n"
                       "    return output[0:2, 0]\n");
  ASSERT_NE(bad, nullptr);
  bad->setLoss(LossKind::kModule);
  Status st = checkModelFitsData(*bad, kRegression, "'torchscript'", "'r.csv'");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("train.loss = \"module\" on the model's output [3, 1]"));
  EXPECT_THAT(st.message(), HasSubstr("one value (the batch's mean) or one per sample [3]"));
}

}  // namespace
}  // namespace fedfleet::model
