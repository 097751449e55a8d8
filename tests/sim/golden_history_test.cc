// Golden histories: the determinism guard of the project.
//
// A fixed set of simulations, one per family of round policies, runs here and each history
// table it wrote (rounds, updates, events, block_metrics, checkpoints) is reduced to a row
// count and a SHA-256 digest of its values, compared with the digests committed in
// tests/sim/golden_histories.txt. A refactor that claims to keep behaviour keeps every digest;
// a change that means to alter a history updates the file in a commit of its own that says why.
//
// What the digest covers: every column of those tables except the ones that measure the host
// (wall-clock times: rounds.wall_start/wall_end, updates.wall_compute_s/encode_s/decode_s) and
// row ids. Reals are hashed by their exact bits (printf %a), so "equal" means bit for bit.
// The columns are read with PRAGMA table_info, so a column added to a table changes the digest
// (deliberately: the file is then updated in that commit).
//
// To write the file after an intended change (from the source tree, through ctest, which sets
// the environment below):
//   FEDFLEET_GOLDEN_WRITE=$PWD/tests/sim/golden_histories.txt \
//     ctest --test-dir build -R sim_golden_history --output-on-failure
// then review `git diff` and commit it with the reason.
//
// LibTorch's kernels and the BLAS it calls choose code by CPU; ctest pins both
// (ATEN_CPU_CAPABILITY, OPENBLAS_CORETYPE in tests/CMakeLists.txt) so that the digests do not
// depend on which x86-64 machine runs the test.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/crypto/sha256.h"
#include "sim/fleet_simulator.h"
#include "tests/sim/history_digest.h"

namespace fedfleet::sim {
namespace {

const char* kGoldenFile = FEDFLEET_SOURCE_DIR "/tests/sim/golden_histories.txt";

std::string tmpPath(const std::string& name) {
  const std::string p = std::string(FEDFLEET_TEST_TMP) + "/" + name;
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(p + suffix);
  return p;
}

// 30 virtual clients on 3000 Fashion-MNIST samples, 6 a round, 3 rounds, on the mobile-mix
// fleet with dropouts and rejoins: sampling, stragglers and goodbyes are all in play.
config::Config baseJob(const std::string& db) {
  config::Config c;
  c.run.seed = 1234;
  c.run.rounds = 3;
  c.model.name = "mlp";
  c.data.train_subset = 3000;
  c.data.test_subset = 1000;
  c.data.partition = "dirichlet";
  c.data.alpha = 0.5;
  c.coordinator.clients_per_round = 6;
  c.coordinator.quorum = 1;
  c.coordinator.deadline_s = 30;
  c.train.batch = 16;
  c.sim.clients = 30;
  c.sim.fleet = "mobile-mix";
  c.sim.dropout = 0.1;
  c.sim.rejoin_s = 5;
  c.sim.progress = "off";
  c.history.db = db;
  return c;
}

// Each case also names a query whose count must be positive in its history: rows that only its
// policy writes, so that a digest cannot stay equal because a case silently fell back to plain
// FedAvg.
struct GoldenCase {
  const char* name;
  void (*apply)(config::Config&);
  const char* exercised_sql;
};

const std::vector<GoldenCase>& goldenCases() {
  static const std::vector<GoldenCase> cases = {
      {"fedavg", [](config::Config&) {}, "SELECT count(*) FROM updates WHERE status = 'dropped'"},
      {"fednova",
       [](config::Config& c) {
         c.aggregation.method = "fednova";
         c.train.epochs = 2;
       },
       "SELECT count(*) FROM updates WHERE status = 'completed' AND steps > 0"},
      {"scaffold_fedprox",
       [](config::Config& c) {
         c.aggregation.method = "scaffold";
         c.train.prox_mu = 0.01;
       },
       "SELECT count(*) FROM checkpoints WHERE length(engine_state) > 0"},
      {"median", [](config::Config& c) { c.aggregation.method = "median"; },
       "SELECT count(*) FROM rounds WHERE status = 'ok'"},
      {"trimmed_mean_clip",
       [](config::Config& c) {
         c.aggregation.method = "trimmed_mean";
         c.aggregation.trim_fraction = 0.2;
         c.aggregation.clip_norm = 0.5;
       },
       "SELECT count(*) FROM rounds WHERE status = 'ok'"},
      {"fedbuff_oort",
       [](config::Config& c) {
         c.policy.mode = "async";
         c.policy.async_concurrency = 6;
         c.policy.async_buffer = 3;
         c.selection.selector = "oort";
       },
       "SELECT count(DISTINCT model_version) - 1 FROM rounds"},
      {"oversel_percentile_partial",
       [](config::Config& c) {
         c.policy.over_selection = 0.5;
         c.policy.deadline = "percentile";
         c.policy.deadline_window = 2;
         c.policy.partial_work = true;
         c.train.epochs = 2;
         c.coordinator.deadline_s = 20;
         c.run.rounds = 4;
       },
       "SELECT count(*) FROM rounds WHERE selected > 6"},
      {"adaptive_steps",
       [](config::Config& c) {
         c.policy.adaptive_steps = true;
         c.policy.adaptive_max_factor = 2;
         c.train.steps = 20;
         c.coordinator.deadline_s = 20;
         c.run.rounds = 4;
       },
       "SELECT count(DISTINCT steps) - 1 FROM updates WHERE status = 'completed'"},
      {"blocks_pluralistic",
       [](config::Config& c) {
         c.blocks.count = 2;
         c.blocks.rounds_per_block = 2;
         c.blocks.mode = "pluralistic";
         c.blocks.validation_samples = 200;
         c.blocks.test_samples = 200;
         c.run.rounds = 6;
       },
       "SELECT count(*) FROM block_metrics WHERE model = 'pluralistic'"},
      {"blocks_multichain",
       [](config::Config& c) {
         c.blocks.count = 2;
         c.blocks.rounds_per_block = 2;
         c.blocks.mode = "multichain";
         c.blocks.validation_samples = 200;
         c.blocks.test_samples = 200;
         c.run.rounds = 6;
       },
       "SELECT count(*) FROM block_metrics WHERE model = 'chain'"},
      {"qsgd", [](config::Config& c) { c.coordinator.codec = "qsgd8"; },
       "SELECT count(*) FROM updates WHERE codec = 'qsgd'"},
      {"topk_error_feedback",
       [](config::Config& c) {
         c.coordinator.codec = "topk:0.05";
         c.sim.clients = 8;  // every client most rounds: residuals carry over
       },
       "SELECT count(*) FROM updates WHERE codec = 'topk'"},
      {"fedadam",
       [](config::Config& c) {
         c.aggregation.server_optimizer = "fedadam";
         c.coordinator.server_lr = 0.01;
       },
       "SELECT count(*) FROM checkpoints WHERE length(engine_state) > 0"},
      {"secagg_plus",
       [](config::Config& c) {
         c.secagg.mode = "secagg_plus";
         // Neither applies under secure aggregation (the coordinator sees no single update).
         c.aggregation.norm_bound = 0;
         c.aggregation.weight_cap = 1e9;
         c.coordinator.deadline_s = 120;
         c.sim.dropout = 0.25;  // clients go at every stage: unmasking rebuilds their masks
         c.run.rounds = 4;
       },
       "SELECT count(*) FROM updates WHERE codec = 'secagg' AND status = 'completed'"},
  };
  return cases;
}

using testing::Db;
using testing::digestTable;
using testing::rowOrder;
using testing::TableDigest;

// "case table" -> digest, as the committed file holds them: "case table rows sha256" lines;
// lines starting with '#' are comments.
std::map<std::string, TableDigest> readGolden() {
  std::map<std::string, TableDigest> out;
  std::ifstream in(kGoldenFile);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name, table;
    TableDigest d;
    fields >> name >> table >> d.rows >> d.sha256;
    out[name + " " + table] = d;
  }
  return out;
}

std::map<std::string, TableDigest> runCase(const GoldenCase& gc, uint32_t workers) {
  std::map<std::string, TableDigest> out;
  const std::string db =
      tmpPath(std::string("golden_") + gc.name + "_" + std::to_string(workers) + ".db");
  config::Config c = baseJob(db);
  gc.apply(c);
  c.sim.workers = workers;
  const Status valid = c.validate();
  EXPECT_TRUE(valid.isOk()) << gc.name << ": " << valid.toString();
  auto sim = FleetSimulator::create(c);
  EXPECT_TRUE(sim.isOk()) << gc.name << ": " << sim.status().toString();
  if (!sim.isOk()) return out;
  auto summary = (*sim)->run();
  EXPECT_TRUE(summary.isOk()) << gc.name << ": " << summary.status().toString();
  if (!summary.isOk()) return out;
  EXPECT_EQ(summary->rounds, c.run.rounds) << gc.name;  // committed rounds, the failed included
  Db handle(db);
  for (const auto& [table, order] : rowOrder()) {
    out[std::string(gc.name) + " " + table] = digestTable(handle.get(), table, summary->run_id);
  }
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(handle.get(), gc.exercised_sql, -1, &st, nullptr), SQLITE_OK)
      << gc.exercised_sql;
  EXPECT_EQ(sqlite3_step(st), SQLITE_ROW) << gc.exercised_sql;
  EXPECT_GT(sqlite3_column_int64(st, 0), 0)
      << gc.name << " did not exercise its policy: " << gc.exercised_sql;
  sqlite3_finalize(st);
  return out;
}

// Each case runs with 2 worker threads and again with 1: the history may not depend on how
// many threads trained (sim/fleet_simulator.h), so both runs must give the committed digests.
TEST(GoldenHistory, EveryCaseMatchesItsCommittedDigests) {
  const std::map<std::string, TableDigest> golden = readGolden();
  std::map<std::string, TableDigest> actual;
  for (const auto& gc : goldenCases()) {
    SCOPED_TRACE(gc.name);
    for (auto& [key, d] : runCase(gc, 2)) actual[key] = d;
    for (auto& [key, d] : runCase(gc, 1)) {
      EXPECT_EQ(d.sha256, actual[key].sha256) << key << ": 1 worker and 2 workers differ";
      EXPECT_EQ(d.rows, actual[key].rows) << key << ": 1 worker and 2 workers differ";
    }
  }
  if (const char* path = std::getenv("FEDFLEET_GOLDEN_WRITE")) {
    std::ofstream out(path);
    out << "# Golden history digests (tests/sim/golden_history_test.cc): case table rows sha256.\n"
           "# Changed only by a commit that says why the histories changed.\n";
    for (const auto& [key, d] : actual) out << key << " " << d.rows << " " << d.sha256 << "\n";
    ASSERT_TRUE(out.good()) << "cannot write " << path;
    GTEST_SKIP() << "wrote " << actual.size() << " digests to " << path;
  }
  ASSERT_FALSE(golden.empty()) << "no digests in " << kGoldenFile;
  EXPECT_EQ(golden.size(), actual.size())
      << "the committed file and the cases disagree on which tables exist";
  for (const auto& [key, d] : actual) {
    SCOPED_TRACE(key);
    auto it = golden.find(key);
    ASSERT_NE(it, golden.end()) << key << " has no committed digest";
    EXPECT_EQ(d.rows, it->second.rows) << key << ": row count changed";
    EXPECT_EQ(d.sha256, it->second.sha256)
        << key << ": the history changed. If the change is intended, rewrite the file with "
        << "FEDFLEET_GOLDEN_WRITE (see the top of this test) in a commit that says why.";
  }
}

}  // namespace
}  // namespace fedfleet::sim
