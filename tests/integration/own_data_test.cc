// Real deployments where each client holds its own data: a coordinator with only a test file
// of its own and three client processes, each reading only its own CSV file (of a different
// size and label mix) with data.partition = "none". The global model learns all three classes
// although no client holds them all but one; each update claims exactly its file's samples.
#include <gtest/gtest.h>

#include "common/history/history.h"
#include "tests/cli/blobs.h"
#include "tests/integration/coordinator_fixture.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

using testing::Process;

const std::vector<std::string> kCsv = {
    "--set", "data.format=csv",
    "--set", "data.partition=none",
    "--set", "data.label_column=class",
    "--set", "data.feature_columns=[\"f0\",\"f1\",\"f2\",\"f3\"]",
    "--set", "data.num_classes=3",
    "--set", "model.name=logreg",
    "--set", "train.lr=0.1"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST(Integration, ClientsTrainTheirOwnFilesAndTheCoordinatorOnlyEvaluates) {
  const std::string dir = testing::freshDir("own-data");
  ASSERT_EQ(testing::keygen(dir + "/keys", {"--coordinator", "--clients", "3"}), 0);
  testing::writeBlobsOf(dir + "/test.csv", 300, 9, {0, 1, 2});
  const std::vector<int> sizes = {120, 200, 400};
  const std::vector<std::vector<int>> mixes = {{0, 1}, {1, 2}, {0, 1, 2}};
  for (int i = 0; i < 3; ++i) {
    testing::writeBlobsOf(dir + "/client-" + std::to_string(i + 1) + ".csv", sizes[i], 10 + i,
                          mixes[i]);
  }
  const std::string config = testing::writeConfig(dir, testing::coordinatorSection(3, 3, 3, 120));
  std::string endpoint;
  auto coord = testing::startCoordinator(
      dir, config, with({"--rounds", "5", "--set", "data.test_path=" + dir + "/test.csv"}, kCsv),
      &endpoint);
  ASSERT_FALSE(endpoint.empty()) << coord->log();
  std::vector<std::unique_ptr<Process>> clients;
  for (int i = 1; i <= 3; ++i) {
    const std::string id = "client-" + std::to_string(i);
    clients.push_back(testing::startClient(
        dir, config, endpoint, id, with({"--set", "data.path=" + dir + "/" + id + ".csv"}, kCsv)));
  }
  auto rc = coord->waitFor(240);
  ASSERT_TRUE(rc.has_value()) << "coordinator did not finish\n" << coord->log();
  ASSERT_EQ(*rc, 0) << coord->log() << clients[0]->log();
  for (auto& c : clients) {
    auto crc = c->waitFor(30);
    ASSERT_TRUE(crc.has_value()) << c->log();
    EXPECT_EQ(*crc, 0) << c->log();
  }

  auto store = testing::openHistory(dir);
  ASSERT_TRUE(store);
  const int64_t run = store->runs().value().front().run_id;
  const auto rounds = store->rounds(run).value();
  ASSERT_EQ(rounds.size(), 6u);
  for (uint32_t r = 1; r <= 5; ++r) {
    EXPECT_EQ(rounds[r].status, "ok") << r;
    EXPECT_EQ(rounds[r].completed, 3u) << r;
    const auto updates = store->updates(run, r).value();  // a copy: the Result is a temporary
    ASSERT_EQ(updates.size(), 3u) << r;
    for (const auto& u : updates) {
      const int k = std::stoi(u.client_id.substr(7)) - 1;
      EXPECT_EQ(u.n_samples, static_cast<uint64_t>(sizes[k])) << u.client_id << " round " << r;
    }
  }
  ASSERT_TRUE(rounds.front().test_accuracy && rounds.back().test_accuracy);
  EXPECT_GT(*rounds.back().test_accuracy, 0.9);
  EXPECT_GT(*rounds.back().test_accuracy, *rounds.front().test_accuracy + 0.2);
}

// A client without files of its own, given a coordinator whose tasks say "none", fails each
// task with a message that says what to give it; one with files, given partitioned tasks, too.
TEST(Integration, AClientAndACoordinatorThatDisagreeOnWhoHoldsTheDataSaySo) {
  const std::string dir = testing::freshDir("own-data-mismatch");
  ASSERT_EQ(testing::keygen(dir + "/keys", {"--coordinator", "--clients", "1"}), 0);
  testing::writeBlobs(dir + "/test.csv", 60, 9);
  const std::string config = testing::writeConfig(dir, testing::coordinatorSection(1, 1, 1, 30));
  std::string endpoint;
  auto coord = testing::startCoordinator(
      dir, config, with({"--rounds", "1", "--set", "data.test_path=" + dir + "/test.csv"}, kCsv),
      &endpoint);
  ASSERT_FALSE(endpoint.empty()) << coord->log();
  auto client = testing::startClient(dir, config, endpoint, "client-1");
  auto rc = coord->waitFor(120);
  ASSERT_TRUE(rc.has_value()) << coord->log();
  EXPECT_EQ(*rc, 1) << "its only round failed\n" << coord->log();
  client->waitFor(30);
  EXPECT_NE(client->log().find("this client has no files of its own"), std::string::npos)
      << client->log();
}

}  // namespace
}  // namespace fedfleet
