#include "common/model/data_files.h"

#include "common/model/tensor_data.h"

namespace fedfleet::model {

Result<data::FileSource> fileSourceOf(const config::Config& config) {
  if (!config.readsDataFiles()) {
    return invalidArgument("data.format = \"" + config.dataFormat() +
                           "\" is not read from the user's files");
  }
  const auto& dc = config.data;
  data::FileSource source;
  FEDFLEET_ASSIGN_OR_RETURN(source.format, data::parseDataFormat(config.dataFormat()));
  source.path = dc.path;
  source.labels_path = dc.labels_path;
  source.test_path = dc.test_path;
  source.test_labels_path = dc.test_labels_path;
  source.csv.label = dc.label_column;
  source.csv.features = dc.feature_columns;
  source.read_tensors = [](const std::string& path, size_t limit) {
    return loadTensorFile(path, limit);
  };
  source.image_folder.channels = dc.image_channels;
  if (!dc.image_size.empty()) {
    source.image_folder.rows = dc.image_size[0];
    source.image_folder.cols = dc.image_size[1];
  }
  source.holdout_fraction = dc.holdout_fraction;
  source.seed = config.run.seed;
  source.train_limit = dc.train_subset;
  source.test_limit = dc.test_subset;
  return source;
}

namespace {

// The source's training file alone, with data.num_classes applied.
Result<data::Dataset> loadAlone(data::FileSource source, const config::Config& config,
                                const std::string& file) {
  source.test_path.clear();
  source.test_labels_path.clear();
  source.holdout_fraction = 0;
  FEDFLEET_ASSIGN_OR_RETURN(data::TrainTest both, data::loadTrainTest(source));
  data::Dataset ds = std::move(both.train);
  if (const uint32_t classes = config.data.num_classes; classes > 0) {
    for (uint8_t label : ds.labels) {
      if (label >= classes) {
        return invalidArgument(file + " has label " + std::to_string(label) +
                               ", beyond data.num_classes = " + std::to_string(classes));
      }
    }
    ds.num_classes = classes;
  }
  return ds;
}

}  // namespace

Result<data::Dataset> loadOwnTrainingData(const config::Config& config) {
  FEDFLEET_ASSIGN_OR_RETURN(data::FileSource source, fileSourceOf(config));
  if (source.path.empty()) {
    return invalidArgument("data.path: a client that trains its own data (data.format = \"" +
                           config.dataFormat() + "\") needs its file");
  }
  const std::string file = source.path;
  return loadAlone(std::move(source), config, file);
}

Result<data::Dataset> loadTestFile(const config::Config& config) {
  FEDFLEET_ASSIGN_OR_RETURN(data::FileSource source, fileSourceOf(config));
  if (source.test_path.empty()) {
    return invalidArgument(
        "data.test_path: the coordinator evaluates the global model on a test "
        "file of its own; give one (data.format = \"" +
        config.dataFormat() + "\")");
  }
  // The test file read as the training file of a source with no test part.
  const std::string file = source.test_path;
  source.path = source.test_path;
  source.labels_path = source.test_labels_path;
  source.train_limit = source.test_limit;
  return loadAlone(std::move(source), config, file);
}

}  // namespace fedfleet::model
