// Real deployments where each client holds its own data: a coordinator with only a test file
// of its own and three client processes, each reading only its own CSV file (of a different
// size and label mix) with data.partition = "none". The global model learns all three classes
// although no client holds them all but one; each update claims exactly its file's samples.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

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

// The coordinator ends the run with status 0, and then each client with status 0.
void expectAllFinish(Process& coord, std::vector<std::unique_ptr<Process>>& clients) {
  auto rc = coord.waitFor(240);
  ASSERT_TRUE(rc.has_value()) << "coordinator did not finish\n" << coord.log();
  ASSERT_EQ(*rc, 0) << coord.log() << clients[0]->log();
  for (auto& c : clients) {
    auto crc = c->waitFor(30);
    ASSERT_TRUE(crc.has_value()) << c->log();
    EXPECT_EQ(*crc, 0) << c->log();
  }
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
  ASSERT_NO_FATAL_FAILURE(expectAllFinish(*coord, clients));

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

// Federated evaluation alone: a coordinator with no test data of its own, and three clients
// each holding its own CSV file of a different size and label mix, two keeping a quarter of it
// back and one a test file of its own. Every round's tasks ask for an evaluation of the model
// they carry; the rounds' federated figures are the sample-weighted means of the clients' rows,
// and the federated accuracy rises.
TEST(Integration, ACoordinatorWithoutTestDataRunsOnFederatedEvaluation) {
  const std::string dir = testing::freshDir("own-data-fed-eval");
  ASSERT_EQ(testing::keygen(dir + "/keys", {"--coordinator", "--clients", "3"}), 0);
  const std::vector<int> sizes = {160, 240, 400};
  const std::vector<std::vector<int>> mixes = {{0, 1}, {1, 2}, {0, 1, 2}};
  for (int i = 0; i < 3; ++i) {
    testing::writeBlobsOf(dir + "/client-" + std::to_string(i + 1) + ".csv", sizes[i], 20 + i,
                          mixes[i]);
  }
  testing::writeBlobsOf(dir + "/client-3-test.csv", 90, 30, mixes[2]);
  const std::string config = testing::writeConfig(dir, testing::coordinatorSection(3, 3, 3, 120));
  std::string endpoint;
  auto coord = testing::startCoordinator(
      dir, config, with({"--rounds", "5", "--set", "coordinator.fed_eval_every=1"}, kCsv),
      &endpoint);
  ASSERT_FALSE(endpoint.empty()) << coord->log();
  std::vector<std::unique_ptr<Process>> clients;
  for (int i = 1; i <= 3; ++i) {
    const std::string id = "client-" + std::to_string(i);
    std::vector<std::string> args = {"--set", "data.path=" + dir + "/" + id + ".csv"};
    if (i < 3) {
      args.insert(args.end(), {"--set", "data.holdout_fraction=0.25"});
    } else {
      args.insert(args.end(), {"--set", "data.test_path=" + dir + "/client-3-test.csv"});
    }
    clients.push_back(testing::startClient(dir, config, endpoint, id, with(args, kCsv)));
  }
  ASSERT_NO_FATAL_FAILURE(expectAllFinish(*coord, clients));

  auto store = testing::openHistory(dir);
  ASSERT_TRUE(store);
  const int64_t run = store->runs().value().front().run_id;
  const auto rounds = store->rounds(run).value();
  ASSERT_EQ(rounds.size(), 6u);
  EXPECT_EQ(rounds[0].status, "initial");
  // What each client holds out: a quarter of 160 and of 240 (rounded), and its 90-sample file.
  const std::vector<uint64_t> held = {40, 60, 90};
  for (uint32_t r = 0; r <= 5; ++r) {
    EXPECT_FALSE(rounds[r].test_accuracy.has_value()) << "the coordinator has no test data";
  }
  for (uint32_t r = 1; r <= 5; ++r) {
    SCOPED_TRACE("round " + std::to_string(r));
    EXPECT_EQ(rounds[r].status, "ok");
    const auto updates = store->updates(run, r).value();
    ASSERT_EQ(updates.size(), 3u);
    uint64_t n = 0;
    double loss = 0, correct = 0;
    for (const auto& u : updates) {
      const int k = std::stoi(u.client_id.substr(7)) - 1;
      EXPECT_EQ(u.n_samples, static_cast<uint64_t>(sizes[k]) - (k < 2 ? held[k] : 0));
      EXPECT_EQ(u.eval_samples, held[k]) << u.client_id;
      ASSERT_TRUE(u.eval_loss && u.eval_accuracy) << u.client_id;
      n += u.eval_samples;
      loss += static_cast<double>(u.eval_samples) * *u.eval_loss;
      correct += static_cast<double>(u.eval_samples) * *u.eval_accuracy;
    }
    EXPECT_EQ(rounds[r].fed_eval_clients, 3u);
    EXPECT_EQ(rounds[r].fed_eval_samples, n);
    ASSERT_TRUE(rounds[r].fed_eval_loss && rounds[r].fed_eval_accuracy);
    EXPECT_NEAR(*rounds[r].fed_eval_loss, loss / static_cast<double>(n), 1e-12);
    EXPECT_NEAR(*rounds[r].fed_eval_accuracy, correct / static_cast<double>(n), 1e-12);
  }
  // Round 1 evaluates the initial model, round 5 the model after four rounds.
  EXPECT_GT(*rounds[5].fed_eval_accuracy, *rounds[1].fed_eval_accuracy + 0.2);
  EXPECT_GT(*rounds[5].fed_eval_accuracy, 0.8);
}

// y = 1.5 f0 - 2 f1 + 0.3 + noise(0.1), features from N(shift, 1): each client its own region.
void writeLine(const std::string& path, int n, uint64_t seed, double shift) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> x(shift, 1), noise(0, 0.1);
  std::ofstream out(path);
  out << "f0,f1,y\n";
  for (int i = 0; i < n; ++i) {
    const double a = x(rng), b = x(rng);
    out << a << "," << b << "," << 1.5 * a - 2 * b + 0.3 + noise(rng) << "\n";
  }
}

// A regression over real processes: a coordinator without test data (the model built from the
// config: two features, one output) and three clients with their own CSV files of targets; the
// tasks carry train.loss = "mse", the clients report no accuracy and their mse and mae, and the
// rounds' federated figures are the sample-weighted means of the rows, falling as it trains.
TEST(Integration, ARegressionRunsOnTheClientsOwnTargetsWithFederatedEvaluation) {
  const std::string dir = testing::freshDir("own-data-regression");
  ASSERT_EQ(testing::keygen(dir + "/keys", {"--coordinator", "--clients", "3"}), 0);
  const std::vector<int> sizes = {120, 200, 320};
  for (int i = 0; i < 3; ++i) {
    writeLine(dir + "/client-" + std::to_string(i + 1) + ".csv", sizes[i], 40 + i, i - 1.0);
  }
  const std::vector<std::string> regression = {
      "--set", "data.format=csv",      "--set", "data.partition=none",
      "--set", "data.label_column=y",  "--set", "data.feature_columns=[\"f0\",\"f1\"]",
      "--set", "data.task=regression", "--set", "train.loss=mse",
      "--set", "model.name=logreg",    "--set", "train.lr=0.05"};
  const std::string config = testing::writeConfig(dir, testing::coordinatorSection(3, 3, 3, 120));
  std::string endpoint;
  auto coord = testing::startCoordinator(
      dir, config, with({"--rounds", "4", "--set", "coordinator.fed_eval_every=1"}, regression),
      &endpoint);
  ASSERT_FALSE(endpoint.empty()) << coord->log();
  std::vector<std::unique_ptr<Process>> clients;
  for (int i = 1; i <= 3; ++i) {
    const std::string id = "client-" + std::to_string(i);
    clients.push_back(testing::startClient(dir, config, endpoint, id,
                                           with({"--set", "data.path=" + dir + "/" + id + ".csv",
                                                 "--set", "data.holdout_fraction=0.25"},
                                                regression)));
  }
  ASSERT_NO_FATAL_FAILURE(expectAllFinish(*coord, clients));

  auto store = testing::openHistory(dir);
  ASSERT_TRUE(store);
  const int64_t run = store->runs().value().front().run_id;
  const auto rounds = store->rounds(run).value();
  ASSERT_EQ(rounds.size(), 5u);
  for (uint32_t r = 1; r <= 4; ++r) {
    SCOPED_TRACE("round " + std::to_string(r));
    EXPECT_EQ(rounds[r].status, "ok");
    EXPECT_FALSE(rounds[r].fed_eval_accuracy.has_value()) << "a regression";
    const auto updates = store->updates(run, r).value();
    ASSERT_EQ(updates.size(), 3u);
    double n = 0, loss = 0, mae = 0;
    for (const auto& u : updates) {
      EXPECT_EQ(u.status, "completed");
      EXPECT_FALSE(u.eval_accuracy.has_value()) << u.client_id;
      ASSERT_TRUE(u.eval_loss) << u.client_id;
      ASSERT_EQ(u.eval_metrics.size(), 2u) << u.client_id;
      EXPECT_EQ(u.eval_metrics[0].first, "mse");
      EXPECT_NEAR(u.eval_metrics[0].second, *u.eval_loss, 1e-6 * *u.eval_loss)
          << "with one target, the mse loss is the mse";
      EXPECT_EQ(u.eval_metrics[1].first, "mae");
      const auto k = static_cast<double>(u.eval_samples);
      n += k;
      loss += k * *u.eval_loss;
      mae += k * u.eval_metrics[1].second;
    }
    ASSERT_TRUE(rounds[r].fed_eval_loss);
    EXPECT_NEAR(*rounds[r].fed_eval_loss, loss / n, 1e-12);
    ASSERT_EQ(rounds[r].fed_eval_metrics.size(), 2u);
    EXPECT_NEAR(rounds[r].fed_eval_metrics[1].second, mae / n, 1e-12);
  }
  // Round 1 evaluates the initial model, round 4 the model after three rounds.
  EXPECT_LT(*rounds[4].fed_eval_loss, 0.5 * *rounds[1].fed_eval_loss)
      << *rounds[1].fed_eval_loss << " -> " << *rounds[4].fed_eval_loss;
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
