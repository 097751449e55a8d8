// Stopping and resuming a real coordinator: SIGTERM mid-round, --resume of a finished run, and
// --resume with a config that changes the run.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>

#include "common/history/history.h"
#include "tests/integration/coordinator_fixture.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

using testing::coordinatorSection;
using testing::hasEvent;
using testing::kBinary;
using testing::keygen;
using testing::openHistory;
using testing::Process;
using testing::startClient;
using testing::startCoordinator;
using testing::writeConfig;

// A coordinator on `endpoint` resuming the run of `dir`'s history, with `extra` flags.
std::unique_ptr<Process> resumeCoordinator(const std::string& dir, const std::string& config,
                                           const std::string& endpoint,
                                           const std::vector<std::string>& extra,
                                           const std::string& log_name) {
  std::vector<std::string> args = {kBinary,   "coordinator", "--bind", endpoint,
                                   "--keys",  dir + "/keys", "--db",   dir + "/history.db",
                                   "--resume"};
  if (!config.empty()) args.insert(args.end(), {"--config", config});  // else: the stored one
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<Process>(args, dir + "/" + log_name);
}

// Every round of the run exactly once, 0..rounds.size()-1 in order; ok rounds with their updates.
void expectConsistentRounds(history::HistoryStore& store, int64_t run, uint32_t clients) {
  auto rounds = store.rounds(run);
  ASSERT_TRUE(rounds.isOk());
  for (size_t i = 0; i < rounds->size(); ++i) {
    const auto& r = (*rounds)[i];
    EXPECT_EQ(r.round, i);
    if (r.status != "ok") continue;
    auto updates = store.updates(run, r.round);
    ASSERT_TRUE(updates.isOk());
    EXPECT_EQ(updates->size(), r.selected);
    EXPECT_EQ(r.completed, clients);
  }
}

// SIGTERM stops the coordinator cleanly (exit 143, as a shell reports SIGTERM), and a resume
// with nothing but --resume and where things are takes the run's stored config. The clients'
// uploads of the old session are dropped quietly: no warning on either side.
TEST(Resume, SigtermMidRoundExits143WithAConsistentHistoryAndTheRunContinues) {
  const std::string dir = testing::freshDir("sigterm");
  ASSERT_EQ(keygen(dir + "/keys", {"--coordinator", "--clients", "2"}), 0);
  const std::string config = writeConfig(dir, coordinatorSection(2, 2, 2, 90));
  const std::vector<std::string> extra = {"--rounds", "4", "--set", "train.epochs=2"};
  std::string endpoint;
  auto first = startCoordinator(dir, config, extra, &endpoint);
  ASSERT_FALSE(endpoint.empty()) << first->log();
  std::vector<std::unique_ptr<Process>> clients;
  for (int i = 1; i <= 2; ++i) {
    clients.push_back(startClient(dir, config, endpoint, "client-" + std::to_string(i)));
  }
  ASSERT_TRUE(first->waitForLog("round   1 ok", 150)) << first->log();
  first->kill(SIGTERM);  // round 2 is in flight
  auto rc = first->waitFor(60);
  ASSERT_TRUE(rc.has_value()) << first->log();
  EXPECT_EQ(*rc, 128 + SIGTERM) << first->log();
  EXPECT_NE(first->log().find("continue with --resume"), std::string::npos) << first->log();

  {
    auto store = openHistory(dir);
    ASSERT_TRUE(store);
    const int64_t run = store->runs()->front().run_id;
    expectConsistentRounds(*store, run, 2);
    auto rounds = store->rounds(run);
    ASSERT_TRUE(rounds.isOk());
    ASSERT_GE(rounds->size(), 2u);
    EXPECT_LT(rounds->size(), 5u);
    // The last committed round has its checkpoint: the resume starts right after it.
    auto cps = store->checkpointRounds(run);
    ASSERT_TRUE(cps.isOk());
    ASSERT_FALSE(cps->empty());
    EXPECT_EQ(cps->back(), rounds->back().round);
    auto events = store->events(run);
    ASSERT_TRUE(events.isOk());
    EXPECT_TRUE(hasEvent(*events, "run_interrupted", "stopped")) << first->log();
  }

  // The clients kept waiting; the resumed coordinator finishes the run with them, from the
  // run's stored config (no --config, no --rounds: the 4 rounds and 2 epochs are the run's).
  const size_t client_log_before = clients[0]->log().size();
  auto second = resumeCoordinator(dir, "", endpoint, {}, "coordinator2.log");
  rc = second->waitFor(240);
  ASSERT_TRUE(rc.has_value()) << second->log();
  ASSERT_EQ(*rc, 0) << second->log();
  for (auto& c : clients) EXPECT_TRUE(c->waitFor(30).has_value()) << c->log();
  auto store = openHistory(dir);
  ASSERT_TRUE(store);
  const int64_t run = store->runs()->front().run_id;
  auto rounds = store->rounds(run);
  ASSERT_TRUE(rounds.isOk());
  ASSERT_EQ(rounds->size(), 5u);
  expectConsistentRounds(*store, run, 2);
  for (uint32_t r = 1; r <= 4; ++r) EXPECT_EQ((*rounds)[r].status, "ok");
  // The old session's traffic is neither an event nor a warning.
  auto events = store->events(run);
  ASSERT_TRUE(events.isOk());
  EXPECT_FALSE(hasEvent(*events, "unknown_client")) << second->log();
  EXPECT_FALSE(hasEvent(*events, "unknown_token")) << second->log();
  EXPECT_EQ(second->log().find("warning"), std::string::npos) << second->log();
  const std::string after = clients[0]->log().substr(client_log_before);
  EXPECT_EQ(after.find("coordinator error"), std::string::npos) << after;
}

TEST(Resume, AFinishedRunSaysSoAndAChangedConfigIsRefusedUnlessAccepted) {
  const std::string dir = testing::freshDir("resumecfg");
  ASSERT_EQ(keygen(dir + "/keys", {"--coordinator", "--clients", "2"}), 0);
  const std::string config = writeConfig(dir, coordinatorSection(2, 2, 2, 90));
  std::string endpoint;
  auto coord = startCoordinator(dir, config, {"--rounds", "2"}, &endpoint);
  ASSERT_FALSE(endpoint.empty()) << coord->log();
  std::vector<std::unique_ptr<Process>> clients;
  clients.push_back(startClient(dir, config, endpoint, "client-1"));
  // One of two: the coordinator says who it is waiting with.
  EXPECT_TRUE(coord->waitForLog("waiting for clients: 1 of 2 connected (client-1)", 60))
      << coord->log();
  clients.push_back(startClient(dir, config, endpoint, "client-2"));
  auto rc = coord->waitFor(240);
  ASSERT_TRUE(rc.has_value()) << coord->log();
  ASSERT_EQ(*rc, 0) << coord->log();
  for (auto& c : clients) c->waitFor(30);

  // The same config: nothing to resume, said plainly, exit 0.
  auto same = resumeCoordinator(dir, config, endpoint, {"--rounds", "2"}, "same.log");
  rc = same->waitFor(60);
  ASSERT_TRUE(rc.has_value()) << same->log();
  EXPECT_EQ(*rc, 0) << same->log();
  EXPECT_NE(same->log().find("already finished"), std::string::npos) << same->log();

  // More rounds change the run: refused, naming the change and the flag.
  auto more = resumeCoordinator(dir, config, endpoint, {"--rounds", "3"}, "more.log");
  rc = more->waitFor(60);
  ASSERT_TRUE(rc.has_value()) << more->log();
  EXPECT_NE(*rc, 0) << more->log();
  EXPECT_NE(more->log().find("run.rounds 2 -> 3"), std::string::npos) << more->log();
  EXPECT_NE(more->log().find("--resume-changes"), std::string::npos) << more->log();

  // Accepted: recorded, and the run trains its third round.
  auto accepted = resumeCoordinator(dir, config, endpoint, {"--rounds", "3", "--resume-changes"},
                                    "accepted.log");
  clients.clear();
  for (int i = 1; i <= 2; ++i) {
    clients.push_back(startClient(dir, config, endpoint, "client-" + std::to_string(i)));
  }
  rc = accepted->waitFor(240);
  ASSERT_TRUE(rc.has_value()) << accepted->log();
  ASSERT_EQ(*rc, 0) << accepted->log();
  for (auto& c : clients) c->waitFor(30);

  // The accepted change is the run's config now: the same flags again find it finished.
  auto again = resumeCoordinator(dir, config, endpoint, {"--rounds", "3"}, "again.log");
  rc = again->waitFor(60);
  ASSERT_TRUE(rc.has_value()) << again->log();
  EXPECT_EQ(*rc, 0) << again->log();
  EXPECT_NE(again->log().find("already finished"), std::string::npos) << again->log();

  auto store = openHistory(dir);
  ASSERT_TRUE(store);
  auto runs = store->runs();
  ASSERT_TRUE(runs.isOk());
  ASSERT_EQ(runs->size(), 1u);
  const int64_t run = runs->front().run_id;
  auto rounds = store->rounds(run);
  ASSERT_TRUE(rounds.isOk());
  ASSERT_EQ(rounds->size(), 4u);
  EXPECT_EQ((*rounds)[3].status, "ok");
  auto events = store->events(run);
  ASSERT_TRUE(events.isOk());
  int changes = 0;
  for (const auto& e : *events) {
    if (e.kind != "resume_changes") continue;
    ++changes;
    EXPECT_EQ(e.detail, R"({"run.rounds":{"from":2,"to":3}})");
  }
  EXPECT_EQ(changes, 1);
}

}  // namespace
}  // namespace fedfleet
