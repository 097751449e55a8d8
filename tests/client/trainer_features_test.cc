// Trainer on feature-vector data sets: FedProx's Synthetic(alpha, beta) and hand-made ones.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "client/trainer.h"
#include "common/data/dataset.h"
#include "common/data/synthetic.h"
#include "common/model/evaluate.h"
#include "common/model/model.h"

namespace fedfleet::client {
namespace {

std::vector<uint32_t> range(uint32_t n) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), 0u);
  return v;
}

std::unique_ptr<model::Model> mustCreateFor(const std::string& name, uint64_t seed,
                                            const data::Dataset& ds) {
  auto m = model::createModel(name, seed, "", model::inputShapeOf(ds));
  EXPECT_TRUE(m.isOk()) << m.status().toString();
  return m.isOk() ? std::move(m).value() : nullptr;
}

double majorityShare(const data::Dataset& ds) {
  std::vector<size_t> counts(ds.num_classes, 0);
  for (uint8_t l : ds.labels) ++counts[l];
  return static_cast<double>(*std::max_element(counts.begin(), counts.end())) /
         static_cast<double>(ds.size());
}

TEST(TrainerFeaturesTest, LogisticRegressionLearnsASyntheticDevice) {
  // y = argmax(x W + b) is linear in x, so a logistic regression can learn it. Take the largest
  // of the first 30 devices whose labels are not dominated by one class (majority < 60%), so that
  // the accuracy it reaches says something beyond "always predict the majority".
  data::SyntheticSpec spec;
  spec.max_samples = 3000;
  auto fed = data::SyntheticFederation::create(spec);
  ASSERT_TRUE(fed.isOk()) << fed.status().toString();
  uint64_t best = spec.devices;
  data::Dataset train, test;
  for (uint64_t k = 0; k < spec.devices; ++k) {
    if (fed->trainSamples(k) < 500) continue;
    if (best < spec.devices && fed->trainSamples(k) <= fed->trainSamples(best)) continue;
    auto tr = fed->generate(k, true);
    ASSERT_TRUE(tr.isOk());
    if (majorityShare(*tr) >= 0.6) continue;
    best = k;
    train = std::move(tr).value();
  }
  ASSERT_LT(best, spec.devices) << "no device of 500+ samples with a majority under 60%";
  auto te = fed->generate(best, false);
  ASSERT_TRUE(te.isOk());
  test = std::move(te).value();

  auto m = mustCreateFor("logreg", 1, train);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->numParameters(), 60u * 10 + 10);
  auto before = model::evaluate(*m, test);
  ASSERT_TRUE(before.isOk()) << before.status().toString();
  Trainer trainer(torch::kCPU);
  TrainOptions opts;
  opts.epochs = 20;
  opts.batch_size = 32;
  opts.lr = 0.05f;
  auto r = trainer.train(*m, m->flatParameters(), train, range(train.size()), opts);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->n_samples, 20 * train.size());
  auto after = model::evaluate(*m, test);
  ASSERT_TRUE(after.isOk()) << after.status().toString();
  const double majority = majorityShare(test);
  RecordProperty("device", std::to_string(best));
  RecordProperty("accuracy", std::to_string(after->accuracy.value()));
  EXPECT_GT(after->accuracy, 0.5);
  EXPECT_GT(after->accuracy, majority + 0.15) << "majority share " << majority;
  EXPECT_LT(after->loss, before->loss);
}

// Random features, labels a fixed linear rule of them.
data::Dataset linearFeatures(size_t n, uint32_t dim, uint32_t classes) {
  data::Dataset ds;
  ds.feature_dim = dim;
  ds.num_classes = classes;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal(0, 1);
  ds.features.resize(n * dim);
  for (auto& v : ds.features) v = normal(rng);
  for (size_t i = 0; i < n; ++i) {
    const float* x = ds.feature(i);
    ds.labels.push_back(static_cast<uint8_t>((x[0] > 0) + 2 * (x[1] > x[2])) % classes);
  }
  return ds;
}

TEST(TrainerFeaturesTest, DeviceShardPathGivesTheSameBits) {
  const auto ds = linearFeatures(230, 12, 4);
  TrainOptions opts;
  opts.epochs = 2;
  opts.batch_size = 25;
  opts.seed = 3;
  std::vector<uint32_t> idx;  // a scattered subset, to exercise the gather
  for (uint32_t i = 0; i < ds.size(); i += 3) idx.push_back(i);
  auto run = [&](Trainer::BatchSource source) {
    auto m = mustCreateFor("mlp", 8, ds);
    Trainer trainer(torch::kCPU, source);
    auto r = trainer.train(*m, m->flatParameters(), ds, idx, opts);
    EXPECT_TRUE(r.isOk()) << r.status().toString();
    return std::move(r).value();
  };
  const TrainResult host = run(Trainer::BatchSource::kHostGather);
  const TrainResult shard = run(Trainer::BatchSource::kDeviceShard);
  EXPECT_EQ(host.delta, shard.delta);
  EXPECT_EQ(host.mean_loss, shard.mean_loss);
  EXPECT_EQ(host.n_samples, shard.n_samples);
  EXPECT_NE(host.delta, std::vector<float>(host.delta.size(), 0.0f));
}

TEST(TrainerFeaturesTest, RejectsBadStorageAndMismatchedModels) {
  const auto ds = linearFeatures(40, 6, 4);
  Trainer trainer(torch::kCPU);
  TrainOptions opts;
  opts.max_steps = 2;
  auto m = mustCreateFor("logreg", 0, ds);
  ASSERT_NE(m, nullptr);
  const auto start = m->flatParameters();
  ASSERT_TRUE(trainer.train(*m, start, ds, range(40), opts).isOk());

  for (auto source : {Trainer::BatchSource::kHostGather, Trainer::BatchSource::kDeviceShard}) {
    Trainer t(torch::kCPU, source);
    auto broken = ds;
    broken.features.pop_back();  // one float short of 40 x 6
    auto r = t.train(*m, start, broken, range(40), opts);
    ASSERT_FALSE(r.isOk());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

    // A model for Fashion-MNIST cannot take 6 features: LibTorch's error comes back as a Status.
    auto images_model = model::createModel("logreg", 0);
    ASSERT_TRUE(images_model.isOk());
    auto bad = t.train(**images_model, (*images_model)->flatParameters(), ds, range(40), opts);
    ASSERT_FALSE(bad.isOk());
    EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
  }
}

}  // namespace
}  // namespace fedfleet::client
