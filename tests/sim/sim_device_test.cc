// sim.device: where the virtual clients train and the server evaluates. Without a CUDA device
// (a CPU-only LibTorch, or no GPU) `cuda` stops the simulator at start-up naming the key; with
// one, a run on the GPU learns as the same run on the CPU does (float rounding apart).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "common/config/config.h"
#include "sim/fleet_simulator.h"
#include "sim/sim_jobs.h"

namespace fedfleet::sim {
namespace {

config::Config job(const std::string& name, const std::string& device) {
  config::Config c;
  c.run.seed = 5;
  c.run.rounds = 3;
  c.model.name = "cnn";
  c.data.train_subset = 2000;
  c.data.test_subset = 500;
  c.data.partition = "iid";
  c.coordinator.clients_per_round = 4;
  c.coordinator.quorum = 1;
  c.train.batch = 32;
  c.sim.clients = 8;
  c.sim.progress = "off";
  EXPECT_TRUE(c.set("sim.device=" + device).isOk()) << device;
  c.history.db = ":memory:";
  c.run.name = name;
  return c;
}

TEST(SimDevice, AnUnknownDeviceIsRefusedNamingTheKey) {
  config::Config c = job("x", "cpu");
  const Status st = c.set("sim.device=tpu");  // refused as the config is read
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("'sim.device' must be one of cpu, cuda; got"), std::string::npos)
      << st.message();
}

TEST(SimDevice, CudaWithoutADeviceStopsTheStartNamingTheKey) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is here: see the next test";
  auto sim = FleetSimulator::create(job("cuda", "cuda"));
  ASSERT_FALSE(sim.isOk());
  EXPECT_EQ(sim.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(sim.status().message().find("sim.device"), std::string::npos) << sim.status().message();
  // A worker (an MPI rank) refuses the same device the same way.
  EXPECT_EQ(deviceOf("cuda").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(deviceOf("cpu").isOk());
}

TEST(SimDevice, TheGpuRunLearnsAsTheCpuRunDoes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto cpu = FleetSimulator::create(job("cpu", "cpu"));
  auto gpu = FleetSimulator::create(job("gpu", "cuda"));
  ASSERT_TRUE(cpu.isOk()) << cpu.status().toString();
  ASSERT_TRUE(gpu.isOk()) << gpu.status().toString();
  auto a = (*cpu)->run();
  auto b = (*gpu)->run();
  ASSERT_TRUE(a.isOk() && b.isOk());
  ASSERT_TRUE(a->final_accuracy && b->final_accuracy);
  EXPECT_GT(*b->final_accuracy, 0.5);
  EXPECT_NEAR(*a->final_accuracy, *b->final_accuracy, 0.03);
  EXPECT_EQ(a->completed, b->completed);
}

}  // namespace
}  // namespace fedfleet::sim
