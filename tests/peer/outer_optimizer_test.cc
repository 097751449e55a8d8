#include "peer/outer_optimizer.h"

#include <gtest/gtest.h>

namespace fedfleet::peer {
namespace {

TEST(NesterovOuterTest, DiLoCoStepByHand) {
  NesterovOuter outer(2, 0.7, 0.9);
  std::vector<float> x = {1.0f, -2.0f};
  // v = 0.5; x = 1 - 0.7 (0.5 + 0.9 * 0.5) = 0.335. Second element: d = -1, v = -1,
  // x = -2 - 0.7 (-1 - 0.9) = -0.67.
  outer.step(x, {0.5f, -1.0f});
  EXPECT_NEAR(x[0], 0.335f, 1e-6);
  EXPECT_NEAR(x[1], -0.67f, 1e-6);
  // v = 0.9 * 0.5 + 0.5 = 0.95; x = 0.335 - 0.7 (0.5 + 0.855) = -0.6135.
  outer.step(x, {0.5f, 0.0f});
  EXPECT_NEAR(x[0], -0.6135f, 1e-6);
  EXPECT_NEAR(outer.velocity()[0], 0.95f, 1e-6);
  // d = 0: v = -0.9; x = -0.67 - 0.7 (0 + 0.9 * -0.9) = -0.103.
  EXPECT_NEAR(x[1], -0.103f, 1e-6);
}

TEST(NesterovOuterTest, LearningRateOneNoMomentumIsPlainAveraging) {
  NesterovOuter outer(1, 1.0, 0.0);
  std::vector<float> x = {3.0f};
  outer.step(x, {1.25f});  // x_prev - mean(x_i) = 1.25: the average is 1.75
  EXPECT_FLOAT_EQ(x[0], 1.75f);
}

}  // namespace
}  // namespace fedfleet::peer
