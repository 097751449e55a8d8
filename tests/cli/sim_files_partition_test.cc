// data.partition = "files" in `fedfleet sim`: a directory of one file per client gives natural
// partitions (LEAF's per-user splits): client k trains the k-th file by name, whole, and its
// updates claim exactly that file's samples; a directory that does not match sim.clients, or
// holds a broken file, is one clear error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/history/history.h"
#include "tests/cli/blobs.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

const std::string kBinary = FEDFLEET_BINARY;

std::vector<std::string> simArgs(const std::string& dir, int clients) {
  return {kBinary,
          "sim",
          "--clients",
          std::to_string(clients),
          "--clients-per-round",
          std::to_string(clients),
          "--rounds",
          "2",
          "--progress",
          "off",
          "--db",
          dir + "/h.db",
          "--set",
          "data.format=csv",
          "--set",
          "data.partition=files",
          "--set",
          "data.path=" + dir + "/clients",
          "--set",
          "data.test_path=" + dir + "/test.csv",
          "--set",
          "data.label_column=class",
          "--set",
          "data.feature_columns=[\"f0\",\"f1\",\"f2\",\"f3\"]",
          "--set",
          "model.name=logreg",
          "--set",
          "train.lr=0.1"};
}

// Files b.csv, a.csv, c.csv (written out of order) of 80, 50 and 120 samples.
void writeClientFiles(const std::string& dir) {
  std::filesystem::create_directories(dir + "/clients");
  testing::writeBlobsOf(dir + "/clients/b.csv", 80, 3, {1, 2});
  testing::writeBlobsOf(dir + "/clients/a.csv", 50, 4, {0, 1});
  testing::writeBlobsOf(dir + "/clients/c.csv", 120, 5, {0, 1, 2});
  testing::writeBlobs(dir + "/test.csv", 90, 6);
  std::ofstream(dir + "/clients/.hidden") << "not a client\n";
}

TEST(SimFilesPartition, EachClientTrainsItsOwnFileWhole) {
  const std::string dir = testing::freshDir("sim-files");
  writeClientFiles(dir);
  testing::Process p(simArgs(dir, 3), dir + "/sim.txt");
  ASSERT_EQ(p.waitFor(120).value_or(-1), 0) << p.log();
  auto store = history::openSqliteHistoryReadOnly(dir + "/h.db");
  ASSERT_TRUE(store.isOk()) << store.status().toString();
  const int64_t run = (*store)->runs().value().front().run_id;
  const auto updates = (*store)->updates(run, std::nullopt).value();
  ASSERT_EQ(updates.size(), 6u);
  const std::vector<uint64_t> by_name = {50, 80, 120};  // a.csv, b.csv, c.csv
  for (const auto& u : updates) {
    ASSERT_GE(u.partition, 0);
    ASSERT_LT(u.partition, 3);
    EXPECT_EQ(u.status, "completed");
    EXPECT_EQ(u.n_samples, by_name[u.partition]) << u.client_id << " round " << u.round;
  }
  const auto rounds = (*store)->rounds(run).value();
  ASSERT_EQ(rounds.size(), 3u);
  ASSERT_TRUE(rounds[2].test_accuracy.has_value());
}

TEST(SimFilesPartition, ADirectoryThatDoesNotFitIsAClearError) {
  const std::string dir = testing::freshDir("sim-files-bad");
  writeClientFiles(dir);
  {
    testing::Process p(simArgs(dir, 4), dir + "/sim4.txt");
    EXPECT_NE(p.waitFor(60).value_or(-1), 0);
    EXPECT_NE(p.log().find("holds 3 client files"), std::string::npos) << p.log();
    EXPECT_NE(p.log().find("set sim.clients = 3"), std::string::npos) << p.log();
  }
  // A fourth file that lacks two of the feature columns: the error names it.
  std::ofstream(dir + "/clients/d.csv") << "id,f0,f1,class\ns0,0.5,1.5,0\ns1,1.0,2.0,1\n";
  testing::Process p(simArgs(dir, 4), dir + "/columns.txt");
  EXPECT_NE(p.waitFor(60).value_or(-1), 0);
  EXPECT_NE(p.log().find("d.csv"), std::string::npos) << p.log();
}

}  // namespace
}  // namespace fedfleet
