#include "sim/fleet_simulator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "client/client_session.h"
#include "client/served_model.h"
#include "client/trainer.h"
#include "common/data/synthetic.h"
#include "common/history/history.h"
#include "common/privacy/rdp_accountant.h"
#include "sim/fleet.h"
#include "sim/model_cost.h"
#include "sim/progress.h"

namespace fedfleet::sim {
namespace {

std::string tmpPath(const std::string& name) {
  const std::string p = std::string(FEDFLEET_TEST_TMP) + "/" + name;
  std::filesystem::remove(p);
  std::filesystem::remove(p + "-wal");
  std::filesystem::remove(p + "-shm");
  return p;
}

// A small Fashion-MNIST job: 40 clients on 4000 samples, 8 a round.
config::Config smallJob(const std::string& db) {
  config::Config c;
  c.run.seed = 21;
  c.run.rounds = 3;
  c.model.name = "mlp";
  c.data.train_subset = 4000;
  c.data.test_subset = 2000;
  c.data.partition = "dirichlet";
  c.data.alpha = 0.5;
  c.coordinator.clients_per_round = 8;
  c.coordinator.quorum = 1;
  c.train.batch = 16;
  c.sim.clients = 40;
  c.sim.progress = "off";
  c.history.db = db;
  return c;
}

// smallJob in `count` blocks of 2 rounds (engine/block_models.h), 4 clients a round.
config::Config blocksJob(const std::string& db, const std::string& mode, uint32_t rounds,
                         uint32_t test_samples) {
  config::Config c = smallJob(db);
  c.run.rounds = rounds;
  c.coordinator.clients_per_round = 4;
  c.blocks.count = 2;
  c.blocks.rounds_per_block = 2;
  EXPECT_TRUE(c.set("blocks.mode=" + mode).isOk()) << mode;
  c.blocks.validation_samples = 200;
  c.blocks.test_samples = test_samples;
  return c;
}

struct History {
  std::vector<history::RunRecord> runs;
  std::vector<history::RoundRecord> rounds;
  std::vector<history::UpdateRecord> updates;
  std::vector<history::EventRecord> events;
};

History readHistory(const std::string& db, int64_t run_id) {
  History h;
  auto store = history::openSqliteHistory(db);
  EXPECT_TRUE(store.isOk());
  if (!store.isOk()) return h;
  h.runs = *(*store)->runs();
  h.rounds = *(*store)->rounds(run_id);
  h.updates = *(*store)->updates(run_id, std::nullopt);
  h.events = *(*store)->events(run_id);
  return h;
}

// The model checkpointed at `round` (rounds 1 on); empty, with a failure, if none.
std::vector<float> modelAt(const std::string& db, int64_t run_id, uint32_t round) {
  auto store = history::openSqliteHistory(db);
  EXPECT_TRUE(store.isOk()) << store.status().toString();
  if (!store.isOk()) return {};
  auto checkpoint = (*store)->checkpointAt(run_id, round);
  EXPECT_TRUE(checkpoint.isOk()) << "round " << round << ": " << checkpoint.status().toString();
  if (!checkpoint.isOk()) return {};
  return client::floatsOf(checkpoint->blob);
}

// The root mean square of (b - a) over their values; b and a of the same size.
double rmsStep(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  if (a.empty() || a.size() != b.size()) return NAN;
  double sq = 0;
  for (size_t i = 0; i < a.size(); ++i) sq += (b[i] - a[i]) * static_cast<double>(b[i] - a[i]);
  return std::sqrt(sq / static_cast<double>(a.size()));
}

Result<SimSummary> runJob(const config::Config& c) {
  FEDFLEET_ASSIGN_OR_RETURN(auto sim, FleetSimulator::create(c));
  return sim->run();
}

// Determinism (docs/SIM.md): the same config and seed give the same history, bit for
// bit, at 1 and at 2 worker threads - with a heterogeneous fleet, dropouts and a deadline that
// cuts off stragglers, so every path of the scheduler is in play.
TEST(FleetSimulator, SameSeedSameHistoryAtOneAndTwoWorkers) {
  std::vector<History> runs;
  for (uint32_t workers : {1u, 2u}) {
    const std::string db = tmpPath("sim_det_" + std::to_string(workers) + ".db");
    config::Config c = smallJob(db);
    c.sim.fleet = "mobile-mix";
    c.sim.dropout = 0.1;
    c.sim.rejoin_s = 1;
    c.coordinator.deadline_s = 5;   // the embedded boards (0.1x, 0.5/2 Mbit/s) miss it
    c.coordinator.codec = "qsgd8";  // stochastic rounding, seeded per task and chunk
    c.sim.workers = workers;
    auto summary = runJob(c);
    ASSERT_TRUE(summary.isOk()) << summary.status().toString();
    runs.push_back(readHistory(db, summary->run_id));
  }
  const History& a = runs[0];
  const History& b = runs[1];
  ASSERT_EQ(a.rounds.size(), 4u);  // round 0 + 3
  ASSERT_EQ(a.rounds.size(), b.rounds.size());
  for (size_t i = 0; i < a.rounds.size(); ++i) {
    SCOPED_TRACE("round " + std::to_string(i));
    ASSERT_TRUE(a.rounds[i].test_accuracy.has_value());
    EXPECT_EQ(*a.rounds[i].test_accuracy, *b.rounds[i].test_accuracy);  // bit for bit
    EXPECT_EQ(*a.rounds[i].test_loss, *b.rounds[i].test_loss);
    EXPECT_EQ(a.rounds[i].train_loss, b.rounds[i].train_loss);
    EXPECT_EQ(a.rounds[i].start_time, b.rounds[i].start_time);
    EXPECT_EQ(a.rounds[i].end_time, b.rounds[i].end_time);
    EXPECT_EQ(a.rounds[i].completed, b.rounds[i].completed);
    EXPECT_EQ(a.rounds[i].late, b.rounds[i].late);
    EXPECT_EQ(a.rounds[i].dropped, b.rounds[i].dropped);
    EXPECT_EQ(a.rounds[i].bytes_up, b.rounds[i].bytes_up);
  }
  ASSERT_EQ(a.updates.size(), b.updates.size());
  for (size_t i = 0; i < a.updates.size(); ++i) {
    EXPECT_EQ(a.updates[i].client_id, b.updates[i].client_id);
    EXPECT_EQ(a.updates[i].status, b.updates[i].status);
    EXPECT_EQ(a.updates[i].loss, b.updates[i].loss);
    EXPECT_EQ(a.updates[i].end_time, b.updates[i].end_time);
    EXPECT_EQ(a.updates[i].weight, b.updates[i].weight);
  }
  // The run exercised what it was meant to: stragglers cut off and dropouts.
  uint32_t late = 0, dropped = 0;
  for (const auto& r : a.rounds) {
    late += r.late;
    dropped += r.dropped;
  }
  EXPECT_GT(late, 0u);
  EXPECT_GT(dropped, 0u);
  EXPECT_EQ(a.runs.back().clock, "virtual");
  // Training made progress.
  EXPECT_GT(*a.rounds.back().test_accuracy, *a.rounds.front().test_accuracy + 0.2);
}

// Remote workers that are never asked (create refuses first).
class RemoteWorkersStub : public RemoteWorkers {
 public:
  std::future<Result<std::string>> submit(std::string) override {
    std::promise<Result<std::string>> p;
    p.set_value(unavailable("no worker"));
    return p.get_future();
  }
  std::string describe() const override { return "no workers"; }
};

// Extensions::custom_trainer: a trainer of the caller's own replaces client::Trainer in every
// worker job. One that runs client::Trainer itself gives the built-in history bit for bit, with
// SCAFFOLD (whose control delta the simulator computes from the reported steps) and a
// mobile-mix fleet; one that fails fails its client's task alone.
TEST(FleetSimulator, ACustomTrainerReplacesTheBuiltInOne) {
  for (const char* method : {"fedavg", "scaffold"}) {
    SCOPED_TRACE(method);
    std::vector<History> runs;
    std::atomic<int> calls{0};
    for (bool custom : {false, true}) {
      const std::string db = tmpPath(std::string("sim_custom_") + method + (custom ? "1" : "0"));
      config::Config c = smallJob(db);
      ASSERT_TRUE(c.set(std::string("aggregation.method=") + method).isOk());
      c.sim.fleet = "mobile-mix";
      c.sim.workers = 2;
      FleetSimulator::Extensions ext;
      if (custom) {
        ext.custom_trainer = [&](const CustomTrainJob& job,
                                 const std::atomic<bool>* stop) -> Result<client::TrainResult> {
          ++calls;
          thread_local std::unique_ptr<model::Model> m;
          if (!m) {
            model::InputShape shape;
            shape.sample = {1, 28, 28};
            FEDFLEET_ASSIGN_OR_RETURN(m, model::createModel("mlp", 0, "", shape));
          }
          EXPECT_EQ(job.layout->total, m->layout().total);
          EXPECT_EQ(job.options->usesScaffold(), std::string(method) == "scaffold");
          client::Trainer trainer(c10::Device(c10::kCPU));
          FEDFLEET_ASSIGN_OR_RETURN(
              client::TrainResult r,
              trainer.train(*m, *job.start, *job.data, *job.indices, *job.options, stop));
          r.control_delta.clear();  // the simulator's to compute
          return r;
        };
      }
      auto sim = FleetSimulator::create(c, std::move(ext));
      ASSERT_TRUE(sim.isOk()) << sim.status().toString();
      auto summary = (*sim)->run();
      ASSERT_TRUE(summary.isOk()) << summary.status().toString();
      runs.push_back(readHistory(db, summary->run_id));
    }
    const History& a = runs[0];
    const History& b = runs[1];
    ASSERT_EQ(a.rounds.size(), b.rounds.size());
    ASSERT_EQ(a.updates.size(), b.updates.size());
    int completed = 0;
    for (size_t i = 0; i < a.updates.size(); ++i) {
      EXPECT_EQ(a.updates[i].client_id, b.updates[i].client_id);
      EXPECT_EQ(a.updates[i].status, b.updates[i].status);
      EXPECT_EQ(a.updates[i].loss, b.updates[i].loss);
      EXPECT_EQ(a.updates[i].end_time, b.updates[i].end_time);
      completed += a.updates[i].status == "completed";
    }
    EXPECT_GE(calls.load(), completed) << "one call a trained task";
    EXPECT_GT(completed, 0);
    for (size_t i = 0; i < a.rounds.size(); ++i) {
      EXPECT_EQ(*a.rounds[i].test_loss, *b.rounds[i].test_loss) << "round " << i;
    }
  }
  // A trainer that fails for client 3: that client's error, the rounds go on.
  const std::string db = tmpPath("sim_custom_fail");
  config::Config c = smallJob(db);
  c.sim.clients = 8;
  c.coordinator.clients_per_round = 8;
  FleetSimulator::Extensions ext;
  ext.custom_trainer = [](const CustomTrainJob& job,
                          const std::atomic<bool>*) -> Result<client::TrainResult> {
    if (job.client == 3) return internalError("client 3 ran out of memory");
    client::TrainResult r;
    r.delta.assign(job.start->size(), 0.0f);
    r.steps = 1;
    return r;
  };
  auto sim = FleetSimulator::create(c, std::move(ext));
  ASSERT_TRUE(sim.isOk()) << sim.status().toString();
  auto summary = (*sim)->run();
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  History h = readHistory(db, summary->run_id);
  ASSERT_EQ(h.updates.size(), 24u);
  for (const auto& u : h.updates) {
    EXPECT_EQ(u.status == "completed", u.client_id != "v3") << u.client_id << " " << u.status;
  }
  bool said = false;
  for (const auto& e : h.events) {
    said |= e.client_id == "v3" && e.detail.find("ran out of memory") != std::string::npos;
  }
  EXPECT_TRUE(said);
  // Not with MPI ranks: they train with the built-in trainer.
  FleetSimulator::Extensions remote_too;
  remote_too.remote = std::make_shared<RemoteWorkersStub>();
  remote_too.custom_trainer = [](const CustomTrainJob&, const std::atomic<bool>*) {
    return Result<client::TrainResult>(client::TrainResult{});
  };
  auto refused = FleetSimulator::create(smallJob(tmpPath("sim_custom_mpi")), remote_too);
  ASSERT_FALSE(refused.isOk());
  EXPECT_NE(refused.status().message().find("without MPI ranks"), std::string::npos);
}

// Virtual time follows the profile formulas: on the uniform fleet (reference device, 50/20
// Mbit/s, 20 ms) an update's time is download + samples / speed + upload of the bytes sent.
TEST(FleetSimulator, VirtualTimeFollowsTheProfiles) {
  const std::string db = tmpPath("sim_time.db");
  config::Config c = smallJob(db);
  c.run.rounds = 2;
  c.sim.reference_gflops = 0.5;
  auto summary = runJob(c);
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  const History h = readHistory(db, summary->run_id);
  const uint64_t params = 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10;
  const double samples_per_s = 0.5e9 / trainFlopsPerSample("mlp", params);
  const double down = 0.02 + params * 4.0 / (50e6 / 8);
  ASSERT_EQ(h.updates.size(), 16u);
  for (const auto& u : h.updates) {
    SCOPED_TRACE(u.client_id);
    ASSERT_EQ(u.status, "completed");
    const double compute = static_cast<double>(u.n_samples) / samples_per_s;
    EXPECT_NEAR(u.compute_s, compute, 1e-9);
    const double upload = 0.02 + static_cast<double>(u.bytes_up) / (20e6 / 8);
    EXPECT_NEAR(u.upload_s, upload, 1e-9);
    EXPECT_NEAR(u.end_time - u.start_time, down + compute + upload, 1e-6);
    EXPECT_GT(u.wall_compute_s, 0.0);
    EXPECT_GT(u.bytes_up, params * 4);  // the frames: payload plus framing
    EXPECT_LT(u.bytes_up, params * 4 + 4096);
  }
  // A round lasts as long as its slowest client.
  for (uint32_t r = 1; r <= 2; ++r) {
    double slowest = 0;
    for (const auto& u : h.updates) {
      if (u.round == r) slowest = std::max(slowest, u.end_time);
    }
    EXPECT_DOUBLE_EQ(h.rounds[r].end_time, slowest);
    EXPECT_GE(h.rounds[r].wall_end, h.rounds[r].wall_start);
    EXPECT_GT(h.rounds[r].wall_start, 1.7e9);  // unix seconds
  }
  EXPECT_DOUBLE_EQ(h.rounds[2].start_time, h.rounds[1].end_time);  // back to back
}

// The summary's virtual time ends with the last round, even when a client that dropped out in
// that round rejoins (sim.rejoin_s) long after it: the rejoin is not part of the run.
TEST(FleetSimulator, SummaryVirtualTimeEndsWithTheLastRound) {
  const std::string db = tmpPath("sim_summary_time.db");
  config::Config c = smallJob(db);
  c.run.rounds = 2;
  c.sim.dropout = 0.3;
  c.sim.rejoin_s = 600;  // far beyond the run's end (a round takes a few seconds here)
  c.sim.workers = 2;
  auto summary = runJob(c);
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  const History h = readHistory(db, summary->run_id);
  ASSERT_EQ(h.rounds.size(), 3u);
  const history::RoundRecord& last = h.rounds.back();
  // The case that matters: a client dropped out of the last round, so its rejoin was pending.
  ASSERT_GT(last.dropped, 0u);
  ASSERT_LT(last.end_time, 600.0);
  EXPECT_DOUBLE_EQ(summary->virtual_seconds, last.end_time);
  // Nothing the history holds happened after the run's end either.
  for (const auto& e : h.events) {
    EXPECT_LE(e.time, last.end_time) << e.kind << " " << e.client_id << " " << e.detail;
  }
  EXPECT_NE(formatSummary(*summary).find("time: " + ProgressDisplay::duration(last.end_time) +
                                         " virtual"),
            std::string::npos)
      << formatSummary(*summary);
}

// Deadlines fire in virtual time: a tier too slow for the deadline is always late, the round
// ends exactly at the deadline, and only the fast tier's updates are aggregated.
TEST(FleetSimulator, DeadlineCutsOffTheSlowTierInVirtualTime) {
  const std::string fleet = std::string(FEDFLEET_TEST_TMP) + "/sim_two_tiers.csv";
  std::ofstream(fleet) << "name,share,device,speed,memory_mib,up_mbps,down_mbps,latency_ms\n"
                          "fast,1,cpu,100,4096,100,100,1\n"
                          "slow,1,cpu,0.001,1024,1,1,100\n";
  const std::string db = tmpPath("sim_deadline.db");
  config::Config c = smallJob(db);
  c.run.rounds = 2;
  c.sim.fleet = fleet;
  c.coordinator.deadline_s = 30;
  auto summary = runJob(c);
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  const History h = readHistory(db, summary->run_id);
  auto profiles = Fleet::create(fleet, 40, c.run.seed, {});
  ASSERT_TRUE(profiles.isOk());
  int late = 0, completed = 0;
  for (const auto& u : h.updates) {
    const uint64_t k = std::stoull(u.client_id.substr(1));
    const bool slow = profiles->profile(k).tier == 1;
    EXPECT_EQ(u.status, slow ? "late" : "completed") << u.client_id;
    late += u.status == "late";
    completed += u.status == "completed";
    if (slow) {
      EXPECT_EQ(u.weight, 0.0);
    }
  }
  EXPECT_GT(late, 0);
  EXPECT_GT(completed, 0);
  for (uint32_t r = 1; r <= 2; ++r) {
    if (h.rounds[r].late > 0) {
      EXPECT_DOUBLE_EQ(h.rounds[r].end_time - h.rounds[r].start_time, 30.0);
    }
  }
}

// Synthetic(1, 1) with many registered clients: data exists only for sampled clients, and the
// server evaluates on the first devices' test splits.
TEST(FleetSimulator, SyntheticFleetOfManyClientsTrainsOnlyTheSampled) {
  const std::string db = tmpPath("sim_synth.db");
  config::Config c;
  c.run.seed = 4;
  c.run.rounds = 3;
  c.model.name = "logreg";
  c.data.dataset = "synthetic";
  c.data.eval_devices = 200;
  c.coordinator.clients_per_round = 20;
  c.coordinator.quorum = 1;
  c.train.batch = 10;
  c.train.lr = 0.01;
  c.sim.clients = 200000;
  c.sim.fleet = "mobile-mix";
  c.sim.progress = "off";
  c.history.db = db;
  auto summary = runJob(c);
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  EXPECT_EQ(summary->rounds, 3u);
  EXPECT_EQ(summary->registered_clients, 200000u);
  EXPECT_LE(summary->distinct_participants, 60u);
  const History h = readHistory(db, summary->run_id);
  auto store = history::openSqliteHistory(db);
  ASSERT_TRUE(store.isOk());
  auto clients = (*store)->clients();
  ASSERT_TRUE(clients.isOk());
  EXPECT_EQ(clients->size(), summary->distinct_participants);  // rows only for the sampled
  for (const auto& r : h.rounds) {
    ASSERT_TRUE(r.test_accuracy.has_value());
    EXPECT_GE(*r.test_accuracy, 0.0);
  }
  // Each update trained on its own device's generated train split: one epoch processes exactly
  // the device's train samples, counted independently here.
  data::SyntheticSpec spec;
  spec.devices = 200000;
  spec.seed = 4;
  auto fed = data::SyntheticFederation::create(spec);
  ASSERT_TRUE(fed.isOk());
  ASSERT_EQ(h.updates.size(), 60u);
  for (const auto& u : h.updates) {
    const uint64_t k = std::stoull(u.client_id.substr(1));
    EXPECT_EQ(u.n_samples, fed->trainSamples(k)) << u.client_id;
    EXPECT_EQ(u.partition, static_cast<int32_t>(k));
  }
}

// The codec decides the bytes and so the upload time: top-k 1% with error feedback sends a fp16
// value and a 1-2 byte varint index for 1% of the values, about 1/125 of fp32's 4 bytes each,
// and the uplink time shrinks with them.
TEST(FleetSimulator, CodecBytesDecideTheUploadTime) {
  std::map<std::string, std::pair<double, double>> per_codec;  // bytes, upload seconds
  for (const std::string codec : {"none", "topk:0.01", "topk:0.01,dense_below=100"}) {
    const std::string db = tmpPath("sim_codec_" + std::to_string(per_codec.size()) + ".db");
    config::Config c = smallJob(db);
    c.run.rounds = 4;
    c.sim.clients = 10;
    c.coordinator.clients_per_round = 10;  // every client every round: residuals carry over
    c.coordinator.codec = codec;
    auto summary = runJob(c);
    ASSERT_TRUE(summary.isOk()) << summary.status().toString();
    const History h = readHistory(db, summary->run_id);
    double bytes = 0, upload = 0;
    for (const auto& u : h.updates) {
      EXPECT_EQ(u.codec, codec == "none" ? "none" : "topk");
      EXPECT_GT(u.decode_s, 0.0);
      bytes += static_cast<double>(u.bytes_up);
      upload += u.upload_s;
    }
    per_codec[codec] = {bytes, upload};
    EXPECT_GT(*h.rounds.back().test_accuracy, 0.3) << codec;  // it still learns
  }
  const double ratio = per_codec["none"].first / per_codec["topk:0.01"].first;
  EXPECT_GT(ratio, 90.0);
  EXPECT_LT(ratio, 200.0);
  EXPECT_GT(per_codec["none"].second, 10 * per_codec["topk:0.01"].second);
  // dense_below=100 sends logreg's 10 biases whole as fp16 (20 bytes of values instead of one
  // kept value: 2 bytes and its index) and the weights as before, 78 values a chunk, whose
  // bytes move only with the index gaps; the history still names the updates topk (their
  // largest payload).
  const double dense = per_codec["topk:0.01,dense_below=100"].first;
  EXPECT_GT(dense, per_codec["topk:0.01"].first);
  EXPECT_LT(dense, per_codec["topk:0.01"].first * 1.25);
}

// lowrank:2 sends each of the MLP's tensors as two rank-2 factors (a bias as one row, rank 1):
// payloads of 3,960 + 422 + 1,624 + 422 + 864 + 42 = 7,334 bytes (header 12, rows 4, 4 a scale,
// 2 a factor value: fc1 [200, 784] is 24 + 4 * 984 bytes), in 6 chunks, against fp32's 12 +
// 4 * 199,210 = 796,852 in one. The history names the updates lowrank and the run still learns.
TEST(FleetSimulator, LowrankSendsFactorsOfEachTensor) {
  std::map<std::string, double> bytes;
  for (const std::string codec : {"none", "lowrank:2"}) {
    const std::string db = tmpPath("sim_lowrank_" + std::to_string(bytes.size()) + ".db");
    config::Config c = smallJob(db);
    c.run.rounds = 4;
    c.sim.clients = 10;
    c.coordinator.clients_per_round = 10;
    c.coordinator.codec = codec;
    auto summary = runJob(c);
    ASSERT_TRUE(summary.isOk()) << summary.status().toString();
    const History h = readHistory(db, summary->run_id);
    ASSERT_EQ(h.updates.size(), 40u);
    for (const auto& u : h.updates) {
      EXPECT_EQ(u.codec, codec == "none" ? "none" : "lowrank");
      bytes[codec] += static_cast<double>(u.bytes_up);
    }
    EXPECT_GT(*h.rounds.back().test_accuracy, 0.3) << codec;
  }
  // Each chunk's frame adds a few bytes, 6 of them to lowrank's updates and one to fp32's: the
  // ratio is below the payloads' 796,852 / 7,334 = 108.65, and near it.
  const double ratio = bytes["none"] / bytes["lowrank:2"];
  EXPECT_LT(ratio, 796852.0 / 7334.0);
  EXPECT_GT(ratio, 90.0);
}

// Block-cyclic data: 2 blocks of 2 rounds, multichain. Every update comes from a
// client of the round's block (client k is in block k mod 2), each block end records the
// per-block rows, and the chain appears once its block was visited.
TEST(FleetSimulator, BlockCyclicRunTrainsEachBlockOnItsClients) {
  const std::string db = tmpPath("sim_blocks.db");
  const config::Config c = blocksJob(db, "multichain", 8, 400);
  auto summary = runJob(c);
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  EXPECT_EQ(summary->rounds, 8u);
  const History h = readHistory(db, summary->run_id);
  ASSERT_FALSE(h.updates.empty());
  for (const auto& u : h.updates) {
    const uint32_t block = ((u.round - 1) / 2) % 2;
    EXPECT_EQ(static_cast<uint32_t>(u.partition) % 2, block)
        << "round " << u.round << " trained " << u.client_id;
    // Each task named its block's served model; a completed one reports it on the client's
    // held-out data.
    EXPECT_EQ(u.served_block, static_cast<int32_t>(block));
    EXPECT_FALSE(u.served_model.empty());
    EXPECT_EQ(u.served_sha256_hex.size(), 64u);
    if (u.status == "completed") {
      EXPECT_GT(u.served_samples, 0u) << "round " << u.round << " " << u.client_id;
      ASSERT_TRUE(u.served_accuracy.has_value());
      EXPECT_GE(*u.served_accuracy, 0.0);
      EXPECT_LE(*u.served_accuracy, 1.0);
    }
  }
  int mismatches = 0;
  for (const auto& e : h.events) mismatches += e.kind == "served_mismatch";
  EXPECT_EQ(mismatches, 0);  // a virtual client keeps what it is sent
  auto store = history::openSqliteHistory(db);
  ASSERT_TRUE(store.isOk());
  auto rows = (*store)->blockMetrics(summary->run_id);
  ASSERT_TRUE(rows.isOk());
  std::map<uint32_t, std::set<std::string>> models;  // round -> "block:model"
  for (const auto& r : *rows) {
    models[r.round].insert(r.block + ":" + r.model);
    ASSERT_TRUE(r.accuracy.has_value());
    EXPECT_GE(*r.accuracy, 0.0);
    EXPECT_LE(*r.accuracy, 1.0);
  }
  ASSERT_EQ(models.size(), 4u);  // after rounds 2, 4, 6, 8
  EXPECT_EQ(models[2], (std::set<std::string>{"0:shared", "0:pluralistic", "0:chain", "0:served",
                                              "1:shared", "1:served"}));
  EXPECT_EQ(models[8].size(), 8u);  // both blocks: shared, pluralistic, chain, served
  int started = 0;
  for (const auto& e : h.events) started += e.kind == "block_started";
  EXPECT_EQ(started, 4);
}

TEST(FleetSimulator, BadConfigsAreClearErrors) {
  config::Config c = smallJob(":memory:");
  c.sim.fleet = "phones";
  auto sim = FleetSimulator::create(c);
  ASSERT_FALSE(sim.isOk());
  EXPECT_NE(sim.status().message().find("unknown fleet 'phones'"), std::string::npos);

  c = smallJob(":memory:");
  c.sim.clients = 100000;  // more clients than 4000 samples can be split among
  sim = FleetSimulator::create(c);
  ASSERT_FALSE(sim.isOk());

  // A name no choice has is refused when the config is read (in code it does not compile).
  c = smallJob(":memory:");
  Status st = c.set("sim.availability=weekly");
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("'sim.availability' must be one of always, diurnal; got"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(c.sim.availability, config::AvailabilityMode::kAlways);  // unchanged

  for (double ingress : {-1.0, std::nan(""), static_cast<double>(INFINITY)}) {
    c = smallJob(":memory:");
    c.sim.coordinator_ingress_mbps = ingress;
    sim = FleetSimulator::create(c);
    ASSERT_FALSE(sim.isOk()) << ingress;
    EXPECT_NE(sim.status().message().find("sim.coordinator_ingress_mbps"), std::string::npos);
  }
}

// Straggler policies, aggregators and selectors through the simulator: the same seed gives the same
// history at 1 and 2 workers, and training makes progress, for an asynchronous run with Oort
// selection, SCAFFOLD with FedProx's proximal term, and FedNova with over-selection, a percentile
// deadline and partial work on a heterogeneous fleet.
struct MethodCase {
  const char* name;
  void (*apply)(config::Config&);
};

class SimMethods : public ::testing::TestWithParam<MethodCase> {};

TEST_P(SimMethods, SameSeedSameHistoryAndProgress) {
  std::vector<History> runs;
  for (uint32_t workers : {1u, 2u}) {
    const std::string db =
        tmpPath(std::string("sim_method_") + GetParam().name + std::to_string(workers) + ".db");
    config::Config c = smallJob(db);
    c.sim.fleet = "mobile-mix";
    c.sim.workers = workers;
    c.run.rounds = 4;
    GetParam().apply(c);
    ASSERT_TRUE(c.validate().isOk()) << c.validate().toString();
    auto summary = runJob(c);
    ASSERT_TRUE(summary.isOk()) << summary.status().toString();
    runs.push_back(readHistory(db, summary->run_id));
  }
  const History& a = runs[0];
  const History& b = runs[1];
  ASSERT_EQ(a.rounds.size(), b.rounds.size());
  ASSERT_EQ(a.rounds.size(), 5u);
  for (size_t i = 0; i < a.rounds.size(); ++i) {
    SCOPED_TRACE("round " + std::to_string(i));
    EXPECT_EQ(a.rounds[i].test_accuracy, b.rounds[i].test_accuracy);
    EXPECT_EQ(a.rounds[i].end_time, b.rounds[i].end_time);
    EXPECT_EQ(a.rounds[i].completed, b.rounds[i].completed);
    EXPECT_EQ(a.rounds[i].status, b.rounds[i].status);
    EXPECT_EQ(a.rounds[i].status, i == 0 ? "initial" : "ok");
  }
  ASSERT_EQ(a.updates.size(), b.updates.size());
  for (size_t i = 0; i < a.updates.size(); ++i) {
    EXPECT_EQ(a.updates[i].client_id, b.updates[i].client_id);
    EXPECT_EQ(a.updates[i].steps, b.updates[i].steps);
    EXPECT_EQ(a.updates[i].weight, b.updates[i].weight);
  }
  ASSERT_TRUE(a.rounds.back().test_accuracy.has_value());
  EXPECT_GT(*a.rounds.back().test_accuracy, *a.rounds.front().test_accuracy + 0.15);
}

INSTANTIATE_TEST_SUITE_P(Methods, SimMethods,
                         ::testing::Values(MethodCase{"fedbuff_oort",
                                                      [](config::Config& c) {
                                                        c.policy.mode = "async";
                                                        c.policy.async_concurrency = 8;
                                                        c.policy.async_buffer = 4;
                                                        c.selection.selector = "oort";
                                                      }},
                                           MethodCase{"scaffold_prox",
                                                      [](config::Config& c) {
                                                        c.aggregation.method = "scaffold";
                                                        c.train.prox_mu = 0.01;
                                                      }},
                                           MethodCase{"fednova_oversel_partial",
                                                      [](config::Config& c) {
                                                        c.aggregation.method = "fednova";
                                                        c.policy.over_selection = 0.5;
                                                        c.policy.deadline = "percentile";
                                                        c.policy.partial_work = true;
                                                        c.train.epochs = 2;
                                                        c.coordinator.deadline_s = 20;
                                                      }}),
                         [](const auto& info) { return std::string(info.param.name); });

// FedProx's systems heterogeneity: stragglers in "drop" mode never report (late at the
// deadline); in "partial" mode they send fewer epochs' steps than the others.
// sim.attackers, sim.attack (docs/SIM.md): client v0 of 4 uploads 1e20 everywhere whenever it
// is sampled. The norm bound clips it in rounds 1 and 2, it is then quarantined, and rounds 3
// and 4 go on without it; every round counts. The quiet attack (a constant update just inside
// the bound) is never flagged.
TEST(FleetSimulator, AttackingClientsAreClippedThenQuarantined) {
  auto job = [](const std::string& db, const std::string& attack) {
    config::Config c = smallJob(db);
    c.run.rounds = 4;
    c.data.train_subset = 600;
    c.data.test_subset = 500;
    c.data.partition = "iid";
    c.coordinator.clients_per_round = 4;
    c.sim.clients = 4;
    c.sim.attackers = 0.25;
    c.sim.attack = attack;
    return c;
  };
  const std::string db = tmpPath("sim_attack.db");
  auto summary = runJob(job(db, "constant:1e20"));
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  EXPECT_EQ(summary->failed_rounds, 0u);
  const History h = readHistory(db, summary->run_id);
  std::map<std::string, std::vector<std::string>> events;  // kind -> clients
  for (const auto& e : h.events) events[e.kind].push_back(e.client_id);
  EXPECT_EQ(events["update_clipped"], (std::vector<std::string>{"v0", "v0"}));
  EXPECT_EQ(events["client_quarantined"], (std::vector<std::string>{"v0"}));
  std::map<uint32_t, std::set<std::string>> sampled;
  for (const auto& u : h.updates) sampled[u.round].insert(u.client_id);
  EXPECT_EQ(sampled[2].count("v0"), 1u);
  EXPECT_EQ(sampled[3], (std::set<std::string>{"v1", "v2", "v3"}));
  EXPECT_EQ(sampled[4], (std::set<std::string>{"v1", "v2", "v3"}));

  const std::string quiet_db = tmpPath("sim_attack_quiet.db");
  auto quiet = runJob(job(quiet_db, "inside_bound"));
  ASSERT_TRUE(quiet.isOk()) << quiet.status().toString();
  for (const auto& e : readHistory(quiet_db, quiet->run_id).events) {
    EXPECT_NE(e.kind, "update_clipped") << e.detail;
    EXPECT_NE(e.kind, "client_quarantined") << e.detail;
  }
  // A sim.attack that does not parse names the key.
  config::Config bad = job(tmpPath("sim_attack_bad.db"), "flip");
  auto refused = FleetSimulator::create(bad);
  ASSERT_FALSE(refused.isOk());
  EXPECT_NE(refused.status().message().find("sim.attack"), std::string::npos);
}

TEST(FleetSimulator, StragglersDropOrSendPartialWork) {
  for (const char* mode : {"drop", "partial"}) {
    SCOPED_TRACE(mode);
    const std::string db = tmpPath(std::string("sim_stragglers_") + mode + ".db");
    config::Config c = smallJob(db);
    c.train.epochs = 4;
    c.sim.stragglers = 0.5;
    ASSERT_TRUE(c.set(std::string("sim.straggler_mode=") + mode).isOk()) << mode;
    c.coordinator.deadline_s = 600;
    auto summary = runJob(c);
    ASSERT_TRUE(summary.isOk()) << summary.status().toString();
    History h = readHistory(db, summary->run_id);
    uint32_t late = 0, fewer = 0, full = 0;
    for (const auto& u : h.updates) {
      if (u.status == "late") ++late;
      if (u.status != "completed") continue;
      // Full work: 4 epochs of ceil(n / 16) steps.
      const uint64_t planned = 4 * ((u.n_samples + 15) / 16);
      if (u.steps < planned) ++fewer;
      if (u.steps == planned) ++full;
    }
    EXPECT_GT(full, 0u);
    if (std::string(mode) == "drop") {
      EXPECT_GT(late, 0u);
      EXPECT_EQ(fewer, 0u);
    } else {
      EXPECT_EQ(late, 0u);
      EXPECT_GT(fewer, 0u);
    }
  }
}

// Upload credits run in virtual time, through each virtual client's session: 50 clients of the
// uniform fleet (20 Mbit/s uplinks) upload one logreg update each through 2 credits, and the
// coordinator takes in an upload at 0.1 Mbit/s. The uploads drain two at a time, so the round
// lasts about 25 upload times (an update's bytes / the ingress rate): download and training take
// milliseconds, an upload seconds. With unlimited ingress the same round is over in a fraction.
TEST(FleetSimulator, CreditsAndCoordinatorIngressBoundTheUploads) {
  constexpr double kIngressMbps = 0.1;
  struct Outcome {
    double round_s = 0;
    double upload_s = 0;  // mean update bytes / ingress rate
    double max_grant_wait_s = 0;
    size_t completed = 0;
  };
  auto run = [](double ingress_mbps) {
    const std::string db = tmpPath("sim_ingress_" + std::to_string(ingress_mbps > 0) + ".db");
    config::Config c = smallJob(db);
    c.model.name = "logreg";
    c.run.rounds = 1;
    c.sim.clients = 50;
    c.coordinator.clients_per_round = 50;
    c.coordinator.max_concurrent_uploads = 2;
    c.coordinator.deadline_s = 1000;
    c.sim.coordinator_ingress_mbps = ingress_mbps;
    Outcome o;
    auto summary = runJob(c);
    EXPECT_TRUE(summary.isOk()) << summary.status().toString();
    if (!summary.isOk()) return o;
    const History h = readHistory(db, summary->run_id);
    for (const auto& r : h.rounds) {
      if (r.round == 1) o.round_s = r.end_time - r.start_time;
    }
    double bytes = 0;
    for (const auto& u : h.updates) {
      if (u.status != "completed") continue;
      ++o.completed;
      bytes += static_cast<double>(u.bytes_up);
      o.max_grant_wait_s = std::max(o.max_grant_wait_s, u.grant_wait_s);
    }
    if (o.completed > 0) o.upload_s = bytes / o.completed / (kIngressMbps * 1e6 / 8);
    return o;
  };
  const Outcome limited = run(kIngressMbps);
  ASSERT_EQ(limited.completed, 50u);
  const double expected = 25 * limited.upload_s;
  std::printf(
      "50 uploads, 2 credits, %.1f Mbit/s ingress: round %.2f s virtual = %.3f x 25 "
      "upload times of %.3f s\n",
      kIngressMbps, limited.round_s, limited.round_s / expected, limited.upload_s);
  // Within 5%: latency, the Summary frames, download and training add a little.
  EXPECT_GT(limited.round_s, 0.98 * expected);
  EXPECT_LT(limited.round_s, 1.05 * expected);
  // The last pair waited for the 24 pairs before it.
  EXPECT_GT(limited.max_grant_wait_s, 23 * limited.upload_s);

  const Outcome unlimited = run(0);
  ASSERT_EQ(unlimited.completed, 50u);
  std::printf("unlimited ingress: round %.3f s virtual\n", unlimited.round_s);
  EXPECT_LT(unlimited.round_s, 0.05 * limited.round_s);
}

// The served-model checks run in the simulator as in a client process: the first served models
// that reach a virtual client damaged are refused with the error a client's ServedModelStore
// gives, recorded as the client's error, and the task is not trained (its update is rejected).
TEST(FleetSimulator, ADamagedServedModelIsRefusedAsAClientRefusesIt) {
  const std::string db = tmpPath("sim_served_damaged.db");
  const config::Config c = blocksJob(db, "pluralistic", 4, 200);
  auto sim = FleetSimulator::create(c);
  ASSERT_TRUE(sim.isOk()) << sim.status().toString();
  std::map<std::string, std::string> refused;  // client id -> the error a client gives
  (*sim)->setReceiveFilter([&refused](uint64_t k, client::ReceivedTask& r) {
    const wire::ServedSource source = r.task.served.source;
    const bool brings =
        source == wire::ServedSource::kAttached || source == wire::ServedSource::kTaskModel;
    if (!brings || refused.size() >= 3) return;
    if (source == wire::ServedSource::kAttached) {
      auto bad = std::make_shared<std::string>(*r.served_bytes);
      (*bad)[5] ^= 0x10;
      r.served_bytes = bad;
    } else {
      r.task.served.sha256[0] ^= 1;  // names another model than the task's
    }
    client::ServedModelStore store("");  // what a client process checks a served model with
    auto got = store.take(r.task, r.model_bytes, r.served_bytes);
    EXPECT_FALSE(got.isOk());
    refused["v" + std::string(k < 10 ? "0" : "") + std::to_string(k)] = got.status().message();
  });
  auto summary = (*sim)->run();
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  ASSERT_EQ(refused.size(), 3u);
  const History h = readHistory(db, summary->run_id);
  std::map<std::string, std::string> recorded;
  for (const auto& e : h.events) {
    if (e.kind == "client_error" && !recorded.count(e.client_id)) recorded[e.client_id] = e.detail;
  }
  for (const auto& [id, message] : refused) {
    ASSERT_TRUE(recorded.count(id)) << id;
    EXPECT_EQ(recorded[id], message) << id;
    EXPECT_NE(message.find("served model"), std::string::npos);
  }
  size_t rejected = 0;
  for (const auto& u : h.updates) rejected += u.status == "rejected";
  EXPECT_GE(rejected, refused.size());
}

// SCAFFOLD's client state lives in each virtual client's session and takes an update's Dc_k only
// once its Summary reached the coordinator in time: on a mobile fleet with a tight deadline, a
// client whose every update was late (cancelled, its upload abandoned) still holds c_k = 0, and
// every client with a completed update holds a c_k it changed.
TEST(FleetSimulator, ScaffoldStateIsCommittedOnlyForAcceptedUpdates) {
  const std::string db = tmpPath("sim_scaffold_commit.db");
  config::Config c = smallJob(db);
  c.sim.fleet = "mobile-mix";
  c.aggregation.method = "scaffold";
  c.aggregation.norm_bound = 0;  // no settlement rejection the client cannot know of
  c.coordinator.deadline_s = 4;
  c.run.rounds = 4;
  auto sim = FleetSimulator::create(c);
  ASSERT_TRUE(sim.isOk()) << sim.status().toString();
  auto summary = (*sim)->run();
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  const History h = readHistory(db, summary->run_id);
  std::map<std::string, std::pair<int, int>> per_client;  // completed, not completed
  for (const auto& u : h.updates) {
    auto& [done, not_done] = per_client[u.client_id];
    (u.status == "completed" ? done : not_done) += 1;
  }
  int never_accepted = 0, accepted = 0;
  for (uint64_t k = 0; k < c.sim.clients; ++k) {
    const std::string id = "v" + std::string(k < 10 ? "0" : "") + std::to_string(k);
    const client::ClientSession* session = (*sim)->clientSession(k);
    if (!per_client.count(id)) continue;
    const auto [done, not_done] = per_client[id];
    if (session == nullptr) continue;  // dropped out before it took a task
    const client::ControlVariate* ck = session->controlVariate();
    const bool changed = ck != nullptr && ck->memoryBytes() > 0;
    EXPECT_EQ(changed, done > 0) << id << ": " << done << " completed, " << not_done << " not";
    (done > 0 ? accepted : never_accepted) += 1;
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(never_accepted, 0);
}

}  // namespace
}  // namespace fedfleet::sim

namespace fedfleet::sim {
namespace {

// Differentially private FedAvg through the simulator: the same seed gives the same history
// (noise included) at 1 and 2 workers; every round records the accountant's epsilon for
// q = K / N = 8 / 40 and the clip, which adapts; the budget ends the run early; a method DP
// cannot wrap is refused at start-up.
TEST(FleetSimulator, DifferentiallyPrivateRunsRecordTheirEpsilonAndStopAtTheBudget) {
  auto privateJob = [](const std::string& db, uint32_t workers) {
    config::Config c = smallJob(db);
    c.model.name = "logreg";
    c.run.rounds = 6;
    c.sim.workers = workers;
    c.dp.mode = "central";
    c.dp.noise_multiplier = 0.8;
    c.dp.clip_norm = 0.5;
    c.dp.adaptive_clip = true;
    c.dp.count_stddev = 1;  // > z / 2 (the default K / 20 = 0.4 is not)
    return c;
  };
  std::vector<History> runs;
  for (uint32_t workers : {1u, 2u}) {
    const std::string db = tmpPath("sim_dp" + std::to_string(workers) + ".db");
    auto summary = runJob(privateJob(db, workers));
    ASSERT_TRUE(summary.isOk()) << summary.status().toString();
    runs.push_back(readHistory(db, summary->run_id));
  }
  const History& a = runs[0];
  ASSERT_EQ(a.rounds.size(), 7u);
  ASSERT_EQ(runs[1].rounds.size(), 7u);
  std::set<double> clips;
  for (size_t i = 1; i < a.rounds.size(); ++i) {
    SCOPED_TRACE("round " + std::to_string(i));
    const auto& r = a.rounds[i];
    EXPECT_EQ(r.status, "ok");
    EXPECT_EQ(r.test_accuracy, runs[1].rounds[i].test_accuracy);
    ASSERT_TRUE(r.dp_epsilon && r.dp_clip);
    EXPECT_EQ(r.dp_epsilon, runs[1].rounds[i].dp_epsilon);
    EXPECT_EQ(r.dp_clip, runs[1].rounds[i].dp_clip);
    auto want = privacy::epsilonOf(8.0 / 40, 0.8, i, 1e-5);
    ASSERT_TRUE(want.isOk());
    EXPECT_DOUBLE_EQ(*r.dp_epsilon, want->epsilon);
    clips.insert(*r.dp_clip);
  }
  EXPECT_EQ(*a.rounds[1].dp_clip, 0.5);
  EXPECT_GT(clips.size(), 1u) << "the clip adapts";
  EXPECT_FALSE(a.rounds[0].dp_epsilon.has_value());

  // A budget between epsilon after 3 and after 4 rounds: 3 rounds, and an event that says so.
  config::Config budget = privateJob(tmpPath("sim_dp_budget.db"), 1);
  const double e3 = privacy::epsilonOf(0.2, 0.8, 3, 1e-5)->epsilon;
  const double e4 = privacy::epsilonOf(0.2, 0.8, 4, 1e-5)->epsilon;
  budget.dp.target_epsilon = (e3 + e4) / 2;
  auto summary = runJob(budget);
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  History h = readHistory(budget.history.db, summary->run_id);
  ASSERT_EQ(h.rounds.size(), 4u);
  EXPECT_DOUBLE_EQ(*h.rounds.back().dp_epsilon, e3);
  int budget_events = 0;
  for (const auto& e : h.events) budget_events += e.kind == "privacy_budget";
  EXPECT_EQ(budget_events, 1);

  config::Config nova = privateJob(":memory:", 1);
  nova.aggregation.method = "fednova";
  auto refused = FleetSimulator::create(nova);
  ASSERT_FALSE(refused.isOk());
  EXPECT_NE(refused.status().message().find("dp.mode"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace fedfleet::sim

namespace fedfleet::sim {
namespace {

// Secure aggregation (SecAgg+) through the simulator, the engine and the client sessions: the
// coordinator sees only masked sums, yet each round's model is FedAvg's to within the
// quantisation (the test accuracy of every round within 0.5 points of the same run in the
// clear); the key and unmasking stages cost virtual time; the same seed gives the same history
// at 1 and 2 workers, with clients dropping out at every stage; a method it cannot sum is
// refused at start-up with the reason.
TEST(FleetSimulator, SecureAggregationMatchesFedAvgAndSurvivesDropouts) {
  auto job = [](const std::string& db, bool secure, double dropout, uint32_t workers) {
    config::Config c = smallJob(db);
    c.model.name = "logreg";
    c.run.rounds = 4;
    c.sim.workers = workers;
    c.sim.dropout = dropout;
    c.sim.rejoin_s = 1;
    c.coordinator.deadline_s = 600;
    // Neither applies under secure aggregation (the coordinator sees no single update): off in
    // the clear too, so the two runs aggregate alike.
    c.aggregation.norm_bound = 0;
    c.aggregation.weight_cap = 1e9;
    if (secure) c.secagg.mode = "secagg_plus";
    return c;
  };
  const std::string plain_db = tmpPath("sim_sa_plain.db");
  const std::string secure_db = tmpPath("sim_sa_secure.db");
  auto plain = runJob(job(plain_db, false, 0, 1));
  auto secure = runJob(job(secure_db, true, 0, 1));
  ASSERT_TRUE(plain.isOk()) << plain.status().toString();
  ASSERT_TRUE(secure.isOk()) << secure.status().toString();
  const History p = readHistory(plain_db, plain->run_id);
  const History s = readHistory(secure_db, secure->run_id);
  ASSERT_EQ(p.rounds.size(), 5u);
  ASSERT_EQ(s.rounds.size(), 5u);
  for (size_t i = 1; i < s.rounds.size(); ++i) {
    SCOPED_TRACE("round " + std::to_string(i));
    EXPECT_EQ(s.rounds[i].status, "ok");
    EXPECT_EQ(s.rounds[i].completed, 8u);
    ASSERT_TRUE(s.rounds[i].test_accuracy && p.rounds[i].test_accuracy);
    EXPECT_NEAR(*s.rounds[i].test_accuracy, *p.rounds[i].test_accuracy, 0.005);
    // Two key stages and the unmasking: at least three more one-way latencies each way.
    EXPECT_GT(s.rounds[i].end_time - s.rounds[i].start_time,
              p.rounds[i].end_time - p.rounds[i].start_time);
  }
  size_t masked = 0;
  for (const auto& u : s.updates) masked += u.codec == "secagg";
  EXPECT_EQ(masked, 32u);  // 4 rounds of 8
  EXPECT_GT(*s.rounds.back().test_accuracy, *s.rounds[0].test_accuracy + 0.2);

  // Dropouts: the same history at 1 and 2 workers, every round committed.
  std::vector<History> runs;
  for (uint32_t workers : {1u, 2u}) {
    const std::string db = tmpPath("sim_sa_drop" + std::to_string(workers) + ".db");
    auto summary = runJob(job(db, true, 0.25, workers));
    ASSERT_TRUE(summary.isOk()) << summary.status().toString();
    runs.push_back(readHistory(db, summary->run_id));
  }
  ASSERT_EQ(runs[0].rounds.size(), 5u);
  ASSERT_EQ(runs[1].rounds.size(), 5u);
  uint32_t dropped = 0;
  for (size_t i = 1; i < runs[0].rounds.size(); ++i) {
    SCOPED_TRACE("round " + std::to_string(i));
    const auto& r = runs[0].rounds[i];
    EXPECT_EQ(r.status, "ok");
    EXPECT_EQ(r.test_accuracy, runs[1].rounds[i].test_accuracy);
    EXPECT_EQ(r.end_time, runs[1].rounds[i].end_time);
    EXPECT_EQ(r.completed + r.dropped + r.late + r.rejected, 8u);
    dropped += r.dropped;
  }
  EXPECT_GT(dropped, 0u) << "some clients dropped";
  // Some went at the unmasking, after their whole masked upload: their updates are in the sum
  // (completed) and the round still ended ok, their self masks rebuilt from their neighbours'
  // shares. They leave (idle, their task done) before the round they completed in ends.
  uint32_t at_unmasking = 0;
  for (const auto& ev : runs[0].events) {
    if (ev.kind != "client_left") continue;
    for (const auto& u : runs[0].updates) {
      const auto& r = runs[0].rounds.at(u.round);
      at_unmasking += u.client_id == ev.client_id && u.status == "completed" &&
                      ev.time > r.start_time && ev.time < r.end_time;
    }
  }
  EXPECT_GT(at_unmasking, 0u) << "no client dropped at the unmasking";

  config::Config median = job(":memory:", true, 0, 1);
  median.aggregation.method = "median";
  auto refused = FleetSimulator::create(median);
  ASSERT_FALSE(refused.isOk());
  EXPECT_NE(refused.status().message().find("secagg"), std::string::npos)
      << refused.status().message();
}

// A server optimiser and over-selection under secure aggregation. FedAvgM on the unmasked sum
// follows the same run in the clear round by round (test accuracy within 0.5 points); with
// over-selection (b = 0.5: 12 selected for K = 8) each round aggregates the first 8 and the
// other 4 drop out of the masked sum, whose masks the survivors' shares then remove.
TEST(FleetSimulator, SecureAggregationWithAServerOptimiserAndOverSelection) {
  auto job = [](const std::string& db, bool secure, double over_selection) {
    config::Config c = smallJob(db);
    c.model.name = "logreg";
    c.run.rounds = 3;
    c.coordinator.deadline_s = 600;
    c.aggregation.norm_bound = 0;
    c.aggregation.weight_cap = 1e9;
    c.aggregation.server_optimizer = "fedavgm";
    c.policy.over_selection = over_selection;
    if (secure) c.secagg.mode = "secagg_plus";
    return c;
  };
  const std::string plain_db = tmpPath("sim_sa_m_plain.db");
  const std::string secure_db = tmpPath("sim_sa_m_secure.db");
  auto plain = runJob(job(plain_db, false, 0));
  auto secure = runJob(job(secure_db, true, 0));
  ASSERT_TRUE(plain.isOk()) << plain.status().toString();
  ASSERT_TRUE(secure.isOk()) << secure.status().toString();
  const History p = readHistory(plain_db, plain->run_id);
  const History s = readHistory(secure_db, secure->run_id);
  ASSERT_EQ(p.rounds.size(), 4u);
  ASSERT_EQ(s.rounds.size(), 4u);
  for (size_t i = 1; i < s.rounds.size(); ++i) {
    SCOPED_TRACE("round " + std::to_string(i));
    EXPECT_EQ(s.rounds[i].status, "ok");
    ASSERT_TRUE(s.rounds[i].test_accuracy && p.rounds[i].test_accuracy);
    EXPECT_NEAR(*s.rounds[i].test_accuracy, *p.rounds[i].test_accuracy, 0.005);
  }
  // Momentum carries across rounds: the third round's model differs from plain FedAvg's.
  const std::string avg_db = tmpPath("sim_sa_m_avg.db");
  config::Config avg = job(avg_db, true, 0);
  avg.aggregation.server_optimizer = "fedavg";
  auto secure_avg = runJob(avg);
  ASSERT_TRUE(secure_avg.isOk()) << secure_avg.status().toString();
  const double momentum_gap =
      rmsStep(modelAt(avg_db, secure_avg->run_id, 3), modelAt(secure_db, secure->run_id, 3));
  const double masked_error =
      rmsStep(modelAt(plain_db, plain->run_id, 3), modelAt(secure_db, secure->run_id, 3));
  EXPECT_GT(momentum_gap, 10 * masked_error);

  const std::string over_db = tmpPath("sim_sa_over.db");
  auto over = runJob(job(over_db, true, 0.5));
  ASSERT_TRUE(over.isOk()) << over.status().toString();
  const History o = readHistory(over_db, over->run_id);
  ASSERT_EQ(o.rounds.size(), 4u);
  for (size_t i = 1; i < o.rounds.size(); ++i) {
    SCOPED_TRACE("round " + std::to_string(i));
    EXPECT_EQ(o.rounds[i].status, "ok");
    EXPECT_EQ(o.rounds[i].selected, 12u);
    EXPECT_EQ(o.rounds[i].completed, 8u);
  }
  EXPECT_GT(*o.rounds.back().test_accuracy, *o.rounds[0].test_accuracy + 0.2);
}

// FedNova under secure aggregation, through the client sessions: each client divides its
// weight by its own a(tau_k, rho) before masking, so the first round's model equals FedNova's
// in the clear to within the quantisation, and differs from FedAvg's (the Dirichlet partitions
// give the clients unequal step counts) by far more than that.
TEST(FleetSimulator, FedNovaUnderSecureAggregationIsFedNovasStep) {
  auto job = [](const std::string& db, const std::string& method, bool secure) {
    config::Config c = smallJob(db);
    c.model.name = "logreg";
    c.run.rounds = 1;
    c.train.momentum = 0.5;
    c.coordinator.deadline_s = 600;
    c.aggregation.norm_bound = 0;
    c.aggregation.weight_cap = 1e9;
    EXPECT_TRUE(c.set("aggregation.method=" + method).isOk()) << method;
    if (secure) c.secagg.mode = "secagg_plus";
    return c;
  };
  std::map<std::string, std::vector<float>> step1;  // the model after round 1
  for (const auto& [name, method, secure] :
       {std::tuple<std::string, std::string, bool>{"nova_clear", "fednova", false},
        {"nova_secure", "fednova", true},
        {"avg_clear", "fedavg", false}}) {
    const std::string db = tmpPath("sim_" + name + ".db");
    auto summary = runJob(job(db, method, secure));
    ASSERT_TRUE(summary.isOk()) << name << ": " << summary.status().toString();
    const History h = readHistory(db, summary->run_id);
    ASSERT_EQ(h.rounds.size(), 2u) << name;
    EXPECT_EQ(h.rounds[1].status, "ok") << name;
    EXPECT_EQ(h.rounds[1].completed, 8u) << name;
    std::set<uint64_t> steps;
    for (const auto& u : h.updates) steps.insert(u.steps);
    EXPECT_GT(steps.size(), 1u) << name << ": the clients' step counts should differ";
    step1[name] = modelAt(db, summary->run_id, 1);
  }
  // The three runs start from the same initial model (the seed's) with the same cohort.
  const double masked_error = rmsStep(step1["nova_clear"], step1["nova_secure"]);
  const double fedavg_gap = rmsStep(step1["nova_clear"], step1["avg_clear"]);
  EXPECT_GT(fedavg_gap, 0);
  EXPECT_LT(masked_error, 0.05 * fedavg_gap) << "FedNova against FedAvg: " << fedavg_gap;
}

}  // namespace
}  // namespace fedfleet::sim

namespace fedfleet::sim {
namespace {

// Distributed DP under secure aggregation: every client clips its update to C at weight 1 and
// adds N(0, (z C)^2 / M) (M = the quorum) from its own secret stream; the coordinator adds
// nothing and divides by K. With updates near zero (a learning rate of 1e-9) the second round's
// step is that noise alone: its standard deviation over the model's 7,850 values must be
// sqrt(survivors) z C / (sqrt(M) K), checked to 5% (the estimate's own spread is 1.6%). Every
// round records the accountant's epsilon for q = K / N; without secure aggregation the mode is
// refused.
TEST(FleetSimulator, DistributedDpNoiseHasTheScaleItPromises) {
  auto job = [](const std::string& db) {
    config::Config c = smallJob(db);
    c.model.name = "logreg";
    c.run.rounds = 2;
    c.train.lr = 1e-9;
    c.coordinator.quorum = 4;
    c.coordinator.deadline_s = 600;
    c.aggregation.norm_bound = 0;
    c.secagg.mode = "secagg_plus";
    c.dp.mode = "distributed";
    c.dp.noise_multiplier = 0.5;
    c.dp.clip_norm = 2.0;
    return c;
  };
  const std::string db = tmpPath("sim_ddp.db");
  auto summary = runJob(job(db));
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  const History h = readHistory(db, summary->run_id);
  ASSERT_EQ(h.rounds.size(), 3u);
  const auto& r = h.rounds[2];
  ASSERT_EQ(h.rounds[1].status, "ok");
  ASSERT_EQ(r.status, "ok");
  ASSERT_TRUE(r.dp_epsilon.has_value());
  EXPECT_DOUBLE_EQ(*r.dp_epsilon, privacy::epsilonOf(8.0 / 40, 0.5, 2, 1e-5)->epsilon);
  EXPECT_EQ(*r.dp_clip, 2.0);

  const double got = rmsStep(modelAt(db, summary->run_id, 1), modelAt(db, summary->run_id, 2));
  const double want = std::sqrt(static_cast<double>(r.completed)) * 0.5 * 2.0 / std::sqrt(4.0) / 8;
  EXPECT_NEAR(got, want, 0.05 * want) << r.completed << " survivors";

  config::Config clear = job(":memory:");
  clear.secagg.mode = "none";
  auto refused = FleetSimulator::create(clear);
  ASSERT_FALSE(refused.isOk());
  EXPECT_NE(refused.status().message().find("secagg"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace fedfleet::sim

namespace fedfleet::sim {
namespace {

// Local DP: every client clips its own update to C and adds N(0, (z C)^2) before it leaves.
// With updates near zero the round's step is the weighted average of that noise, of standard
// deviation z C sqrt(sum n_k^2) / sum n_k, checked to 5% over the model's 7,850 values; each
// round records the epsilon of the client with the most releases, at sampling rate 1.
TEST(FleetSimulator, LocalDpNoisesEachUpdateAndAccountsPerClient) {
  const std::string db = tmpPath("sim_ldp.db");
  config::Config c = smallJob(db);
  c.model.name = "logreg";
  c.run.rounds = 3;
  c.train.lr = 1e-9;
  c.aggregation.norm_bound = 0;
  c.aggregation.weight_cap = 1e9;
  c.dp.mode = "local";
  c.dp.noise_multiplier = 0.02;
  c.dp.clip_norm = 1.0;
  auto summary = runJob(c);
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  const History h = readHistory(db, summary->run_id);
  ASSERT_EQ(h.rounds.size(), 4u);
  std::map<std::string, uint64_t> releases;
  for (uint32_t round = 1; round <= 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    ASSERT_EQ(h.rounds[round].status, "ok");
    uint64_t most = 0;
    for (const auto& u : h.updates) {
      if (u.round == round) most = std::max(most, ++releases[u.client_id]);
    }
    for (const auto& [id, n] : releases) most = std::max(most, n);
    ASSERT_TRUE(h.rounds[round].dp_epsilon.has_value());
    EXPECT_DOUBLE_EQ(*h.rounds[round].dp_epsilon,
                     privacy::epsilonOf(1.0, 0.02, most, 1e-5)->epsilon);
  }
  const double got = rmsStep(modelAt(db, summary->run_id, 2), modelAt(db, summary->run_id, 3));
  double sum_n = 0, sum_n2 = 0;
  for (const auto& u : h.updates) {
    if (u.round != 3) continue;
    sum_n += static_cast<double>(u.n_samples);
    sum_n2 += static_cast<double>(u.n_samples) * static_cast<double>(u.n_samples);
  }
  const double want = 0.02 * 1.0 * std::sqrt(sum_n2) / sum_n;
  EXPECT_NEAR(got, want, 0.05 * want);

  config::Config with_secagg = c;
  with_secagg.history.db = ":memory:";
  with_secagg.secagg.mode = "secagg_plus";
  auto refused = FleetSimulator::create(with_secagg);
  ASSERT_FALSE(refused.isOk());
  EXPECT_NE(refused.status().message().find("distributed"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace fedfleet::sim
