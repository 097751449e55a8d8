// Federated evaluation in `fedfleet sim`: each virtual client evaluates the model its task
// carries on its part of the test split before training, the round's figures are the
// sample-weighted means of those rows, and the evaluation costs virtual compute time (a forward
// pass over the held-out samples: a third of a training sample's work each) and nothing else.
#include <gtest/gtest.h>

#include <map>

#include "common/history/history.h"
#include "tests/cli/blobs.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

const std::string kBinary = FEDFLEET_BINARY;

struct SimRun {
  int rc = -1;
  std::string log;
  std::vector<history::RoundRecord> rounds;
  std::vector<history::UpdateRecord> updates;
};

SimRun simulate(const std::string& dir, const std::vector<std::string>& sets) {
  testing::writeBlobs(dir + "/train.csv", 600, 1);
  testing::writeBlobs(dir + "/test.csv", 150, 2);
  std::vector<std::string> all = testing::blobsSimSets(dir);
  all.insert(all.end(), sets.begin(), sets.end());
  testing::Process p(testing::smallSimArgs(kBinary, dir + "/h.db", 3, all), dir + "/sim.txt");
  SimRun r;
  r.rc = p.waitFor(120).value_or(-1);
  r.log = p.log();
  auto store = history::openSqliteHistoryReadOnly(dir + "/h.db");
  if (!store.isOk()) return r;
  const auto runs = (*store)->runs().value();
  if (runs.empty()) return r;
  r.rounds = (*store)->rounds(runs[0].run_id).value();
  r.updates = (*store)->updates(runs[0].run_id, std::nullopt).value();
  return r;
}

TEST(SimFedEval, ClientsEvaluateOnTheirHeldOutDataAndTheRoundWeighsThem) {
  const std::string on_dir = testing::freshDir("sim-fed-eval-on");
  const std::string off_dir = testing::freshDir("sim-fed-eval-off");
  const SimRun on = simulate(on_dir, {"coordinator.fed_eval_every=1"});
  const SimRun off = simulate(off_dir, {});
  ASSERT_EQ(on.rc, 0) << on.log;
  ASSERT_EQ(off.rc, 0) << off.log;
  ASSERT_EQ(on.rounds.size(), 4u);
  ASSERT_EQ(on.updates.size(), 9u);

  std::map<std::string, uint64_t> held;  // each client's held-out samples
  for (uint32_t r = 1; r <= 3; ++r) {
    SCOPED_TRACE("round " + std::to_string(r));
    uint64_t n = 0;
    double loss = 0, correct = 0;
    for (const auto& u : on.updates) {
      if (u.round != r) continue;
      ASSERT_GT(u.eval_samples, 0u) << u.client_id;
      ASSERT_TRUE(u.eval_loss && u.eval_accuracy);
      // The same part of the test split every time it is asked.
      auto [it, fresh] = held.emplace(u.client_id, u.eval_samples);
      EXPECT_EQ(it->second, u.eval_samples) << u.client_id;
      n += u.eval_samples;
      loss += static_cast<double>(u.eval_samples) * *u.eval_loss;
      correct += static_cast<double>(u.eval_samples) * *u.eval_accuracy;
    }
    EXPECT_EQ(on.rounds[r].fed_eval_clients, 3u);
    EXPECT_EQ(on.rounds[r].fed_eval_samples, n);
    ASSERT_TRUE(on.rounds[r].fed_eval_accuracy && on.rounds[r].fed_eval_loss);
    EXPECT_NEAR(*on.rounds[r].fed_eval_accuracy, correct / static_cast<double>(n), 1e-12);
    EXPECT_NEAR(*on.rounds[r].fed_eval_loss, loss / static_cast<double>(n), 1e-12);
    EXPECT_FALSE(off.rounds[r].fed_eval_accuracy.has_value());
  }
  // iid over 6 clients: each holds about a sixth of the 150 test samples.
  for (const auto& [id, n] : held) {
    EXPECT_GE(n, 20u) << id;
    EXPECT_LE(n, 30u) << id;
  }

  // Round 1 is the same work in both runs (same clients, same model, same training), but each
  // evaluating client spends eval_samples / 3 training samples' time more.
  for (const auto& u : on.updates) {
    if (u.round != 1) continue;
    const history::UpdateRecord* twin = nullptr;
    for (const auto& v : off.updates) {
      if (v.round == 1 && v.client_id == u.client_id) twin = &v;
    }
    ASSERT_NE(twin, nullptr) << u.client_id;
    EXPECT_EQ(twin->eval_samples, 0u);
    EXPECT_EQ(u.n_samples, twin->n_samples);
    EXPECT_EQ(u.loss, twin->loss) << "evaluating first changed the training";
    // compute time = planned samples / speed (one epoch: the shard), plus held-out / (3 speed).
    const double ratio = (u.compute_s - twin->compute_s) / twin->compute_s;
    EXPECT_NEAR(ratio, static_cast<double>(u.eval_samples) / (3.0 * u.n_samples), 1e-9)
        << u.client_id;
  }
}

}  // namespace
}  // namespace fedfleet
