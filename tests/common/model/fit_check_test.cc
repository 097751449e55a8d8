// The start-up check (checkModelFitsData): one batch of the data through the model before any
// round, each mismatch one error naming the model, the data and the shapes.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <string>

#include "common/data/dataset.h"
#include "common/model/evaluate.h"
#include "common/model/model.h"

namespace fedfleet::model {
namespace {

// A feature-vector data set of `n` samples of `dim` features, labels i % classes.
data::Dataset features(size_t n, uint32_t dim, uint32_t classes) {
  data::Dataset ds;
  ds.feature_dim = dim;
  ds.num_classes = classes;
  ds.features.assign(n * dim, 0.5f);
  for (size_t i = 0; i < n; ++i) ds.labels.push_back(static_cast<uint8_t>(i % classes));
  return ds;
}

// A TorchScript module with one parameter and the given forward body, saved from C++ (no
// Python needed).
std::string scriptModule(const std::string& name, const std::string& forward_body) {
  torch::jit::Module m("FitCheck");
  m.register_parameter("w", torch::ones({4}), /*is_buffer=*/false);
  m.define("def forward(self, x):\n    " + forward_body + "\n");
  const std::string path = std::string(FEDFLEET_TEST_TMP) + "/fit_check_" + name + "." +
                           std::to_string(::getpid()) + ".pt";
  m.save(path);
  return path;
}

TEST(FitCheck, AModelThatFitsPassesAndIsLeftAsItWas) {
  auto m = createModel("mlp", 1, "", InputShape{{6}, 3});
  ASSERT_TRUE(m.isOk());
  (*m)->train(true);
  const std::vector<float> before = (*m)->flatParameters();
  EXPECT_TRUE(checkModelFitsData(**m, features(20, 6, 3), "'mlp'", "csv").isOk());
  EXPECT_TRUE((*m)->isTraining());
  EXPECT_EQ((*m)->flatParameters(), before);
  EXPECT_TRUE(checkModelFitsData(**m, data::Dataset{}, "'mlp'", "empty").isOk());
}

TEST(FitCheck, AnInputShapeTheModelRejectsNamesBothShapes) {
  auto m = createModel("mlp", 1, "", InputShape{{6}, 3});
  ASSERT_TRUE(m.isOk());
  Status st = checkModelFitsData(**m, features(20, 5, 3), "'mlp'", "'csv' (a.csv)");
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("model 'mlp' and data 'csv' (a.csv) do not fit"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("rejects a batch of shape [8, 5]"), std::string::npos)
      << st.message();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << "one line: " << st.message();
}

TEST(FitCheck, ALabelBeyondTheModelsOutputsIsNamed) {
  auto m = createModel("logreg", 1, "", InputShape{{6}, 3});
  ASSERT_TRUE(m.isOk());
  data::Dataset ds = features(20, 6, 3);
  ds.labels[13] = 7;  // beyond the batch of 8 checked: every label is scanned
  Status st = checkModelFitsData(**m, ds, "'logreg'", "'csv'");
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("the data has label 7 but the model has 3 outputs (labels 0..2)"),
            std::string::npos)
      << st.message();
}

TEST(FitCheck, AnOutputThatIsNotOneRowOfLogitsPerSampleIsRefused) {
  const std::string path = scriptModule("vector", "return (x * self.w).sum(1)");
  auto m = createModel("torchscript", 0, path);
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  Status st = checkModelFitsData(**m, features(20, 4, 2), "'torchscript'", "'csv'");
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("a batch of shape [8, 4] gives an output of shape [8], not [8, "
                              "classes]"),
            std::string::npos)
      << st.message();

  const std::string fits =
      scriptModule("fits", "return torch.stack([(x * self.w).sum(1), x.sum(1)], 1)");
  auto ok = createModel("torchscript", 0, fits);
  ASSERT_TRUE(ok.isOk()) << ok.status().toString();
  EXPECT_TRUE(checkModelFitsData(**ok, features(20, 4, 2), "'torchscript'", "'csv'").isOk());
  Status three = checkModelFitsData(**ok, features(20, 4, 3), "'torchscript'", "'csv'");
  EXPECT_NE(three.message().find("label 2 but the model has 2 outputs"), std::string::npos)
      << three.message();
}

}  // namespace
}  // namespace fedfleet::model
