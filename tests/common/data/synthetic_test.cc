#include "common/data/synthetic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace fedfleet::data {
namespace {

SyntheticFederation mustCreate(const SyntheticSpec& spec) {
  auto fed = SyntheticFederation::create(spec);
  EXPECT_TRUE(fed.isOk()) << fed.status().toString();
  return std::move(fed).value();
}

Dataset mustGenerate(const SyntheticFederation& fed, uint64_t k, bool train) {
  auto ds = fed.generate(k, train);
  EXPECT_TRUE(ds.isOk()) << ds.status().toString();
  return std::move(ds).value();
}

bool sameBytes(const Dataset& a, const Dataset& b) {
  return a.feature_dim == b.feature_dim && a.num_classes == b.num_classes && a.labels == b.labels &&
         a.features.size() == b.features.size() &&
         std::memcmp(a.features.data(), b.features.data(), a.features.size() * sizeof(float)) == 0;
}

std::vector<double> labelShares(const Dataset& ds) {
  std::vector<double> shares(ds.num_classes, 0);
  for (uint8_t l : ds.labels) shares[l] += 1.0 / static_cast<double>(ds.size());
  return shares;
}

double totalVariation(const std::vector<double>& p, const std::vector<double>& q) {
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += std::abs(p[i] - q[i]);
  return sum / 2;
}

TEST(SyntheticTest, SplitsHaveTheAdvertisedShape) {
  SyntheticSpec spec;
  spec.max_samples = 2000;
  const auto fed = mustCreate(spec);
  EXPECT_EQ(fed.devices(), 30u);
  for (uint64_t k = 0; k < fed.devices(); ++k) {
    const uint64_t total = fed.totalSamples(k), train = fed.trainSamples(k);
    ASSERT_GE(total, 50u);
    ASSERT_LE(total, 2000u);
    EXPECT_EQ(train, static_cast<uint64_t>(std::llround(0.9 * static_cast<double>(total))));
    const Dataset tr = mustGenerate(fed, k, true), te = mustGenerate(fed, k, false);
    for (const Dataset* ds : {&tr, &te}) {
      EXPECT_TRUE(ds->hasFeatures());
      EXPECT_EQ(ds->feature_dim, 60u);
      EXPECT_EQ(ds->num_classes, 10u);
      EXPECT_EQ(ds->rows, 0u);
      EXPECT_EQ(ds->cols, 0u);
      EXPECT_TRUE(ds->images.empty());
      EXPECT_EQ(ds->features.size(), ds->size() * 60);
      EXPECT_TRUE(checkSampleStorage(*ds).isOk());
      for (float v : ds->features) ASSERT_TRUE(std::isfinite(v));
    }
    EXPECT_EQ(tr.size(), train);
    EXPECT_EQ(te.size(), total - train);
  }
}

TEST(SyntheticTest, TinyCapStillGivesBothSplitsASample) {
  SyntheticSpec spec;
  spec.max_samples = 2;
  spec.train_fraction = 0.99;
  const auto fed = mustCreate(spec);
  EXPECT_EQ(fed.totalSamples(0), 2u);
  EXPECT_EQ(fed.trainSamples(0), 1u);
  EXPECT_EQ(mustGenerate(fed, 0, false).size(), 1u);
  spec.train_fraction = 0.01;
  EXPECT_EQ(mustCreate(spec).trainSamples(0), 1u);
}

TEST(SyntheticTest, SameDeviceGivesTheSameBytesWhateverCameBefore) {
  SyntheticSpec spec;
  spec.devices = 50;
  spec.seed = 11;
  spec.max_samples = 1500;
  const uint64_t k = 17;
  const auto first = mustCreate(spec);
  const Dataset alone = mustGenerate(first, k, true);
  EXPECT_TRUE(sameBytes(alone, mustGenerate(first, k, true)));

  // A fresh federation that generated other devices (and the other split) first, in reverse.
  const auto second = mustCreate(spec);
  for (uint64_t j = spec.devices; j-- > 0;) {
    if (j != k) (void)mustGenerate(second, j, j % 2 == 0);
  }
  (void)mustGenerate(second, k, false);
  EXPECT_TRUE(sameBytes(alone, mustGenerate(second, k, true)));

  // Another thread, while this one generates another device.
  Dataset from_thread;
  std::thread t([&] { from_thread = mustGenerate(second, k, true); });
  (void)mustGenerate(second, k + 1, true);
  t.join();
  EXPECT_TRUE(sameBytes(alone, from_thread));

  // The device count does not change a device's data either.
  spec.devices = 1000000;
  EXPECT_TRUE(sameBytes(alone, mustGenerate(mustCreate(spec), k, true)));
}

TEST(SyntheticTest, DevicesSeedsAndSplitsDiffer) {
  SyntheticSpec spec;
  spec.max_samples = 500;
  const auto fed = mustCreate(spec);
  const Dataset a = mustGenerate(fed, 3, true);
  EXPECT_FALSE(sameBytes(a, mustGenerate(fed, 4, true)));
  EXPECT_FALSE(sameBytes(a, mustGenerate(fed, 3, false)));
  spec.seed = 1;
  EXPECT_FALSE(sameBytes(a, mustGenerate(mustCreate(spec), 3, true)));
  // Sample counts differ across devices too (a lognormal draw each).
  std::set<uint64_t> totals;
  for (uint64_t k = 0; k < 30; ++k) totals.insert(fed.totalSamples(k));
  EXPECT_GT(totals.size(), 20u);
}

// P(Z < z) for Z ~ N(4, 2).
double normalCdf42(double z) { return 0.5 * std::erfc(-(z - 4) / (2 * std::sqrt(2.0))); }

// floor(lognormal(4, 2)) + 50 is 50 + floor(e^Z) with Z ~ N(4, 2). The sample median of Z over
// N devices has standard deviation ~ 1.2533 * 2 / sqrt(N) = 0.0177 at N = 20000, so at 4 standard
// deviations the median total lies in 50 + floor(e^(4 +- 0.071)) = [100, 108]; we allow
// 50 + e^4 +- 5. A tail share p (total <= 57, i.e. Z < ln 8; total >= 454, i.e. Z >= ln 404)
// has standard deviation sqrt(p (1 - p) / N) ~ 0.0026; we allow +- 0.012 (4.6 sigma).
TEST(SyntheticTest, SampleCountsFollowTheLognormal) {
  SyntheticSpec spec;
  spec.devices = 20000;
  spec.seed = 5;
  const auto fed = mustCreate(spec);
  std::vector<uint64_t> totals(spec.devices);
  size_t low = 0, high = 0;
  for (uint64_t k = 0; k < spec.devices; ++k) {
    totals[k] = fed.totalSamples(k);
    ASSERT_GE(totals[k], 50u);
    low += totals[k] <= 57;
    high += totals[k] >= 454;
  }
  std::nth_element(totals.begin(), totals.begin() + totals.size() / 2, totals.end());
  const double median = static_cast<double>(totals[totals.size() / 2]);
  EXPECT_NEAR(median, 50 + std::exp(4.0), 5.0);
  EXPECT_NEAR(static_cast<double>(low) / spec.devices, normalCdf42(std::log(8.0)), 0.012);
  EXPECT_NEAR(static_cast<double>(high) / spec.devices, 1 - normalCdf42(std::log(404.0)), 0.012);

  // The cap bounds the tail and leaves the rest alone.
  spec.max_samples = 200;
  const auto capped = mustCreate(spec);
  bool some_capped = false;
  for (uint64_t k = 0; k < 2000; ++k) {
    const uint64_t t = fed.totalSamples(k);
    EXPECT_EQ(capped.totalSamples(k), std::min<uint64_t>(t, 200));
    some_capped = some_capped || t > 200;
  }
  EXPECT_TRUE(some_capped);
}

TEST(SyntheticTest, LabelsInRangeAndEveryClassAppears) {
  for (uint32_t classes : {10u, 3u}) {
    SyntheticSpec spec;
    spec.num_classes = classes;
    spec.max_samples = 1000;
    const auto fed = mustCreate(spec);
    std::vector<size_t> counts(classes, 0);
    for (uint64_t k = 0; k < fed.devices(); ++k) {
      for (bool train : {true, false}) {
        for (uint8_t l : mustGenerate(fed, k, train).labels) {
          ASSERT_LT(l, classes);
          ++counts[l];
        }
      }
    }
    for (uint32_t c = 0; c < classes; ++c) EXPECT_GT(counts[c], 0u) << "class " << c;
  }
}

TEST(SyntheticTest, FeaturesFollowTheDeviceDistribution) {
  // Dimension j has standard deviation (j + 1)^-0.6 around v_k: 1 for j = 0, 60^-0.6 = 0.086 for
  // j = 59. Over 3000 samples the sample standard deviation's relative error has standard
  // deviation 1 / sqrt(2 * 2999) = 0.013; we allow 0.06 (4.6 sigma).
  SyntheticSpec spec;
  spec.devices = 300;
  spec.max_samples = 3333;  // round(0.9 * 3333) = 3000 train samples
  spec.seed = 2;
  const auto fed = mustCreate(spec);
  uint64_t k = 0;
  while (k < spec.devices && fed.totalSamples(k) < spec.max_samples) ++k;
  ASSERT_LT(k, spec.devices) << "P(3333+ samples) = P(Z > 2.05) = 0.02: ~6 in 300 expected";
  const Dataset ds = mustGenerate(fed, k, true);
  ASSERT_EQ(ds.size(), 3000u);
  for (size_t j : {size_t{0}, size_t{9}, size_t{59}}) {
    double sum = 0, sq = 0;
    for (size_t i = 0; i < ds.size(); ++i) sum += ds.feature(i)[j];
    const double mean = sum / ds.size();
    for (size_t i = 0; i < ds.size(); ++i) sq += std::pow(ds.feature(i)[j] - mean, 2);
    const double sd = std::sqrt(sq / (ds.size() - 1));
    EXPECT_NEAR(sd / std::pow(j + 1.0, -0.6), 1.0, 0.06) << "dimension " << j;
  }
}

// Standardised residuals (x_ij - v_j) / (j + 1)^-0.6 of a device's samples: N(0, 1) each.
std::vector<double> residuals(const Dataset& ds, const SyntheticFederation::DeviceParameters& p) {
  std::vector<double> z(ds.features.size());
  for (size_t i = 0; i < ds.size(); ++i) {
    for (size_t j = 0; j < ds.feature_dim; ++j) {
      z[i * ds.feature_dim + j] = (ds.feature(i)[j] - p.v[j]) / std::pow(j + 1.0, -0.6);
    }
  }
  return z;
}

// The stated distribution, dimension by dimension, on one device of n = 20000 samples, against
// the device's own v_k. The sample mean of dimension j has standard error sd_j / sqrt(n) =
// 0.0071 sd_j; the mean square deviation from v_j (n degrees of freedom) over sd_j^2 has
// standard deviation sqrt(2 / n) = 0.010. We allow 5 standard errors each: 120 checks then fail
// by chance with probability ~120 * 5.7e-7 < 1e-4.
TEST(SyntheticTest, FeaturesHaveTheStatedMeanAndVariance) {
  SyntheticSpec spec;
  spec.devices = 5000;
  spec.max_samples = 22222;  // round(0.9 * 22222) = 20000 train samples
  spec.seed = 4;
  const auto fed = mustCreate(spec);
  uint64_t k = 0;
  while (k < spec.devices && fed.totalSamples(k) < spec.max_samples) ++k;
  ASSERT_LT(k + 1, spec.devices) << "P(22222+ samples) = P(Z > 3.0) = 0.0013: ~7 in 5000 expected";
  const Dataset ds = mustGenerate(fed, k, true);
  const auto p = fed.deviceParameters(k);
  ASSERT_EQ(ds.size(), 20000u);
  ASSERT_EQ(p.v.size(), 60u);
  const double n = static_cast<double>(ds.size());
  for (size_t j = 0; j < 60; ++j) {
    const double sd = std::pow(j + 1.0, -0.6);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < ds.size(); ++i) {
      sum += ds.feature(i)[j];
      sq += std::pow(ds.feature(i)[j] - p.v[j], 2);
    }
    EXPECT_NEAR(sum / n, p.v[j], 5 * sd / std::sqrt(n)) << "dimension " << j;
    EXPECT_NEAR(sq / n / (sd * sd), 1.0, 5 * std::sqrt(2 / n)) << "dimension " << j;
  }

  // The labels are argmax(x W + b) of the stored x with these parameters. generate() sums in
  // fp32, this in fp64: they may disagree only where two logits tie to within rounding (~1e-6),
  // which a handful of 20000 samples at most could do.
  size_t disagree = 0;
  for (size_t i = 0; i < ds.size(); ++i) {
    std::vector<double> logits(p.b.begin(), p.b.end());
    for (size_t j = 0; j < 60; ++j) {
      for (size_t c = 0; c < 10; ++c) logits[c] += double(ds.feature(i)[j]) * p.w[j * 10 + c];
    }
    disagree += std::max_element(logits.begin(), logits.end()) - logits.begin() != ds.labels[i];
  }
  EXPECT_LE(disagree, 5u);

  // Independent streams: the residuals of another device, and of this device's test split,
  // are uncorrelated with these (a correlation over m pairs has standard deviation 1/sqrt(m)).
  const auto z = residuals(ds, p);
  for (const auto& [other, params] :
       {std::pair{mustGenerate(fed, k + 1, true), fed.deviceParameters(k + 1)},
        std::pair{mustGenerate(fed, k, false), p}}) {
    const auto w = residuals(other, params);
    const size_t m = std::min(z.size(), w.size());
    ASSERT_GE(m, 50u * 60u);
    double dot = 0, zz = 0, ww = 0;
    for (size_t i = 0; i < m; ++i) {
      dot += z[i] * w[i];
      zz += z[i] * z[i];
      ww += w[i] * w[i];
    }
    EXPECT_LT(std::abs(dot / std::sqrt(zz * ww)), 5 / std::sqrt(static_cast<double>(m)));
  }
}

TEST(SyntheticTest, IidVariantSharesTheDistribution) {
  // Two large devices: under the IID variant their label distributions agree up to sampling
  // noise (total variation ~ sqrt(classes / n) ~ 0.07 at n ~ 1000, usually far less); under the
  // non-IID one each device has its own W, b and v, and they differ far more.
  SyntheticSpec spec;
  spec.devices = 300;
  spec.max_samples = 3000;
  spec.seed = 3;
  std::vector<uint64_t> big;
  const auto probe = mustCreate(spec);
  for (uint64_t k = 0; k < probe.devices() && big.size() < 2; ++k) {
    if (probe.totalSamples(k) >= 1200) big.push_back(k);
  }
  // P(1200+ samples) = P(Z > 3.55) = 0.04: ~12 expected in 300.
  ASSERT_EQ(big.size(), 2u);
  spec.iid = true;
  const auto iid = mustCreate(spec);
  const double tv_iid = totalVariation(labelShares(mustGenerate(iid, big[0], true)),
                                       labelShares(mustGenerate(iid, big[1], true)));
  EXPECT_LT(tv_iid, 0.08);
  const double tv_niid = totalVariation(labelShares(mustGenerate(probe, big[0], true)),
                                        labelShares(mustGenerate(probe, big[1], true)));
  EXPECT_GT(tv_niid, 0.3);
  // The shared parameters make even the features' means agree (v = B * 1 for every device).
  const auto pa = iid.deviceParameters(big[0]), pb = iid.deviceParameters(big[1]);
  EXPECT_EQ(pa.w, pb.w);
  EXPECT_EQ(pa.b, pb.b);
  EXPECT_EQ(pa.v, std::vector<float>(spec.dim, pa.v[0]));
  EXPECT_NE(probe.deviceParameters(big[0]).w, probe.deviceParameters(big[1]).w);
  const Dataset a = mustGenerate(iid, big[0], true), b = mustGenerate(iid, big[1], true);
  double mean_a = 0, mean_b = 0;
  for (size_t i = 0; i < a.size(); ++i) mean_a += a.feature(i)[0] / a.size();
  for (size_t i = 0; i < b.size(); ++i) mean_b += b.feature(i)[0] / b.size();
  // Both estimate v_0 from 1080+ samples of standard deviation 1: the difference has standard
  // deviation <= sqrt(2 / 1080) = 0.043; 0.2 is 4.6 sigma.
  EXPECT_NEAR(mean_a, mean_b, 0.2);
}

TEST(SyntheticTest, AMillionDevicesCostNothingUpFront) {
  SyntheticSpec spec;
  spec.devices = 1000000;
  spec.max_samples = 100;
  const auto fed = mustCreate(spec);
  EXPECT_LE(sizeof(fed), 256u);  // no per-device state inside the object either
  const uint64_t last = spec.devices - 1;
  EXPECT_GE(fed.totalSamples(last), 50u);
  EXPECT_EQ(mustGenerate(fed, last, true).size(), fed.trainSamples(last));
  auto out = fed.generate(spec.devices, true);
  ASSERT_FALSE(out.isOk());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
}

TEST(SyntheticTest, BadSpecsAreInvalidArgument) {
  auto expectInvalid = [](SyntheticSpec s, const std::string& needle) {
    auto r = SyntheticFederation::create(s);
    ASSERT_FALSE(r.isOk()) << needle;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  SyntheticSpec s;
  s.devices = 0;
  expectInvalid(s, "devices");
  s = {};
  s.dim = 0;
  expectInvalid(s, "dim");
  for (uint32_t c : {0u, 1u, 257u}) {
    s = {};
    s.num_classes = c;
    expectInvalid(s, "num_classes");
  }
  for (double bad : {-0.1, nan, inf}) {
    s = {};
    s.alpha = bad;
    expectInvalid(s, "alpha");
    s = {};
    s.beta = bad;
    expectInvalid(s, "beta");
  }
  for (double bad : {0.0, 1.0, -0.5, 1.5, nan}) {
    s = {};
    s.train_fraction = bad;
    expectInvalid(s, "train_fraction");
  }
  s = {};
  s.max_samples = 1;
  expectInvalid(s, "max_samples");
  // The edges that are fine.
  s = {};
  s.alpha = s.beta = 0;
  s.num_classes = 256;
  s.dim = 1;
  EXPECT_TRUE(SyntheticFederation::create(s).isOk());
}

// Block-cyclic variant: device k of block m = k mod 2 has the plain device's parameters with
// v shifted by m x shift and b raised by shift on block m's classes (10 classes in 2 groups:
// 0-4 and 5-9); W is unchanged.
TEST(SyntheticTest, BlockVariantShiftsInputsAndFavoursTheBlockClasses) {
  SyntheticSpec plain;
  plain.devices = 4;
  plain.seed = 5;
  SyntheticSpec blocks = plain;
  blocks.blocks = 2;
  blocks.block_shift = 3;
  auto a = SyntheticFederation::create(plain);
  auto b = SyntheticFederation::create(blocks);
  ASSERT_TRUE(a.isOk() && b.isOk());
  for (uint64_t k = 0; k < 4; ++k) {
    const auto pa = a->deviceParameters(k);
    const auto pb = b->deviceParameters(k);
    const float m = static_cast<float>(k % 2);
    for (size_t j = 0; j < pa.v.size(); ++j) EXPECT_FLOAT_EQ(pb.v[j], pa.v[j] + 3 * m);
    EXPECT_EQ(pb.w, pa.w);
    for (uint32_t c = 0; c < 10; ++c) {
      const bool own = (c / 5) == k % 2;
      EXPECT_FLOAT_EQ(pb.b[c], pa.b[c] + (own ? 3.0f : 0.0f)) << "device " << k << " class " << c;
    }
  }
  blocks.blocks = 11;  // more blocks than classes
  EXPECT_FALSE(SyntheticFederation::create(blocks).isOk());
}

}  // namespace
}  // namespace fedfleet::data
