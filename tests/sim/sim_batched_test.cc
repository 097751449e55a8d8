// sim.batch_clients: a round's clients trained batched (client/batched_trainer.h) give the
// history per-client training gives, up to float rounding: the same rounds, the same updates
// with the same steps and sample counts, nearly the same losses and accuracies; and a batched
// run repeats its own history bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "common/history/history.h"
#include "sim/fleet_simulator.h"

namespace fedfleet::sim {
namespace {

std::string tmpPath(const std::string& name) {
  const std::string p = std::string(FEDFLEET_TEST_TMP) + "/" + name;
  std::filesystem::remove(p);
  std::filesystem::remove(p + "-wal");
  std::filesystem::remove(p + "-shm");
  return p;
}

struct History {
  std::vector<history::RoundRecord> rounds;
  std::vector<history::UpdateRecord> updates;
};

// Runs `c` (its history in `db`) and reads the run's rounds and updates back.
History runAndRead(config::Config c, const std::string& db) {
  c.history.db = db;
  History h;
  auto sim = FleetSimulator::create(c);
  EXPECT_TRUE(sim.isOk()) << sim.status().toString();
  if (!sim.isOk()) return h;
  auto summary = (*sim)->run();
  EXPECT_TRUE(summary.isOk()) << summary.status().toString();
  if (!summary.isOk()) return h;
  auto store = history::openSqliteHistory(db);
  EXPECT_TRUE(store.isOk());
  if (!store.isOk()) return h;
  h.rounds = *(*store)->rounds(summary->run_id);
  h.updates = *(*store)->updates(summary->run_id, std::nullopt);
  return h;
}

// A small Fashion-MNIST job: 40 clients on 4000 samples, 8 a round, 3 rounds, 2 workers (two
// batches of 4 a round), with FedProx and stragglers that send partial work (1 to 3 of 4
// epochs), so clients of one batch take unequal numbers of steps.
config::Config smallJob(const std::string& model, const std::string& method) {
  config::Config c;
  c.run.seed = 21;
  c.run.rounds = 3;
  c.model.name = model;
  c.data.train_subset = 4000;
  c.data.test_subset = 1000;
  c.data.partition = "dirichlet";
  c.data.alpha = 0.5;
  c.coordinator.clients_per_round = 8;
  c.coordinator.quorum = 1;
  c.coordinator.deadline_s = 100000;
  c.train.batch = 16;
  c.train.epochs = model == "mlp" ? 4 : 2;
  c.train.prox_mu = 0.01;
  EXPECT_TRUE(c.set("aggregation.method=" + method).isOk()) << method;
  c.sim.stragglers = 0.5;
  c.sim.straggler_mode = "partial";
  c.sim.clients = 40;
  c.sim.workers = 2;
  c.sim.progress = "off";
  return c;
}

class SimBatchedTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

// Rounding differences grow over rounds as the models move apart by their last bits. Here, after
// three rounds, batched and per-client runs had the same test accuracies (on 1000 samples) and
// every update's mean loss differed, by at most 1.1e-7 relative. We allow 0.005 on the
// accuracies (5 test samples) and 1e-5 relative on the losses; a client trained on another's
// data, or for other steps, is off by far more.
TEST_P(SimBatchedTest, HistoryMatchesPerClientTraining) {
  const auto& [model, method] = GetParam();
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist") &&
      std::getenv("FEDFLEET_FASHION_MNIST_DIR") == nullptr) {
    GTEST_SKIP() << "Fashion-MNIST not installed";
  }
  config::Config c = smallJob(model, method);
  ASSERT_TRUE(c.validate().isOk()) << c.validate().toString();
  const History plain = runAndRead(c, tmpPath("sim_batched_off_" + model + method + ".db"));
  c.sim.batch_clients = true;
  const History batched = runAndRead(c, tmpPath("sim_batched_on_" + model + method + ".db"));

  ASSERT_EQ(plain.rounds.size(), 4u);  // the initial evaluation and 3 rounds
  ASSERT_EQ(batched.rounds.size(), plain.rounds.size());
  for (size_t i = 0; i < plain.rounds.size(); ++i) {
    SCOPED_TRACE("round " + std::to_string(i));
    EXPECT_EQ(batched.rounds[i].status, plain.rounds[i].status);
    EXPECT_EQ(batched.rounds[i].completed, plain.rounds[i].completed);
    EXPECT_EQ(batched.rounds[i].end_time, plain.rounds[i].end_time);  // virtual time
    ASSERT_TRUE(plain.rounds[i].test_accuracy && batched.rounds[i].test_accuracy);
    EXPECT_NEAR(*batched.rounds[i].test_accuracy, *plain.rounds[i].test_accuracy, 0.005);
  }
  ASSERT_EQ(batched.updates.size(), plain.updates.size());
  size_t partial = 0, differ = 0;
  for (size_t i = 0; i < plain.updates.size(); ++i) {
    const auto& a = plain.updates[i];
    const auto& b = batched.updates[i];
    SCOPED_TRACE("update " + std::to_string(i) + " of " + a.client_id);
    EXPECT_EQ(b.client_id, a.client_id);
    EXPECT_EQ(b.status, a.status);
    EXPECT_EQ(b.steps, a.steps);
    EXPECT_EQ(b.n_samples, a.n_samples);
    EXPECT_GT(a.loss, 0);
    EXPECT_NEAR(b.loss, a.loss, 1e-5 * a.loss);
    if (b.loss != a.loss) ++differ;
    if (a.steps < c.train.epochs * ((a.n_samples + 15) / 16)) ++partial;
  }
  EXPECT_GT(partial, 0u);  // the batches did hold clients of unequal step counts
  EXPECT_GT(differ, 0u);   // and were trained batched: per-client training repeats its bits
  if (model == "mlp" && method == "fedavg") {  // batched runs repeat their bits
    const History again = runAndRead(c, tmpPath("sim_batched_again.db"));
    ASSERT_EQ(again.updates.size(), batched.updates.size());
    for (size_t i = 0; i < again.updates.size(); ++i) {
      EXPECT_EQ(again.updates[i].loss, batched.updates[i].loss);
    }
    for (size_t i = 0; i < again.rounds.size(); ++i) {
      EXPECT_EQ(again.rounds[i].test_accuracy, batched.rounds[i].test_accuracy);
    }
  }
  // Training made progress, batched as per client.
  EXPECT_GT(*batched.rounds.back().test_accuracy, *batched.rounds.front().test_accuracy + 0.15);
}

INSTANTIATE_TEST_SUITE_P(Runs, SimBatchedTest,
                         ::testing::Values(std::make_tuple("mlp", "fedavg"),
                                           std::make_tuple("mlp", "scaffold"),
                                           std::make_tuple("lenet", "fedavg")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace fedfleet::sim
