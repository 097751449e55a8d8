// ControlVariate: SCAFFOLD's c_k accumulates control deltas, in fp32 exactly and in bf16/fp16
// within their rounding, and survives a save/load; a corrupt, truncated or wrong-size file is
// refused (load) or replaced by zeros (loadOrZeros).
#include "client/control_variate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tests/client/test_data.h"

namespace fedfleet::client {
namespace {

using compress::ResidualStorage;

class ControlVariateFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(FEDFLEET_TEST_TMP) /
           ("control_variate_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "ck.bin").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string readFile() const {
    std::ifstream in(path_, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  void writeFile(const std::string& bytes) const {
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes;
  }

  std::filesystem::path dir_;
  std::string path_;
};

TEST(ControlVariateTest, StartsAtZeroWithoutMemoryAndAccumulatesExactlyInFp32) {
  ControlVariate cv(1000);
  EXPECT_EQ(cv.size(), 1000u);
  EXPECT_EQ(cv.memoryBytes(), 0u);
  EXPECT_EQ(cv.values(), std::vector<float>(1000, 0.0f));
  const std::vector<float> a = uniformFloats(1000, 1, 1.0f), b = uniformFloats(1000, 2, 1.0f);
  cv.apply(a);
  EXPECT_EQ(cv.memoryBytes(), 4000u);
  EXPECT_EQ(cv.values(), a);
  cv.apply(b);
  const std::vector<float> got = cv.values();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], a[i] + b[i]) << i;
  float part[3];
  cv.values(500, 3, part);
  EXPECT_EQ(part[2], a[502] + b[502]);
  cv.reset(7);
  EXPECT_EQ(cv.size(), 7u);
  EXPECT_EQ(cv.memoryBytes(), 0u);
  EXPECT_EQ(cv.values(), std::vector<float>(7, 0.0f));
}

// Half storage: each stored value is the running sum rounded once more, so after T applications
// the error is at most T half-ulps of the largest magnitude seen: 2^-8 relative (bf16, 8
// significant bits) or 2^-11 (fp16, 11) per application. Values here stay below 4.
TEST(ControlVariateTest, HalfStorageIsWithinItsRounding) {
  for (const auto& [storage, rel] : {std::pair{ResidualStorage::kBf16, 1.0 / 256},
                                     std::pair{ResidualStorage::kFp16, 1.0 / 2048}}) {
    ControlVariate cv(3000, storage);
    std::vector<double> exact(3000, 0.0);
    constexpr int kRounds = 4;
    for (int t = 0; t < kRounds; ++t) {
      const std::vector<float> d = uniformFloats(3000, 10 + t, 1.0f);
      cv.apply(d);
      for (size_t i = 0; i < d.size(); ++i) exact[i] += d[i];
    }
    EXPECT_EQ(cv.memoryBytes(), 6000u);
    const std::vector<float> got = cv.values();
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - exact[i]));
    EXPECT_LE(worst, kRounds * 4.0 * rel) << compress::residualStorageName(storage);
    EXPECT_GT(worst, 0.0) << "no rounding at all: not stored as half";
  }
}

TEST_F(ControlVariateFileTest, SaveThenLoadGivesTheSameValuesAndLeavesNoTemporaryFile) {
  ControlVariate cv(777);
  cv.apply(uniformFloats(777, 3, 0.5f));
  ASSERT_TRUE(cv.save(path_).isOk());
  EXPECT_EQ(readFile().size(), 16 + 777 * 4 + 32);
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    ++files;
    EXPECT_EQ(e.path().filename(), "ck.bin");
  }
  EXPECT_EQ(files, 1u);
  auto loaded = ControlVariate::load(path_);
  ASSERT_TRUE(loaded.isOk()) << loaded.status().toString();
  EXPECT_EQ(loaded->values(), cv.values());

  // Saving again replaces the file; a zero control variate saves and loads as zeros.
  ControlVariate zero(5);
  ASSERT_TRUE(zero.save(path_).isOk());
  loaded = ControlVariate::load(path_, ResidualStorage::kBf16);
  ASSERT_TRUE(loaded.isOk());
  EXPECT_EQ(loaded->size(), 5u);
  EXPECT_EQ(loaded->storage(), ResidualStorage::kBf16);
  EXPECT_EQ(loaded->memoryBytes(), 0u);
}

TEST_F(ControlVariateFileTest, BadFilesAreRefused) {
  EXPECT_EQ(ControlVariate::load(path_).status().code(), StatusCode::kNotFound);
  ControlVariate cv(64);
  cv.apply(uniformFloats(64, 4, 1.0f));
  ASSERT_TRUE(cv.save(path_).isOk());
  const std::string good = readFile();

  std::string flipped = good;
  flipped[40] = static_cast<char>(flipped[40] ^ 0x10);  // a value's bit: the checksum tells
  writeFile(flipped);
  auto r = ControlVariate::load(path_);
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(r.status().message().find("checksum"), std::string::npos) << r.status().toString();

  writeFile(good.substr(0, good.size() - 4));  // truncated
  EXPECT_EQ(ControlVariate::load(path_).status().code(), StatusCode::kCorrupt);
  writeFile("not a control variate at all, but long enough to have a header and a digest");
  EXPECT_EQ(ControlVariate::load(path_).status().code(), StatusCode::kCorrupt);
  writeFile("");
  EXPECT_EQ(ControlVariate::load(path_).status().code(), StatusCode::kCorrupt);

  // A directory that does not exist: the save fails, nothing is created.
  const std::string nowhere = (dir_ / "missing" / "ck.bin").string();
  EXPECT_EQ(cv.save(nowhere).code(), StatusCode::kIoError);
  EXPECT_FALSE(std::filesystem::exists(nowhere));
}

TEST_F(ControlVariateFileTest, LoadOrZerosFallsBackToZeroOnABadOrWrongSizeFile) {
  ControlVariate cv(32);
  cv.apply(uniformFloats(32, 5, 1.0f));
  ASSERT_TRUE(cv.save(path_).isOk());
  EXPECT_EQ(ControlVariate::loadOrZeros(path_, 32).values(), cv.values());
  EXPECT_EQ(ControlVariate::loadOrZeros(path_, 33).values(), std::vector<float>(33, 0.0f));
  writeFile("garbage");
  EXPECT_EQ(ControlVariate::loadOrZeros(path_, 32).values(), std::vector<float>(32, 0.0f));
  EXPECT_EQ(ControlVariate::loadOrZeros((dir_ / "none").string(), 4).values(),
            std::vector<float>(4, 0.0f));
  EXPECT_EQ(ControlVariate::loadOrZeros("", 4, ResidualStorage::kFp16).storage(),
            ResidualStorage::kFp16);
}

}  // namespace
}  // namespace fedfleet::client
