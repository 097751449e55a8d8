// A small regression data set the loss and trainer tests write by hand: feature vectors of two
// values, one float target each.
#pragma once

#include <array>
#include <vector>

#include "common/data/dataset.h"

namespace fedfleet::testing {

inline data::Dataset regressionSet(const std::vector<std::array<float, 2>>& x,
                                   const std::vector<float>& y) {
  data::Dataset ds;
  ds.feature_dim = 2;
  ds.num_classes = 0;
  ds.target_dim = 1;
  for (const auto& row : x) ds.features.insert(ds.features.end(), row.begin(), row.end());
  ds.targets = y;
  return ds;
}

}  // namespace fedfleet::testing
