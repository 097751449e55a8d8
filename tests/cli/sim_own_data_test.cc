// `fedfleet sim` on the user's own files: a CSV training file split over the virtual clients
// and a CSV test file (or a held-out share) the server evaluates on, and folders of RGB PNG and
// JPEG images. The files are written here; the history must show the model learning them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "common/history/history.h"
#include "tests/cli/blobs.h"
#include "tests/common/data/image_files.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

using ::testing::HasSubstr;
const std::string kBinary = FEDFLEET_BINARY;

using testing::writeBlobs;

std::vector<std::string> simArgs(const std::string& db, const std::vector<std::string>& sets) {
  std::vector<std::string> all = {"model.name=logreg", "data.partition=iid", "train.epochs=2",
                                  "train.lr=0.1"};
  all.insert(all.end(), sets.begin(), sets.end());
  return testing::smallSimArgs(kBinary, db, 5, all);
}

std::vector<history::RoundRecord> roundsOf(const std::string& db) {
  auto store = history::openSqliteHistoryReadOnly(db);
  EXPECT_TRUE(store.isOk()) << store.status().toString();
  if (!store.isOk()) return {};
  auto runs = (*store)->runs().value();
  EXPECT_EQ(runs.size(), 1u);
  return (*store)->rounds(runs.at(0).run_id).value();
}

// The history of a 5-round run on separable data: every round ok and, whatever the untrained
// model's random start, nearly every test sample right at the end and the loss fallen.
void expectLearnt(const std::string& db) {
  const auto rounds = roundsOf(db);
  ASSERT_EQ(rounds.size(), 6u) << "the initial evaluation and 5 rounds";
  ASSERT_TRUE(rounds.front().test_accuracy.has_value());
  ASSERT_TRUE(rounds.back().test_accuracy.has_value());
  EXPECT_GT(*rounds.back().test_accuracy, 0.9);
  EXPECT_GT(*rounds.back().test_accuracy, *rounds.front().test_accuracy);
  ASSERT_TRUE(rounds.front().test_loss.has_value() && rounds.back().test_loss.has_value());
  EXPECT_LT(*rounds.back().test_loss, *rounds.front().test_loss);
  for (const auto& r : rounds) {
    if (r.round > 0) {
      EXPECT_EQ(r.status, "ok") << r.round;
    }
  }
}

TEST(SimOwnData, ACsvDataSetIsSplitOverTheClientsAndLearnt) {
  const std::string dir = testing::freshDir("sim-own-csv");
  writeBlobs(dir + "/train.csv", 900, 1);
  writeBlobs(dir + "/test.csv", 300, 2);
  const std::string db = dir + "/h.db";
  testing::Process sim(
      simArgs(db, {"data.format=csv", "data.path=" + dir + "/train.csv",
                   "data.test_path=" + dir + "/test.csv", "data.label_column=class",
                   "data.feature_columns=[\"f0\",\"f1\",\"f2\",\"f3\"]"}),
      dir + "/sim.txt");
  ASSERT_EQ(sim.waitFor(120).value_or(-1), 0) << sim.log();
  expectLearnt(db);
}

TEST(SimOwnData, AHeldOutShareServesAsTheTestSet) {
  const std::string dir = testing::freshDir("sim-own-holdout");
  writeBlobs(dir + "/all.csv", 1200, 3);
  const std::string db = dir + "/h.db";
  testing::Process sim(simArgs(db, {"data.format=csv", "data.path=" + dir + "/all.csv",
                                    "data.holdout_fraction=0.25", "data.label_column=class",
                                    "data.feature_columns=[\"f0\",\"f1\",\"f2\",\"f3\"]"}),
                       dir + "/sim.txt");
  ASSERT_EQ(sim.waitFor(120).value_or(-1), 0) << sim.log();
  const auto rounds = roundsOf(db);
  ASSERT_EQ(rounds.size(), 6u);
  EXPECT_GT(rounds.back().test_accuracy.value_or(0), 0.9);
}

TEST(SimOwnData, ABrokenDataFileStopsTheRunNamingTheFileAndRow) {
  const std::string dir = testing::freshDir("sim-own-broken");
  {
    std::ofstream out(dir + "/train.csv");
    out << "a,b,label\n1,2,0\n3,4\n";
  }
  writeBlobs(dir + "/test.csv", 30, 2);
  testing::Process sim(simArgs(dir + "/h.db", {"data.format=csv", "data.path=" + dir + "/train.csv",
                                               "data.test_path=" + dir + "/test.csv"}),
                       dir + "/sim.txt");
  const int rc = sim.waitFor(60).value_or(-1);
  EXPECT_NE(rc, 0);
  EXPECT_THAT(sim.log(), HasSubstr(dir + "/train.csv"));
  EXPECT_THAT(sim.log(), HasSubstr("row 3: 2 fields, the header has 3"));
}

// root/<colour>/<i>.png|.jpg: `per_class` images of each of three classes, noisy squares whose
// dominant channel is the class (blue, green, red in byte order: channels 2, 1, 0), some 8x8
// PNGs, some 12x12 JPEGs that the reader resamples to 8x8.
void writeColourFolder(const std::string& root, int per_class, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> noise(-30, 30);
  const char* names[] = {"blue", "green", "red"};
  for (int c = 0; c < 3; ++c) {
    std::filesystem::create_directories(root + "/" + names[c]);
    for (int i = 0; i < per_class; ++i) {
      const bool jpeg = i % 3 == 0;
      const uint32_t side = jpeg ? 12 : 8;
      std::vector<uint8_t> px(side * side * 3);
      for (size_t p = 0; p < px.size(); ++p) {
        const bool dominant = static_cast<int>(p % 3) == 2 - c;
        px[p] = static_cast<uint8_t>((dominant ? 190 : 60) + noise(rng));
      }
      const std::string file = root + "/" + names[c] + "/" + std::to_string(i);
      const bool written = jpeg ? data::testing::writeJpeg(file + ".jpg", side, side, 3, px, 90)
                                : data::testing::writePng(file + ".png", side, side, 3, px);
      ASSERT_TRUE(written) << file;
    }
  }
}

TEST(SimOwnData, AnRgbImageFolderIsSplitOverTheClientsAndLearnt) {
  const std::string dir = testing::freshDir("sim-own-images");
  writeColourFolder(dir + "/train", 60, 1);
  writeColourFolder(dir + "/test", 20, 2);
  const std::string db = dir + "/h.db";
  testing::Process sim(simArgs(db, {"data.format=image-folder", "data.path=" + dir + "/train",
                                    "data.test_path=" + dir + "/test", "data.image_channels=3",
                                    "data.image_size=8"}),
                       dir + "/sim.txt");
  ASSERT_EQ(sim.waitFor(120).value_or(-1), 0) << sim.log();
  expectLearnt(db);
}

TEST(SimOwnData, ABrokenImageStopsTheRunNamingTheFile) {
  const std::string dir = testing::freshDir("sim-own-broken-image");
  writeColourFolder(dir + "/train", 10, 1);
  writeColourFolder(dir + "/test", 3, 2);
  std::ofstream(dir + "/train/red/zz.png") << "not a PNG";
  testing::Process sim(
      simArgs(dir + "/h.db", {"data.format=image-folder", "data.path=" + dir + "/train",
                              "data.test_path=" + dir + "/test"}),
      dir + "/sim.txt");
  EXPECT_NE(sim.waitFor(60).value_or(-1), 0);
  EXPECT_THAT(sim.log(), HasSubstr(dir + "/train/red/zz.png: neither a PNG nor a JPEG"));
}

TEST(SimOwnData, ACsvConfigWithoutATestSetIsRefusedBeforeAnythingRuns) {
  const std::string dir = testing::freshDir("sim-own-notest");
  writeBlobs(dir + "/train.csv", 30, 1);
  testing::Process sim(
      simArgs(dir + "/h.db", {"data.format=csv", "data.path=" + dir + "/train.csv"}),
      dir + "/sim.txt");
  EXPECT_NE(sim.waitFor(60).value_or(-1), 0);
  EXPECT_THAT(sim.log(), HasSubstr("data.test_path' or data.holdout_fraction is needed"));
}

}  // namespace
}  // namespace fedfleet
