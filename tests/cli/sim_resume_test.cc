// `fedfleet sim --resume`: a simulation killed (SIGKILL, no chance to clean up) part way
// through and resumed ends with the history an uninterrupted run of the same config writes,
// table by table, every column but row ids and the wall-clock measurements.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/history/history.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

const std::string kBinary = FEDFLEET_BINARY;
constexpr uint32_t kRounds = 8;

// Dropouts and rejoins, a biased codec with error feedback (client residuals carried across
// rounds) and pruned checkpoints: state the replay must rebuild exactly.
std::vector<std::string> simArgs(const std::string& db) {
  // clang-format off
  return {kBinary, "sim",
          "--clients", "12", "--clients-per-round", "4", "--rounds", std::to_string(kRounds),
          "--model", "mlp", "--name", "resumable", "--progress", "off", "--workers", "2",
          "--set", "data.train_subset=24000", "--set", "data.test_subset=500",
          "--set", "train.epochs=4",
          "--set", "sim.dropout=0.2", "--set", "sim.rejoin_s=2",
          "--set", "coordinator.codec=topk:0.1", "--set", "coordinator.keep_checkpoints=2",
          "--fleet", "mobile-mix", "--db", db};
  // clang-format on
}

std::string hex(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}
std::string hex(const std::optional<double>& v) { return v ? hex(*v) : "null"; }

// Every row of the file's only run as text, one line a row, wall-clock columns left out.
std::string dump(const std::string& db) {
  auto opened = history::openSqliteHistoryReadOnly(db);
  EXPECT_TRUE(opened.isOk()) << opened.status().toString();
  if (!opened.isOk()) return "";
  auto& store = **opened;
  const auto runs = store.runs().value();
  EXPECT_EQ(runs.size(), 1u);
  const int64_t run = runs.at(0).run_id;
  // The configuration without where the file is (the two runs write two files).
  nlohmann::json config = nlohmann::json::parse(runs[0].config_json);
  config.erase("history");
  std::string out = "run " + runs[0].name + " " + runs[0].clock + " " +
                    std::to_string(runs[0].seed) + " " + config.dump() + "\n";
  const auto rounds = store.rounds(run).value();
  const auto updates = store.updates(run, std::nullopt).value();
  const auto events = store.events(run).value();
  const auto clients = store.clients().value();
  const auto checkpoints = store.checkpointRounds(run).value();
  for (const auto& r : rounds) {
    out += "round " + std::to_string(r.round) + " " + hex(r.start_time) + " " + hex(r.end_time) +
           " " + std::to_string(r.selected) + "/" + std::to_string(r.completed) + "/" +
           std::to_string(r.late) + "/" + std::to_string(r.dropped) + "/" +
           std::to_string(r.rejected) + " " + r.status + " " + hex(r.train_loss) + " " +
           hex(r.test_loss) + " " + hex(r.test_accuracy) + " " + std::to_string(r.bytes_up) + " " +
           std::to_string(r.bytes_down) + " v" + std::to_string(r.model_version) + "\n";
  }
  for (const auto& u : updates) {
    out += "update " + std::to_string(u.round) + " " + u.client_id + " " +
           std::to_string(u.partition) + " " + std::to_string(u.n_samples) + " " +
           std::to_string(u.steps) + " " + hex(u.loss) + " " + hex(u.compute_s) + " " +
           hex(u.upload_s) + " " + hex(u.start_time) + " " + hex(u.end_time) + " " + u.codec + " " +
           hex(u.grant_wait_s) + " " + std::to_string(u.bytes_up) + " " +
           std::to_string(u.bytes_down) + " " + hex(u.weight) + " " + u.status + "\n";
  }
  for (const auto& e : events) {
    out += "event " + hex(e.time) + " " + e.kind + " " + e.client_id + " " + e.detail + "\n";
  }
  for (const auto& c : clients) {
    out += "client " + c.client_id + " " + c.device_name + " " + std::to_string(c.data_size) + " " +
           hex(c.first_seen) + " " + hex(c.last_seen) + "\n";
  }
  for (uint32_t r : checkpoints) out += "checkpoint " + std::to_string(r);
  auto cp = store.latestCheckpoint(run);
  EXPECT_TRUE(cp.isOk());
  if (cp.isOk()) {
    out += "\nlatest " + std::to_string(cp->round) + " v" + std::to_string(cp->model_version) +
           " " + cp->sha256_hex + " state " + std::to_string(cp->engine_state.size()) + "\n";
  }
  return out;
}

// Rounds recorded in `db` so far (0 while the file is not there yet).
size_t roundsIn(const std::string& db) {
  if (!std::filesystem::exists(db)) return 0;
  auto store = history::openSqliteHistoryReadOnly(db);
  if (!store.isOk()) return 0;
  auto runs = (*store)->runs();
  if (!runs.isOk() || runs->empty()) return 0;
  auto rounds = (*store)->rounds(runs->back().run_id);
  return rounds.isOk() ? rounds->size() : 0;
}

TEST(SimResume, AKilledRunResumedEndsWithTheHistoryOfAnUninterruptedOne) {
  const std::string dir = testing::freshDir("sim-resume");
  const std::string whole = dir + "/whole.db";
  const std::string cut = dir + "/cut.db";

  testing::Process uninterrupted(simArgs(whole), dir + "/whole.txt");
  ASSERT_EQ(uninterrupted.waitFor(300).value_or(-1), 0) << uninterrupted.log();
  const std::string want = dump(whole);
  ASSERT_NE(want.find("round " + std::to_string(kRounds) + " "), std::string::npos) << want;

  // Killed once it has recorded round 3 (rounds 0..3), without a chance to write anything more.
  {
    testing::Process first(simArgs(cut), dir + "/first.txt");
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(300);
    while (roundsIn(cut) < 4 && first.running() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(first.running()) << "the run ended before it could be killed:\n" << first.log();
    first.kill(SIGKILL);
    first.waitFor(30);
  }
  const size_t recorded = roundsIn(cut);
  ASSERT_GE(recorded, 4u);
  ASSERT_LT(recorded, kRounds + 1) << "killed too late to test a resume";

  std::vector<std::string> resume = simArgs(cut);
  resume.push_back("--resume");
  testing::Process second(resume, dir + "/second.txt");
  ASSERT_EQ(second.waitFor(300).value_or(-1), 0) << second.log();
  EXPECT_NE(second.log().find("resuming run 1 'resumable'"), std::string::npos) << second.log();
  EXPECT_NE(second.log().find("run 1: " + std::to_string(kRounds) + " rounds"), std::string::npos)
      << second.log();
  EXPECT_EQ(dump(cut), want);

  // Once finished there is nothing to resume (said, and not an error, as for a coordinator),
  // and the file is left as it is.
  testing::Process third(resume, dir + "/third.txt");
  EXPECT_EQ(third.waitFor(120).value_or(-1), 0) << third.log();
  EXPECT_NE(third.log().find("already finished"), std::string::npos) << third.log();
  EXPECT_EQ(dump(cut), want);
}

TEST(SimResume, AChangedConfigOrAMemoryHistoryIsRefusedAndTheFileIsLeftAlone) {
  const std::string dir = testing::freshDir("sim-resume-refused");
  const std::string db = dir + "/sim.db";
  std::vector<std::string> args = simArgs(db);
  args[7] = "2";  // --rounds 2
  testing::Process run(args, dir + "/run.txt");
  ASSERT_EQ(run.waitFor(300).value_or(-1), 0) << run.log();
  const std::string before = dump(db);

  std::vector<std::string> changed = args;
  changed[7] = "4";
  changed.push_back("--resume");
  changed.push_back("--set");
  changed.push_back("train.lr=0.5");
  testing::Process refused(changed, dir + "/refused.txt");
  EXPECT_EQ(refused.waitFor(120).value_or(-1), 1) << refused.log();
  EXPECT_NE(refused.log().find("replaying its recorded rounds"), std::string::npos)
      << refused.log();
  EXPECT_NE(refused.log().find("train.lr"), std::string::npos) << refused.log();
  EXPECT_EQ(dump(db), before);

  std::vector<std::string> memory = args;
  memory.back() = ":memory:";
  memory.push_back("--resume");
  testing::Process nothing(memory, dir + "/memory.txt");
  EXPECT_EQ(nothing.waitFor(120).value_or(-1), 2) << nothing.log();
  EXPECT_NE(nothing.log().find("--db"), std::string::npos) << nothing.log();
}

}  // namespace
}  // namespace fedfleet
