// model.local: which tensors are local, how a client's local values go into its start and come
// out of its delta, and the file that keeps them across restarts.
#include "common/model/local_part.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>

namespace fedfleet::model {
namespace {

// fc1.weight [2, 2] at 0, fc1.bias [2] at 4, bn.running_mean [2] at 6 (buffer),
// bn.running_var [2] at 8 (buffer), head.weight [1, 2] at 10: 12 values.
Layout layout() {
  Layout l;
  const auto add = [&l](const std::string& name, std::vector<int64_t> shape, bool buffer) {
    TensorSpec t;
    t.name = name;
    t.shape = shape;
    t.numel = 1;
    for (int64_t d : shape) t.numel *= static_cast<size_t>(d);
    t.offset = l.total;
    t.buffer = buffer;
    l.total += t.numel;
    l.tensors.push_back(t);
  };
  add("fc1.weight", {2, 2}, false);
  add("fc1.bias", {2}, false);
  add("bn.running_mean", {2}, true);
  add("bn.running_var", {2}, true);
  add("head.weight", {1, 2}, false);
  return l;
}

std::string tmpPath(const std::string& name) {
  return std::string(FEDFLEET_TEST_TMP) + "/local_part_" + name + "." + std::to_string(::getpid());
}

TEST(LocalPart, PatternsPickTensorsAndAdjacentOnesFormOneRange) {
  auto part = LocalPart::of(layout(), {"bn.*", "head.*"});
  ASSERT_TRUE(part.isOk()) << part.status().toString();
  EXPECT_EQ(part->values(), 6u);
  EXPECT_EQ(part->ranges(), (std::vector<std::pair<size_t, size_t>>{{6, 6}}));
  EXPECT_TRUE(part->isLocal("bn.running_var"));
  EXPECT_FALSE(part->isLocal("fc1.bias"));

  auto split = LocalPart::of(layout(), {"fc1.bias", "*.running_var"});
  ASSERT_TRUE(split.isOk());
  EXPECT_EQ(split->ranges(), (std::vector<std::pair<size_t, size_t>>{{4, 2}, {8, 2}}));
  std::vector<float> flat(12);
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<float>(i);
  EXPECT_EQ(split->gather(flat), (std::vector<float>{4, 5, 8, 9}));
  split->scatter({-1, -2, -3, -4}, flat);
  EXPECT_EQ(flat[4], -1);
  EXPECT_EQ(flat[9], -4);
  EXPECT_EQ(flat[6], 6);
  split->zero(flat);
  EXPECT_EQ(split->gather(flat), (std::vector<float>{0, 0, 0, 0}));

  EXPECT_TRUE(LocalPart::of(layout(), {})->empty());
}

TEST(LocalPart, APatternThatMatchesNothingOrAllTensorsLocalAreRefused) {
  auto typo = LocalPart::of(layout(), {"bn.*", "batchnorm.*"});
  ASSERT_EQ(typo.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(typo.status().message().find("\"batchnorm.*\" matches no tensor"), std::string::npos);
  EXPECT_NE(typo.status().message().find("bn.running_mean"), std::string::npos);
  auto all = LocalPart::of(layout(), {"*"});
  ASSERT_EQ(all.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(all.status().message().find("nothing would be federated"), std::string::npos);
}

TEST(LocalState, TheClientsValuesGoIntoTheStartAndTheDeltaLeavesThemOut) {
  auto part = LocalPart::of(layout(), {"bn.*"});
  ASSERT_TRUE(part.isOk());
  const std::string path = tmpPath("state");
  std::remove(path.c_str());
  auto state = LocalState::open(*part, path);
  ASSERT_TRUE(state.isOk()) << state.status().toString();
  EXPECT_TRUE(state->values.empty()) << "no file yet: the global values at first";

  // First task: the start is the global model; training moves everything by +1.
  std::vector<float> start(12, 0.5f);
  state->applyTo(start);
  EXPECT_EQ(start, std::vector<float>(12, 0.5f));
  std::vector<float> delta(12, 1.0f);
  ASSERT_TRUE(state->absorb(start, delta).isOk());
  EXPECT_EQ(state->values, std::vector<float>(4, 1.5f));
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(delta[i], (i >= 6 && i < 10) ? 0.0f : 1.0f) << i;

  // A restart: the file holds the trained local part, written over the next global model.
  auto again = LocalState::open(*part, path);
  ASSERT_TRUE(again.isOk()) << again.status().toString();
  EXPECT_EQ(again->values, std::vector<float>(4, 1.5f));
  std::vector<float> next(12, 0.25f);
  again->applyTo(next);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(next[i], (i >= 6 && i < 10) ? 1.5f : 0.25f) << i;
  std::remove(path.c_str());
}

TEST(LocalState, ADamagedOrForeignFileIsAnErrorNamingIt) {
  const std::string path = tmpPath("bad");
  ASSERT_TRUE(saveLocalValues(path, {1, 2, 3, 4}).isOk());
  auto good = loadLocalValues(path, 4);
  ASSERT_TRUE(good.isOk());
  EXPECT_EQ(*good, (std::vector<float>{1, 2, 3, 4}));

  auto other = loadLocalValues(path, 6);
  ASSERT_EQ(other.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(other.status().message().find(path), std::string::npos);
  EXPECT_NE(other.status().message().find("holds 4 values"), std::string::npos);

  {  // one value changed: the checksum no longer matches
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(16);
    f.put('\x7f');
  }
  auto flipped = loadLocalValues(path, 4);
  ASSERT_EQ(flipped.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(flipped.status().message().find("checksum"), std::string::npos);
  auto part = LocalPart::of(layout(), {"bn.*"});
  EXPECT_EQ(LocalState::open(*part, path).status().code(), StatusCode::kCorrupt);

  std::ofstream(path, std::ios::binary | std::ios::trunc) << "FFLOCAL1";
  EXPECT_EQ(loadLocalValues(path, 4).status().code(), StatusCode::kCorrupt);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "something else entirely, longer";
  auto magic = loadLocalValues(path, 4);
  EXPECT_NE(magic.status().message().find("bad magic"), std::string::npos);

  ASSERT_TRUE(saveLocalValues(path, {1, std::nanf(""), 3, 4}).isOk());
  EXPECT_NE(loadLocalValues(path, 4).status().message().find("NaN"), std::string::npos);
  EXPECT_EQ(loadLocalValues(path + ".none", 4).status().code(), StatusCode::kNotFound);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace fedfleet::model
