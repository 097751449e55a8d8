// Local DP on the client (client/local_dp.h): an update longer than the clip C comes out with
// norm C before the noise and pointing the same way; a shorter one is not scaled; the noise is
// N(0, (z C)^2) from the stream it is given, added after the clip.
#include "client/local_dp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/privacy/gaussian_noise.h"

namespace fedfleet::client {
namespace {

double norm(const std::vector<float>& v) {
  double sq = 0;
  for (float x : v) sq += static_cast<double>(x) * x;
  return std::sqrt(sq);
}

crypto::KeyedStream streamOf(uint64_t seed) {
  return crypto::KeyedStream(crypto::streamKeyFromSeed("local dp test", seed), 0, 0);
}

TEST(LocalDp, AnUpdateAboveTheClipComesOutWithNormCPointingTheSameWay) {
  std::vector<float> delta = {30, -40, 0, 120};  // norm 130
  applyLocalDp({/*clip=*/2.6, /*noise_multiplier=*/0, /*delta=*/1e-5}, delta.data(), delta.size(),
               streamOf(1));
  EXPECT_NEAR(norm(delta), 2.6, 1e-6);
  EXPECT_FLOAT_EQ(delta[0], 0.6f);
  EXPECT_FLOAT_EQ(delta[1], -0.8f);
  EXPECT_EQ(delta[2], 0.0f);
  EXPECT_FLOAT_EQ(delta[3], 2.4f);
}

TEST(LocalDp, AnUpdateBelowTheClipIsNotScaled) {
  const std::vector<float> before = {0.3f, -0.4f, 1.2f};  // norm 1.3
  std::vector<float> delta = before;
  applyLocalDp({2.0, 0, 1e-5}, delta.data(), delta.size(), streamOf(1));
  EXPECT_EQ(delta, before);
}

// With noise: exactly the clipped update plus z C times the stream's standard normals (the
// same stream regenerated here), so the clip is applied before the noise, not after.
TEST(LocalDp, TheNoiseIsZTimesTheClipAddedAfterClipping) {
  constexpr size_t kN = 20000;
  std::vector<float> delta(kN, 1.0f);  // norm sqrt(kN), clipped to 1: each value 1 / sqrt(kN)
  const wire::LocalDpTask dp{1.0, 0.8, 1e-5};
  applyLocalDp(dp, delta.data(), kN, streamOf(7));
  std::vector<float> want(kN, static_cast<float>(1.0 / std::sqrt(static_cast<double>(kN))));
  privacy::GaussianStream noise(streamOf(7));
  noise.addTo(want.data(), kN, 0.8 * 1.0);
  EXPECT_EQ(delta, want);
  double sq = 0;
  for (float x : delta) sq += static_cast<double>(x) * x;
  EXPECT_NEAR(std::sqrt(sq / kN), 0.8, 0.02);  // z C, the clipped signal is negligible
}

}  // namespace
}  // namespace fedfleet::client
