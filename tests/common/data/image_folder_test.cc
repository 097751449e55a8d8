// The image-folder data source: folders of PNG and JPEG files written here, grey and RGB, of
// several sizes; the pixels, labels and counts they become; and every broken folder or file,
// each a clear error naming it.
#include "common/data/image_folder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/atomic_file.h"
#include "common/data/image_codec.h"
#include "common/data/source.h"
#include "tests/common/data/image_files.h"
#include "tests/common/data/scratch_dir.h"

namespace fedfleet::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::solid;
using testing::writeJpeg;
using testing::writePng;

class ImageFolderTest : public testing::ScratchDirTest {
 protected:
  // dir_/relative, its folders created; returns the path.
  std::string path(const std::string& relative) {
    const std::filesystem::path p = dir_ / relative;
    std::filesystem::create_directories(p.parent_path());
    return p.string();
  }
  std::string png(const std::string& relative, uint32_t rows, uint32_t cols, uint32_t channels,
                  const std::vector<uint8_t>& pixels) {
    const std::string p = path(relative);
    EXPECT_TRUE(writePng(p, rows, cols, channels, pixels)) << p;
    return p;
  }
  std::string jpeg(const std::string& relative, uint32_t rows, uint32_t cols, uint32_t channels,
                   const std::vector<uint8_t>& pixels) {
    const std::string p = path(relative);
    EXPECT_TRUE(writeJpeg(p, rows, cols, channels, pixels)) << p;
    return p;
  }
  // The first `keep` bytes of `file` written over it.
  void truncate(const std::string& file, size_t keep) {
    std::string bytes = readWholeFile(file).value();
    ASSERT_GT(bytes.size(), keep);
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes.substr(0, keep);
  }
  Result<ImageFolder> load(const std::string& relative, ImageFolderOptions options = {}) {
    return loadImageFolder((dir_ / relative).string(), options);
  }
};

TEST(ResizeImage, ReducingAveragesAndEnlargingInterpolatesBetweenNeighbours) {
  Image square{2, 2, 1, {0, 100, 200, 100}};
  Image out;
  resizeImage(square, 1, 1, out);
  EXPECT_THAT(out.pixels, ElementsAre(100));  // (0 + 100 + 200 + 100) / 4

  Image pair{1, 2, 1, {0, 200}};
  resizeImage(pair, 1, 4, out);
  // Output centres 0.25, 0.75, 1.25, 1.75 in source pixels: edge, 3:1, 1:3, edge.
  EXPECT_THAT(out.pixels, ElementsAre(0, 50, 150, 200));

  Image rgb{5, 3, 3, solid(5, 3, {10, 20, 30})};
  resizeImage(rgb, 2, 7, out);
  EXPECT_EQ(out.rows, 2u);
  EXPECT_EQ(out.cols, 7u);
  EXPECT_EQ(out.pixels, solid(2, 7, {10, 20, 30}));
}

// Classes in byte order (upper case first), files by name, extensions in any case, other files
// left alone; every image decoded to grey and brought to the first image's 2x2.
TEST_F(ImageFolderTest, GreyFolderOfPngAndJpegIsReadInClassAndNameOrder) {
  png("root/C_up/x.PNG", 2, 2, 1, {0, 100, 200, 100});
  std::ofstream(path("root/C_up/notes.txt")) << "not an image";
  png("root/a_dog/0.png", 2, 2, 3, solid(2, 2, {200, 100, 50}));  // luma 124.7 -> 124
  jpeg("root/a_dog/1.jpg", 16, 16, 1, solid(16, 16, {77}));       // reduced to 2x2
  png("root/b_cat/big.png", 4, 4, 2, solid(4, 4, {30, 0}));       // alpha dropped, not composited
  jpeg("root/b_cat/z.JPEG", 8, 8, 3, solid(8, 8, {200, 100, 50}));
  std::filesystem::create_directories(dir_ / "root/b_cat/nested");
  png("root/b_cat/nested/ignored.png", 2, 2, 1, {1, 2, 3, 4});
  std::ofstream(path("root/README")) << "a file beside the class folders";

  auto folder = load("root");
  ASSERT_TRUE(folder.isOk()) << folder.status().toString();
  EXPECT_THAT(folder->classes, ElementsAre("C_up", "a_dog", "b_cat"));
  const Dataset& ds = folder->data;
  EXPECT_EQ(ds.num_classes, 3u);
  EXPECT_FALSE(ds.hasFeatures());
  EXPECT_EQ(ds.rows, 2u);
  EXPECT_EQ(ds.cols, 2u);
  ASSERT_EQ(ds.size(), 5u);
  EXPECT_THAT(ds.labels, ElementsAre(0, 1, 1, 2, 2));
  auto pixelsOf = [&](size_t i) {
    return std::vector<uint8_t>(ds.image(i), ds.image(i) + ds.imageBytes());
  };
  EXPECT_THAT(pixelsOf(0), ElementsAre(0, 100, 200, 100));
  EXPECT_EQ(pixelsOf(1), solid(2, 2, {124}));
  EXPECT_EQ(pixelsOf(2), solid(2, 2, {77}));  // a solid JPEG of quality 100 decodes exactly
  EXPECT_EQ(pixelsOf(3), solid(2, 2, {30}));
  // A colour JPEG decoded to grey is its Y plane: 0.299 R + 0.587 G + 0.114 B = 124.7.
  for (uint8_t v : pixelsOf(4)) EXPECT_NEAR(v, 125, 1);
}

// RGB: feature vectors [3, rows, cols], channel after channel, each byte / 255; grey images
// repeated into the three channels; every image resampled to the configured size.
TEST_F(ImageFolderTest, RgbFolderBecomesChannelFirstFeaturesOfTheConfiguredSize) {
  png("rgb/one/a.png", 3, 3, 3, solid(3, 3, {10, 20, 30}));
  png("rgb/one/b.png", 2, 2, 4, solid(2, 2, {40, 50, 60, 0}));  // transparent: colour kept
  png("rgb/two/c.png", 5, 5, 1, solid(5, 5, {90}));
  jpeg("rgb/two/d.jpg", 8, 8, 3, solid(8, 8, {200, 100, 50}));
  ImageFolderOptions options;
  options.channels = 3;
  options.rows = 2;
  options.cols = 4;
  auto folder = load("rgb", options);
  ASSERT_TRUE(folder.isOk()) << folder.status().toString();
  const Dataset& ds = folder->data;
  ASSERT_EQ(ds.size(), 4u);
  EXPECT_THAT(ds.labels, ElementsAre(0, 0, 1, 1));
  EXPECT_TRUE(ds.hasFeatures());
  EXPECT_THAT(ds.sample_shape, ElementsAre(3, 2, 4));
  EXPECT_EQ(ds.feature_dim, 24u);
  EXPECT_EQ(ds.rows, 0u);
  EXPECT_TRUE(checkSampleStorage(ds).isOk());
  auto expectSolid = [&](size_t i, std::vector<int> rgb, float tolerance) {
    const float* x = ds.feature(i);
    for (size_t c = 0; c < 3; ++c) {
      for (size_t p = 0; p < 8; ++p) {
        EXPECT_NEAR(x[c * 8 + p], rgb[c] / 255.0f, tolerance) << "sample " << i << " c " << c;
      }
    }
  };
  expectSolid(0, {10, 20, 30}, 0);
  expectSolid(1, {40, 50, 60}, 0);
  expectSolid(2, {90, 90, 90}, 0);
  expectSolid(3, {200, 100, 50}, 3 / 255.0f);  // JPEG's colour conversion rounds
}

TEST_F(ImageFolderTest, ALimitDecodesOnlyTheFirstImages) {
  png("root/a/0.png", 2, 2, 1, solid(2, 2, {1}));
  png("root/a/1.png", 2, 2, 1, solid(2, 2, {2}));
  std::ofstream(path("root/b/broken.png")) << "\x89PNG\r\n\x1a\n and then nothing";
  auto folder = loadImageFolder((dir_ / "root").string(), {}, /*limit=*/2);
  ASSERT_TRUE(folder.isOk()) << folder.status().toString();
  EXPECT_EQ(folder->data.size(), 2u);
  EXPECT_EQ(folder->data.num_classes, 2u);
}

// Many images over several threads: the failure reported is the first broken file in order.
TEST_F(ImageFolderTest, TheFirstBrokenImageInOrderIsReportedWhateverTheThreads) {
  for (int i = 0; i < 300; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "root/c/%03d.png", i);
    if (i == 150 || i == 290) {
      std::ofstream(path(name)) << "\x89PNG\r\n\x1a\n garbage";
    } else {
      png(name, 3, 3, 1, solid(3, 3, {static_cast<uint8_t>(i)}));
    }
  }
  ImageFolderOptions options;
  options.threads = 4;
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto folder = load("root", options);
    ASSERT_FALSE(folder.isOk());
    EXPECT_EQ(folder.status().code(), StatusCode::kCorrupt);
    EXPECT_THAT(folder.status().message(), HasSubstr("150.png"));
  }
  std::filesystem::remove(dir_ / "root/c/150.png");
  std::filesystem::remove(dir_ / "root/c/290.png");
  auto good = load("root", options);
  ASSERT_TRUE(good.isOk()) << good.status().toString();
  ASSERT_EQ(good->data.size(), 298u);
  EXPECT_EQ(good->data.image(297)[0], static_cast<uint8_t>(299));  // "299.png" is the last
}

// Each broken file or folder alone in a root of its own (beside a good image where it is a
// file), and what its error must say.
class BrokenImageFolderTest : public ImageFolderTest {
 protected:
  std::string good(const std::string& root) {
    return png(root + "/good/ok.png", 4, 4, 1, solid(4, 4, {5}));
  }
};

TEST_F(BrokenImageFolderTest, EachBrokenInputIsAClearErrorNamingTheFileOrFolder) {
  auto expectError = [&](const std::string& root, StatusCode code, const std::string& names,
                         const std::string& reason, ImageFolderOptions options = {}) {
    auto folder = load(root, options);
    ASSERT_FALSE(folder.isOk()) << root;
    EXPECT_EQ(folder.status().code(), code) << folder.status().toString();
    EXPECT_THAT(folder.status().message(), HasSubstr(names));
    EXPECT_THAT(folder.status().message(), HasSubstr(reason));
  };
  // A corrupt PNG: the signature, then bytes that are no PNG chunk.
  good("corrupt_png");
  std::ofstream(path("corrupt_png/good/bad.png"), std::ios::binary)
      << std::string("\x89PNG\r\n\x1a\n", 8) << std::string(64, 'x');
  expectError("corrupt_png", StatusCode::kCorrupt, "corrupt_png/good/bad.png", "PNG");

  // A PNG cut in the middle of its image data.
  std::vector<uint8_t> noise(64 * 64 * 3);
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<uint8_t>(i * 7919 % 251);
  const std::string whole = png("truncated_png/a/whole.png", 64, 64, 3, noise);
  truncate(whole, readWholeFile(whole)->size() / 2);
  expectError("truncated_png", StatusCode::kCorrupt, "truncated_png/a/whole.png",
              "damaged or truncated PNG");

  // A corrupt JPEG: the start-of-image marker, then nothing a decoder can use.
  good("corrupt_jpeg");
  std::ofstream(path("corrupt_jpeg/good/bad.jpg"), std::ios::binary)
      << std::string("\xff\xd8\xff\xe0", 4) << std::string(100, '\x01');
  expectError("corrupt_jpeg", StatusCode::kCorrupt, "corrupt_jpeg/good/bad.jpg", "JPEG");

  // A JPEG cut halfway through its scan: libjpeg would only warn and make up the rest.
  noise.resize(32 * 32 * 3);
  const std::string cut = jpeg("truncated_jpeg/a/cut.jpg", 32, 32, 3, noise);
  truncate(cut, readWholeFile(cut)->size() * 2 / 3);
  expectError("truncated_jpeg", StatusCode::kCorrupt, "truncated_jpeg/a/cut.jpg",
              "damaged or truncated JPEG");

  // A text file named .png among images, and an empty one.
  good("text_png");
  std::ofstream(path("text_png/good/notes.png")) << "hello";
  expectError("text_png", StatusCode::kCorrupt, "text_png/good/notes.png",
              "neither a PNG nor a JPEG");
  good("empty_png");
  std::ofstream(path("empty_png/good/empty.png")) << "";
  expectError("empty_png", StatusCode::kCorrupt, "empty_png/good/empty.png", "an empty file");

  // An empty class folder beside a good one, and one holding only files of other kinds.
  good("empty_class");
  std::filesystem::create_directories(dir_ / "empty_class/nothing");
  expectError("empty_class", StatusCode::kInvalidArgument, "empty_class/nothing",
              "holds no .png, .jpg or .jpeg file");
  good("no_images");
  std::ofstream(path("no_images/texts/a.txt")) << "a";
  expectError("no_images", StatusCode::kInvalidArgument, "no_images/texts", "holds no .png");

  // No root; a root with images but no class folders; a root that is a file.
  expectError("missing", StatusCode::kNotFound, "missing'", "does not exist");
  png("flat/a.png", 2, 2, 1, {1, 2, 3, 4});
  expectError("flat", StatusCode::kInvalidArgument, "flat'", "holds no class folder");
  expectError("flat/a.png", StatusCode::kInvalidArgument, "flat/a.png'", "is not a folder");

  // Options out of range.
  good("options");
  ImageFolderOptions two_channels;
  two_channels.channels = 2;
  expectError("options", StatusCode::kInvalidArgument, "2", "1 (grey) or 3 (RGB)", two_channels);
  ImageFolderOptions half_size;
  half_size.rows = 8;
  expectError("options", StatusCode::kInvalidArgument, "8x0", "both sides", half_size);
}

class ImageFolderSourceTest : public ImageFolderTest {
 protected:
  FileSource source(const std::string& train, const std::string& test) {
    FileSource s;
    s.format = DataFormat::kImageFolder;
    s.path = (dir_ / train).string();
    if (!test.empty()) s.test_path = (dir_ / test).string();
    return s;
  }
};

// The test folder takes the training images' size and must name the same classes.
TEST_F(ImageFolderSourceTest, TheTestFolderTakesTheTrainingSizeAndClasses) {
  png("train/cat/0.png", 2, 2, 1, solid(2, 2, {10}));
  png("train/dog/0.png", 2, 2, 1, solid(2, 2, {20}));
  png("test/cat/0.png", 6, 6, 1, solid(6, 6, {30}));
  jpeg("test/dog/0.jpg", 8, 8, 1, solid(8, 8, {40}));
  auto both = loadTrainTest(source("train", "test"));
  ASSERT_TRUE(both.isOk()) << both.status().toString();
  EXPECT_EQ(both->train.size(), 2u);
  ASSERT_EQ(both->test.size(), 2u);
  EXPECT_EQ(both->test.rows, 2u);
  EXPECT_EQ(both->test.cols, 2u);
  EXPECT_THAT(both->test.labels, ElementsAre(0, 1));
  EXPECT_EQ(both->test.image(1)[3], 40);
  EXPECT_EQ(both->train.num_classes, 2u);

  png("other/cat/0.png", 2, 2, 1, solid(2, 2, {30}));
  png("other/emu/0.png", 2, 2, 1, solid(2, 2, {30}));
  auto renamed = loadTrainTest(source("train", "other"));
  ASSERT_FALSE(renamed.isOk());
  EXPECT_EQ(renamed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(renamed.status().message(), HasSubstr((dir_ / "train").string()));
  EXPECT_THAT(renamed.status().message(), HasSubstr((dir_ / "other").string()));
  EXPECT_THAT(renamed.status().message(), HasSubstr("class 1 is 'dog' in the one, 'emu'"));

  png("fewer/cat/0.png", 2, 2, 1, solid(2, 2, {30}));
  auto fewer = loadTrainTest(source("train", "fewer"));
  ASSERT_FALSE(fewer.isOk());
  EXPECT_THAT(fewer.status().message(), HasSubstr("only the training folder has 'dog'"));
}

TEST_F(ImageFolderSourceTest, WithoutATestFolderASeededShareIsHeldOut) {
  for (int i = 0; i < 10; ++i) {
    png("train/" + std::string(i % 2 ? "b" : "a") + "/" + std::to_string(i) + ".png", 3, 3, 3,
        solid(3, 3, {static_cast<uint8_t>(i), 0, 0}));
  }
  FileSource s = source("train", "");
  s.image_folder.channels = 3;
  s.holdout_fraction = 0.3;
  s.seed = 7;
  auto both = loadTrainTest(s);
  ASSERT_TRUE(both.isOk()) << both.status().toString();
  EXPECT_EQ(both->train.size(), 7u);
  EXPECT_EQ(both->test.size(), 3u);
  EXPECT_THAT(both->test.sample_shape, ElementsAre(3, 3, 3));
}

}  // namespace
}  // namespace fedfleet::data
