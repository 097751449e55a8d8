// The weights a client applies to its update under secure aggregation (client/masked_upload.h):
// n_k / weight_scale capped at 1; under FedNova also divided by a(tau_k, rho) (hand-computed
// values: a(4, 0) = 4, a(3, 0.5) = 3 - 0.5 (1 - 0.125) / 0.5 all over 0.5 = 4.25); under
// distributed DP the L2 clip at weight 1.
#include "client/masked_upload.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace fedfleet::client {
namespace {

wire::SecAggTask taskOf(double scale) {
  wire::SecAggTask t;
  t.clients = 2;
  t.weight_scale = scale;
  t.clip_range = 8;
  t.quant_range = 1u << 20;
  return t;
}

TEST(MaskedUpload, FedAvgWeightIsSamplesOverTheScaleAtMostOne) {
  const wire::SecAggTask t = taskOf(40);
  EXPECT_DOUBLE_EQ(secAggWeight(t, 10, 7), 0.25);
  EXPECT_DOUBLE_EQ(secAggWeight(t, 40, 1), 1.0);
  EXPECT_DOUBLE_EQ(secAggWeight(t, 400, 1), 1.0);  // a claim past the scale is capped
}

TEST(MaskedUpload, FedNovaDividesByTheNormaliserOfTheStepsTaken) {
  wire::SecAggTask t = taskOf(40);
  t.fednova = true;
  t.fednova_momentum = 0;
  EXPECT_DOUBLE_EQ(secAggWeight(t, 10, 4), 0.25 / 4);
  EXPECT_DOUBLE_EQ(secAggWeight(t, 20, 1), 0.5);
  t.fednova_momentum = 0.5;
  EXPECT_DOUBLE_EQ(secAggWeight(t, 20, 3), 0.5 / 4.25);
  EXPECT_DOUBLE_EQ(secAggWeight(t, 20, 2), 0.5 / 2.5);  // 1 + 1.5
  EXPECT_EQ(secAggWeight(t, 20, 0), 0.0);               // refused by the coordinator anyway
  // Off: the steps do not matter.
  t.fednova = false;
  EXPECT_DOUBLE_EQ(secAggWeight(t, 20, 3), 0.5);
}

TEST(MaskedUpload, DistributedDpClipsAtWeightOne) {
  wire::SecAggTask t = taskOf(1);
  const std::vector<float> delta = {3, 4};                             // norm 5
  EXPECT_DOUBLE_EQ(maskedUploadWeight(t, 0.3, delta.data(), 2), 0.3);  // no DP: as given
  t.dp_clip = 2;
  EXPECT_DOUBLE_EQ(maskedUploadWeight(t, 0.3, delta.data(), 2), 0.4);
  t.dp_clip = 10;
  EXPECT_DOUBLE_EQ(maskedUploadWeight(t, 0.3, delta.data(), 2), 1.0);
}

}  // namespace
}  // namespace fedfleet::client
