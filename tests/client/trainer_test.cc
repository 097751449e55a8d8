#include "client/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <thread>

#include "common/data/dataset.h"
#include "common/model/batch.h"
#include "common/model/evaluate.h"
#include "common/model/model.h"

namespace fedfleet::client {
namespace {

std::vector<uint32_t> range(uint32_t n) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), 0u);
  return v;
}

std::unique_ptr<model::Model> mustCreate(const std::string& name, uint64_t seed) {
  auto m = model::createModel(name, seed);
  EXPECT_TRUE(m.isOk()) << m.status().toString();
  return m.isOk() ? std::move(m).value() : nullptr;
}

class TrainerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto train = data::loadFashionMnist(data::defaultFashionMnistDir(), true, 2000);
    auto test = data::loadFashionMnist(data::defaultFashionMnistDir(), false, 1000);
    if (train.isOk() && test.isOk()) {
      train_ = new data::Dataset(std::move(train).value());
      test_ = new data::Dataset(std::move(test).value());
    }
  }
  static void TearDownTestSuite() {
    delete train_;
    delete test_;
    train_ = test_ = nullptr;
  }
  void SetUp() override {
    if (train_ == nullptr) GTEST_SKIP() << "Fashion-MNIST not installed";
  }
  static data::Dataset* train_;
  static data::Dataset* test_;
};
data::Dataset* TrainerTest::train_ = nullptr;
data::Dataset* TrainerTest::test_ = nullptr;

TEST_F(TrainerTest, MlpLearnsFashionMnist) {
  auto m = mustCreate("mlp", 1);
  ASSERT_NE(m, nullptr);
  const auto start = m->flatParameters();
  auto before = model::evaluate(*m, *test_);
  ASSERT_TRUE(before.isOk());
  TrainOptions opts;
  opts.epochs = 2;
  opts.batch_size = 32;
  opts.lr = 0.05f;
  Trainer trainer(torch::kCPU);
  auto r = trainer.train(*m, start, *train_, range(2000), opts);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  auto after = model::evaluate(*m, *test_);
  ASSERT_TRUE(after.isOk());
  // A classifier's evaluation has an accuracy; without one the comparisons below would hold for
  // an empty optional.
  ASSERT_TRUE(before->accuracy.has_value());
  ASSERT_TRUE(after->accuracy.has_value());
  std::printf("mlp, 2000 samples, 2 epochs: accuracy %.3f -> %.3f, train loss %.3f, %.2f s\n",
              *before->accuracy, *after->accuracy, r->mean_loss, r->compute_seconds);
  EXPECT_LT(*before->accuracy, 0.25);
  EXPECT_GT(*after->accuracy, 0.60);
  EXPECT_EQ(r->n_samples, 4000u);
  EXPECT_EQ(r->steps, 2u * 63u);  // ceil(2000 / 32) = 63 per epoch
  EXPECT_FALSE(r->stopped_early);
  EXPECT_GT(r->compute_seconds, 0.0);
  EXPECT_LT(r->mean_loss, 1.5);
  EXPECT_GT(r->sum_sq_loss, 0.0);
}

TEST_F(TrainerTest, DeterministicForASeed) {
  Trainer trainer(torch::kCPU);
  TrainOptions opts;
  opts.epochs = 1;
  opts.batch_size = 16;
  opts.momentum = 0.9f;
  opts.seed = 77;
  const auto idx = range(300);
  auto run = [&](uint64_t seed) {
    auto m = mustCreate("lenet", 4);
    const auto start = m->flatParameters();
    opts.seed = seed;
    auto r = trainer.train(*m, start, *train_, idx, opts);
    EXPECT_TRUE(r.isOk()) << r.status().toString();
    return std::move(r).value();
  };
  const TrainResult a = run(77), b = run(77), c = run(78);
  EXPECT_EQ(a.delta, b.delta);  // bitwise
  EXPECT_EQ(a.mean_loss, b.mean_loss);
  EXPECT_EQ(a.sum_sq_loss, b.sum_sq_loss);
  EXPECT_NE(a.delta, c.delta);
}

TEST_F(TrainerTest, DeltaIsAfterMinusStartExactly) {
  auto m = mustCreate("mlp", 2);
  // Start somewhere other than the model's current weights: train() must load `start`.
  std::vector<float> start = m->flatParameters();
  for (auto& v : start) v *= 0.5f;
  Trainer trainer(torch::kCPU);
  TrainOptions opts;
  opts.max_steps = 5;
  auto r = trainer.train(*m, start, *train_, range(500), opts);
  ASSERT_TRUE(r.isOk());
  const auto after = m->flatParameters();
  ASSERT_EQ(r->delta.size(), after.size());
  size_t changed = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    ASSERT_EQ(r->delta[i], after[i] - start[i]) << i;
    changed += r->delta[i] != 0.0f;
  }
  EXPECT_GT(changed, after.size() / 10);
}

TEST_F(TrainerTest, DeltaOnDeviceIsIgnoredOnTheCpu) {
  auto m = mustCreate("logreg", 2);
  const std::vector<float> start = m->flatParameters();
  Trainer trainer(torch::kCPU);
  TrainOptions opts;
  opts.max_steps = 3;
  opts.delta_on_device = true;
  auto r = trainer.train(*m, start, *train_, range(200), opts);
  ASSERT_TRUE(r.isOk());
  EXPECT_FALSE(r->device_delta.defined());
  const auto after = m->flatParameters();
  ASSERT_EQ(r->delta.size(), after.size());
  for (size_t i = 0; i < after.size(); ++i) ASSERT_EQ(r->delta[i], after[i] - start[i]) << i;
}

TEST_F(TrainerTest, DeltaOnDeviceStaysOnTheGpuWithTheHostsValues) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "LibTorch sees no CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  auto m = mustCreate("cnn", 2);
  std::vector<float> start = m->flatParameters();
  for (auto& v : start) v *= 0.5f;
  Trainer trainer(cuda);
  TrainOptions opts;
  opts.max_steps = 4;
  opts.delta_on_device = true;
  auto r = trainer.train(*m, start, *train_, range(300), opts);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_TRUE(r->delta.empty());
  ASSERT_TRUE(r->device_delta.defined());
  EXPECT_TRUE(r->device_delta.is_cuda());
  EXPECT_TRUE(r->device_delta.is_contiguous());
  const auto after = m->flatParameters();  // the trained model, copied to the host
  ASSERT_EQ(static_cast<size_t>(r->device_delta.numel()), after.size());
  const at::Tensor host = r->device_delta.cpu();
  const float* d = host.data_ptr<float>();
  size_t changed = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    ASSERT_EQ(d[i], after[i] - start[i]) << i;  // one IEEE subtraction, on either side
    changed += d[i] != 0.0f;
  }
  EXPECT_GT(changed, after.size() / 10);

  // SCAFFOLD's control delta is computed on the host: the delta comes back there.
  std::vector<float> c(start.size(), 0.0f), ck(start.size(), 0.0f);
  opts.scaffold = {&c, &ck};
  auto s = trainer.train(*m, start, *train_, range(300), opts);
  ASSERT_TRUE(s.isOk()) << s.status().toString();
  EXPECT_FALSE(s->device_delta.defined());
  EXPECT_EQ(s->delta.size(), start.size());
}

TEST_F(TrainerTest, CountsStepsAndSamples) {
  Trainer trainer(torch::kCPU);
  auto m = mustCreate("logreg", 0);
  const auto start = m->flatParameters();
  TrainOptions opts;
  opts.batch_size = 32;
  opts.epochs = 3;
  auto r = trainer.train(*m, start, *train_, range(100), opts);
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(r->steps, 12u);  // 4 steps per pass (32, 32, 32, 4)
  EXPECT_EQ(r->n_samples, 300u);

  opts.max_steps = 10;  // two full passes (8 steps, 200 samples) and 2 more batches
  r = trainer.train(*m, start, *train_, range(100), opts);
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(r->steps, 10u);
  EXPECT_EQ(r->n_samples, 264u);
  EXPECT_FALSE(r->stopped_early);

  opts.max_steps = 3;  // fewer than one pass
  r = trainer.train(*m, start, *train_, range(100), opts);
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(r->steps, 3u);
  EXPECT_EQ(r->n_samples, 96u);
}

TEST_F(TrainerTest, StopFlagSetBeforeStart) {
  Trainer trainer(torch::kCPU);
  auto m = mustCreate("mlp", 0);
  const auto start = m->flatParameters();
  std::atomic<bool> stop{true};
  auto r = trainer.train(*m, start, *train_, range(500), TrainOptions{}, &stop);
  ASSERT_TRUE(r.isOk());
  EXPECT_TRUE(r->stopped_early);
  EXPECT_LE(r->steps, 1u);
  EXPECT_EQ(r->n_samples, r->steps * 32);
  EXPECT_EQ(r->delta.size(), start.size());
  if (r->steps == 0) {
    EXPECT_EQ(r->delta, std::vector<float>(start.size(), 0.0f));
    EXPECT_EQ(r->mean_loss, 0.0);
  }
}

TEST_F(TrainerTest, StopFlagDuringTraining) {
  Trainer trainer(torch::kCPU);
  auto m = mustCreate("mlp", 0);
  const auto start = m->flatParameters();
  TrainOptions opts;
  opts.max_steps = 1000000;  // hours of work unless stopped
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stop.store(true);
  });
  auto r = trainer.train(*m, start, *train_, range(2000), opts, &stop);
  stopper.join();
  ASSERT_TRUE(r.isOk());
  EXPECT_TRUE(r->stopped_early);
  EXPECT_GT(r->steps, 0u);
  EXPECT_LT(r->steps, 1000000u);
  // A pass over 2000 samples is 62 batches of 32 and one of 16.
  EXPECT_EQ(r->n_samples, (r->steps / 63) * 2000 + (r->steps % 63) * 32);
  EXPECT_GT(r->mean_loss, 0.0);
  EXPECT_LT(r->compute_seconds, 30.0);
}

TEST_F(TrainerTest, ZeroLearningRateLossMatchesEvaluate) {
  Trainer trainer(torch::kCPU);
  auto m = mustCreate("cnn", 9);
  const auto start = m->flatParameters();
  const auto idx = range(64);
  TrainOptions opts;
  opts.batch_size = 64;  // one batch covers every sample
  opts.lr = 0;
  auto r = trainer.train(*m, start, *train_, idx, opts);
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(r->steps, 1u);
  EXPECT_EQ(r->delta, std::vector<float>(start.size(), 0.0f));
  auto ev = model::evaluateIndices(*m, *train_, idx, 1000);
  ASSERT_TRUE(ev.isOk());
  EXPECT_NEAR(r->mean_loss, ev->loss, 1e-5);
  // Sum of squared per-sample losses, computed independently.
  torch::NoGradGuard no_grad;
  auto [x, y] = model::makeBatch(*train_, idx.data(), idx.size(), torch::kCPU);
  const auto per = -torch::log_softmax(m->forward(x), 1).gather(1, y.unsqueeze(1)).squeeze(1);
  EXPECT_NEAR(r->sum_sq_loss, per.square().sum().item<double>(), 1e-4);
  EXPECT_NEAR(r->mean_loss, per.mean().item<double>(), 1e-5);
}

// The trainer against a plain LibTorch SGD loop written here: same order, same batches. The
// trainer takes its manual gradient path for the MLP (by default); the loop uses autograd.
TEST_F(TrainerTest, MatchesAPlainSgdLoop) {
  TrainOptions opts;
  opts.epochs = 2;
  opts.batch_size = 20;
  opts.lr = 0.03f;
  opts.momentum = 0.9f;
  opts.weight_decay = 1e-3f;
  opts.seed = 5;
  const auto idx = range(150);
  auto m = mustCreate("mlp", 6);
  const auto start = m->flatParameters();
  Trainer trainer(torch::kCPU);
  EXPECT_TRUE(trainer.supportsManualGradients(*m));
  auto r = trainer.train(*m, start, *train_, idx, opts);
  ASSERT_TRUE(r.isOk());

  auto ref = mustCreate("mlp", 6);
  auto params = ref->parameters();
  torch::optim::SGD sgd(
      params,
      torch::optim::SGDOptions(opts.lr).momentum(opts.momentum).weight_decay(opts.weight_decay));
  std::mt19937_64 rng(opts.seed);
  double loss_sum = 0;
  for (uint32_t e = 0; e < opts.epochs; ++e) {
    std::vector<int64_t> order(idx.size());
    std::iota(order.begin(), order.end(), int64_t{0});
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t pos = 0; pos < order.size(); pos += opts.batch_size) {
      std::vector<uint32_t> b;
      for (size_t i = pos; i < std::min(order.size(), pos + opts.batch_size); ++i) {
        b.push_back(idx[order[i]]);
      }
      auto [x, y] = model::makeBatch(*train_, b.data(), b.size(), torch::kCPU);
      sgd.zero_grad();
      const auto loss = torch::nn::functional::cross_entropy(ref->forward(x), y);
      loss.backward();
      sgd.step();
      loss_sum += loss.item<double>() * b.size();
    }
  }
  const auto ref_flat = ref->flatParameters();
  double max_diff = 0;
  for (size_t i = 0; i < ref_flat.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(double(ref_flat[i]) - start[i] - r->delta[i]));
  }
  EXPECT_LT(max_diff, 1e-5);
  EXPECT_NEAR(r->mean_loss, loss_sum / 300, 1e-5);
}

TEST_F(TrainerTest, DeviceShardPathGivesTheSameBits) {
  TrainOptions opts;
  opts.epochs = 2;
  opts.batch_size = 25;
  opts.seed = 3;
  const auto idx = range(210);
  auto run = [&](Trainer::BatchSource source) {
    auto m = mustCreate("lenet", 8);
    Trainer trainer(torch::kCPU, source);
    auto r = trainer.train(*m, m->flatParameters(), *train_, idx, opts);
    EXPECT_TRUE(r.isOk()) << r.status().toString();
    return std::move(r).value();
  };
  const TrainResult host = run(Trainer::BatchSource::kHostGather);
  const TrainResult shard = run(Trainer::BatchSource::kDeviceShard);
  EXPECT_EQ(host.delta, shard.delta);
  EXPECT_EQ(host.mean_loss, shard.mean_loss);
  EXPECT_EQ(host.n_samples, shard.n_samples);
}

TEST_F(TrainerTest, SubsetIndicesAreHonoured) {
  // Training on samples of one class only pushes predictions toward that class.
  std::vector<uint32_t> sevens;
  for (uint32_t i = 0; i < train_->size(); ++i) {
    if (train_->labels[i] == 7) sevens.push_back(i);
  }
  auto m = mustCreate("logreg", 1);
  Trainer trainer(torch::kCPU);
  TrainOptions opts;
  opts.epochs = 3;
  auto r = trainer.train(*m, m->flatParameters(), *train_, sevens, opts);
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(r->n_samples, 3 * sevens.size());
  torch::NoGradGuard no_grad;
  const std::vector<uint32_t> probe = {0, 1, 2, 3, 4, 5, 6, 8, 9, 10};
  auto [x, y] = model::makeBatch(*test_, probe.data(), probe.size(), torch::kCPU);
  EXPECT_TRUE(m->forward(x).argmax(1).eq(7).all().item<bool>());
}

TEST_F(TrainerTest, RestoresModeAndRejectsBadInput) {
  Trainer trainer(torch::kCPU);
  auto m = mustCreate("mlp", 0);
  const auto start = m->flatParameters();
  m->train(false);
  TrainOptions opts;
  opts.max_steps = 2;
  ASSERT_TRUE(trainer.train(*m, start, *train_, range(64), opts).isOk());
  EXPECT_FALSE(m->isTraining());

  auto code = [&](const std::vector<float>& s, const std::vector<uint32_t>& idx,
                  const TrainOptions& o) {
    return trainer.train(*m, s, *train_, idx, o).status().code();
  };
  std::vector<float> short_start(start.begin(), start.end() - 1);
  EXPECT_EQ(code(short_start, range(10), opts), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(start, {}, opts), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(start, {0, 2000}, opts), StatusCode::kInvalidArgument);
  TrainOptions zero_batch = opts;
  zero_batch.batch_size = 0;
  EXPECT_EQ(code(start, range(10), zero_batch), StatusCode::kInvalidArgument);
  TrainOptions nothing = opts;
  nothing.epochs = 0;
  nothing.max_steps = 0;
  EXPECT_EQ(code(start, range(10), nothing), StatusCode::kInvalidArgument);

  // 5x5 images cannot feed a 784-input MLP: LibTorch's error comes back as a Status.
  data::Dataset tiny;
  tiny.rows = tiny.cols = 5;
  tiny.images.assign(4 * 25, 100);
  tiny.labels = {0, 1, 2, 3};
  auto bad = trainer.train(*m, start, tiny, range(4), opts);
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
  EXPECT_FALSE(m->isTraining());
}

// One full-batch step of Adam from fresh moments is w -= lr g / (|g| + eps) (the bias-corrected
// moments are g and g^2), AdamW first shrinks w by lr * weight_decay, and Adam with weight decay
// adds it to the gradient: each checked against the gradient LibTorch's autograd computes on a
// copy of the model.
TEST(TrainerOptimizers, OneAdamAndAdamWStepMatchTheirDefinitions) {
  data::Dataset ds;
  ds.feature_dim = 3;
  ds.num_classes = 2;
  ds.features = {0.5f, -1.0f, 2.0f, 1.5f, 0.25f, -0.5f, -2.0f, 1.0f, 0.75f, 0.0f, 0.5f, -1.25f};
  ds.labels = {0, 1, 1, 0};
  const model::InputShape shape{{3}, 2};
  auto reference = model::createModel("logreg", 5, "", shape).value();
  const std::vector<float> start = reference->flatParameters();
  const at::Tensor x = torch::from_blob(ds.features.data(), {4, 3}, torch::kFloat).clone();
  const at::Tensor y = torch::tensor({0, 1, 1, 0}, torch::kLong);
  torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
  std::vector<float> g;
  for (const auto& p : reference->parameters()) {
    const at::Tensor flat = p.grad().reshape({-1}).contiguous();
    g.insert(g.end(), flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
  }
  ASSERT_EQ(g.size(), start.size());

  struct Case {
    wire::Optimizer optimizer;
    float weight_decay;
  };
  for (const Case c : {Case{wire::Optimizer::kAdam, 0.0f}, Case{wire::Optimizer::kAdam, 0.1f},
                       Case{wire::Optimizer::kAdamW, 0.1f}}) {
    auto m = model::createModel("logreg", 5, "", shape).value();
    TrainOptions o;
    o.batch_size = 4;
    o.max_steps = 1;
    o.lr = 0.01f;
    o.optimizer = c.optimizer;
    o.weight_decay = c.weight_decay;
    Trainer trainer(c10::kCPU);
    auto r = trainer.train(*m, start, ds, {0, 1, 2, 3}, o);
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    for (size_t i = 0; i < start.size(); ++i) {
      const bool adamw = c.optimizer == wire::Optimizer::kAdamW;
      const double gi = g[i] + (adamw ? 0.0 : c.weight_decay * start[i]);
      const double expected =
          -o.lr * gi / (std::abs(gi) + 1e-8) - (adamw ? o.lr * c.weight_decay * start[i] : 0.0);
      EXPECT_NEAR(r->delta[i], expected, 1e-6)
          << wire::optimizerName(c.optimizer) << " weight_decay " << c.weight_decay << " i " << i;
    }
  }
  // SGD's step is -lr g: a different update.
  auto m = model::createModel("logreg", 5, "", shape).value();
  TrainOptions o;
  o.batch_size = 4;
  o.max_steps = 1;
  o.lr = 0.01f;
  auto r = Trainer(c10::kCPU).train(*m, start, ds, {0, 1, 2, 3}, o);
  ASSERT_TRUE(r.isOk());
  for (size_t i = 0; i < start.size(); ++i) EXPECT_NEAR(r->delta[i], -o.lr * g[i], 1e-6) << i;
}

}  // namespace
}  // namespace fedfleet::client
