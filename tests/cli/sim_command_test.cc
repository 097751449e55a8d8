// `fedfleet sim` end to end: the summary and the database it names, and the progress bar that
// appears on a terminal and stays out of logs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/history/history.h"
#include "sim/fleet.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

const std::string kBinary = FEDFLEET_BINARY;

std::vector<std::string> simArgs(const std::string& db) {
  // clang-format off
  return {kBinary, "sim",
          "--clients", "20", "--clients-per-round", "4", "--rounds", "3", "--model", "logreg",
          "--set", "data.train_subset=2000", "--set", "data.test_subset=500",
          "--fleet", "mobile-mix", "--db", db};
  // clang-format on
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
  testing::Process p({"/usr/bin/script", "-q", "-e", "-c", command, "/dev/null"}, dir + "/out.txt");
  const auto rc = p.waitFor(120);
  const std::string out = p.log();
  ASSERT_EQ(rc.value_or(-1), 0) << out;
  EXPECT_NE(out.find("\r\x1b[K["), std::string::npos) << out;  // redrawn in place
  EXPECT_NE(out.find("round 3/3"), std::string::npos) << out;
  EXPECT_NE(out.find("ETA"), std::string::npos) << out;
  EXPECT_NE(out.find("virtual"), std::string::npos) << out;
  EXPECT_EQ(out.find("round   2 ok"), std::string::npos) << out;   // the bar replaces log lines
  EXPECT_NE(out.find("test accuracy"), std::string::npos) << out;  // and the summary follows
}

// Runs `fedfleet` with `args` (after the binary); returns (exit code, output).
std::pair<int, std::string> runFedfleet(std::vector<std::string> args, const std::string& log,
                                        double seconds = 120) {
  args.insert(args.begin(), kBinary);
  testing::Process p(args, log);
  const auto rc = p.waitFor(seconds);
  return {rc.value_or(-1), p.log()};
}

// `history tiers` of a simulated run on the mobile-mix fleet, with dropouts and a deadline the
// slow tiers miss: the counts per tier match a count of the run's update rows by the tier each
// client's row names; and the history's times show on the virtual clock, never as 1970 dates.
TEST(SimCommand, HistoryTiersCountsEachFleetTiersUpdates) {
  const std::string dir = testing::freshDir("sim-cli-tiers");
  const std::string db = dir + "/sim.db";
  std::vector<std::string> args = simArgs(db);
  args.erase(args.begin());
  for (const char* extra :
       {"sim.dropout=0.2", "sim.rejoin_s=1", "coordinator.deadline_s=1", "coordinator.quorum=1"}) {
    args.push_back("--set");
    args.push_back(extra);
  }
  auto [rc, out] = runFedfleet(args, dir + "/sim.txt");
  ASSERT_EQ(rc, 0) << out;

  // The independent count: every update row of the run, by its client's device_name.
  auto store = history::openSqliteHistory(db);
  ASSERT_TRUE(store.isOk());
  const int64_t run = (*store)->runs()->back().run_id;
  auto clients_table = (*store)->clients();
  ASSERT_TRUE(clients_table.isOk());
  std::map<std::string, std::string> tier_of;
  for (const auto& c : *clients_table) tier_of[c.client_id] = c.device_name;
  std::map<std::string, std::map<std::string, uint64_t>> want;  // tier -> status -> count
  std::map<std::string, std::set<std::string>> clients_of;
  uint64_t late = 0, dropped = 0;
  auto updates = (*store)->updates(run, std::nullopt);
  ASSERT_TRUE(updates.isOk());
  for (const auto& u : *updates) {
    ASSERT_TRUE(tier_of.count(u.client_id)) << u.client_id;
    ++want[tier_of[u.client_id]][u.status];
    ++want[tier_of[u.client_id]]["updates"];
    clients_of[tier_of[u.client_id]].insert(u.client_id);
    late += u.status == "late";
    dropped += u.status == "dropped";
  }
  // The run had what the view is for: updates that straggled and updates that dropped out.
  EXPECT_GT(late, 0u);
  EXPECT_GT(dropped, 0u);

  auto [rc2, json] =
      runFedfleet({"history", "tiers", "--db", db, "--format", "json"}, dir + "/tiers.txt");
  ASSERT_EQ(rc2, 0) << json;
  auto got = nlohmann::json::parse(json);
  ASSERT_EQ(got.size(), want.size()) << json;
  std::set<std::string> mobile_mix;
  for (const auto& t : sim::mobileMixTiers()) mobile_mix.insert(t.name);
  for (const auto& row : got) {
    const std::string tier = row["tier"];
    SCOPED_TRACE(tier);
    EXPECT_TRUE(mobile_mix.count(tier)) << json;
    ASSERT_TRUE(want.count(tier)) << json;
    EXPECT_EQ(row["run_id"], run);
    EXPECT_EQ(row["clients"], clients_of[tier].size());
    for (const char* field : {"updates", "completed", "late", "dropped", "rejected"}) {
      EXPECT_EQ(row[field].get<uint64_t>(), want[tier][field]) << field;
    }
  }

  // The table says the same, and the run's times are virtual seconds, not dates.
  auto [rc3, table] = runFedfleet({"history", "tiers", "--db", db}, dir + "/table.txt");
  ASSERT_EQ(rc3, 0) << table;
  EXPECT_NE(table.find(sim::mobileMixTiers().back().name), std::string::npos) << table;
  auto [rc4, events] = runFedfleet({"history", "events", "--db", db}, dir + "/events.txt");
  ASSERT_EQ(rc4, 0) << events;
  EXPECT_NE(events.find("t="), std::string::npos) << events;
  EXPECT_EQ(events.find("1970"), std::string::npos) << events;
  auto [rc5, clients] = runFedfleet({"history", "clients", "--db", db}, dir + "/clients.txt");
  ASSERT_EQ(rc5, 0) << clients;
  EXPECT_NE(clients.find("t="), std::string::npos) << clients;
  EXPECT_EQ(clients.find("1970"), std::string::npos) << clients;
}

// `sim --model-path` sets model.path: a missing file is reported by its path, and (where
// Python's torch can export one) a TorchScript module trains for two rounds, as
// examples/models/export_torchscript.py documents, with the path in the recorded config.
TEST(SimCommand, ModelPathFlagReachesTheModelConfig) {
  const std::string dir = testing::freshDir("sim-cli-torchscript");
  const std::string missing = dir + "/no_such_module.pt";
  auto [rc, out] = runFedfleet({"sim", "--model", "torchscript", "--model-path", missing,
                                "--clients", "10", "--rounds", "1", "--db", ":memory:"},
                               dir + "/missing.txt");
  // The flag parsed (the message names the file): a file the config names that is not there is
  // a usage error, exit 2, as a bad value is.
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("not found: " + missing), std::string::npos) << out;

  if (std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch: no TorchScript module to train";
  }
  const std::string module = dir + "/tiny_cnn.pt";
  const std::string export_cmd = "/usr/bin/python3 " + std::string(FEDFLEET_SOURCE_DIR) +
                                 "/examples/models/export_torchscript.py " + module +
                                 " --seed 1 > " + dir + "/export.txt 2>&1";
  ASSERT_EQ(std::system(export_cmd.c_str()), 0) << "see " << dir << "/export.txt";
  const std::string db = dir + "/ts.db";
  auto [rc2, out2] =
      runFedfleet({"sim", "--model", "torchscript", "--model-path", module, "--rounds", "2",
                   "--clients", "20", "--clients-per-round", "4", "--set", "data.train_subset=2000",
                   "--set", "data.test_subset=500", "--db", db},
                  dir + "/sim.txt", 300);
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("2 rounds (0 failed)"), std::string::npos) << out2;
  auto store = history::openSqliteHistory(db);
  ASSERT_TRUE(store.isOk());
  auto runs = (*store)->runs();
  ASSERT_TRUE(runs.isOk());
  ASSERT_EQ(runs->size(), 1u);
  const auto config = nlohmann::json::parse((*runs)[0].config_json);
  EXPECT_EQ(config["model"]["name"], "torchscript");
  EXPECT_EQ(config["model"]["path"], module);
  auto rounds = (*store)->rounds((*runs)[0].run_id);
  ASSERT_TRUE(rounds.isOk());
  ASSERT_EQ(rounds->size(), 3u);
  EXPECT_EQ(rounds->back().status, "ok");
  EXPECT_TRUE(rounds->back().test_accuracy.has_value());
}

}  // namespace
}  // namespace fedfleet
