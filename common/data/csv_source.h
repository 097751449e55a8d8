// The CSV data source: numeric feature columns and an integer class label column (or, for
// regression, a numeric target column), named in the config, under a header row. Each row is one
// sample; the features become a feature-vector Dataset (common/data/dataset.h) batched as they are
// stored.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/data/dataset.h"
#include "common/status.h"

namespace fedfleet::data {

struct CsvColumns {
  std::string label = "label";        // the column of class ids 0, 1, ... (or of targets)
  std::vector<std::string> features;  // in this order; empty: every other column, in file order
  bool regression = false;            // the label column holds float targets (target_dim 1)
};

// Reads the CSV data file at `path` (header row, then one sample per row). Every row must have
// as many fields as the header; feature fields must be finite numbers (an empty field is a
// missing value, refused); labels integers in [0, kMaxClasses), or with `regression` finite
// numbers stored as targets (target_dim 1, no labels). Columns not named are ignored.
// `limit` > 0 keeps only the first `limit` samples (the whole file is still read and
// checked). num_classes is the largest label + 1 (at least 2; regression: 0).
// Errors, each naming the file (and the row and column where there is one): kNotFound,
// kIoError, kInvalidArgument for text that is not CSV, an empty or duplicated header name, a
// named column the header lacks, a label column among the features, no feature columns, a
// row of another length, a field that is not a number, a label that is not an integer in
// range, or a file with no samples.
Result<Dataset> loadCsv(const std::string& path, const CsvColumns& columns, size_t limit = 0);

}  // namespace fedfleet::data
