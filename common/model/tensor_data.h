// The `tensors` data format: a file written in Python with
//
//   torch.save({"x": X, "y": Y}, path)
//
// where X holds one sample per row of its first dimension, of any shape and of any real or
// integer dtype (read as float32, as they are: no normalisation), and Y holds one integer class
// id per sample (int64 or any integer dtype, 0 to data::kMaxClasses - 1) or, for regression, float
// targets ([samples] or [samples, outputs], any floating dtype, read as float32). LibTorch's
// unpickler reads the file, which is why this reader lives with the model library and not in
// common/data (which links no LibTorch); common/data/source.h takes it as FileSource::read_tensors.
#pragma once

#include <cstddef>
#include <string>

#include "common/data/dataset.h"
#include "common/status.h"

namespace fedfleet::model {

// Reads `path` into a feature-vector data set whose sample_shape is X's shape without its first
// dimension. `limit` > 0 keeps the first `limit` samples. num_classes is the largest label + 1
// (at least 2); a float Y gives a regression set (target_dim outputs, num_classes 0).
// Failures, each naming the file: kNotFound (no file); kCorrupt for a file that is not a
// torch.save file (truncated or damaged), a value that is not a dictionary with tensors "x" and
// "y", X with fewer than 2 dimensions or no samples, Y not [samples] (or [samples, outputs] when
// float) or of another length than X, Y complex or boolean, a label below 0 or at or above
// kMaxClasses, a non-finite value in X or in float targets (naming the sample); kIoError when the
// file cannot be read.
Result<data::Dataset> loadTensorFile(const std::string& path, size_t limit = 0);

}  // namespace fedfleet::model
