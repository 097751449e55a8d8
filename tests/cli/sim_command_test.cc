// `fedfleet sim` end to end: the summary and the database it names, and the progress bar that
// appears on a terminal and stays out of logs.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/history/history.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

const std::string kBinary = FEDFLEET_BINARY;

std::vector<std::string> simArgs(const std::string& db) {
  return {kBinary,        "sim",     "--clients", "20",      "--clients-per-round",
          "4",            "--rounds", "3",        "--model", "logreg",
          "--set",        "data.train_subset=2000", "--set", "data.test_subset=500",
          "--fleet",      "mobile-mix", "--db",   db};
}

TEST(SimCommand, WithoutATerminalPrintsLogLinesAndASummaryButNoBar) {
  const std::string dir = testing::freshDir("sim-cli-log");
  const std::string db = dir + "/sim.db";
  testing::Process p(simArgs(db), dir + "/out.txt");
  const auto rc = p.waitFor(120);
  const std::string out = p.log();
  ASSERT_EQ(rc.value_or(-1), 0) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  EXPECT_EQ(out.find("ETA"), std::string::npos) << out;
  EXPECT_NE(out.find("round   3"), std::string::npos) << out;  // one log line per round
  EXPECT_NE(out.find("run 1: 3 rounds (0 failed), test accuracy"), std::string::npos) << out;
  EXPECT_NE(out.find("history: " + std::filesystem::absolute(db).string()), std::string::npos)
      << out;
  // The database it names holds the run: rounds 0..3 on the virtual clock.
  auto store = history::openSqliteHistory(db);
  ASSERT_TRUE(store.isOk());
  auto runs = (*store)->runs();
  ASSERT_TRUE(runs.isOk());
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0].clock, "virtual");
  auto rounds = (*store)->rounds((*runs)[0].run_id);
  ASSERT_TRUE(rounds.isOk());
  ASSERT_EQ(rounds->size(), 4u);
  for (uint32_t r = 1; r <= 3; ++r) {
    EXPECT_EQ((*rounds)[r].status, "ok");
    EXPECT_EQ((*rounds)[r].selected, 4u);
  }
}

TEST(SimCommand, OnATerminalDrawsTheProgressBar) {
  if (!std::filesystem::exists("/usr/bin/script")) GTEST_SKIP() << "util-linux script missing";
  const std::string dir = testing::freshDir("sim-cli-tty");
  std::string command;
  for (const auto& a : simArgs(dir + "/sim.db")) command += "'" + a + "' ";
  // script(1) runs the command on a pseudo-terminal and copies what it writes to our file.
  testing::Process p({"/usr/bin/script", "-q", "-e", "-c", command, "/dev/null"},
                     dir + "/out.txt");
  const auto rc = p.waitFor(120);
  const std::string out = p.log();
  ASSERT_EQ(rc.value_or(-1), 0) << out;
  EXPECT_NE(out.find("\r\x1b[K["), std::string::npos) << out;  // redrawn in place
  EXPECT_NE(out.find("round 3/3"), std::string::npos) << out;
  EXPECT_NE(out.find("ETA"), std::string::npos) << out;
  EXPECT_NE(out.find("virtual"), std::string::npos) << out;
  EXPECT_EQ(out.find("round   2 ok"), std::string::npos) << out;  // the bar replaces log lines
  EXPECT_NE(out.find("test accuracy"), std::string::npos) << out;  // and the summary follows
}

}  // namespace
}  // namespace fedfleet
