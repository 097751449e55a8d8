#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/data/dataset.h"

namespace fedfleet::data {
namespace {

namespace fs = std::filesystem;

void putBigEndian32(std::vector<uint8_t>& out, uint32_t v) {
  out.push_back(static_cast<uint8_t>(v >> 24));
  out.push_back(static_cast<uint8_t>(v >> 16));
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

std::vector<uint8_t> idxImages(uint32_t n, uint32_t rows, uint32_t cols, uint32_t magic = 0x803) {
  std::vector<uint8_t> out;
  putBigEndian32(out, magic);
  putBigEndian32(out, n);
  putBigEndian32(out, rows);
  putBigEndian32(out, cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) out.push_back(static_cast<uint8_t>(i * 7 + 3));
  return out;
}

std::vector<uint8_t> idxLabels(uint32_t n, uint32_t magic = 0x801) {
  std::vector<uint8_t> out;
  putBigEndian32(out, magic);
  putBigEndian32(out, n);
  for (uint32_t i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>((i * 3) % 10));
  return out;
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(FEDFLEET_TEST_TMP) /
           ("idx_test_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string writePlain(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    return path;
  }

  std::string writeGzip(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = (dir_ / name).string();
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    EXPECT_EQ(gzclose(f), Z_OK);
    return path;
  }

  fs::path dir_;
};

TEST_F(IdxTest, ReadsPlainFiles) {
  const auto images = idxImages(5, 3, 4);
  const auto labels = idxLabels(5);
  auto ds = loadIdx(writePlain("img", images), writePlain("lbl", labels));
  ASSERT_TRUE(ds.isOk()) << ds.status().toString();
  EXPECT_EQ(ds->size(), 5u);
  EXPECT_EQ(ds->rows, 3u);
  EXPECT_EQ(ds->cols, 4u);
  EXPECT_EQ(ds->num_classes, 10u) << "labels 0 3 6 9 2: the largest is 9";
  EXPECT_EQ(ds->images, std::vector<uint8_t>(images.begin() + 16, images.end()));
  EXPECT_EQ(ds->labels, std::vector<Label>(labels.begin() + 8, labels.end()));
  EXPECT_EQ(ds->image(2)[0], images[16 + 2 * 12]);
}

TEST_F(IdxTest, TheClassCountIsTheLargestLabelPlusOneNotTen) {
  // Labels 0 and 3: four classes, not Fashion-MNIST's ten.
  auto ds = loadIdx(writePlain("img", idxImages(2, 2, 2)), writePlain("lbl", idxLabels(2)));
  ASSERT_TRUE(ds.isOk()) << ds.status().toString();
  EXPECT_EQ(ds->num_classes, 4u);
}

TEST_F(IdxTest, ReadsGzipFilesAndKeepsLimit) {
  const auto images = idxImages(7, 2, 5);
  const auto labels = idxLabels(7);
  auto ds = loadIdx(writeGzip("img.gz", images), writeGzip("lbl.gz", labels), 3);
  ASSERT_TRUE(ds.isOk()) << ds.status().toString();
  EXPECT_EQ(ds->size(), 3u);
  EXPECT_EQ(ds->images, std::vector<uint8_t>(images.begin() + 16, images.begin() + 16 + 3 * 10));
  EXPECT_EQ(ds->labels, std::vector<Label>(labels.begin() + 8, labels.begin() + 11));
  // A limit above the count keeps everything.
  auto all = loadIdx((dir_ / "img.gz").string(), (dir_ / "lbl.gz").string(), 100);
  ASSERT_TRUE(all.isOk());
  EXPECT_EQ(all->size(), 7u);
}

TEST_F(IdxTest, NumClassesGrowsWithLargeLabels) {
  auto labels = idxLabels(3);
  labels.back() = 46;  // EMNIST-balanced style
  auto ds = loadIdx(writePlain("img", idxImages(3, 2, 2)), writePlain("lbl", labels));
  ASSERT_TRUE(ds.isOk());
  EXPECT_EQ(ds->num_classes, 47u);
}

TEST_F(IdxTest, BadMagicIsCorrupt) {
  const std::string lbl = writePlain("lbl", idxLabels(4));
  auto ds = loadIdx(writePlain("img", idxImages(4, 2, 2, 0x801)), lbl);
  ASSERT_FALSE(ds.isOk());
  EXPECT_EQ(ds.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(ds.status().message().find("img"), std::string::npos);
  EXPECT_NE(ds.status().message().find("magic"), std::string::npos);

  auto swapped =
      loadIdx(writePlain("img2", idxImages(4, 2, 2)), writePlain("lbl2", idxLabels(4, 0x803)));
  ASSERT_FALSE(swapped.isOk());
  EXPECT_EQ(swapped.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(swapped.status().message().find("lbl2"), std::string::npos);
}

TEST_F(IdxTest, TruncatedPlainFileIsCorrupt) {
  auto images = idxImages(4, 3, 3);
  images.resize(images.size() - 5);
  auto ds = loadIdx(writePlain("img", images), writePlain("lbl", idxLabels(4)));
  ASSERT_FALSE(ds.isOk());
  EXPECT_EQ(ds.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(ds.status().message().find("truncated"), std::string::npos);

  auto header_only = idxLabels(4);
  header_only.resize(6);
  auto ds2 = loadIdx(writePlain("img2", idxImages(4, 3, 3)), writePlain("lbl2", header_only));
  ASSERT_FALSE(ds2.isOk());
  EXPECT_EQ(ds2.status().code(), StatusCode::kCorrupt);
}

TEST_F(IdxTest, TruncatedGzipFileIsCorrupt) {
  const std::string full = writeGzip("img.gz", idxImages(200, 28, 28));
  std::ifstream in(full, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 100u);
  bytes.resize(bytes.size() / 2);
  const std::string cut = writePlain("cut.gz", std::vector<uint8_t>(bytes.begin(), bytes.end()));
  auto ds = loadIdx(cut, writeGzip("lbl.gz", idxLabels(200)));
  ASSERT_FALSE(ds.isOk());
  EXPECT_EQ(ds.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(ds.status().message().find("cut.gz"), std::string::npos);
}

TEST_F(IdxTest, TrailingBytesAreCorrupt) {
  auto labels = idxLabels(4);
  labels.push_back(1);
  auto ds = loadIdx(writePlain("img", idxImages(4, 2, 2)), writePlain("lbl", labels));
  ASSERT_FALSE(ds.isOk());
  EXPECT_EQ(ds.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(ds.status().message().find("longer"), std::string::npos);
}

TEST_F(IdxTest, CountMismatchIsCorrupt) {
  auto ds = loadIdx(writePlain("img", idxImages(5, 2, 2)), writePlain("lbl", idxLabels(4)));
  ASSERT_FALSE(ds.isOk());
  EXPECT_EQ(ds.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(ds.status().message().find("labels"), std::string::npos);
}

TEST_F(IdxTest, ZeroDimensionIsCorrupt) {
  auto ds = loadIdx(writePlain("img", idxImages(4, 0, 2)), writePlain("lbl", idxLabels(4)));
  ASSERT_FALSE(ds.isOk());
  EXPECT_EQ(ds.status().code(), StatusCode::kCorrupt);
}

TEST_F(IdxTest, AbsurdHeaderIsCorruptWithoutAllocating) {
  // A header announcing 2^32-1 images of 4096x4096 must be rejected, not allocated.
  auto ds = loadIdx(writePlain("img", idxImages(0, 4096, 4096)), writePlain("lbl", idxLabels(0)));
  ASSERT_FALSE(ds.isOk());  // zero count
  std::vector<uint8_t> huge;
  putBigEndian32(huge, 0x803);
  putBigEndian32(huge, 0xffffffffu);
  putBigEndian32(huge, 4096);
  putBigEndian32(huge, 4096);
  auto ds2 = loadIdx(writePlain("huge", huge), writePlain("lbl2", idxLabels(4)));
  ASSERT_FALSE(ds2.isOk());
  EXPECT_EQ(ds2.status().code(), StatusCode::kCorrupt);
}

TEST_F(IdxTest, MissingFileIsNotFound) {
  const std::string lbl = writePlain("lbl", idxLabels(4));
  auto ds = loadIdx((dir_ / "nope").string(), lbl);
  ASSERT_FALSE(ds.isOk());
  EXPECT_EQ(ds.status().code(), StatusCode::kNotFound);
  EXPECT_NE(ds.status().message().find("nope"), std::string::npos);
  auto fm = loadFashionMnist((dir_ / "no_such_dir").string(), true);
  ASSERT_FALSE(fm.isOk());
  EXPECT_EQ(fm.status().code(), StatusCode::kNotFound);
}

// ----- parseIdx: the same reader over bytes in memory -------------------------------------------

std::string asString(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

std::string gzipBytes(const std::string& plain) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, plain.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(plain.data()));
  z.avail_in = static_cast<uInt>(plain.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

TEST_F(IdxTest, ParseIdxReadsWhatLoadIdxReads) {
  const auto images = idxImages(6, 3, 2);
  const auto labels = idxLabels(6);
  auto loaded = loadIdx(writeGzip("img.gz", images), writePlain("lbl", labels), 4);
  ASSERT_TRUE(loaded.isOk()) << loaded.status().toString();
  for (bool gzip_images : {false, true}) {
    const std::string img = gzip_images ? gzipBytes(asString(images)) : asString(images);
    auto parsed = parseIdx(img, asString(labels), 4);
    ASSERT_TRUE(parsed.isOk()) << parsed.status().toString();
    EXPECT_EQ(parsed->rows, loaded->rows);
    EXPECT_EQ(parsed->cols, loaded->cols);
    EXPECT_EQ(parsed->num_classes, loaded->num_classes);
    EXPECT_EQ(parsed->images, loaded->images);
    EXPECT_EQ(parsed->labels, loaded->labels);
  }
}

TEST(ParseIdxTest, GzipMembersFollowOneAnotherAndTrailingBytesAreIgnored) {
  // As zlib's gzread: a second member continues the data; bytes after the last member that do
  // not start another are ignored.
  const std::string images = asString(idxImages(3, 2, 2));
  const std::string labels = asString(idxLabels(3));
  const std::string two_members = gzipBytes(images.substr(0, 9)) + gzipBytes(images.substr(9));
  auto ds = parseIdx(two_members, gzipBytes(labels) + "trailing", 0);
  ASSERT_TRUE(ds.isOk()) << ds.status().toString();
  EXPECT_EQ(ds->images, std::vector<uint8_t>(images.begin() + 16, images.end()));
  EXPECT_EQ(ds->labels, std::vector<Label>(labels.begin() + 8, labels.end()));
}

TEST(ParseIdxTest, DamagedGzipIsCorruptAndNamesTheInput) {
  const std::string labels = asString(idxLabels(3));
  std::string bad_crc = gzipBytes(asString(idxImages(3, 2, 2)));
  bad_crc[bad_crc.size() - 6] ^= 0x5a;  // the CRC-32 in the trailer
  auto ds = parseIdx(bad_crc, labels, 0, "imgs.gz", "lbls");
  ASSERT_FALSE(ds.isOk());
  EXPECT_EQ(ds.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(ds.status().message().find("imgs.gz"), std::string::npos) << ds.status().toString();
  EXPECT_NE(ds.status().message().find("damaged"), std::string::npos) << ds.status().toString();

  std::string cut = gzipBytes(asString(idxImages(50, 8, 8)));
  cut.resize(cut.size() / 2);
  auto truncated = parseIdx(cut, asString(idxLabels(50)), 0, "imgs.gz", "lbls");
  ASSERT_FALSE(truncated.isOk());
  EXPECT_EQ(truncated.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos);
}

TEST(ParseIdxTest, EmptyAndShortInputsAreCorrupt) {
  const std::string images = asString(idxImages(3, 2, 2));
  const std::string labels = asString(idxLabels(3));
  for (const std::string& bad :
       {std::string(), std::string("\x1f"), std::string("\x1f\x8b"), labels.substr(0, 7)}) {
    auto ds = parseIdx(images, bad, 0);
    ASSERT_FALSE(ds.isOk());
    EXPECT_EQ(ds.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(ds.status().message().find("labels"), std::string::npos);
  }
}

TEST(FashionMnistTest, DefaultDirHonoursEnvironment) {
  ::setenv("FEDFLEET_FASHION_MNIST_DIR", "/tmp/elsewhere", 1);
  EXPECT_EQ(defaultFashionMnistDir(), "/tmp/elsewhere");
  ::unsetenv("FEDFLEET_FASHION_MNIST_DIR");
  EXPECT_EQ(defaultFashionMnistDir(), "/usr/share/datasets/fashion-mnist");
}

class RealFashionMnistTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fs::path(defaultFashionMnistDir()) / kFashionMnistTrainImages)) {
      GTEST_SKIP() << "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)";
    }
  }
};

TEST_F(RealFashionMnistTest, LoadsTrainAndTest) {
  auto train = loadFashionMnist(defaultFashionMnistDir(), true);
  ASSERT_TRUE(train.isOk()) << train.status().toString();
  EXPECT_EQ(train->size(), 60000u);
  EXPECT_EQ(train->rows, 28u);
  EXPECT_EQ(train->cols, 28u);
  EXPECT_EQ(train->num_classes, 10u);
  EXPECT_EQ(train->images.size(), 60000u * 784u);
  EXPECT_EQ(train->labels[0], 9);  // the first training image is an ankle boot
  std::vector<size_t> counts(10, 0);
  for (uint8_t l : train->labels) {
    ASSERT_LT(l, 10);
    ++counts[l];
  }
  for (size_t c : counts) EXPECT_EQ(c, 6000u);  // Fashion-MNIST is balanced

  auto test = loadFashionMnist(defaultFashionMnistDir(), false);
  ASSERT_TRUE(test.isOk()) << test.status().toString();
  EXPECT_EQ(test->size(), 10000u);
  EXPECT_EQ(test->rows, 28u);
}

TEST_F(RealFashionMnistTest, LimitKeepsPrefix) {
  auto head = loadFashionMnist(defaultFashionMnistDir(), false, 100);
  ASSERT_TRUE(head.isOk());
  auto all = loadFashionMnist(defaultFashionMnistDir(), false);
  ASSERT_TRUE(all.isOk());
  ASSERT_EQ(head->size(), 100u);
  EXPECT_TRUE(std::equal(head->images.begin(), head->images.end(), all->images.begin()));
  EXPECT_TRUE(std::equal(head->labels.begin(), head->labels.end(), all->labels.begin()));
}

}  // namespace
}  // namespace fedfleet::data
