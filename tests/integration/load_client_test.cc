// The benchmarks' load client (bench/load_client.cc) against a real coordinator: its fake
// updates must be accepted, or bench/load.sh and bench/memory_soak.sh measure rounds that fail.
// And its claims are checked like anyone's: an update claiming more samples than its partition
// holds is rejected, and the load client says so in its exit status.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/history/history.h"
#include "tests/integration/coordinator_fixture.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

using testing::coordinatorSection;
using testing::keygen;
using testing::openHistory;
using testing::Process;
using testing::startCoordinator;
using testing::writeConfig;

constexpr int kClients = 5;
constexpr int kRounds = 2;

// A coordinator of kRounds rounds of all kClients (logistic regression, two upload credits so
// that grants are waited for) and the load client with `load_extra` flags. Returns the load
// client's exit status (-1: it did not stop) and leaves its output in *load_log.
int runLoad(const std::string& dir, const std::vector<std::string>& load_extra,
            std::string* load_log) {
  EXPECT_EQ(keygen(dir + "/keys", {"--coordinator", "--clients", std::to_string(kClients)}), 0);
  const std::string config = writeConfig(
      dir, coordinatorSection(kClients, kClients, kClients, 30, "max_concurrent_uploads = 2"));
  std::string endpoint;
  auto coord = startCoordinator(
      dir, config, {"--rounds", std::to_string(kRounds), "--model", "logreg"}, &endpoint);
  EXPECT_FALSE(endpoint.empty()) << coord->log();
  if (endpoint.empty()) return -1;
  std::vector<std::string> args = {FEDFLEET_LOAD_CLIENT,
                                   "--coordinator",
                                   endpoint,
                                   "--keys",
                                   dir + "/keys",
                                   "--clients",
                                   std::to_string(kClients),
                                   "--time-limit-s",
                                   "120",
                                   "--exit-idle-s",
                                   "30",
                                   "--seed",
                                   "7"};
  args.insert(args.end(), load_extra.begin(), load_extra.end());
  Process load(args, dir + "/load.log");
  auto rc = coord->waitFor(120);
  EXPECT_TRUE(rc.has_value()) << "coordinator did not finish\n" << coord->log();
  // A coordinator that exits may not flush every Bye: stop the load client as the benchmarks do.
  load.kill(SIGTERM);
  auto load_rc = load.waitFor(30);
  *load_log = load.log();
  return load_rc.value_or(-1);
}

TEST(LoadClient, FakeUpdatesAreAcceptedEveryRound) {
  const std::string dir = testing::freshDir("load_client");
  std::string log;
  const int rc = runLoad(dir, {"--delay-s", "0.05"}, &log);
  EXPECT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("LOAD clients=5 connected=5 "), std::string::npos) << log;
  EXPECT_NE(log.find(" uploads=10 rejected=0 "), std::string::npos) << log;

  auto store = openHistory(dir);
  ASSERT_TRUE(store);
  auto runs = store->runs();
  ASSERT_TRUE(runs.isOk() && runs->size() == 1);
  auto rounds = store->rounds(runs->front().run_id);
  ASSERT_TRUE(rounds.isOk());
  int ok = 0;
  for (const auto& r : *rounds) {
    if (r.round == 0) continue;
    EXPECT_EQ(r.status, "ok") << "round " << r.round;
    EXPECT_EQ(r.completed, static_cast<uint32_t>(kClients)) << "round " << r.round;
    EXPECT_EQ(r.rejected, 0u) << "round " << r.round;
    ok += r.status == "ok";
  }
  EXPECT_EQ(ok, kRounds);
  auto updates = store->updates(runs->front().run_id, std::nullopt);
  ASSERT_TRUE(updates.isOk());
  ASSERT_EQ(updates->size(), static_cast<size_t>(kClients * kRounds));
  for (const auto& u : *updates) {
    EXPECT_EQ(u.status, "completed") << u.client_id << " round " << u.round;
    EXPECT_EQ(u.n_samples, 1u);
  }
}

TEST(LoadClient, AnUpdateClaimingTooManySamplesIsRejected) {
  const std::string dir = testing::freshDir("load_client_claims");
  std::string log;
  // 6,000 training samples in 5 partitions: none holds a million.
  const int rc = runLoad(dir, {"--samples", "1000000"}, &log);
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find("connected=5 "), std::string::npos) << log;
  EXPECT_NE(log.find(" rejected=10 "), std::string::npos) << log;
  EXPECT_NE(log.find("samples, partition"), std::string::npos) << log;

  auto store = openHistory(dir);
  ASSERT_TRUE(store);
  auto runs = store->runs();
  ASSERT_TRUE(runs.isOk() && runs->size() == 1);
  auto rounds = store->rounds(runs->front().run_id);
  ASSERT_TRUE(rounds.isOk());
  for (const auto& r : *rounds) {
    if (r.round == 0) continue;
    EXPECT_EQ(r.status, "failed") << "round " << r.round;
  }
}

}  // namespace
}  // namespace fedfleet
