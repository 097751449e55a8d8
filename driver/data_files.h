// The user's data files a config names (data.format idx, csv, tensors or image-folder, with
// data.path and data.test_path), as one FileSource: what the simulator splits over its virtual
// clients, what a client process trains on with data.partition = "none", and what a coordinator
// evaluates on. It is the driver layer's: it reads the config and builds data for models.
#pragma once

#include "common/config/config.h"
#include "common/data/source.h"
#include "common/model/model.h"
#include "common/status.h"

namespace fedfleet::driver {

// The FileSource of config.data (readsDataFiles() must hold; kInvalidArgument otherwise).
Result<data::FileSource> fileSourceOf(const config::Config& config);

// The config's word on a data set read from `file`: its kind of target must be data.task's
// (class labels for "classification", float targets for "regression"), and data.num_classes,
// when set, becomes its class count (a label at or above it is an error). kInvalidArgument
// naming the file and what to change otherwise.
Status applyClasses(data::Dataset& ds, const config::Config& config, const std::string& file);

// A client's own data (data.partition = "none": it trains everything it holds): data.path
// (with data.labels_path for idx), data.train_subset applied, less the data.holdout_fraction it
// holds out; and its held-out data for federated evaluation: data.test_path when given, else
// that held-out part (test empty: neither). data.num_classes applies to both when set (a label
// at or above it is kInvalidArgument naming the file). The reader's errors.
Result<data::TrainTest> loadOwnData(const config::Config& config);
// loadOwnData's training part alone.
Result<data::Dataset> loadOwnTrainingData(const config::Config& config);

// Only the test file of config.data (data.test_path, with data.test_labels_path for idx) as a
// data set of its own, data.num_classes applied as above. kInvalidArgument when there is no
// test file; the reader's errors.
Result<data::Dataset> loadTestFile(const config::Config& config);

// data.normalize on data read from the user's files: "fixed" normalises train and test with
// data.mean/data.std; "computed" with the training part's channel statistics, which it returns
// (to be recorded in the run's config); "none" leaves both. The normaliser's errors.
Result<data::ChannelStats> applyNormalization(const config::Config& config, data::TrainTest& both);

// The input shape of the samples config.data declares without reading a file, for a coordinator
// that holds no data (federated evaluation only): csv with data.feature_columns ({features}),
// image-folder with data.image_size ({channels, rows, cols}), and data.num_classes classes. A
// TorchScript model (model.path) needs none: what is declared is returned, the rest as not
// known (an empty sample shape, 0 classes). kInvalidArgument saying what to give otherwise.
Result<model::InputShape> declaredInputShape(const config::Config& config);

}  // namespace fedfleet::driver
