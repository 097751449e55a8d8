// Choosing OpenBLAS's kernels: a CPU OpenBLAS took for one without AVX2 gets the widest kernels
// its /proc/cpuinfo flags allow, and a recognised one is left alone.
#include "common/model/blas_core.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace fedfleet::model {
namespace {

// A Sapphire Rapids-class virtual machine's flags (abridged), which OpenBLAS 0.3.21 took for
// Prescott.
const std::string kAvx512 =
    "fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx512ifma avx512cd "
    "avx512bw avx512vl avx512_bf16 avx512vbmi";
const std::string kAvx2 = "fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2";

TEST(BlasCore, AnUnrecognisedCpuGetsTheWidestKernelsItsFlagsAllow) {
  EXPECT_EQ(betterBlasCore("Prescott", kAvx512), std::optional<std::string>("SkylakeX"));
  EXPECT_EQ(betterBlasCore("Prescott", kAvx2), std::optional<std::string>("Haswell"));
  EXPECT_EQ(betterBlasCore("Nehalem", kAvx2), std::optional<std::string>("Haswell"));
  EXPECT_EQ(betterBlasCore("Sandybridge", kAvx512), std::optional<std::string>("SkylakeX"));
  // AVX-512 without VL (and the other four) is not SkylakeX's set: AVX2 kernels.
  EXPECT_EQ(betterBlasCore("Prescott", kAvx2 + " avx512f avx512cd avx512bw avx512dq"),
            std::optional<std::string>("Haswell"));
}

TEST(BlasCore, NothingBetterWithoutTheFlags) {
  EXPECT_EQ(betterBlasCore("Prescott", "fpu sse sse2 pni ssse3 sse4_1 avx"), std::nullopt);
  EXPECT_EQ(betterBlasCore("Prescott", "avx2"), std::nullopt);  // AVX2 without FMA
  EXPECT_EQ(betterBlasCore("Prescott", ""), std::nullopt);
  // Whole flags only: names that merely start like the wanted ones do not count.
  EXPECT_EQ(betterBlasCore("Prescott", "avx2x fmax avx512fx"), std::nullopt);
}

TEST(BlasCore, ARecognisedCpuOrNoOpenBlasIsLeftAlone) {
  for (const char* core : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids",
                           "Excavator", "SKYLAKEX", "haswell"}) {
    EXPECT_EQ(betterBlasCore(core, kAvx512), std::nullopt) << core;
  }
  EXPECT_EQ(betterBlasCore("", kAvx512), std::nullopt);  // no OpenBLAS in the process
}

TEST(BlasCore, CpuFlagsAreTheFlagsLine) {
  const std::string flags = cpuFlags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags line here";
  EXPECT_NE(flags.find(" fpu"), std::string::npos) << flags;  // every x86-64 CPU has an FPU
  EXPECT_EQ(flags.find(':'), std::string::npos) << flags;
}

}  // namespace
}  // namespace fedfleet::model
