// The coordinator's live metrics: a real coordinator and two client processes on 127.0.0.1; the
// test scrapes /metrics while the run goes on and sees the round counter rise, then checks the
// figures it saw against the history the run wrote.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/history/history.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

using testing::Process;

const std::string kBinary = FEDFLEET_BINARY;
constexpr int kRounds = 6;

// The value of the sample `name` (no labels) in a Prometheus text; -1 when absent.
double sampleValue(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

TEST(Metrics, ScrapedRoundCounterRisesDuringARun) {
  const std::string dir = testing::freshDir("metrics");
  const std::string config = dir + "/job.toml";
  std::ofstream(config) << "[run]\nname = \"metrics\"\nseed = 5\nrounds = " << kRounds
                        << "\n[model]\nname = \"mlp\"\n[data]\npartition = \"iid\"\n"
                           "train_subset = 6000\ntest_subset = 1000\n"
                           "[coordinator]\nclients_per_round = 2\nmin_clients = 2\nquorum = 2\n"
                           "deadline_s = 120\n[train]\nepochs = 1\nbatch = 32\n";
  const int port = testing::freeLoopbackPort();
  Process coord({kBinary, "coordinator", "--config", config, "--insecure", "--bind",
                 "tcp://127.0.0.1:*", "--db", dir + "/history.db", "--endpoint-file",
                 dir + "/endpoint", "--metrics-port", std::to_string(port)},
                dir + "/coordinator.log");
  const std::string endpoint = testing::waitForEndpoint(dir + "/endpoint", 60);
  ASSERT_FALSE(endpoint.empty()) << coord.log();

  httplib::Client http("127.0.0.1", port);
  http.set_connection_timeout(2);
  http.set_read_timeout(2);
  // Before any client: the endpoint answers, and no training round is committed. Round 0 (the
  // initial model's evaluation, counted too) needs no client, so it may already be in: a
  // loaded machine scrapes after the evaluation ends.
  auto first = http.Get("/metrics");
  ASSERT_TRUE(first) << httplib::to_string(first.error()) << "\n" << coord.log();
  EXPECT_EQ(first->status, 200);
  EXPECT_EQ(sampleValue(first->body, "fedfleet_rounds_target"), kRounds);
  const double committed_before = sampleValue(first->body, "fedfleet_rounds_committed_total");
  EXPECT_GE(committed_before, 0);
  EXPECT_LE(committed_before, 1);
  auto status = http.Get("/status");
  ASSERT_TRUE(status);
  const int64_t run_id = nlohmann::json::parse(status->body)["run_id"].get<int64_t>();

  std::vector<std::unique_ptr<Process>> clients;
  for (int i = 1; i <= 2; ++i) {
    const std::string id = "client-" + std::to_string(i);
    clients.push_back(std::make_unique<Process>(
        std::vector<std::string>{kBinary, "client", "--config", config, "--insecure",
                                 "--coordinator", endpoint, "--id", id, "--exit-idle", "60"},
        dir + "/" + id + ".log"));
  }

  // Scrape until the coordinator exits (bounded): every value of the counters seen, in order.
  std::vector<double> rounds_seen, committed_seen;
  double max_connected = 0, last_bytes_up = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  while (coord.running() && std::chrono::steady_clock::now() < until) {
    if (coord.waitFor(0)) break;
    if (auto res = http.Get("/metrics"); res && res->status == 200) {
      const double round = sampleValue(res->body, "fedfleet_round");
      const double committed = sampleValue(res->body, "fedfleet_rounds_committed_total");
      if (rounds_seen.empty() || rounds_seen.back() != round) rounds_seen.push_back(round);
      if (committed_seen.empty() || committed_seen.back() != committed) {
        committed_seen.push_back(committed);
      }
      max_connected = std::max(max_connected, sampleValue(res->body, "fedfleet_connected_clients"));
      last_bytes_up = sampleValue(res->body, "fedfleet_bytes_up_total");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto rc = coord.waitFor(30);
  ASSERT_TRUE(rc.has_value()) << "coordinator did not finish\n" << coord.log();
  ASSERT_EQ(*rc, 0) << coord.log();

  // The counter rose: several values, each above the one before, never past the run's rounds.
  ASSERT_GE(rounds_seen.size(), 3u) << coord.log();
  for (size_t i = 1; i < rounds_seen.size(); ++i) {
    EXPECT_GT(rounds_seen[i], rounds_seen[i - 1]) << "fedfleet_round went back at " << i;
  }
  EXPECT_LE(rounds_seen.back(), kRounds);
  ASSERT_GE(committed_seen.size(), 2u);
  for (size_t i = 1; i < committed_seen.size(); ++i) {
    EXPECT_GT(committed_seen[i], committed_seen[i - 1]);
  }
  EXPECT_EQ(max_connected, 2);

  // What was scraped agrees with the history: no more rounds than were committed, and the last
  // bytes figure is the sum over the rounds committed by then (a prefix of the run's rounds).
  auto store = history::openSqliteHistory(dir + "/history.db");
  ASSERT_TRUE(store.isOk());
  auto rounds = (*store)->rounds(run_id);
  ASSERT_TRUE(rounds.isOk());
  ASSERT_EQ(rounds->size(), static_cast<size_t>(kRounds + 1));
  EXPECT_LE(committed_seen.back(), static_cast<double>(rounds->size()));
  double prefix = 0;
  bool matches_a_prefix = last_bytes_up == 0;
  for (const auto& r : *rounds) {
    prefix += static_cast<double>(r.bytes_up);
    matches_a_prefix |= prefix == last_bytes_up;
  }
  EXPECT_TRUE(matches_a_prefix) << "bytes_up " << last_bytes_up << " is no prefix sum";
  for (auto& c : clients) c->waitFor(20);
}

}  // namespace
}  // namespace fedfleet
