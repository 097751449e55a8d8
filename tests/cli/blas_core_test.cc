// The fedfleet program's OpenBLAS kernels: where OpenBLAS took the CPU for one without AVX2, a
// training subcommand runs itself again with OPENBLAS_CORETYPE naming the kernels the CPU can
// run (the simulator's start-up line names them), and a core the user set is kept.
#include "common/model/blas_core.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/cli/blobs.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

using ::testing::HasSubstr;
const std::string kBinary = FEDFLEET_BINARY;

// Runs `args` with OPENBLAS_CORETYPE set to `core` (unset when empty); returns the exit status
// and the output.
std::pair<int, std::string> runWithCore(const std::vector<std::string>& args,
                                        const std::string& core, const std::string& log) {
  const char* was = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = was ? was : "";
  if (core.empty()) {
    ::unsetenv("OPENBLAS_CORETYPE");
  } else {
    ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  }
  testing::Process p(args, log);
  const int rc = p.waitFor(120).value_or(-1);
  if (was) {
    ::setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  } else {
    ::unsetenv("OPENBLAS_CORETYPE");
  }
  return {rc, p.log()};
}

// A 1-round simulation of the blobs, which logs its kernels at start-up.
std::vector<std::string> tinySim(const std::string& dir) {
  testing::writeBlobs(dir + "/train.csv", 120, 1);
  testing::writeBlobs(dir + "/test.csv", 30, 2);
  return testing::smallSimArgs(
      kBinary, dir + "/h.db", 1,
      {"data.format=csv", "data.path=" + dir + "/train.csv", "data.test_path=" + dir + "/test.csv",
       "data.label_column=class", "data.feature_columns=[\"f0\",\"f1\",\"f2\",\"f3\"]",
       "data.partition=iid", "model.name=logreg"});
}

TEST(BlasCore, TheSimulatorRunsOnTheBetterKernels) {
  const std::string loaded = model::openblasCoreName();
  if (loaded.empty()) GTEST_SKIP() << "this LibTorch does not use OpenBLAS";
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) {
    GTEST_SKIP() << "OPENBLAS_CORETYPE is set for the tests: this process did not detect";
  }
  // What OpenBLAS detected in this process is what the program detects when it starts.
  const std::string want = model::betterBlasCore(loaded, model::cpuFlags()).value_or(loaded);
  const std::string dir = testing::freshDir("blas-core-sim");
  const auto [rc, out] = runWithCore(tinySim(dir), "", dir + "/sim.txt");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("(OpenBLAS " + want + " kernels)")) << "detected " << loaded;
  // The reading subcommands are not run again; --blas-core names the training ones' kernels.
  const auto [rc2, printed] = runWithCore({kBinary, "--blas-core"}, "", dir + "/core.txt");
  EXPECT_EQ(rc2, 0) << printed;
  EXPECT_EQ(printed, want + "\n");
}

TEST(BlasCore, ACoreTheUserSetIsKept) {
  if (model::openblasCoreName().empty()) GTEST_SKIP() << "this LibTorch does not use OpenBLAS";
  const std::string dir = testing::freshDir("blas-core-kept");
  const auto [rc, out] = runWithCore(tinySim(dir), "Prescott", dir + "/sim.txt");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("(OpenBLAS Prescott kernels)"));
  const auto [rc2, printed] = runWithCore({kBinary, "--blas-core"}, "Haswell", dir + "/core.txt");
  EXPECT_EQ(rc2, 0) << printed;
  EXPECT_EQ(printed, "Haswell\n");
}

}  // namespace
}  // namespace fedfleet
