// The user's data files a config names (data.format idx, csv, tensors or image-folder, with
// data.path and data.test_path), as one FileSource: what the simulator splits over its virtual
// clients, what a client process trains on with data.partition = "none", and what a coordinator
// evaluates on. It lives beside the model because the tensors format is read by LibTorch.
#pragma once

#include "common/config/config.h"
#include "common/data/source.h"
#include "common/status.h"

namespace fedfleet::model {

// The FileSource of config.data (readsDataFiles() must hold; kInvalidArgument otherwise).
Result<data::FileSource> fileSourceOf(const config::Config& config);

// A client's own training data (data.partition = "none": it trains everything it holds):
// data.path (with data.labels_path for idx), data.train_subset applied, and data.num_classes
// when set (a label at or above it is kInvalidArgument naming the file). The reader's errors.
Result<data::Dataset> loadOwnTrainingData(const config::Config& config);

// Only the test file of config.data (data.test_path, with data.test_labels_path for idx) as a
// data set of its own, data.num_classes applied as above. kInvalidArgument when there is no
// test file; the reader's errors.
Result<data::Dataset> loadTestFile(const config::Config& config);

}  // namespace fedfleet::model
