#include "driver/data_files.h"

#include "common/model/tensor_data.h"

namespace fedfleet::driver {

Result<data::FileSource> fileSourceOf(const config::Config& config) {
  if (!config.readsDataFiles()) {
    return invalidArgument("data.format = \"" + config.dataFormatName() +
                           "\" is not read from the user's files");
  }
  const auto& dc = config.data;
  data::FileSource source;
  source.format = config.dataFormat();
  source.path = dc.path;
  source.labels_path = dc.labels_path;
  source.test_path = dc.test_path;
  source.test_labels_path = dc.test_labels_path;
  source.csv.label = dc.label_column;
  source.csv.features = dc.feature_columns;
  source.csv.regression = dc.task == config::DataTask::kRegression;
  source.read_tensors = [](const std::string& path, size_t limit) {
    return model::loadTensorFile(path, limit);
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

Status applyClasses(data::Dataset& ds, const config::Config& config, const std::string& file) {
  const bool regression = config.data.task == config::DataTask::kRegression;
  if (ds.size() > 0 && ds.hasTargets() != regression) {
    return invalidArgument(
        file + (regression ? " holds class labels, but data.task = \"regression\" needs float "
                             "targets (a float \"y\" in a tensors file)"
                           : " holds float targets (a float \"y\"): set data.task = "
                             "\"regression\" with train.loss = \"mse\", or save class ids "
                             "(y.long() in Python)"));
  }
  if (const uint32_t classes = config.data.num_classes; classes > 0) {
    for (data::Label label : ds.labels) {
      if (label >= classes) {
        return invalidArgument(file + " has label " + std::to_string(label) +
                               ", beyond data.num_classes = " + std::to_string(classes));
      }
    }
    ds.num_classes = classes;
  }
  return Status::ok();
}

namespace {

// The source's training file alone, with data.num_classes applied.
Result<data::Dataset> loadAlone(data::FileSource source, const config::Config& config,
                                const std::string& file) {
  source.test_path.clear();
  source.test_labels_path.clear();
  source.holdout_fraction = 0;
  FEDFLEET_ASSIGN_OR_RETURN(data::TrainTest both, data::loadTrainTest(source));
  FEDFLEET_RETURN_IF_ERROR(applyClasses(both.train, config, file));
  return std::move(both.train);
}

}  // namespace

Result<data::ChannelStats> applyNormalization(const config::Config& config, data::TrainTest& both) {
  const auto& dc = config.data;
  data::ChannelStats stats;
  if (dc.normalize == config::Normalization::kNone) return stats;
  if (dc.normalize == config::Normalization::kFixed) {
    stats.mean = dc.mean;
    stats.stddev = dc.stddev;
  } else {
    FEDFLEET_ASSIGN_OR_RETURN(stats, data::channelStats(both.train));
  }
  FEDFLEET_RETURN_IF_ERROR(data::normalizeFeatures(both.train, stats, "'" + dc.path + "'"));
  FEDFLEET_RETURN_IF_ERROR(data::normalizeFeatures(
      both.test, stats, "'" + (dc.test_path.empty() ? dc.path : dc.test_path) + "'"));
  return stats;
}

namespace {

// A real deployment normalises every client's data and the coordinator's test data alike:
// only with values fixed in the config.
Status refuseComputed(const config::Config& config) {
  if (config.data.normalize != config::Normalization::kComputed) return Status::ok();
  return invalidArgument(
      "data.normalize = \"computed\" is for the simulator (it computes the statistics of the "
      "one training set it splits); clients and a coordinator each hold other data, so give "
      "them data.normalize = \"fixed\" with data.mean and data.std (a simulation records the "
      "values it computed in its run's config: fedfleet history --db FILE runs --format json)");
}

}  // namespace

Result<data::TrainTest> loadOwnData(const config::Config& config) {
  FEDFLEET_RETURN_IF_ERROR(refuseComputed(config));
  FEDFLEET_ASSIGN_OR_RETURN(data::FileSource source, fileSourceOf(config));
  if (source.path.empty()) {
    return invalidArgument("data.path: a client that trains its own data (data.format = \"" +
                           config.dataFormatName() + "\") needs its file");
  }
  FEDFLEET_ASSIGN_OR_RETURN(data::TrainTest both, data::loadTrainTest(source));
  FEDFLEET_RETURN_IF_ERROR(applyClasses(both.train, config, source.path));
  const std::string test_file = source.test_path.empty() ? source.path : source.test_path;
  FEDFLEET_RETURN_IF_ERROR(applyClasses(both.test, config, test_file));
  FEDFLEET_RETURN_IF_ERROR(applyNormalization(config, both).status());
  return both;
}

Result<data::Dataset> loadOwnTrainingData(const config::Config& config) {
  FEDFLEET_ASSIGN_OR_RETURN(data::TrainTest both, loadOwnData(config));
  return std::move(both.train);
}

Result<data::Dataset> loadTestFile(const config::Config& config) {
  FEDFLEET_ASSIGN_OR_RETURN(data::FileSource source, fileSourceOf(config));
  if (source.test_path.empty()) {
    return invalidArgument(
        "data.test_path: the coordinator evaluates the global model on a test "
        "file of its own; give one (data.format = \"" +
        config.dataFormatName() + "\")");
  }
  // The test file read as the training file of a source with no test part.
  FEDFLEET_RETURN_IF_ERROR(refuseComputed(config));
  const std::string file = source.test_path;
  source.path = source.test_path;
  source.labels_path = source.test_labels_path;
  source.train_key = "data.test_path";
  source.train_limit = source.test_limit;
  data::TrainTest both;
  FEDFLEET_ASSIGN_OR_RETURN(both.test, loadAlone(std::move(source), config, file));
  FEDFLEET_RETURN_IF_ERROR(applyNormalization(config, both).status());
  return std::move(both.test);
}

Result<model::InputShape> declaredInputShape(const config::Config& config) {
  model::InputShape shape;
  const auto& dc = config.data;
  if (config.model.name == "torchscript") {
    // The module takes whatever its clients feed it; what the config declares is recorded, and
    // what it does not is recorded as not known (an empty input, 0 classes), never a guess.
    shape.sample.clear();
    shape.classes = dc.task == config::DataTask::kRegression ? 0 : dc.num_classes;
    if (config.dataFormat() == data::DataFormat::kCsv && !dc.feature_columns.empty()) {
      shape.sample = {static_cast<int64_t>(dc.feature_columns.size())};
    } else if (config.dataFormat() == data::DataFormat::kImageFolder && dc.image_size.size() == 2) {
      shape.sample = {static_cast<int64_t>(dc.image_channels),
                      static_cast<int64_t>(dc.image_size[0]),
                      static_cast<int64_t>(dc.image_size[1])};
    }
    return shape;
  }
  const std::string what =
      "the coordinator has no test file (data.test_path) to read the samples' shape from, so "
      "model '" +
      config.model.name + "' is built from the config: ";
  if (dc.task == config::DataTask::kRegression) {
    shape.classes = 1;  // a csv file's one target column
  } else if (dc.num_classes == 0) {
    return invalidArgument(what + "give data.num_classes (or data.test_path)");
  } else {
    shape.classes = dc.num_classes;
  }
  if (config.dataFormat() == data::DataFormat::kCsv && !dc.feature_columns.empty()) {
    shape.sample = {static_cast<int64_t>(dc.feature_columns.size())};
    return shape;
  }
  if (config.dataFormat() == data::DataFormat::kImageFolder && dc.image_size.size() == 2) {
    shape.sample = {static_cast<int64_t>(dc.image_channels), static_cast<int64_t>(dc.image_size[0]),
                    static_cast<int64_t>(dc.image_size[1])};
    return shape;
  }
  return invalidArgument(what +
                         "list data.feature_columns (csv) or data.image_size (image-folder), "
                         "use a TorchScript model (model.path), or give data.test_path");
}

}  // namespace fedfleet::driver
