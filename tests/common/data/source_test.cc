#include "common/data/source.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "tests/common/data/scratch_dir.h"

namespace fedfleet::data {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

void put32(std::string& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((v >> s) & 0xff));
}

class SourceTest : public testing::ScratchDirTest {
 protected:
  // An IDX pair of n images rows x cols (pixel i of sample s = s + i) and labels s % classes.
  void writeIdx(const std::string& stem, uint32_t n, uint32_t rows, uint32_t cols,
                uint32_t classes) {
    std::string images, labels;
    put32(images, 0x803);
    put32(images, n);
    put32(images, rows);
    put32(images, cols);
    for (uint32_t s = 0; s < n; ++s) {
      for (uint32_t i = 0; i < rows * cols; ++i) images.push_back(static_cast<char>(s + i));
    }
    put32(labels, 0x801);
    put32(labels, n);
    for (uint32_t s = 0; s < n; ++s) labels.push_back(static_cast<char>(s % classes));
    write(stem + "-images.idx", images);
    write(stem + "-labels.idx", labels);
  }
};

TEST(DataFormat, NamesRoundTripAndUnknownNamesAreRefused) {
  for (const char* n : {"fashion-mnist", "idx", "csv", "tensors", "image-folder", "synthetic"}) {
    auto f = parseDataFormat(n);
    ASSERT_TRUE(f.isOk()) << n;
    EXPECT_STREQ(dataFormatName(*f), n);
  }
  auto bad = parseDataFormat("parquet");
  ASSERT_FALSE(bad.isOk());
  EXPECT_THAT(bad.status().message(),
              HasSubstr("fashion-mnist, idx, csv, tensors, image-folder or synthetic"));
}

TEST_F(SourceTest, HoldOutIsASeededPartitionOfTheSamples) {
  std::string text = "v,label\n";
  for (int i = 0; i < 100; ++i) text += std::to_string(i) + "," + std::to_string(i % 3) + "\n";
  FileSource s;
  s.format = DataFormat::kCsv;
  s.path = write("d.csv", text);
  s.holdout_fraction = 0.25;
  s.seed = 7;
  auto a = loadTrainTest(s);
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  EXPECT_EQ(a->test.size(), 25u);
  EXPECT_EQ(a->train.size(), 75u);
  std::set<float> seen;
  for (const Dataset* d : {&a->train, &a->test}) {
    for (size_t i = 0; i < d->size(); ++i) {
      const float v = d->feature(i)[0];
      EXPECT_TRUE(seen.insert(v).second) << "sample " << v << " on both sides";
      EXPECT_EQ(d->labels[i], static_cast<int>(v) % 3) << "label travels with its sample";
      if (i > 0) {
        EXPECT_LT(d->feature(i - 1)[0], v) << "original order kept";
      }
    }
  }
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_EQ(a->test.num_classes, 3u);
  // The same seed draws the same samples; another seed others.
  auto b = loadTrainTest(s);
  ASSERT_TRUE(b.isOk());
  EXPECT_EQ(a->test.features, b->test.features);
  s.seed = 8;
  auto c = loadTrainTest(s);
  ASSERT_TRUE(c.isOk());
  EXPECT_NE(a->test.features, c->test.features);
}

TEST_F(SourceTest, AHoldOutThatLeavesASideEmptyIsRefused) {
  FileSource s;
  s.format = DataFormat::kCsv;
  s.path = write("d.csv", "v,label\n1,0\n2,1\n");
  s.holdout_fraction = 0.1;  // round(0.2) = 0 test samples
  auto r = loadTrainTest(s);
  ASSERT_FALSE(r.isOk());
  EXPECT_THAT(r.status().message(), HasSubstr("no test samples"));
}

TEST_F(SourceTest, IdxFilesOfAnySizeAndTheirTestPair) {
  writeIdx("train", 12, 5, 7, 3);
  writeIdx("test", 4, 5, 7, 3);
  FileSource s;
  s.format = DataFormat::kIdx;
  s.path = (dir_ / "train-images.idx").string();
  s.labels_path = (dir_ / "train-labels.idx").string();
  s.test_path = (dir_ / "test-images.idx").string();
  s.test_labels_path = (dir_ / "test-labels.idx").string();
  s.test_limit = 3;
  auto r = loadTrainTest(s);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->train.size(), 12u);
  EXPECT_EQ(r->test.size(), 3u) << "test_limit";
  EXPECT_EQ(r->train.rows, 5u);
  EXPECT_EQ(r->train.cols, 7u);
  EXPECT_EQ(r->test.image(2)[4], 2 + 4);
  EXPECT_EQ(r->test.labels, (std::vector<data::Label>{0, 1, 2}));
  EXPECT_EQ(r->train.num_classes, r->test.num_classes);
}

TEST_F(SourceTest, TrainAndTestOfDifferentShapesAreRefusedNamingBoth) {
  FileSource s;
  s.format = DataFormat::kCsv;
  s.path = write("train.csv", "a,b,label\n1,2,0\n");
  s.test_path = write("test.csv", "a,label\n1,0\n");
  auto r = loadTrainTest(s);
  ASSERT_FALSE(r.isOk());
  EXPECT_THAT(r.status().message(), HasSubstr("2 features"));
  EXPECT_THAT(r.status().message(), HasSubstr("1 features"));
  EXPECT_THAT(r.status().message(), HasSubstr(s.test_path));
}

TEST_F(SourceTest, TheClassCountCoversBothSplits) {
  FileSource s;
  s.format = DataFormat::kCsv;
  s.path = write("train.csv", "a,label\n1,0\n2,1\n");
  s.test_path = write("test.csv", "a,label\n1,4\n");
  auto r = loadTrainTest(s);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->train.num_classes, 5u);
  EXPECT_EQ(r->test.num_classes, 5u);
}

}  // namespace
}  // namespace fedfleet::data
