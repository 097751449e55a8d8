// Models with state that is not parameters: a TorchScript module with a batch norm carries its
// running mean and variance in the flat model (after the parameters, num_batches_tracked
// left out), training updates them, and FedAvg averages them with the updates' weights: the
// global statistics are the sample-weighted means of the clients', checked here against
// values computed by hand from the clients' data.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include "client/trainer.h"
#include "common/data/dataset.h"
#include "common/model/model.h"
#include "tests/engine/round_engine_fixture.h"
#include "tests/integration/batchnorm_module.h"

namespace fedfleet {
namespace {

constexpr int kFeatures = 4;

std::string writeBatchNormModule() {
  return testing::writeBatchNormModule(
      std::string(FEDFLEET_TEST_TMP) + "/batchnorm." + std::to_string(::getpid()) + ".pt",
      kFeatures, 3);
}

// `n` samples, feature j of sample i = (i + 1) * (j + 1) + offset; labels i % 3.
data::Dataset samples(int n, float offset) {
  data::Dataset ds;
  ds.feature_dim = kFeatures;
  ds.num_classes = 3;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < kFeatures; ++j) ds.features.push_back((i + 1) * (j + 1) + offset);
    ds.labels.push_back(static_cast<uint8_t>(i % 3));
  }
  return ds;
}

// After one training step on the whole of `ds` from mean 0 and variance 1: running_mean =
// 0.1 * batch mean, running_var = 0.9 + 0.1 * unbiased batch variance, per feature.
std::pair<std::vector<double>, std::vector<double>> statsAfterOneStep(const data::Dataset& ds) {
  std::vector<double> mean(kFeatures), var(kFeatures);
  const int n = static_cast<int>(ds.size());
  for (int j = 0; j < kFeatures; ++j) {
    double s = 0;
    for (int i = 0; i < n; ++i) s += ds.features[i * kFeatures + j];
    const double mu = s / n;
    double ss = 0;
    for (int i = 0; i < n; ++i)
      ss += (ds.features[i * kFeatures + j] - mu) * (ds.features[i * kFeatures + j] - mu);
    mean[j] = 0.1 * mu;
    var[j] = 0.9 + 0.1 * ss / (n - 1);
  }
  return {mean, var};
}

TEST(BatchNormBuffers, RunningStatisticsTravelAndAreAveragedWithTheUpdatesWeights) {
  auto model = model::createModel("torchscript", 0, writeBatchNormModule());
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  model::Model& m = **model;

  // The layout: the parameters, then the floating-point buffers; the integer count stays out.
  const model::Layout layout = m.layout();
  ASSERT_EQ(layout.tensors.size(), 4u);
  EXPECT_EQ(layout.tensors[0].name, "w");
  EXPECT_FALSE(layout.tensors[0].buffer);
  EXPECT_EQ(layout.tensors[2].name, "running_mean");
  EXPECT_TRUE(layout.tensors[2].buffer);
  EXPECT_EQ(layout.tensors[2].offset, 15u);
  EXPECT_EQ(layout.tensors[3].name, "running_var");
  EXPECT_EQ(layout.total, 23u);
  const std::vector<float> start = m.flatParameters();
  ASSERT_EQ(start.size(), 23u);
  EXPECT_EQ(start[15], 0.0f);
  EXPECT_EQ(start[19], 1.0f);

  // Two clients of 3 and 5 samples, one step each over all their samples.
  const data::Dataset a = samples(3, 0.0f), b = samples(5, 2.0f);
  client::TrainOptions o;
  o.batch_size = 8;
  o.lr = 0.01f;
  std::vector<std::vector<float>> deltas;
  for (const data::Dataset* ds : {&a, &b}) {
    std::vector<uint32_t> all(ds->size());
    std::iota(all.begin(), all.end(), 0u);
    client::Trainer trainer(c10::kCPU);
    auto r = trainer.train(m, start, *ds, all, o);
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    ASSERT_EQ(r->steps, 1u);
    const auto [mean, var] = statsAfterOneStep(*ds);
    for (int j = 0; j < kFeatures; ++j) {
      EXPECT_NEAR(r->delta[15 + j], mean[j], 1e-5) << "running_mean " << j;
      EXPECT_NEAR(r->delta[19 + j], var[j] - 1.0, 1e-4) << "running_var " << j;
    }
    deltas.push_back(r->delta);
  }

  // FedAvg over the engine: weights 3 and 5.
  engine::engine_test::Fixture f(engine::engine_test::baseOptions(2, 2, 2), start);
  const engine::CommitRound commit = engine::engine_test::oneRound(
      f, {"a", "b"}, {{"a", deltas[0], 3, 1}, {"b", deltas[1], 5, 1}});
  ASSERT_EQ(commit.round.status, "ok");
  const std::vector<float>& global = f.engine->params();
  const auto [mean_a, var_a] = statsAfterOneStep(a);
  const auto [mean_b, var_b] = statsAfterOneStep(b);
  for (int j = 0; j < kFeatures; ++j) {
    EXPECT_NEAR(global[15 + j], (3 * mean_a[j] + 5 * mean_b[j]) / 8, 1e-5) << "mean " << j;
    EXPECT_NEAR(global[19 + j], (3 * var_a[j] + 5 * var_b[j]) / 8, 1e-4) << "var " << j;
  }

  // The model the server evaluates holds the federated statistics.
  ASSERT_TRUE(m.setFlatParameters(global).isOk());
  const std::vector<at::Tensor> bufs = m.buffers();
  ASSERT_EQ(bufs.size(), 2u);
  for (int j = 0; j < kFeatures; ++j) {
    EXPECT_FLOAT_EQ(bufs[0][j].item<float>(), global[15 + j]);
    EXPECT_FLOAT_EQ(bufs[1][j].item<float>(), global[19 + j]);
  }
}

// PyTorch's batch norm refuses a batch of one sample in training: a pass whose last batch would
// hold one sample folds it into the batch before (9 samples in batches of 4: 4 and 5), so every
// sample is trained on and nothing fails.
TEST(BatchNormBuffers, APassNeverEndsWithABatchOfOneSample) {
  auto model = model::createModel("torchscript", 0, writeBatchNormModule());
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  const data::Dataset ds = samples(9, 0.0f);
  std::vector<uint32_t> all(ds.size());
  std::iota(all.begin(), all.end(), 0u);
  client::TrainOptions o;
  o.batch_size = 4;
  o.epochs = 2;
  client::Trainer trainer(c10::kCPU);
  auto r = trainer.train(**model, (*model)->flatParameters(), ds, all, o);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->steps, 4u);
  EXPECT_EQ(r->n_samples, 18u);

  // A built-in model (no buffers) keeps its batch of one: 3 steps a pass.
  auto logreg = model::createModel("logreg", 1, "", model::InputShape{{kFeatures}, 3});
  ASSERT_TRUE(logreg.isOk());
  auto plain = trainer.train(**logreg, (*logreg)->flatParameters(), ds, all, o);
  ASSERT_TRUE(plain.isOk());
  EXPECT_EQ(plain->steps, 6u);
}

}  // namespace
}  // namespace fedfleet
