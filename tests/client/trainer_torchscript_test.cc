// Trains a TorchScript module exported by examples/models/export_torchscript.py with Trainer.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <numeric>
#include <regex>
#include <sstream>

#include "client/trainer.h"
#include "common/data/dataset.h"
#include "common/model/evaluate.h"
#include "common/model/model.h"

namespace fedfleet::client {
namespace {

TEST(TrainerTorchScriptTest, TrainsAnExportedModule) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch (apt-get install python3-torch)";
  }
  auto train = data::loadFashionMnist(data::defaultFashionMnistDir(), true, 1000);
  if (!train.isOk()) GTEST_SKIP() << "Fashion-MNIST not installed";

  const std::string path = std::string(FEDFLEET_TEST_TMP) + "/client_torchscript_test.pt";
  const std::string log = path + ".log";
  const std::string cmd = std::string("/usr/bin/python3 ") + FEDFLEET_SOURCE_DIR +
                          "/examples/models/export_torchscript.py " + path + " --seed 3 > " + log +
                          " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "export failed; see " << log;
  std::ifstream f(log);
  std::stringstream text;
  text << f.rdbuf();
  const std::string printed = text.str();
  std::smatch match;
  ASSERT_TRUE(std::regex_search(printed, match, std::regex("([0-9]+) parameters"))) << printed;
  const size_t module_params = std::stoul(match[1]);

  auto m = model::createModel("torchscript", 0, path);
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  model::Model& model = **m;
  ASSERT_EQ(model.numParameters(), module_params);

  std::vector<uint32_t> idx(1000);
  std::iota(idx.begin(), idx.end(), 0u);
  auto before = model::evaluateIndices(model, *train, idx);
  ASSERT_TRUE(before.isOk()) << before.status().toString();

  const auto start = model.flatParameters();
  Trainer trainer(torch::kCPU);
  TrainOptions opts;
  opts.epochs = 2;
  opts.batch_size = 32;
  opts.lr = 0.05f;
  opts.momentum = 0.5f;
  auto r = trainer.train(model, start, *train, idx, opts);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->delta.size(), module_params);
  EXPECT_EQ(r->steps, 64u);
  auto after = model::evaluateIndices(model, *train, idx);
  ASSERT_TRUE(after.isOk());
  std::printf("torchscript TinyCnn: loss %.3f -> %.3f, accuracy %.3f -> %.3f (%.2f s)\n",
              before->loss, after->loss, before->accuracy.value(), after->accuracy.value(),
              r->compute_seconds);
  EXPECT_LT(after->loss, before->loss - 0.5);
  EXPECT_GT(after->accuracy.value(), before->accuracy.value() + 0.2);

  // The delta is what moved the module's own parameters.
  const auto now = model.flatParameters();
  for (size_t i = 0; i < now.size(); i += 101) ASSERT_EQ(now[i] - start[i], r->delta[i]);
}

}  // namespace
}  // namespace fedfleet::client
