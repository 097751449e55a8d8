// `mpirun -np R fedfleet sim`: the simulator over several processes (sim/mpi_workers.h).
// Rank 0 runs the engine and the history; ranks 1..R-1 train and evaluate. The history must be
// the one a one-process run of the same config writes, bit for bit (every table, wall-clock
// columns aside); a worker rank killed mid-run ends the job with an error that names it, and
// the history of every committed round resumes (`--resume`) to that same history.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "sim/mpi_workers.h"
#include "tests/integration/process.h"
#include "tests/sim/history_digest.h"

namespace fedfleet {
namespace {

const std::string kBinary = FEDFLEET_BINARY;
constexpr uint32_t kRounds = 16;  // long enough that a kill after round 2 lands mid-run

// Dropouts and rejoins, a biased codec whose error-feedback residuals stay on rank 0, and
// federated evaluation (a client-side evaluation inside each training job).
std::vector<std::string> simArgs(const std::string& db) {
  // clang-format off
  return {"sim",
          "--clients", "12", "--clients-per-round", "4", "--rounds", std::to_string(kRounds),
          "--model", "mlp", "--name", "mpi", "--progress", "off", "--workers", "1",
          "--set", "data.train_subset=24000", "--set", "data.test_subset=2100",
          "--set", "train.epochs=2",
          "--set", "sim.dropout=0.2", "--set", "sim.rejoin_s=2",
          "--set", "coordinator.codec=topk:0.1", "--set", "coordinator.fed_eval_every=3",
          "--fleet", "mobile-mix", "--db", db};
  // clang-format on
}

std::vector<std::string> oneProcess(const std::string& db) {
  std::vector<std::string> args = {kBinary};
  for (auto& a : simArgs(db)) args.push_back(a);
  return args;
}

std::vector<std::string> underMpirun(int ranks, const std::string& db) {
  std::vector<std::string> args = {"/usr/bin/mpirun",
                                   "--allow-run-as-root",
                                   "--oversubscribe",
                                   "--mca",
                                   "btl",
                                   "self,vader",
                                   "-np",
                                   std::to_string(ranks),
                                   kBinary};
  for (auto& a : simArgs(db)) args.push_back(a);
  return args;
}

int64_t committedRounds(const std::string& db) {
  sqlite3* h = nullptr;
  int64_t n = -1;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_busy_timeout(h, 1000);
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(h, "SELECT count(*) FROM rounds WHERE round > 0", -1, &st, nullptr) ==
            SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
      n = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
  }
  sqlite3_close(h);
  return n;
}

void expectSameHistory(const std::string& a, const std::string& b) {
  const auto da = testing::digestHistory(a, 1);
  const auto db = testing::digestHistory(b, 1);
  ASSERT_EQ(da.size(), db.size());
  for (const auto& [table, d] : da) {
    EXPECT_EQ(d.rows, db.at(table).rows) << table;
    EXPECT_EQ(d.sha256, db.at(table).sha256) << table;
  }
  EXPECT_EQ(da.at("rounds").rows, kRounds + 1);  // round 0 and every training round
}

class MpiSim : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!sim::mpiBuilt()) GTEST_SKIP() << "built without MPI (libopenmpi-dev)";
    dir_ = testing::freshDir("mpi_sim");
    testing::Process one(oneProcess(dir_ + "/one.db"), dir_ + "/one.log");
    const auto rc = one.waitFor(300);
    ASSERT_TRUE(rc.has_value()) << one.log();
    ASSERT_EQ(*rc, 0) << one.log();
  }
  std::string dir_;
};

TEST_F(MpiSim, ThreeRanksWriteTheHistoryOfOneProcess) {
  testing::Process mpi(underMpirun(3, dir_ + "/mpi.db"), dir_ + "/mpi.log");
  const auto rc = mpi.waitFor(300);
  ASSERT_TRUE(rc.has_value()) << mpi.log();
  ASSERT_EQ(*rc, 0) << mpi.log();
  EXPECT_NE(mpi.log().find("2 MPI worker ranks"), std::string::npos) << mpi.log();
  expectSameHistory(dir_ + "/one.db", dir_ + "/mpi.db");
}

TEST_F(MpiSim, AKilledRankEndsTheRunClearlyAndTheHistoryResumes) {
  const std::string db = dir_ + "/killed.db";
  testing::Process mpi(underMpirun(3, db), dir_ + "/killed.log");
  ASSERT_TRUE(mpi.waitForLog("MPI rank 2 (pid ", 120)) << mpi.log();
  std::smatch m;
  const std::string log = mpi.log();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("MPI rank 2 \\(pid ([0-9]+)\\)"))) << log;
  const pid_t victim = static_cast<pid_t>(std::stol(m[1].str()));
  // Kill it once two rounds are committed.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (committedRounds(db) < 2 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int64_t before = committedRounds(db);
  ASSERT_GE(before, 2) << mpi.log();
  ASSERT_LT(before, kRounds) << "the run finished before the kill; make it longer";
  const size_t mark = mpi.log().size();
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const auto rc = mpi.waitFor(120);
  ASSERT_TRUE(rc.has_value()) << mpi.log();
  EXPECT_NE(*rc, 0) << mpi.log();
  // After the kill, the launcher names the rank and how it ended.
  const std::string after = mpi.log().substr(mark);
  EXPECT_NE(after.find("rank 2"), std::string::npos) << after;
  EXPECT_NE(after.find("signal 9"), std::string::npos) << after;
  const int64_t kept = committedRounds(db);
  EXPECT_GE(kept, before);
  EXPECT_LT(kept, kRounds);

  std::vector<std::string> resume = oneProcess(db);
  resume.push_back("--resume");
  testing::Process again(resume, dir_ + "/resumed.log");
  const auto rc2 = again.waitFor(300);
  ASSERT_TRUE(rc2.has_value()) << again.log();
  ASSERT_EQ(*rc2, 0) << again.log();
  expectSameHistory(dir_ + "/one.db", db);
}

}  // namespace
}  // namespace fedfleet
