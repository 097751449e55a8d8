#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "common/data/dataset.h"

namespace fedfleet::data {
namespace {

Dataset makeDataset(uint8_t seed) {
  Dataset ds;
  ds.rows = 4;
  ds.cols = 3;
  for (int i = 0; i < 5; ++i) ds.labels.push_back(static_cast<uint8_t>(i % 10));
  for (size_t i = 0; i < 5 * 12; ++i) ds.images.push_back(static_cast<uint8_t>(seed + i * 7));
  return ds;
}

std::string cacheDir() {
  std::string dir = std::string(FEDFLEET_TEST_TMP) + "/share-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(ShareImages, MovesPixelsIntoOneMappedFile) {
  const std::string dir = cacheDir();
  Dataset a = makeDataset(1);
  const std::vector<uint8_t> pixels = a.images;
  ASSERT_TRUE(shareImages(a, dir, "k1").isOk());
  EXPECT_TRUE(a.images.empty());
  ASSERT_TRUE(a.shared_images);
  EXPECT_EQ(a.pixelBytes(), pixels.size());
  EXPECT_TRUE(std::equal(pixels.begin(), pixels.end(), a.pixels()));
  EXPECT_EQ(a.image(2)[5], pixels[2 * 12 + 5]);
  EXPECT_EQ(std::filesystem::file_size(dir + "/k1.pixels"), pixels.size());

  // A second process-like load with the same key maps the existing file.
  Dataset b = makeDataset(1);
  ASSERT_TRUE(shareImages(b, dir, "k1").isOk());
  EXPECT_TRUE(std::equal(pixels.begin(), pixels.end(), b.pixels()));
}

TEST(ShareImages, DifferentPixelsUnderTheSameKeyAreRefusedAndKept) {
  const std::string dir = cacheDir();
  Dataset a = makeDataset(1);
  ASSERT_TRUE(shareImages(a, dir, "k").isOk());
  Dataset c = makeDataset(9);
  const std::vector<uint8_t> mine = c.images;
  Status st = shareImages(c, dir, "k");
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.toString();
  EXPECT_FALSE(c.shared_images);
  EXPECT_EQ(c.images, mine);  // nothing lost
}

TEST(ShareImages, UnwritableDirectoryIsAnErrorAndLosesNothing) {
  Dataset a = makeDataset(3);
  const std::vector<uint8_t> mine = a.images;
  Status st = shareImages(a, "/proc/fedfleet-cannot-write-here", "k");
  EXPECT_FALSE(st.isOk());
  EXPECT_EQ(a.images, mine);
}

}  // namespace
}  // namespace fedfleet::data
