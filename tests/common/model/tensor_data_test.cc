// The tensors data format: files written with torch::pickle_save (the format of Python's
// torch.save, which tests/cli/sim_tensors_test.cc writes from Python itself), good and broken.
#include "common/model/tensor_data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "common/data/source.h"
#include "common/model/model.h"
#include "tests/common/data/scratch_dir.h"

namespace fedfleet::model {
namespace {

using ::testing::HasSubstr;

class TensorFileTest : public data::testing::ScratchDirTest {
 protected:
  // torch.save({"x": x, "y": y}) into dir_/name.
  std::string save(const std::string& name, const at::Tensor& x, const at::Tensor& y) {
    c10::Dict<std::string, at::Tensor> d;
    d.insert("x", x);
    d.insert("y", y);
    return saveValue(name, d);
  }
  std::string saveValue(const std::string& name, const c10::IValue& v) {
    const std::vector<char> bytes = torch::pickle_save(v);
    return write(name, std::string(bytes.begin(), bytes.end()));
  }
  // The failure's message, which must name the file.
  std::string failure(const std::string& path, StatusCode code = StatusCode::kCorrupt) {
    auto r = loadTensorFile(path);
    EXPECT_FALSE(r.isOk());
    if (r.isOk()) return "";
    EXPECT_EQ(r.status().code(), code) << r.status().toString();
    EXPECT_THAT(r.status().message(), HasSubstr(path));
    return r.status().message();
  }
};

TEST_F(TensorFileTest, SamplesKeepTheirShapeAndValuesAndTheClassCountIsTheLargestLabelPlusOne) {
  const at::Tensor x = torch::arange(5 * 2 * 3, torch::kFloat64).view({5, 2, 3}) / 7.0;
  const at::Tensor y = torch::tensor({0, 4, 2, 4, 1}, torch::kInt64);
  auto r = loadTensorFile(save("a.pt", x, y));
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  const data::Dataset& ds = r.value();
  EXPECT_EQ(ds.size(), 5u);
  EXPECT_EQ(ds.sample_shape, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(ds.feature_dim, 6u);
  EXPECT_EQ(ds.num_classes, 5u);
  EXPECT_EQ(ds.labels, (std::vector<data::Label>{0, 4, 2, 4, 1}));
  ASSERT_EQ(ds.features.size(), 30u);
  for (int i = 0; i < 30; ++i) EXPECT_FLOAT_EQ(ds.features[i], static_cast<float>(i / 7.0)) << i;
  // The model sees [2, 3] samples.
  EXPECT_EQ(inputShapeOf(ds).sample, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(inputShapeOf(ds).classes, 5);
}

TEST_F(TensorFileTest, ByteImagesAndNarrowIntegerLabelsAreReadAsTheyAre) {
  const at::Tensor x = torch::tensor({0, 255, 7, 128}, torch::kUInt8).view({2, 1, 2, 1});
  const at::Tensor y = torch::tensor({1, 0}, torch::kInt16);
  auto r = loadTensorFile(save("b.pt", x, y), /*limit=*/1);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r.value().size(), 1u);
  EXPECT_EQ(r.value().sample_shape, (std::vector<uint32_t>{1, 2, 1}));
  EXPECT_EQ(r.value().features, (std::vector<float>{0, 255}));
  EXPECT_EQ(r.value().num_classes, 2u);  // at least 2
}

TEST_F(TensorFileTest, ManyClassesAndFloatTargetsAreRead) {
  const at::Tensor x = torch::ones({3, 2});
  auto many = loadTensorFile(save("many.pt", x, torch::tensor({0, 999, 70000}, torch::kInt64)));
  ASSERT_TRUE(many.isOk()) << many.status().toString();
  EXPECT_EQ(many->labels, (std::vector<data::Label>{0, 999, 70000}));
  EXPECT_EQ(many->num_classes, 70001u);
  EXPECT_FALSE(many->hasTargets());

  auto one = loadTensorFile(save("one.pt", x, torch::tensor({0.5, -1.25, 3.0}, torch::kFloat64)));
  ASSERT_TRUE(one.isOk()) << one.status().toString();
  EXPECT_TRUE(one->hasTargets());
  EXPECT_EQ(one->target_dim, 1u);
  EXPECT_EQ(one->size(), 3u);
  EXPECT_TRUE(one->labels.empty());
  EXPECT_EQ(one->num_classes, 0u);
  EXPECT_EQ(one->targets, (std::vector<float>{0.5f, -1.25f, 3.0f}));

  const at::Tensor y2 = torch::arange(6, torch::kFloat).view({3, 2}) / 4.0;
  auto two = loadTensorFile(save("two.pt", x, y2));
  ASSERT_TRUE(two.isOk()) << two.status().toString();
  EXPECT_EQ(two->target_dim, 2u);
  EXPECT_EQ(two->size(), 3u);
  EXPECT_FLOAT_EQ(two->target(2)[1], 5.0f / 4.0f);
}

TEST_F(TensorFileTest, EveryBrokenFileIsAClearErrorNamingIt) {
  const at::Tensor x = torch::ones({4, 3});
  const at::Tensor y = torch::tensor({0, 1, 2, 1}, torch::kInt64);
  const std::string good = save("good.pt", x, y);
  // Truncated: half the bytes of a good file.
  std::string whole;
  {
    std::ifstream in(good, std::ios::binary);
    whole.assign(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_THAT(failure(write("cut.pt", whole.substr(0, whole.size() / 2))),
              HasSubstr("not a readable torch.save file"));
  EXPECT_THAT(failure(write("text.pt", "x,y\n1,2\n")), HasSubstr("not a readable torch.save"));
  EXPECT_THAT(failure(saveValue("tensor.pt", x)), HasSubstr("not a dictionary"));
  {
    c10::Dict<std::string, at::Tensor> only_x;
    only_x.insert("x", x);
    EXPECT_THAT(failure(saveValue("no_y.pt", only_x)), HasSubstr("no \"y\" tensor"));
  }
  {
    c10::Dict<std::string, int64_t> numbers;
    numbers.insert("x", 1);
    numbers.insert("y", 2);
    EXPECT_THAT(failure(saveValue("ints.pt", numbers)), HasSubstr("not a tensor"));
  }
  EXPECT_THAT(failure(save("flat_x.pt", torch::ones({4}), y)), HasSubstr("first dimension"));
  EXPECT_THAT(failure(save("empty.pt", torch::ones({0, 3}), torch::zeros({0}, torch::kInt64))),
              HasSubstr("at least one"));
  EXPECT_THAT(failure(save("short_y.pt", x, y.narrow(0, 0, 3))), HasSubstr("must be [4]"));
  EXPECT_THAT(failure(save("bool_y.pt", x, y.to(torch::kBool))),
              HasSubstr("class ids must be integers"));
  EXPECT_THAT(failure(save("big_label.pt", x,
                           torch::tensor({int64_t{0}, int64_t{1}, int64_t{1} << 20, int64_t{1}},
                                         torch::kInt64))),
              HasSubstr("sample 2 has label 1048576"));
  at::Tensor nan_y = torch::ones({4, 2});
  nan_y[2][1] = std::numeric_limits<float>::infinity();
  EXPECT_THAT(failure(save("inf_target.pt", x, nan_y)),
              HasSubstr("sample 2 of \"y\" holds a target that is not finite"));
  EXPECT_THAT(failure(save("int_2d_y.pt", x, torch::zeros({4, 2}, torch::kInt64))),
              HasSubstr("must be [4]"));
  EXPECT_THAT(failure(save("neg_label.pt", x, torch::tensor({0, -1, 2, 1}, torch::kInt64))),
              HasSubstr("sample 1 has label -1"));
  at::Tensor nan_x = x.clone();
  nan_x[3][1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(failure(save("nan.pt", nan_x, y)), HasSubstr("sample 3 of \"x\""));
  failure((dir_ / "missing.pt").string(), StatusCode::kNotFound);
}

TEST_F(TensorFileTest, TheSourceHoldsOutAndComparesShapesThroughTheReader) {
  const at::Tensor x = torch::rand({40, 2, 2});
  const at::Tensor y = torch::arange(40, torch::kInt64) % 3;
  data::FileSource s;
  s.format = data::DataFormat::kTensors;
  s.path = save("train.pt", x, y);
  s.holdout_fraction = 0.25;
  s.seed = 9;
  s.read_tensors = [](const std::string& p, size_t limit) { return loadTensorFile(p, limit); };
  auto both = data::loadTrainTest(s);
  ASSERT_TRUE(both.isOk()) << both.status().toString();
  EXPECT_EQ(both.value().train.size(), 30u);
  EXPECT_EQ(both.value().test.size(), 10u);
  EXPECT_EQ(both.value().test.sample_shape, (std::vector<uint32_t>{2, 2}));
  EXPECT_EQ(both.value().train.sample_shape, (std::vector<uint32_t>{2, 2}));
  // Every held-out sample is one of the file's, with its label.
  const data::Dataset& t = both.value().test;
  for (size_t i = 0; i < t.size(); ++i) {
    bool found = false;
    for (int64_t j = 0; j < 40 && !found; ++j) {
      found =
          std::memcmp(t.feature(i), x[j].contiguous().data_ptr<float>(), 4 * sizeof(float)) == 0 &&
          t.labels[i] == y[j].item<int64_t>();
    }
    EXPECT_TRUE(found) << "held-out sample " << i;
  }
  // A test file of another sample shape (same value count) is refused, naming both shapes.
  s.holdout_fraction = 0;
  s.test_path = save("test.pt", torch::rand({5, 4}), torch::zeros({5}, torch::kInt64));
  auto mismatch = data::loadTrainTest(s);
  ASSERT_FALSE(mismatch.isOk());
  EXPECT_THAT(mismatch.status().message(), HasSubstr("[2, 2]"));
  EXPECT_THAT(mismatch.status().message(), HasSubstr("[4]"));
}

}  // namespace
}  // namespace fedfleet::model
