// A model's description (runs.model_json), its export as a file PyTorch loads, and model.init's
// loading of such files: each checked by reading the bytes back with LibTorch itself.
#include "common/model/export.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/model/model.h"

namespace fedfleet::model {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Model> make(const std::string& name, uint64_t seed, InputShape shape = {}) {
  auto m = createModel(name, seed, "", shape);
  EXPECT_TRUE(m.isOk()) << m.status().toString();
  return std::move(m).value();
}

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::string(FEDFLEET_TEST_TMP) + "/export_test." + std::to_string(::getpid()) + "." +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    EXPECT_TRUE(writeFileAtomically(path, bytes).isOk());
    return path;
  }
  std::string dir_;
};

TEST_F(ExportTest, TheDescriptionRoundTripsAndRebuildsTheSameLayout) {
  const InputShape csv{{4}, 3};
  auto m = make("mlp", 1, csv);
  const std::string json = describeModel(*m, csv, "ignored for a built-in model");
  auto d = parseModelDescription(json);
  ASSERT_TRUE(d.isOk()) << d.status().toString();
  EXPECT_EQ(d->name, "mlp");
  EXPECT_EQ(d->path, "");
  EXPECT_EQ(d->shape.sample, std::vector<int64_t>{4});
  EXPECT_EQ(d->shape.classes, 3);
  // 4 -> 200 -> 200 -> 3: weights and biases, offsets by hand.
  ASSERT_EQ(d->layout.tensors.size(), 6u);
  EXPECT_EQ(d->layout.tensors[0].name, "fc1.weight");
  EXPECT_EQ(d->layout.tensors[0].shape, (std::vector<int64_t>{200, 4}));
  EXPECT_EQ(d->layout.tensors[1].offset, 800u);
  EXPECT_EQ(d->layout.tensors[5].name, "fc3.bias");
  EXPECT_EQ(d->layout.tensors[5].offset, 800u + 200 + 40000 + 200 + 600);
  EXPECT_EQ(d->layout.total, 800u + 200 + 40000 + 200 + 600 + 3);
  auto rebuilt = rebuildModel(*d);
  ASSERT_TRUE(rebuilt.isOk()) << rebuilt.status().toString();
  EXPECT_EQ((*rebuilt)->numParameters(), d->layout.total);
}

TEST_F(ExportTest, ADamagedDescriptionIsRefusedNamingWhatIsWrong) {
  auto m = make("logreg", 1);
  auto json = nlohmann::json::parse(describeModel(*m, InputShape(), ""));
  auto broken = [&](auto&& edit) {
    auto j = json;
    edit(j);
    return parseModelDescription(j.dump()).status();
  };
  EXPECT_THAT(broken([](auto& j) { j.erase("classes"); }).message(), HasSubstr("\"classes\""));
  EXPECT_THAT(broken([](auto& j) { j["tensors"][1]["offset"] = 7; }).message(),
              HasSubstr("tensor fc.bias starts at 7"));
  EXPECT_THAT(broken([](auto& j) { j["total"] = 1; }).message(), HasSubstr("\"total\" says 1"));
  EXPECT_THAT(broken([](auto& j) { j["dtype"] = "float16"; }).message(), HasSubstr("dtype"));
  EXPECT_EQ(parseModelDescription("not json").status().code(), StatusCode::kCorrupt);
  // A description of another shape than the model built from its name: the layout check names
  // the tensor.
  auto d = parseModelDescription(json.dump());
  ASSERT_TRUE(d.isOk());
  d->shape.classes = 5;
  d->layout = make("logreg", 1)->layout();  // built for 10 classes
  auto rebuilt = rebuildModel(*d);
  EXPECT_EQ(rebuilt.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(rebuilt.status().message(), HasSubstr("fc.weight [5, 784]"));
}

TEST_F(ExportTest, ABuiltInModelExportsAsAStateDictOfItsParameters) {
  auto m = make("lenet", 3);
  auto bytes = m->exportBytes();
  ASSERT_TRUE(bytes.isOk()) << bytes.status().toString();
  const c10::IValue v = torch::pickle_load(std::vector<char>(bytes->begin(), bytes->end()));
  ASSERT_TRUE(v.isGenericDict());
  const auto dict = v.toGenericDict();
  const auto names = m->parameterNames();
  const auto params = m->parameters();
  ASSERT_EQ(dict.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    ASSERT_TRUE(dict.contains(names[i])) << names[i];
    EXPECT_TRUE(torch::equal(dict.at(names[i]).toTensor(), params[i])) << names[i];
  }
}

TEST_F(ExportTest, ExportedWeightsLoadIntoAnotherModelOfTheArchitecture) {
  auto trained = make("mlp", 1);
  auto bytes = trained->exportBytes();
  ASSERT_TRUE(bytes.isOk());
  const std::string state_dict = write("m.pt", *bytes);
  // A flat export: the raw buffer and its description beside it.
  const std::vector<float> flat = trained->flatParameters();
  const std::string raw = write("m.bin", std::string(reinterpret_cast<const char*>(flat.data()),
                                                     flat.size() * sizeof(float)));
  write("m.bin.json", describeModel(*trained, InputShape(), ""));
  for (const std::string& path : {state_dict, raw}) {
    auto fresh = make("mlp", 2);
    ASSERT_NE(fresh->flatParameters(), flat);
    Status st = loadWeights(*fresh, path);
    ASSERT_TRUE(st.isOk()) << path << ": " << st.toString();
    EXPECT_EQ(fresh->flatParameters(), flat) << path;
  }
}

TEST_F(ExportTest, WeightsOfAnotherModelOrAnotherFileAreRefused) {
  auto mlp = make("mlp", 1);
  const std::string mlp_file = write("mlp.pt", mlp->exportBytes().value());
  auto lenet = make("lenet", 1);
  Status st = loadWeights(*lenet, mlp_file);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("has no tensor conv1.weight"));
  // Same names, other shapes: an MLP for 3 classes.
  auto mlp3 = make("mlp", 1, InputShape{{1, 28, 28}, 3});
  st = loadWeights(*mlp3, mlp_file);
  EXPECT_THAT(st.message(), HasSubstr("fc3.weight as [10, 200]"));
  // A logistic regression's file holds fc.weight: not in an MLP.
  auto logreg = make("logreg", 1);
  c10::Dict<std::string, at::Tensor> extra;
  for (const auto& spec : mlp->layout().tensors) extra.insert(spec.name, torch::zeros(spec.shape));
  extra.insert("head.weight", torch::zeros({2}));
  const std::vector<char> extra_bytes = torch::pickle_save(extra);
  st = loadWeights(*mlp, write("extra.pt", std::string(extra_bytes.begin(), extra_bytes.end())));
  EXPECT_THAT(st.message(), HasSubstr("has tensor head.weight"));
  // A NaN weight, a file of no known format, no file.
  c10::Dict<std::string, at::Tensor> nan;
  for (const auto& spec : logreg->layout().tensors) nan.insert(spec.name, torch::zeros(spec.shape));
  nan.insert_or_assign("fc.bias", torch::full({10}, NAN));
  const std::vector<char> nan_bytes = torch::pickle_save(nan);
  st = loadWeights(*logreg, write("nan.pt", std::string(nan_bytes.begin(), nan_bytes.end())));
  EXPECT_THAT(st.message(), HasSubstr("fc.bias holds a NaN"));
  st = loadWeights(*logreg, write("junk.pt", "not a model"));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("neither a state_dict"));
  EXPECT_EQ(loadWeights(*logreg, dir_ + "/absent.pt").code(), StatusCode::kNotFound);
  // Nothing was changed by the refusals.
  EXPECT_EQ(logreg->flatParameters(), make("logreg", 1)->flatParameters());
}

}  // namespace
}  // namespace fedfleet::model
