#include "engine/update_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "engine/server_optimizer.h"

namespace fedfleet::engine {
namespace {

TEST(FedNovaNormaliser, PlainSgdIsTheStepCount) {
  EXPECT_EQ(fedNovaNormaliser(5, 0.0), 5.0);
  EXPECT_EQ(fedNovaNormaliser(1, 0.0), 1.0);
  EXPECT_EQ(fedNovaNormaliser(0, 0.0), 0.0);
}

TEST(FedNovaNormaliser, MomentumByHand) {
  // tau = 3, rho = 0.5: (3 - 0.5 (1 - 0.125) / 0.5) / 0.5 = (3 - 0.875) / 0.5 = 4.25, the sum
  // of the geometric weights (1 - 0.5^j) / 0.5 = 1 + 1.5 + 1.75.
  EXPECT_DOUBLE_EQ(fedNovaNormaliser(3, 0.5), 4.25);
  EXPECT_DOUBLE_EQ(fedNovaNormaliser(2, 0.5), 2.5);  // 1 + 1.5
  // One step with momentum moves by one gradient, whatever rho.
  EXPECT_DOUBLE_EQ(fedNovaNormaliser(1, 0.9), 1.0);
  // tau = 2, rho = 0.9: 1 + (1 - 0.81) / 0.1 = 1 + 1.9
  EXPECT_NEAR(fedNovaNormaliser(2, 0.9), 2.9, 1e-12);
  EXPECT_EQ(fedNovaNormaliser(0, 0.9), 0.0);
}

TEST(FedNovaNormaliserDeathTest, MomentumOutOfRangeAborts) {
  EXPECT_DEATH(fedNovaNormaliser(3, 1.0), "momentum");
  EXPECT_DEATH(fedNovaNormaliser(3, -0.1), "momentum");
}

TEST(StalenessWeight, IsOneOverSqrtOfOnePlusS) {
  EXPECT_EQ(stalenessWeight(0), 1.0);
  EXPECT_EQ(stalenessWeight(3), 0.5);
  EXPECT_DOUBLE_EQ(stalenessWeight(8), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(stalenessWeight(99), 0.1);
}

TEST(ClipScale, ShrinksOnlyNormsAboveTheBound) {
  EXPECT_EQ(clipScale(2.0, 1.0), 0.5);
  EXPECT_EQ(clipScale(8.0, 2.0), 0.25);
  EXPECT_EQ(clipScale(0.5, 1.0), 1.0);
  EXPECT_EQ(clipScale(1.0, 1.0), 1.0);
  EXPECT_EQ(clipScale(0.0, 1.0), 1.0);
  EXPECT_EQ(clipScale(5.0, 0.0), 1.0);   // no clipping
  EXPECT_EQ(clipScale(5.0, -1.0), 1.0);  // no clipping
  EXPECT_EQ(clipScale(std::numeric_limits<double>::infinity(), 1.0), 0.0);
  EXPECT_EQ(clipScale(std::numeric_limits<double>::quiet_NaN(), 1.0), 0.0);
}

TEST(L2Norm, ByHand) {
  const std::vector<float> a = {3.0f, -4.0f};
  EXPECT_EQ(l2Norm(a.data(), a.size()), 5.0);
  const std::vector<float> b = {1.0f, 2.0f, -2.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 4.0f};
  EXPECT_EQ(l2Norm(b.data(), b.size()), 5.0);  // 1 + 4 + 4 + 16 = 25 over interleaved sums
  EXPECT_EQ(l2Norm(nullptr, 0), 0.0);
  const std::vector<float> c = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_TRUE(std::isnan(l2Norm(c.data(), c.size())));
  // The squares of the chunks add up to the square of the whole.
  const double left = l2Norm(b.data(), 3), right = l2Norm(b.data() + 3, 7);
  EXPECT_EQ(left * left + right * right, 25.0);
}

struct Update {
  double n;
  uint64_t tau;
  std::vector<double> delta;
};

// The FedNova pseudo-gradient as the coordinator streams it: fold each update with
// foldWeight, record it with add, scale the sum by finalScale.
std::vector<double> fedNovaStreamed(const std::vector<Update>& updates, double rho) {
  FedNovaAccumulator acc;
  std::vector<double> sum(updates[0].delta.size(), 0.0);
  for (const Update& u : updates) {
    const double a = fedNovaNormaliser(u.tau, rho);
    const double w = acc.foldWeight(u.n, a);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += w * u.delta[i];
    acc.add(u.n, a);
  }
  for (double& s : sum) s *= acc.finalScale();
  return sum;
}

TEST(FedNova, EqualStepCountsGiveFedAvg) {
  const std::vector<Update> updates = {
      {10, 5, {1.0, -2.0, 0.5, 3.0}},
      {20, 5, {0.0, 4.0, -1.5, 2.0}},
      {30, 5, {-3.0, 1.0, 2.5, -1.0}},
  };
  for (double rho : {0.0, 0.5, 0.9}) {
    SCOPED_TRACE(rho);
    const std::vector<double> nova = fedNovaStreamed(updates, rho);
    // FedAvg: sum n_k D_k / 60, by hand.
    const std::vector<double> avg = {(10 - 90) / 60.0, (-20 + 80 + 30) / 60.0, (5 - 30 + 75) / 60.0,
                                     (30 + 40 - 30) / 60.0};
    for (size_t i = 0; i < avg.size(); ++i) EXPECT_NEAR(nova[i], avg[i], 1e-12) << i;
  }
}

TEST(FedNova, FullUpdateOnThreeVectorByHand) {
  // n = (1, 3), tau = (1, 3), plain SGD: a = (1, 3), p = (0.25, 0.75),
  // d = (D1, D2 / 3) = ([1, 2, 3], [1, 0, -2]), sum p d = [1, 0.5, -0.75],
  // tau_eff = 0.25 + 2.25 = 2.5, G = [2.5, 1.25, -1.875] (FedAvg would be [2.5, 0.5, -3.75]).
  const std::vector<Update> updates = {{1, 1, {1, 2, 3}}, {3, 3, {3, 0, -6}}};
  std::vector<double> g = fedNovaStreamed(updates, 0.0);
  EXPECT_DOUBLE_EQ(g[0], 2.5);
  EXPECT_DOUBLE_EQ(g[1], 1.25);
  EXPECT_DOUBLE_EQ(g[2], -1.875);

  // With client momentum 0.5: a = (1, 4.25), tau_eff = 0.25 + 0.75 * 4.25 = 3.4375,
  // sum p d = [0.25 + 0.75 * 3 / 4.25, 0.5, 0.75 - 0.75 * 6 / 4.25]
  //         = [0.779411764..., 0.5, -0.308823529...].
  g = fedNovaStreamed(updates, 0.5);
  EXPECT_NEAR(g[0], 2.6792279411764706, 1e-12);
  EXPECT_NEAR(g[1], 1.71875, 1e-12);
  EXPECT_NEAR(g[2], -1.0615808823529411, 1e-12);

  // Applied by the server optimiser with eta_g = 1 from x = [1, 1, 1].
  auto opt = ServerOptimizer::create(ServerOptimizerOptions{});
  ASSERT_TRUE(opt.isOk());
  std::vector<float> x = {1, 1, 1};
  const std::vector<float> gf = {static_cast<float>(g[0]), static_cast<float>(g[1]),
                                 static_cast<float>(g[2])};
  (*opt)->apply(x.data(), gf.data(), 3);
  EXPECT_FLOAT_EQ(x[0], 3.6792279f);
  EXPECT_FLOAT_EQ(x[1], 2.71875f);
  EXPECT_FLOAT_EQ(x[2], -0.0615808823f);
}

TEST(FedNova, AccumulatorTotals) {
  FedNovaAccumulator acc;
  EXPECT_EQ(acc.finalScale(), 0.0);
  EXPECT_EQ(acc.effectiveSteps(), 0.0);
  EXPECT_EQ(acc.foldWeight(6, 4), 1.5);
  acc.add(6, 4);
  acc.add(2, 8);
  EXPECT_EQ(acc.count(), 2u);
  EXPECT_EQ(acc.totalWeight(), 8.0);
  EXPECT_EQ(acc.effectiveSteps(), 5.0);  // (24 + 16) / 8
  EXPECT_EQ(acc.finalScale(), 0.625);    // 5 / 8
  acc.clear();
  EXPECT_EQ(acc.count(), 0u);
  EXPECT_EQ(acc.finalScale(), 0.0);
}

TEST(FedNovaDeathTest, AnUpdateWithoutStepsAborts) {
  FedNovaAccumulator acc;
  EXPECT_DEATH(acc.foldWeight(10, 0), "normaliser");
  EXPECT_DEATH(acc.add(10, 0), "normaliser");
}

TEST(LowerMedian, IsTheLowerMiddleValue) {
  EXPECT_EQ(lowerMedian({}), 0);
  EXPECT_EQ(lowerMedian({7}), 7);
  // Of two, the smaller: one honest and one hostile update give the honest one.
  EXPECT_EQ(lowerMedian({1e20, 2}), 2);
  EXPECT_EQ(lowerMedian({3, 1, 2}), 2);
  EXPECT_EQ(lowerMedian({4, 1, 3, 2}), 2);
}

TEST(PlannedSteps, MaxStepsOrEpochsTimesBatches) {
  EXPECT_EQ(plannedSteps(2, 0, 32, 100), 8u);  // 2 x ceil(100 / 32)
  EXPECT_EQ(plannedSteps(1, 0, 10, 100), 10u);
  EXPECT_EQ(plannedSteps(3, 5, 32, 100), 5u);  // max_steps wins
  EXPECT_EQ(plannedSteps(1, 0, 0, 4), 4u);     // batch 0 counts as 1
  EXPECT_EQ(plannedSteps(1, 0, 32, 0), 0u);
}

}  // namespace
}  // namespace fedfleet::engine
