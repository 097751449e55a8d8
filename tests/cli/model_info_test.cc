// `fedfleet model info` and `model export` say only what the history knows: a TorchScript run
// on a coordinator without data of its own records no input shape or class count (it used to be
// described as Fashion-MNIST's [1, 28, 28] and 10 classes), and a checkpoint scored by the
// clients' federated evaluation is called federated, never "test accuracy".
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstring>

#include "common/config/config.h"
#include "common/crypto/sha256.h"
#include "common/history/history.h"
#include "driver/data_files.h"
#include "common/model/export.h"
#include "common/model/model.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
const std::string kBinary = FEDFLEET_BINARY;

// A [5] -> 3 TorchScript model: one parameter w [5, 3].
std::string writeModule(const std::string& path) {
  torch::jit::Module m("FiveToThree");
  m.register_parameter("w", torch::full({5, 3}, 0.1).requires_grad_(true), false);
  m.define("def forward(self, x):\n    return x.matmul(self.w)\n");
  m.save(path);
  return path;
}

// A history as a coordinator without test data writes it: the run's model described from the
// config alone, rounds scored only by federated evaluation (round r's fed figure is the model
// after round r - 1), a checkpoint after rounds 1 and 2.
std::string writeHistory(const std::string& dir, const config::Config& config) {
  const std::string db = dir + "/h.db";
  auto store = history::openSqliteHistory(db);
  EXPECT_TRUE(store.isOk()) << store.status().toString();
  auto model = model::createModel("torchscript", 1, config.model.path, {}).value();
  history::RunRecord run;
  run.name = "fed-only";
  run.config_json = config.toJson().dump();
  run.model_json =
      model::describeModel(*model, driver::declaredInputShape(config).value(), config.model.path);
  const int64_t id = (*store)->beginRun(run).value();
  const std::vector<float> params = model->flatParameters();
  for (uint32_t r = 0; r <= 3; ++r) {
    history::RoundRecord row;
    row.run_id = id;
    row.round = r;
    row.status = r == 0 ? "initial" : "ok";
    if (r > 0) {
      row.fed_eval_clients = 2;
      row.fed_eval_samples = 40;
      row.fed_eval_loss = 1.0 - 0.1 * r;
      row.fed_eval_accuracy = r == 2 ? 0.8 : 0.5;  // the model after round 1 is the best
    }
    std::optional<history::CheckpointRecord> cp;
    if (r == 1 || r == 2) {
      cp.emplace();
      cp->run_id = id;
      cp->round = r;
      cp->model_version = r;
      cp->blob.assign(reinterpret_cast<const char*>(params.data()), params.size() * 4);
      cp->sha256_hex = crypto::toHex(crypto::sha256(cp->blob));
    }
    EXPECT_TRUE((*store)->commitRound(row, {}, cp).isOk());
  }
  return db;
}

// The config of a coordinator of clients with their own CSV files, its TorchScript model in
// `dir`.
config::Config ownFilesConfig(const std::string& dir) {
  config::Config config;
  config.model.name = "torchscript";
  config.model.path = writeModule(dir + "/net.pt");
  config.data.format = "csv";
  config.data.partition = "none";
  return config;
}

TEST(ModelInfo, ATorchScriptRunWithoutCoordinatorDataRecordsNoGuessedShape) {
  const std::string dir = testing::freshDir("model-info-fed");
  const std::string db = writeHistory(dir, ownFilesConfig(dir));

  testing::Process info({kBinary, "model", "info", "--db", db}, dir + "/info.txt");
  ASSERT_EQ(info.waitFor(60).value_or(-1), 0) << info.log();
  EXPECT_THAT(info.log(), HasSubstr("input not recorded (no data on the coordinator)"));
  EXPECT_THAT(info.log(), Not(HasSubstr("[1, 28, 28]")));
  EXPECT_THAT(info.log(), Not(HasSubstr("10 classes")));
  EXPECT_THAT(info.log(), HasSubstr("15 float32 values in 1 tensors"));
  // Round 1's model is scored by round 2's federated evaluation: the best, called federated.
  EXPECT_THAT(info.log(), HasSubstr("1 (federated accuracy 80.00%, best)"));
  EXPECT_THAT(info.log(), Not(HasSubstr("test accuracy")));

  testing::Process exported(
      {kBinary, "model", "export", "--db", db, "--best", "-o", dir + "/best.pt"},
      dir + "/export.txt");
  ASSERT_EQ(exported.waitFor(60).value_or(-1), 0) << exported.log();
  EXPECT_THAT(exported.log(), HasSubstr("round 1 (model version 1, federated accuracy 80.00%)"));
}

TEST(ModelInfo, WhatTheConfigDeclaresIsRecorded) {
  const std::string dir = testing::freshDir("model-info-declared");
  config::Config config = ownFilesConfig(dir);
  config.data.feature_columns = {"a", "b", "c", "d", "e"};
  config.data.num_classes = 3;
  const std::string db = writeHistory(dir, config);
  testing::Process info({kBinary, "model", "info", "--db", db}, dir + "/info.txt");
  ASSERT_EQ(info.waitFor(60).value_or(-1), 0) << info.log();
  EXPECT_THAT(info.log(), HasSubstr("model torchscript from " + dir +
                                    "/net.pt, input [5], 3 "
                                    "classes"));
}

}  // namespace
}  // namespace fedfleet
