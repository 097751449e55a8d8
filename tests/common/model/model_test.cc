#include "common/model/model.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "common/data/dataset.h"
#include "common/model/batch.h"
#include "common/model/evaluate.h"

namespace fedfleet::model {
namespace {

std::unique_ptr<Model> mustCreate(const std::string& name, uint64_t seed) {
  auto m = createModel(name, seed);
  EXPECT_TRUE(m.isOk()) << m.status().toString();
  return m.isOk() ? std::move(m).value() : nullptr;
}

// A small deterministic data set of 28x28 images (pixel values cover 0..255).
data::Dataset syntheticDataset(size_t n, uint32_t rows = 28, uint32_t cols = 28) {
  data::Dataset ds;
  ds.rows = rows;
  ds.cols = cols;
  std::mt19937 rng(5);
  ds.images.resize(n * rows * cols);
  for (auto& b : ds.images) b = static_cast<uint8_t>(rng() & 0xff);
  for (size_t i = 0; i < n; ++i) ds.labels.push_back(static_cast<uint8_t>(i % 10));
  return ds;
}

// A small deterministic feature-vector data set: n samples of `dim` floats, labels i % classes.
data::Dataset featureDataset(size_t n, uint32_t dim, uint32_t classes = 3) {
  data::Dataset ds;
  ds.feature_dim = dim;
  ds.num_classes = classes;
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0, 2);
  ds.features.resize(n * dim);
  for (auto& v : ds.features) v = normal(rng);
  for (size_t i = 0; i < n; ++i) ds.labels.push_back(static_cast<uint8_t>(i % classes));
  return ds;
}

std::unique_ptr<Model> mustCreateFor(const std::string& name, uint64_t seed,
                                     const InputShape& shape) {
  auto m = createModel(name, seed, "", shape);
  EXPECT_TRUE(m.isOk()) << m.status().toString();
  return m.isOk() ? std::move(m).value() : nullptr;
}

struct CountCase {
  const char* name;
  size_t params;
  size_t tensors;
};

class BuiltinModelTest : public ::testing::TestWithParam<CountCase> {};

TEST_P(BuiltinModelTest, ParameterCountAndLayout) {
  const auto& c = GetParam();
  auto m = mustCreate(c.name, 1);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->name(), c.name);
  const Layout layout = m->layout();
  EXPECT_EQ(layout.total, c.params);
  EXPECT_EQ(m->numParameters(), c.params);
  ASSERT_EQ(layout.tensors.size(), c.tensors);
  size_t offset = 0;
  const auto names = m->parameterNames();
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const auto& t = layout.tensors[i];
    EXPECT_EQ(t.offset, offset);
    EXPECT_EQ(t.name, names[i]);
    EXPECT_EQ(t.numel, static_cast<size_t>(std::accumulate(t.shape.begin(), t.shape.end(),
                                                           int64_t{1}, std::multiplies<>())));
    offset += t.numel;
  }
  EXPECT_EQ(m->flatParameters().size(), c.params);
}

TEST_P(BuiltinModelTest, ForwardGivesTenLogits) {
  auto m = mustCreate(GetParam().name, 1);
  ASSERT_NE(m, nullptr);
  const auto out = m->forward(torch::randn({3, 1, 28, 28}));
  EXPECT_EQ(out.sizes().vec(), (std::vector<int64_t>{3, 10}));
}

TEST_P(BuiltinModelTest, FlatRoundTripIsExact) {
  auto m = mustCreate(GetParam().name, 1);
  ASSERT_NE(m, nullptr);
  std::vector<float> values(m->numParameters());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 1);
  for (auto& v : values) v = normal(rng);
  ASSERT_TRUE(m->setFlatParameters(values).isOk());
  EXPECT_EQ(m->flatParameters(), values);
  // The values really are in the tensors, in layout order.
  const auto layout = m->layout();
  const auto params = m->parameters();
  const auto& last = layout.tensors.back();
  EXPECT_EQ(params.back().reshape({-1})[0].item<float>(), values[last.offset]);
  EXPECT_FALSE(params.front().grad().defined());  // no autograd recorded
}

TEST_P(BuiltinModelTest, SeedDecidesInitialWeights) {
  auto a = mustCreate(GetParam().name, 42);
  torch::manual_seed(999);  // the global generator plays no part
  auto b = mustCreate(GetParam().name, 42);
  auto c = mustCreate(GetParam().name, 43);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->flatParameters(), b->flatParameters());
  EXPECT_NE(a->flatParameters(), c->flatParameters());
}

TEST_P(BuiltinModelTest, DefaultInitIsUniformInFanInBound) {
  auto m = mustCreate(GetParam().name, 7);
  ASSERT_NE(m, nullptr);
  const auto params = m->parameters();
  for (size_t i = 0; i < params.size(); i += 2) {  // weight, bias pairs
    const auto& w = params[i];
    const double bound = 1.0 / std::sqrt(static_cast<double>(w.numel() / w.size(0)));
    for (const auto& t : {params[i], params[i + 1]}) {
      const double max_abs = t.abs().max().item<double>();
      EXPECT_LE(max_abs, bound + 1e-7);
      if (t.numel() >= 100) {
        EXPECT_GT(max_abs, 0.9 * bound);  // spread over the whole range
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, BuiltinModelTest,
    ::testing::Values(CountCase{"logreg", 784 * 10 + 10, 2},
                      CountCase{"mlp", 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10, 6},
                      CountCase{"cnn", 832 + 51264 + 1606144 + 5130, 8},
                      // conv1 6*25+6, conv2 16*6*25+16, fc1 400*120+120, fc2 120*84+84,
                      // fc3 84*10+10
                      CountCase{"lenet", 156 + 2416 + 48120 + 10164 + 850, 10}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(ModelTest, NamesFollowTheLayers) {
  auto m = mustCreate("mlp", 0);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->parameterNames(), (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight",
                                                           "fc2.bias", "fc3.weight", "fc3.bias"}));
  EXPECT_EQ(m->layout().tensors[0].shape, (std::vector<int64_t>{200, 784}));
  EXPECT_EQ(builtinModelNames(), (std::vector<std::string>{"logreg", "mlp", "cnn", "lenet"}));
}

TEST(ModelTest, WrongFlatSizeIsInvalidArgument) {
  auto m = mustCreate("logreg", 0);
  ASSERT_NE(m, nullptr);
  const auto before = m->flatParameters();
  std::vector<float> small(before.size() - 1, 1.0f);
  const Status st = m->setFlatParameters(small);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("7850"), std::string::npos) << st.message();
  EXPECT_EQ(m->flatParameters(), before);  // untouched
  std::vector<float> big(before.size() + 1, 1.0f);
  EXPECT_EQ(m->setFlatParameters(big).code(), StatusCode::kInvalidArgument);
}

TEST(ModelTest, UnknownModelListsValidNames) {
  auto m = createModel("nope", 0);
  ASSERT_FALSE(m.isOk());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  for (const char* n : {"nope", "logreg", "mlp", "cnn", "lenet", "torchscript"}) {
    EXPECT_NE(m.status().message().find(n), std::string::npos) << m.status().message();
  }
}

TEST(ModelTest, TorchScriptPathErrors) {
  auto empty = createModel("torchscript", 0, "");
  ASSERT_FALSE(empty.isOk());
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);

  const std::string missing = std::string(FEDFLEET_TEST_TMP) + "/no_such_model.pt";
  auto m = createModel("torchscript", 0, missing);
  ASSERT_FALSE(m.isOk());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find(missing), std::string::npos);

  const std::string garbage = std::string(FEDFLEET_TEST_TMP) + "/garbage_model.pt";
  {
    std::ofstream f(garbage);
    f << "this is not a TorchScript archive";
  }
  auto g = createModel("torchscript", 0, garbage);
  ASSERT_FALSE(g.isOk());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find(garbage), std::string::npos);
  std::filesystem::remove(garbage);
}

TEST(InputShapeTest, DefaultIsFashionMnistAndChangesNothing) {
  const InputShape def;
  EXPECT_EQ(def.sample, (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(def.classes, 10);
  for (const auto& name : builtinModelNames()) {
    auto a = mustCreate(name, 21);
    auto b = mustCreateFor(name, 21, InputShape());
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->flatParameters(), b->flatParameters()) << name;
    EXPECT_EQ(a->parameterNames(), b->parameterNames()) << name;
  }
}

struct ShapeCase {
  const char* name;
  std::vector<int64_t> sample;
  int64_t classes;
  size_t params;
};

class FeatureModelTest : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(FeatureModelTest, BuildsForTheShape) {
  const auto& c = GetParam();
  auto m = mustCreateFor(c.name, 4, InputShape{c.sample, c.classes});
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->numParameters(), c.params);
  std::vector<int64_t> batch = {5};
  batch.insert(batch.end(), c.sample.begin(), c.sample.end());
  const auto out = m->forward(torch::randn(batch));
  EXPECT_EQ(out.sizes().vec(), (std::vector<int64_t>{5, c.classes}));
  // Same seed, same weights; the fan-in bound follows the input size.
  auto again = mustCreateFor(c.name, 4, InputShape{c.sample, c.classes});
  EXPECT_EQ(m->flatParameters(), again->flatParameters());
  const at::Tensor w = m->parameters().front();
  const double bound = 1.0 / std::sqrt(static_cast<double>(w.size(1)));
  EXPECT_LE(w.abs().max().item<double>(), bound + 1e-7);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FeatureModelTest,
    ::testing::Values(ShapeCase{"logreg", {60}, 10, 60 * 10 + 10},
                      ShapeCase{"logreg", {3, 8, 8}, 5, 192 * 5 + 5},
                      ShapeCase{"mlp", {60}, 10, 60 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10},
                      ShapeCase{"mlp", {7}, 2, 7 * 200 + 200 + 200 * 200 + 200 + 200 * 2 + 2},
                      ShapeCase{"cnn", {1, 28, 28}, 3, 832 + 51264 + 1606144 + 512 * 3 + 3},
                      ShapeCase{
                          "lenet", {1, 28, 28}, 26, 156 + 2416 + 48120 + 10164 + 84 * 26 + 26}),
    [](const auto& info) {
      std::string s = std::string(info.param.name) + "_";
      for (int64_t d : info.param.sample) s += std::to_string(d) + "x";
      return s + std::to_string(info.param.classes);
    });

TEST(InputShapeTest, BadShapesAreInvalidArgument) {
  auto code = [](const std::string& name, const InputShape& shape) {
    return createModel(name, 0, "", shape).status().code();
  };
  for (const char* name : {"logreg", "mlp", "cnn", "lenet"}) {
    EXPECT_EQ(code(name, InputShape{{}, 10}), StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(code(name, InputShape{{60, 0}, 10}), StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(code(name, InputShape{{-1}, 10}), StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(code(name, InputShape{{1 << 16, 1 << 16}, 10}), StatusCode::kInvalidArgument);
    EXPECT_EQ(code(name, InputShape{{1, 28, 28}, 0}), StatusCode::kInvalidArgument) << name;
  }
  for (const char* name : {"cnn", "lenet"}) {
    for (const auto& sample : std::vector<std::vector<int64_t>>{{60}, {1, 32, 32}, {3, 28, 28}}) {
      auto r = createModel(name, 0, "", InputShape{sample, 10});
      ASSERT_FALSE(r.isOk()) << name;
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(r.status().message().find("1x28x28"), std::string::npos) << r.status().message();
    }
  }
  // An unknown name is reported as such whatever the shape.
  auto r = createModel("nope", 0, "", InputShape{{}, 0});
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("unknown model"), std::string::npos);
}

TEST(InputShapeTest, InputShapeOfDataSets) {
  const auto features = featureDataset(4, 60, 7);
  const InputShape f = inputShapeOf(features);
  EXPECT_EQ(f.sample, (std::vector<int64_t>{60}));
  EXPECT_EQ(f.classes, 7);
  data::Dataset images = syntheticDataset(3, 28, 28);
  const InputShape i = inputShapeOf(images);
  EXPECT_EQ(i.sample, InputShape().sample);
  EXPECT_EQ(i.classes, 10);
  images = syntheticDataset(3, 5, 6);
  EXPECT_EQ(inputShapeOf(images).sample, (std::vector<int64_t>{1, 5, 6}));
  // A model built for a data set's shape takes its batches.
  auto m = mustCreateFor("mlp", 1, inputShapeOf(features));
  const std::vector<uint32_t> idx = {0, 1, 2, 3};
  auto [x, y] = makeBatch(features, idx.data(), idx.size(), torch::kCPU);
  EXPECT_EQ(m->forward(x).sizes().vec(), (std::vector<int64_t>{4, 7}));
}

TEST(DeviceTest, ResolvesSpecs) {
  auto cpu = resolveDevice("cpu");
  ASSERT_TRUE(cpu.isOk());
  EXPECT_TRUE(cpu->is_cpu());
  EXPECT_EQ(deviceName(*cpu), "cpu");
  auto automatic = resolveDevice("auto");
  ASSERT_TRUE(automatic.isOk());
  EXPECT_EQ(automatic->is_cuda(), torch::cuda::is_available());
  for (const char* spec : {"cuda", "cuda:0"}) {
    auto cuda = resolveDevice(spec);
    if (torch::cuda::is_available()) {
      ASSERT_TRUE(cuda.isOk());
      EXPECT_TRUE(cuda->is_cuda());
      EXPECT_FALSE(deviceName(*cuda).empty());
    } else {
      ASSERT_FALSE(cuda.isOk());
      EXPECT_EQ(cuda.status().code(), StatusCode::kUnavailable);
    }
  }
  for (const char* bad : {"gpu", "", "cuda:", "cuda:x", "CPU", "cuda:-1"}) {
    auto r = resolveDevice(bad);
    ASSERT_FALSE(r.isOk()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(BatchTest, NormalisesAndGathers) {
  const auto ds = syntheticDataset(20);
  const std::vector<uint32_t> idx = {7, 0, 19, 7};
  auto [x, y] = makeBatch(ds, idx.data(), idx.size(), torch::kCPU);
  ASSERT_TRUE(x.defined());
  EXPECT_EQ(x.sizes().vec(), (std::vector<int64_t>{4, 1, 28, 28}));
  EXPECT_EQ(x.scalar_type(), torch::kFloat);
  EXPECT_EQ(y.scalar_type(), torch::kLong);
  const auto xa = x.accessor<float, 4>();
  for (size_t i = 0; i < idx.size(); ++i) {
    EXPECT_EQ(y[i].item<int64_t>(), ds.labels[idx[i]]);
    for (int r = 0; r < 28; r += 3) {
      for (int c = 0; c < 28; c += 5) {
        const double v = ds.image(idx[i])[r * 28 + c];
        EXPECT_NEAR(xa[i][0][r][c], (v / 255.0 - 0.2860) / 0.3530, 1e-5);
      }
    }
  }
  // Custom statistics.
  auto [x2, y2] = makeBatch(ds, idx.data(), 1, torch::kCPU, 0.5f, 0.25f);
  EXPECT_NEAR(x2[0][0][0][0].item<float>(), (ds.image(7)[0] / 255.0 - 0.5) / 0.25, 1e-5);
}

TEST(BatchTest, BuilderReusesBuffersAndStaysCorrect) {
  const auto ds = syntheticDataset(50);
  BatchBuilder builder(ds, torch::kCPU);
  for (uint32_t start = 0; start < 50; start += 16) {
    std::vector<uint32_t> idx;
    for (uint32_t i = start; i < std::min(50u, start + 16); ++i) idx.push_back(i);
    auto [x, y] = builder.build(idx.data(), idx.size());
    auto [rx, ry] = makeBatch(ds, idx.data(), idx.size(), torch::kCPU);
    EXPECT_TRUE(torch::equal(x, rx));
    EXPECT_TRUE(torch::equal(y, ry));
  }
}

TEST(BatchTest, FeatureVectorsAreCopiedAsTheyAre) {
  const auto ds = featureDataset(20, 60);
  const std::vector<uint32_t> idx = {7, 0, 19, 7};
  auto [x, y] = makeBatch(ds, idx.data(), idx.size(), torch::kCPU);
  ASSERT_TRUE(x.defined());
  EXPECT_EQ(x.sizes().vec(), (std::vector<int64_t>{4, 60}));
  EXPECT_EQ(x.scalar_type(), torch::kFloat);
  EXPECT_EQ(y.scalar_type(), torch::kLong);
  const auto xa = x.accessor<float, 2>();
  for (size_t i = 0; i < idx.size(); ++i) {
    EXPECT_EQ(y[i].item<int64_t>(), ds.labels[idx[i]]);
    for (int j = 0; j < 60; ++j) EXPECT_EQ(xa[i][j], ds.feature(idx[i])[j]);  // bit for bit
  }
  // Pixel statistics do not apply.
  auto [x2, y2] = makeBatch(ds, idx.data(), idx.size(), torch::kCPU, 0.5f, 0.25f);
  EXPECT_TRUE(torch::equal(x, x2));
  // A builder reuses its buffer across batches of varying size and stays correct.
  BatchBuilder builder(ds, torch::kCPU);
  for (uint32_t start = 0; start < 20; start += 7) {
    std::vector<uint32_t> part;
    for (uint32_t i = start; i < std::min(20u, start + 7); ++i) part.push_back(i);
    auto [bx, by] = builder.build(part.data(), part.size());
    auto [rx, ry] = makeBatch(ds, part.data(), part.size(), torch::kCPU);
    EXPECT_TRUE(torch::equal(bx, rx));
    EXPECT_TRUE(torch::equal(by, ry));
  }
}

TEST(EvaluateFeaturesTest, MatchesAnIndependentComputation) {
  const auto ds = featureDataset(50, 4, 3);
  auto m = mustCreateFor("logreg", 2, InputShape{{4}, 3});
  ASSERT_NE(m, nullptr);
  auto r = evaluate(*m, ds, 0, 16);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->n, 50u);
  const auto params = m->parameters();  // weight [3, 4], bias [3]
  double loss = 0;
  int correct = 0;
  for (size_t i = 0; i < ds.size(); ++i) {
    const auto x = torch::from_blob(const_cast<float*>(ds.feature(i)), {4}).clone();
    const auto logits = torch::matmul(params[0], x) + params[1];
    loss -= torch::log_softmax(logits, 0)[ds.labels[i]].item<double>();
    correct += logits.argmax().item<int64_t>() == ds.labels[i];
  }
  EXPECT_NEAR(r->loss, loss / 50, 1e-5);
  EXPECT_NEAR(r->accuracy.value_or(-1), correct / 50.0, 1e-12);

  auto subset = evaluateIndices(*m, ds, {3, 4, 5}, 2);
  ASSERT_TRUE(subset.isOk());
  EXPECT_EQ(subset->n, 3u);

  // Storage that does not match the labels is an error, not a read past the end.
  auto broken = ds;
  broken.features.resize(broken.features.size() - 1);
  EXPECT_EQ(evaluate(*m, broken).status().code(), StatusCode::kInvalidArgument);
  // A model built for another width: LibTorch's error comes back as a Status.
  auto wide = mustCreateFor("logreg", 2, InputShape{{5}, 3});
  EXPECT_EQ(evaluate(*wide, ds).status().code(), StatusCode::kInternal);
}

class EvaluateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = data::loadFashionMnist(data::defaultFashionMnistDir(), false, 500);
    if (t.isOk()) test_ = new data::Dataset(std::move(t).value());
  }
  static void TearDownTestSuite() {
    delete test_;
    test_ = nullptr;
  }
  void SetUp() override {
    if (test_ == nullptr) GTEST_SKIP() << "Fashion-MNIST not installed";
  }
  static data::Dataset* test_;
};
data::Dataset* EvaluateTest::test_ = nullptr;

TEST_F(EvaluateTest, UntrainedModelIsNearChance) {
  auto m = mustCreate("mlp", 3);
  ASSERT_NE(m, nullptr);
  auto r = evaluate(*m, *test_, 0, 128);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->n, 500u);
  EXPECT_GT(r->loss, 1.8);  // ln 10 = 2.30
  EXPECT_LT(r->loss, 3.0);
  EXPECT_LT(r->accuracy, 0.35);
}

TEST_F(EvaluateTest, BatchSizeDoesNotChangeTheAnswer) {
  auto m = mustCreate("lenet", 3);
  ASSERT_NE(m, nullptr);
  auto a = evaluate(*m, *test_, 300, 1000);
  auto b = evaluate(*m, *test_, 300, 7);
  ASSERT_TRUE(a.isOk() && b.isOk());
  EXPECT_EQ(a->n, 300u);
  EXPECT_NEAR(a->loss, b->loss, 1e-6);
  EXPECT_EQ(a->accuracy, b->accuracy);
  std::vector<uint32_t> first(300);
  std::iota(first.begin(), first.end(), 0u);
  auto c = evaluateIndices(*m, *test_, first, 64);
  ASSERT_TRUE(c.isOk());
  EXPECT_NEAR(a->loss, c->loss, 1e-6);
}

TEST_F(EvaluateTest, MatchesAnIndependentComputation) {
  auto m = mustCreate("logreg", 11);
  ASSERT_NE(m, nullptr);
  auto r = evaluate(*m, *test_, 100, 33);
  ASSERT_TRUE(r.isOk());
  // By hand: normalise, x W^T + b, log-softmax.
  const auto params = m->parameters();
  double loss = 0;
  int correct = 0;
  for (size_t i = 0; i < 100; ++i) {
    auto x = torch::empty({784});
    for (int j = 0; j < 784; ++j) x[j] = (test_->image(i)[j] / 255.0 - 0.2860) / 0.3530;
    const auto logits = torch::matmul(params[0], x) + params[1];
    const int label = test_->labels[i];
    loss -= torch::log_softmax(logits, 0)[label].item<double>();
    correct += logits.argmax().item<int64_t>() == label;
  }
  EXPECT_NEAR(r->loss, loss / 100, 1e-5);
  EXPECT_NEAR(r->accuracy.value_or(-1), correct / 100.0, 1e-12);
}

TEST_F(EvaluateTest, RestoresModeAndReportsErrors) {
  auto m = mustCreate("mlp", 3);
  ASSERT_NE(m, nullptr);
  m->train(true);
  ASSERT_TRUE(evaluate(*m, *test_, 10).isOk());
  EXPECT_TRUE(m->isTraining());
  m->train(false);
  ASSERT_TRUE(evaluate(*m, *test_, 10).isOk());
  EXPECT_FALSE(m->isTraining());

  EXPECT_EQ(evaluate(*m, *test_, 10, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(evaluate(*m, data::Dataset{}, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(evaluateIndices(*m, *test_, {1, 500}).status().code(), StatusCode::kInvalidArgument);

  // 5x5 images do not fit a 784-input MLP: LibTorch's error becomes a Status.
  m->train(true);
  const auto tiny = syntheticDataset(4, 5, 5);
  auto bad = evaluate(*m, tiny);
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
  EXPECT_TRUE(m->isTraining());
}

}  // namespace
}  // namespace fedfleet::model
