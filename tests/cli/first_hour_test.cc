// A newcomer's first hour with `fedfleet sim`, as they would meet it: no run waits for ever, a
// stopped run says so in its exit code and resumes without its flags typed again, bad input
// names the key that fixes it, and what a run prints says what it measured.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/history/history.h"
#include "tests/cli/blobs.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
const std::string kBinary = FEDFLEET_BINARY;

struct Ran {
  int rc;
  std::string out;
  double seconds;
};

// Under a sanitizer the runs are several times slower (the signal test's uninterrupted run took
// over 120 s under ASan beside other tests on two cores): the bound scales.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr double kSlow = 5;
#else
constexpr double kSlow = 1;
#endif

Ran run(std::vector<std::string> args, const std::string& log, double bound_s = 120 * kSlow) {
  const auto t0 = std::chrono::steady_clock::now();
  testing::Process p(std::move(args), log);
  const int rc = p.waitFor(bound_s).value_or(-1);
  return {rc, p.log(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

// `fedfleet sim` on the blobs files of `dir` with `extra` arguments after the small defaults.
// `fedfleet sim` on the blobs files of `dir` (6 clients, 3 a round), history in dir/`db`.
std::vector<std::string> blobsSim(const std::string& dir, int rounds,
                                  std::vector<std::string> sets = {},
                                  const std::string& db = "h.db") {
  testing::writeBlobs(dir + "/train.csv", 300, 1);
  testing::writeBlobs(dir + "/test.csv", 90, 2);
  std::vector<std::string> all = testing::blobsSimSets(dir);
  all.insert(all.end(), sets.begin(), sets.end());
  return testing::smallSimArgs(kBinary, dir + "/" + db, rounds, all);
}

std::vector<history::RoundRecord> roundsOf(const std::string& db) {
  auto store = history::openSqliteHistoryReadOnly(db);
  EXPECT_TRUE(store.isOk()) << store.status().toString();
  if (!store.isOk()) return {};
  const auto runs = (*store)->runs().value();
  EXPECT_EQ(runs.size(), 1u);
  if (runs.empty()) return {};
  return (*store)->rounds(runs.back().run_id).value();
}

// The README's secure-aggregation example once printed round 1 and then nothing: a cohort of
// every client cannot form again while the ones that dropped out are away for sim.rejoin_s,
// longer than coordinator.wait_clients_s. It now stops, saying which keys change that.
TEST(FirstHour, ACohortThatCannotFormAgainStopsNamingTheKeys) {
  const std::string dir = testing::freshDir("first-hour-cohort");
  auto args = blobsSim(dir, 3, {"sim.dropout=0.4"});
  args[5] = "6";  // --clients-per-round = --clients: every client, every round
  const Ran r = run(args, dir + "/log.txt", 60);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_LT(r.seconds, 30);
  EXPECT_THAT(r.out, HasSubstr("(coordinator.wait_clients_s)"));
  EXPECT_THAT(r.out, HasSubstr("The cohort needs 6 idle clients (coordinator.min_clients"));
  EXPECT_THAT(r.out, HasSubstr("dropped out (sim.dropout) and come back 600 s after they left "
                               "(sim.rejoin_s)"));
  EXPECT_THAT(r.out, HasSubstr("lower sim.rejoin_s below coordinator.wait_clients_s"));
  // Its history is whole: the rounds it ran, in order, from 0.
  const auto rounds = roundsOf(dir + "/h.db");
  ASSERT_FALSE(rounds.empty());
  for (size_t i = 0; i < rounds.size(); ++i) EXPECT_EQ(rounds[i].round, i);
  // With the key the message names, the same run completes.
  auto fixed = blobsSim(dir, 3, {"sim.dropout=0.4", "coordinator.min_clients=2"}, "ok.db");
  fixed[5] = "6";
  const Ran ok = run(fixed, dir + "/ok.txt", 60);
  EXPECT_EQ(ok.rc, 0) << ok.out;
}

// A model that diverged fails every later round the same way: the run stops after
// coordinator.max_failed_rounds of them, with the reason, instead of running them all.
TEST(FirstHour, ADivergedRunStopsAfterMaxFailedRounds) {
  const std::string dir = testing::freshDir("first-hour-diverged");
  const Ran r = run(blobsSim(dir, 30, {"train.lr=1e30", "coordinator.max_failed_rounds=4"}),
                    dir + "/log.txt");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("4 rounds in a row failed (coordinator.max_failed_rounds = 4)"));
  EXPECT_THAT(r.out, HasSubstr("lower train.lr"));
  const auto rounds = roundsOf(dir + "/h.db");
  ASSERT_EQ(rounds.size(), 5u);  // round 0 and the four failed ones, not 30
  for (size_t i = 1; i < rounds.size(); ++i) EXPECT_EQ(rounds[i].status, "failed");
}

// Ctrl-C (SIGINT) and SIGTERM stop a run cleanly and say so in the exit code, 128 + the signal
// as a shell reports it; the run then resumes from its stored config with no flag typed again
// and ends as the uninterrupted run does.
TEST(FirstHour, AStoppedRunExits130Or143AndResumesFromItsStoredConfig) {
  const std::string dir = testing::freshDir("first-hour-signal");
  // Slow enough that a signal after round 2 lands mid-run (20 rounds of 800 MLP steps).
  const std::vector<std::string> sets = {"model.name=mlp", "train.epochs=400"};
  // The uninterrupted run, for comparison.
  auto whole = blobsSim(dir, 20, sets, "whole.db");
  ASSERT_EQ(run(whole, dir + "/whole.txt").rc, 0);
  const auto want = roundsOf(dir + "/whole.db");

  for (const int sig : {SIGINT, SIGTERM}) {
    const std::string db = dir + "/cut" + std::to_string(sig) + ".db";
    auto args = blobsSim(dir, 20, sets, "cut" + std::to_string(sig) + ".db");
    testing::Process p(args, dir + "/cut" + std::to_string(sig) + ".txt");
    ASSERT_TRUE(p.waitForLog("round   2", 60)) << p.log();
    p.kill(sig);
    const int rc = p.waitFor(60).value_or(-1);
    ASSERT_NE(rc, 0) << "finished before the signal came:\n" << p.log();
    EXPECT_EQ(rc, 128 + sig) << p.log();
    EXPECT_THAT(p.log(), HasSubstr("interrupted in round"));
    EXPECT_THAT(p.log(), HasSubstr("fedfleet sim --resume --db " + db));
    // Resumed with nothing but --resume and the file: the stored config gives the rest.
    const Ran resumed = run({kBinary, "sim", "--resume", "--db", db, "--progress", "off"},
                            dir + "/resume" + std::to_string(sig) + ".txt");
    ASSERT_EQ(resumed.rc, 0) << resumed.out;
    EXPECT_THAT(resumed.out, Not(HasSubstr("changes run")));
    const auto got = roundsOf(db);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].round, want[i].round);
      EXPECT_EQ(got[i].status, want[i].status);
      EXPECT_EQ(got[i].test_accuracy, want[i].test_accuracy) << "round " << i;
    }
  }
}

// A CSV file of 300 rows split Dirichlet(0.1) over 200 clients leaves some without a sample;
// they used to fail every task ("no sample indices"). It is one error at start-up now.
TEST(FirstHour, ClientsLeftWithoutSamplesAreAStartUpError) {
  const std::string dir = testing::freshDir("first-hour-empty-shards");
  auto args = blobsSim(dir, 2, {"data.partition=dirichlet", "data.alpha=0.1"});
  args[3] = "200";  // --clients
  args[5] = "20";   // --clients-per-round
  const Ran r = run(args, dir + "/log.txt");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("clients (sim.clients) without a training sample"));
  EXPECT_THAT(r.out, HasSubstr("Lower sim.clients"));
  EXPECT_THAT(r.out, Not(HasSubstr("round   1")));
}

TEST(FirstHour, BadInputNamesTheKeyThatFixesIt) {
  const std::string dir = testing::freshDir("first-hour-keys");
  const Ran typo = run({kBinary, "sim", "--set", "train.lrr=0.1"}, dir + "/typo.txt");
  EXPECT_EQ(typo.rc, 2);
  EXPECT_THAT(typo.out, HasSubstr("unknown key 'train.lrr' (did you mean 'train.lr'?)"));
  const Ran type = run({kBinary, "sim", "--set", "run.rounds=five"}, dir + "/type.txt");
  EXPECT_EQ(type.rc, 2);
  EXPECT_THAT(type.out, HasSubstr("'run.rounds' must be a non-negative integer; got five"));
  const Ran file = run(blobsSim(dir, 1, {"data.path=" + dir + "/missing.csv"}), dir + "/f.txt");
  EXPECT_EQ(file.rc, 2) << file.out;
  EXPECT_THAT(file.out, HasSubstr("data.path: "));
  EXPECT_THAT(file.out, HasSubstr("missing.csv"));
  const Ran test_file =
      run(blobsSim(dir, 1, {"data.test_path=" + dir + "/nope.csv"}), dir + "/t.txt");
  EXPECT_NE(test_file.rc, 0);
  EXPECT_THAT(test_file.out, HasSubstr("data.test_path: "));
}

// Paths in a config file are its neighbours, wherever the program starts.
TEST(FirstHour, AConfigFileFindsItsDataNextToIt) {
  const std::string dir = testing::freshDir("first-hour-relative");
  std::filesystem::create_directories(dir + "/job/data");
  testing::writeBlobs(dir + "/job/data/train.csv", 300, 1);
  testing::writeBlobs(dir + "/job/data/test.csv", 90, 2);
  std::ofstream(dir + "/job/job.toml")
      << "[run]\nrounds = 2\n[coordinator]\nclients_per_round = 3\n[sim]\nclients = 6\n"
         "progress = \"off\"\n[model]\nname = \"logreg\"\n"
         "[data]\nformat = \"csv\"\npath = \"data/train.csv\"\ntest_path = \"data/test.csv\"\n"
         "label_column = \"class\"\nfeature_columns = [\"f0\", \"f1\", \"f2\", \"f3\"]\n"
         "partition = \"iid\"\n";
  // Started from `dir`, one folder above the config's.
  const Ran r =
      run({"/bin/sh", "-c",
           "cd '" + dir + "' && exec '" + kBinary + "' sim --config job/job.toml --db h.db"},
          dir + "/log.txt");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(roundsOf(dir + "/h.db").size(), 3u);
}

// One line per round, carrying the run's metric; the thousands of virtual clients' task lines
// only at debug level.
TEST(FirstHour, RoundLinesCarryTheMetricAndClientLinesAreDebug) {
  const std::string dir = testing::freshDir("first-hour-lines");
  const Ran r = run(blobsSim(dir, 2), dir + "/log.txt");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("round   1 ok      3/3 done, 0 late, 0 dropped, 0 rejected  test "
                               "acc "));
  EXPECT_THAT(r.out, Not(HasSubstr("client v0")));
  auto debug = blobsSim(dir, 2, {}, "debug.db");
  debug.insert(debug.end(), {"--log-level", "debug"});
  const Ran d = run(debug, dir + "/debug.txt");
  ASSERT_EQ(d.rc, 0) << d.out;
  EXPECT_THAT(d.out, HasSubstr("task, partition"));

  // A regression run's lines and summary carry its MSE (it has no accuracy).
  std::ofstream reg(dir + "/reg.csv");
  reg << "x,y\n";
  for (int i = 0; i < 240; ++i) reg << i / 240.0 << "," << 2.0 * i / 240.0 + 0.5 << "\n";
  reg.close();
  const Ran g = run(testing::smallSimArgs(
                        kBinary, dir + "/reg.db", 2,
                        {"data.format=csv", "data.path=" + dir + "/reg.csv",
                         "data.holdout_fraction=0.2", "data.label_column=y", "data.task=regression",
                         "data.partition=iid", "model.name=logreg", "train.loss=mse"}),
                    dir + "/reg.txt");
  ASSERT_EQ(g.rc, 0) << g.out;
  EXPECT_THAT(g.out, HasSubstr("round   2 ok"));
  EXPECT_THAT(g.out, HasSubstr(" mse "));
  EXPECT_THAT(g.out, HasSubstr("run 1: 2 rounds (0 failed), round 2: test loss "));
}

}  // namespace
}  // namespace fedfleet
