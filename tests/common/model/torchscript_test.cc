// Loads a TorchScript module exported by examples/models/export_torchscript.py and checks that
// it behaves as a Model (training it is covered in tests/client/trainer_torchscript_test.cc).
#include <gtest/gtest.h>
#include <unistd.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include "common/data/dataset.h"
#include "common/model/evaluate.h"
#include "common/model/model.h"

namespace fedfleet::model {
namespace {

bool pythonHasTorch() {
  static const bool has = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
  return has;
}

// Runs the export script; returns the parameter count it printed, or 0 on failure.
size_t exportModel(const std::string& path, int seed) {
  const std::string log = path + ".log";
  const std::string cmd = std::string("/usr/bin/python3 ") + FEDFLEET_SOURCE_DIR +
                          "/examples/models/export_torchscript.py " + path + " --seed " +
                          std::to_string(seed) + " > " + log + " 2>&1";
  if (std::system(cmd.c_str()) != 0) return 0;
  std::ifstream f(log);
  std::stringstream text;
  text << f.rdbuf();
  std::smatch match;
  const std::string s = text.str();
  if (!std::regex_search(s, match, std::regex("([0-9]+) parameters"))) return 0;
  return std::stoul(match[1]);
}

class TorchScriptTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!pythonHasTorch()) return;
    // One file per process: ctest runs this suite's cases as parallel processes.
    path_ = std::string(FEDFLEET_TEST_TMP) + "/model_torchscript_test." +
            std::to_string(::getpid()) + ".pt";
    expected_params_ = exportModel(path_, 1);
  }
  void SetUp() override {
    if (!pythonHasTorch()) {
      GTEST_SKIP() << "/usr/bin/python3 cannot import torch (apt-get install python3-torch)";
    }
    ASSERT_GT(expected_params_, 0u) << "export_torchscript.py failed; see " << path_ << ".log";
  }
  static std::string path_;
  static size_t expected_params_;
};
std::string TorchScriptTest::path_;
size_t TorchScriptTest::expected_params_ = 0;

TEST_F(TorchScriptTest, LoadsWithTheModulesParameters) {
  auto m = createModel("torchscript", 0, path_);
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  Model& model = **m;
  EXPECT_EQ(model.name(), "torchscript");
  EXPECT_EQ(model.numParameters(), expected_params_);
  EXPECT_EQ(model.layout().total, expected_params_);
  const auto names = model.parameterNames();
  ASSERT_EQ(names.size(), 8u);
  EXPECT_EQ(names.front(), "conv1.weight");
  EXPECT_EQ(names.back(), "fc2.bias");
  const auto out = model.forward(torch::zeros({4, 1, 28, 28}));
  EXPECT_EQ(out.sizes().vec(), (std::vector<int64_t>{4, 10}));
}

TEST_F(TorchScriptTest, FlatRoundTripAndModes) {
  auto m = createModel("torchscript", 0, path_);
  ASSERT_TRUE(m.isOk());
  Model& model = **m;
  std::vector<float> values(model.numParameters());
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 97) * 0.01f;
  ASSERT_TRUE(model.setFlatParameters(values).isOk());
  EXPECT_EQ(model.flatParameters(), values);
  EXPECT_EQ(model.setFlatParameters(values.data(), 3).code(), StatusCode::kInvalidArgument);
  model.train(false);
  EXPECT_FALSE(model.isTraining());
  model.train(true);
  EXPECT_TRUE(model.isTraining());
}

TEST_F(TorchScriptTest, SameFileSameWeightsOtherSeedOtherWeights) {
  auto a = createModel("torchscript", 0, path_);
  auto b = createModel("torchscript", 5, path_);  // the seed is unused for TorchScript
  ASSERT_TRUE(a.isOk() && b.isOk());
  EXPECT_EQ((*a)->flatParameters(), (*b)->flatParameters());
  const std::string other = std::string(FEDFLEET_TEST_TMP) + "/model_torchscript_test_2.pt";
  ASSERT_EQ(exportModel(other, 2), expected_params_);
  auto c = createModel("torchscript", 0, other);
  ASSERT_TRUE(c.isOk());
  EXPECT_NE((*a)->flatParameters(), (*c)->flatParameters());
}

TEST_F(TorchScriptTest, Evaluates) {
  auto test = data::loadFashionMnist(data::defaultFashionMnistDir(), false, 200);
  if (!test.isOk()) GTEST_SKIP() << "Fashion-MNIST not installed";
  auto m = createModel("torchscript", 0, path_);
  ASSERT_TRUE(m.isOk());
  auto r = evaluate(**m, *test, 0, 64);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->n, 200u);
  EXPECT_GT(r->loss, 1.5);
  EXPECT_LT(r->loss, 3.5);
}

}  // namespace
}  // namespace fedfleet::model
