// Inputs several client tests share: a small synthetic feature-vector data set and seeded
// uniform vectors.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "common/data/dataset.h"
#include "common/data/synthetic.h"

namespace fedfleet::client {

// The train split of one Synthetic(1, 1) device with 400 samples: 60 features, 10 classes.
inline const data::Dataset* syntheticFeatures() {
  static const std::unique_ptr<data::Dataset> ds = [] {
    data::SyntheticSpec spec;
    spec.devices = 1000;
    spec.max_samples = 445;  // round(0.9 * 445) = 400
    auto fed = data::SyntheticFederation::create(spec);
    EXPECT_TRUE(fed.isOk());
    uint64_t k = 0;
    while (fed->totalSamples(k) < spec.max_samples) ++k;  // P(445+) = P(Z > 0.99) = 0.16
    return std::make_unique<data::Dataset>(fed->generate(k, true).value());
  }();
  return ds.get();
}

// n values uniform in [-scale, scale), from std::mt19937_64(seed).
inline std::vector<float> uniformFloats(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace fedfleet::client
