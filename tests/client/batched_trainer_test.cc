// BatchedTrainer against Trainer::train client by client: every built-in model, with FedProx,
// SCAFFOLD, momentum and weight decay, and in every case clients with their own shard sizes,
// batch sizes, step counts, learning rates and seeds (so batches of unequal sizes are padded and
// clients leave the batch at different steps). Then the stop flag, and the fallbacks: a
// TorchScript module, an Adam client, a job Trainer refuses and a batch LibTorch fails on.
#include "client/batched_trainer.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "client/trainer.h"
#include "common/data/dataset.h"
#include "common/model/model.h"
#include "tests/client/test_data.h"

namespace fedfleet::client {
namespace {

// 120 random 28x28 images with labels in [0, 10), from std::mt19937_64(seed): the built-in
// models' default input, without the Fashion-MNIST files.
data::Dataset randomImages(uint64_t seed) {
  std::mt19937_64 rng(seed);
  data::Dataset ds;
  ds.rows = ds.cols = 28;
  const size_t n = 120;
  ds.images.resize(n * 28 * 28);
  for (auto& p : ds.images) p = static_cast<uint8_t>(rng() % 256);
  ds.labels.resize(n);
  for (auto& l : ds.labels) l = static_cast<data::Label>(rng() % 10);
  return ds;
}

const data::Dataset& images() {
  static const data::Dataset ds = randomImages(11);
  return ds;
}

std::vector<uint32_t> range(uint32_t begin, uint32_t n) {
  std::vector<uint32_t> v(n);
  for (uint32_t i = 0; i < n; ++i) v[i] = begin + i;
  return v;
}

double maxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double out = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    out = std::max(out, std::abs(double(a[i]) - b[i]));
  }
  return out;
}

double maxAbs(const std::vector<float>& a) {
  double out = 0;
  for (float v : a) out = std::max(out, std::abs(double(v)));
  return out;
}

std::unique_ptr<model::Model> mustCreate(const std::string& name, uint64_t seed) {
  auto m = model::createModel(name, seed);
  EXPECT_TRUE(m.isOk()) << m.status().toString();
  return m.isOk() ? std::move(m).value() : nullptr;
}

// Three clients that differ in everything a client owns:
//   0: 40 samples, batches of 16, 1 epoch (16, 16, 8), lr 0.05
//   1: 25 samples, batches of 8, 5 steps (8, 8, 8, 1, 8: a pass ends after 4), lr 0.1
//   2: 30 samples, batches of 16, 2 steps (16, 14), lr 0.02
// and `variant` adds: "prox" (mu 0.1 and 0.5 for clients 0 and 1, none for 2), "scaffold"
// (clients 0 and 2, their own c and c_k; client 1 without), "momentum" (0.9 with weight decay
// 1e-3, 0.5 alone, and plain SGD).
struct Clients {
  std::vector<std::vector<float>> starts;
  std::vector<std::vector<uint32_t>> indices;
  std::vector<TrainOptions> options;
  std::vector<std::vector<float>> c, ck;  // SCAFFOLD's, per client (empty: none)
  std::vector<std::unique_ptr<std::atomic<bool>>> stops;

  std::vector<BatchedJob> jobs(const data::Dataset& ds) const {
    std::vector<BatchedJob> out;
    for (size_t k = 0; k < starts.size(); ++k) {
      out.push_back({&starts[k], &ds, &indices[k], options[k], stops[k].get()});
    }
    return out;
  }
};

Clients makeClients(model::Model& model, const std::string& variant) {
  Clients c;
  const std::vector<float> base = model.flatParameters();
  c.indices = {range(0, 40), range(40, 25), range(70, 30)};
  for (size_t k = 0; k < 3; ++k) {
    // Each client starts from its own point (the model's weights, shifted a little).
    std::vector<float> start = base;
    const std::vector<float> noise = uniformFloats(base.size(), 100 + k, 0.01f);
    for (size_t i = 0; i < start.size(); ++i) start[i] += noise[i];
    c.starts.push_back(std::move(start));
    c.stops.push_back(std::make_unique<std::atomic<bool>>(false));
  }
  TrainOptions o0, o1, o2;
  o0.batch_size = 16, o0.epochs = 1, o0.lr = 0.05f, o0.seed = 7;
  o1.batch_size = 8, o1.max_steps = 5, o1.lr = 0.1f, o1.seed = 8;
  o2.batch_size = 16, o2.max_steps = 2, o2.lr = 0.02f, o2.seed = 9;
  c.options = {o0, o1, o2};
  c.c.resize(3);
  c.ck.resize(3);
  if (variant == "prox") {
    c.options[0].prox_mu = 0.1f;
    c.options[1].prox_mu = 0.5f;
  } else if (variant == "scaffold") {
    for (size_t k : {0, 2}) {
      c.c[k] = uniformFloats(base.size(), 200 + k, 0.05f);
      c.ck[k] = uniformFloats(base.size(), 300 + k, 0.05f);
    }
  } else if (variant == "momentum") {
    c.options[0].momentum = 0.9f;
    c.options[0].weight_decay = 1e-3f;
    c.options[1].momentum = 0.5f;
  }
  for (size_t k = 0; k < 3; ++k) {
    if (!c.c[k].empty()) c.options[k].scaffold = {&c.c[k], &c.ck[k]};
  }
  return c;
}

// The largest value of a delta in these runs is 0.003 to 0.33. Batched and per-client training
// compute the same function in another order of float operations (and, for logreg and mlp,
// Trainer's manual gradients against autograd here): we saw them differ by at most 9e-8 on the
// deltas, 4e-7 on SCAFFOLD's control deltas (the delta over steps x lr >= 0.04) and 1.7e-7
// relative on the losses. We allow 1e-6, 1e-5 and 1e-6; a client given another client's data,
// rate or correction is off by 1e-4 or more.
void expectSame(const TrainResult& batched, const TrainResult& single) {
  EXPECT_EQ(batched.steps, single.steps);
  EXPECT_EQ(batched.n_samples, single.n_samples);
  EXPECT_EQ(batched.stopped_early, single.stopped_early);
  EXPECT_LT(maxAbsDiff(batched.delta, single.delta), 1e-6);
  EXPECT_NEAR(batched.mean_loss, single.mean_loss, 1e-6 * single.mean_loss);
  EXPECT_NEAR(batched.sum_sq_loss, single.sum_sq_loss, 1e-6 * single.sum_sq_loss);
  EXPECT_EQ(batched.control_delta.size(), single.control_delta.size());
  EXPECT_LT(maxAbsDiff(batched.control_delta, single.control_delta), 1e-5);
}

// (model, variant).
class BatchedTrainerTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(BatchedTrainerTest, EqualsPerClientTraining) {
  const auto& [name, variant] = GetParam();
  auto model = mustCreate(name, 5);
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(BatchedTrainer::supportsModel(*model));
  const Clients clients = makeClients(*model, variant);
  const std::vector<BatchedJob> jobs = clients.jobs(images());

  BatchedTrainer batched(c10::Device(c10::kCPU));
  std::vector<Result<TrainResult>> got = batched.train(*model, jobs);
  ASSERT_EQ(got.size(), 3u);

  Trainer trainer(c10::Device(c10::kCPU));
  const uint64_t steps[] = {3, 5, 2}, samples[] = {40, 33, 30};
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(got[k].isOk()) << got[k].status().toString();
    auto want =
        trainer.train(*model, clients.starts[k], images(), clients.indices[k], clients.options[k]);
    ASSERT_TRUE(want.isOk()) << want.status().toString();
    SCOPED_TRACE("client " + std::to_string(k));
    EXPECT_EQ(got[k]->steps, steps[k]);
    EXPECT_EQ(got[k]->n_samples, samples[k]);
    EXPECT_GT(maxAbs(want->delta), 1e-3);  // the comparison below is not of zeros
    expectSame(*got[k], *want);
    EXPECT_EQ(got[k]->control_delta.empty(), clients.c[k].empty());
  }
  // The clients differ: had one been given another's data or rate, it would not match above.
  EXPECT_GT(maxAbsDiff(got[0]->delta, got[1]->delta), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Models, BatchedTrainerTest,
    ::testing::Combine(::testing::Values("logreg", "mlp", "cnn", "lenet"),
                       ::testing::Values("plain", "prox", "scaffold", "momentum")),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

// Feature vectors (the Synthetic set's 60 features) batch as images do.
TEST(BatchedTrainerFeaturesTest, EqualsPerClientTraining) {
  const data::Dataset& ds = *syntheticFeatures();
  auto model = model::createModel("mlp", 3, "", model::inputShapeOf(ds));
  ASSERT_TRUE(model.isOk());
  const Clients clients = makeClients(**model, "momentum");
  auto got = BatchedTrainer(c10::Device(c10::kCPU)).train(**model, clients.jobs(ds));
  Trainer trainer(c10::Device(c10::kCPU));
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(got[k].isOk()) << got[k].status().toString();
    auto want =
        trainer.train(**model, clients.starts[k], ds, clients.indices[k], clients.options[k]);
    ASSERT_TRUE(want.isOk());
    expectSame(*got[k], *want);
  }
}

// A stop flag set before training: that client takes no step and leaves at once, stopped
// early with a zero delta; the others train as they would have.
TEST(BatchedTrainerStopTest, AStoppedClientLeavesTheBatch) {
  auto model = mustCreate("mlp", 5);
  Clients clients = makeClients(*model, "momentum");
  clients.stops[1]->store(true);
  auto got = BatchedTrainer(c10::Device(c10::kCPU)).train(*model, clients.jobs(images()));
  ASSERT_TRUE(got[1].isOk());
  EXPECT_TRUE(got[1]->stopped_early);
  EXPECT_EQ(got[1]->steps, 0u);
  EXPECT_EQ(got[1]->n_samples, 0u);
  EXPECT_EQ(maxAbs(got[1]->delta), 0.0);
  Trainer trainer(c10::Device(c10::kCPU));
  for (size_t k : {0, 2}) {
    ASSERT_TRUE(got[k].isOk());
    EXPECT_FALSE(got[k]->stopped_early);
    auto want =
        trainer.train(*model, clients.starts[k], images(), clients.indices[k], clients.options[k]);
    expectSame(*got[k], *want);
  }
}

// A client with Adam, and a job Trainer refuses, train (or fail) on their own, with exactly
// Trainer's result; the other clients still batch.
TEST(BatchedTrainerFallbackTest, AdamAndInvalidJobsTrainOnTheirOwn) {
  auto model = mustCreate("logreg", 5);
  Clients clients = makeClients(*model, "plain");
  clients.options[2].optimizer = wire::Optimizer::kAdam;
  clients.indices.push_back({});  // client 3: no samples
  clients.starts.push_back(clients.starts[0]);
  clients.options.push_back(clients.options[0]);
  clients.stops.push_back(nullptr);
  auto got = BatchedTrainer(c10::Device(c10::kCPU)).train(*model, clients.jobs(images()));
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[3].status().code(), StatusCode::kInvalidArgument);
  Trainer trainer(c10::Device(c10::kCPU));
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(got[k].isOk());
    auto want =
        trainer.train(*model, clients.starts[k], images(), clients.indices[k], clients.options[k]);
    expectSame(*got[k], *want);
  }
  auto adam =
      trainer.train(*model, clients.starts[2], images(), clients.indices[2], clients.options[2]);
  EXPECT_EQ(got[2]->delta, adam->delta);  // the same path: the same bits
}

// Batches compute in fp32: a client asking for bf16 trains on its own through Trainer's autocast
// (the same bits as Trainer), and the fp32 ones still batch.
TEST(BatchedTrainerFallbackTest, Bf16JobsTrainOnTheirOwn) {
  auto model = mustCreate("mlp", 5);
  Clients clients = makeClients(*model, "plain");
  clients.options[0].precision = wire::Precision::kBf16;
  auto got = BatchedTrainer(c10::Device(c10::kCPU)).train(*model, clients.jobs(images()));
  ASSERT_EQ(got.size(), 3u);
  Trainer trainer(c10::Device(c10::kCPU));
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(got[k].isOk()) << got[k].status().toString();
    auto want =
        trainer.train(*model, clients.starts[k], images(), clients.indices[k], clients.options[k]);
    ASSERT_TRUE(want.isOk());
    if (k == 0) {
      EXPECT_EQ(got[k]->delta, want->delta);  // the same path: the same bits
    } else {
      expectSame(*got[k], *want);
    }
  }
}

// A label outside the model's classes fails the batch; every client then trains on its own:
// the bad one gets Trainer's error, the others their results.
TEST(BatchedTrainerFallbackTest, AFailedBatchFallsBackPerClient) {
  data::Dataset ds = randomImages(12);
  ds.labels[75] = 10;  // in client 2's shard [70, 100); logreg has 10 classes
  ds.num_classes = 11;
  auto model = mustCreate("logreg", 5);
  const Clients clients = makeClients(*model, "plain");
  auto got = BatchedTrainer(c10::Device(c10::kCPU)).train(*model, clients.jobs(ds));
  EXPECT_EQ(got[2].status().code(), StatusCode::kInternal);
  Trainer trainer(c10::Device(c10::kCPU));
  for (size_t k : {0, 1}) {
    ASSERT_TRUE(got[k].isOk()) << got[k].status().toString();
    auto want =
        trainer.train(*model, clients.starts[k], ds, clients.indices[k], clients.options[k]);
    EXPECT_EQ(got[k]->delta, want->delta);  // trained by Trainer itself
  }
}

// A TorchScript module cannot be batched: its clients train one at a time, as Trainer would.
TEST(BatchedTrainerFallbackTest, TorchScriptTrainsPerClient) {
  torch::jit::Module module("Tiny");
  module.register_parameter("w", torch::full({10, 784}, 0.001f).requires_grad_(true), false);
  module.register_parameter("b", torch::zeros({10}).requires_grad_(true), false);
  module.define(R"(
def forward(self, x):
    return torch.matmul(x.flatten(1), self.w.t()) + self.b
)");
  const std::string path = std::string(FEDFLEET_TEST_TMP) + "/batched_trainer_tiny.pt";
  module.save(path);
  auto model = model::createModel("torchscript", 0, path);
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  EXPECT_FALSE(BatchedTrainer::supportsModel(**model));
  const Clients clients = makeClients(**model, "prox");
  auto got = BatchedTrainer(c10::Device(c10::kCPU)).train(**model, clients.jobs(images()));
  Trainer trainer(c10::Device(c10::kCPU));
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(got[k].isOk()) << got[k].status().toString();
    auto want =
        trainer.train(**model, clients.starts[k], images(), clients.indices[k], clients.options[k]);
    EXPECT_GT(maxAbs(want->delta), 1e-3);
    // (Not bit for bit: the TorchScript executor optimises a graph after its first runs.)
    expectSame(*got[k], *want);
  }
}

// On a CUDA device the same code batches: each model's clients there against Trainer there,
// with TF32 off so that both compute in fp32 (skipped without a device).
TEST(BatchedTrainerCudaTest, EqualsPerClientTrainingOnTheDevice) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  const c10::Device cuda(c10::kCUDA, 0);
  for (const std::string name : {"mlp", "cnn"}) {
    SCOPED_TRACE(name);
    auto model = mustCreate(name, 5);
    const Clients clients = makeClients(*model, "momentum");
    auto got = BatchedTrainer(cuda).train(*model, clients.jobs(images()));
    Trainer trainer(cuda);
    for (size_t k = 0; k < 3; ++k) {
      ASSERT_TRUE(got[k].isOk()) << got[k].status().toString();
      auto want = trainer.train(*model, clients.starts[k], images(), clients.indices[k],
                                clients.options[k]);
      ASSERT_TRUE(want.isOk()) << want.status().toString();
      expectSame(*got[k], *want);
    }
  }
}

}  // namespace
}  // namespace fedfleet::client
