#include "common/data/source.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

namespace fedfleet::data {

Result<DataFormat> parseDataFormat(std::string_view name) {
  if (name == "fashion-mnist") return DataFormat::kFashionMnist;
  if (name == "idx") return DataFormat::kIdx;
  if (name == "csv") return DataFormat::kCsv;
  if (name == "tensors") return DataFormat::kTensors;
  if (name == "image-folder") return DataFormat::kImageFolder;
  if (name == "synthetic") return DataFormat::kSynthetic;
  return invalidArgument(
      "data format must be fashion-mnist, idx, csv, tensors, image-folder or synthetic; got \"" +
      std::string(name) + "\"");
}

const char* dataFormatName(DataFormat format) {
  switch (format) {
    case DataFormat::kFashionMnist:
      return "fashion-mnist";
    case DataFormat::kIdx:
      return "idx";
    case DataFormat::kCsv:
      return "csv";
    case DataFormat::kTensors:
      return "tensors";
    case DataFormat::kImageFolder:
      return "image-folder";
    case DataFormat::kSynthetic:
      return "synthetic";
  }
  return "?";
}

Dataset subsetOf(const Dataset& ds, const std::vector<uint32_t>& indices) {
  Dataset out;
  out.rows = ds.rows;
  out.cols = ds.cols;
  out.num_classes = ds.num_classes;
  out.feature_dim = ds.feature_dim;
  out.sample_shape = ds.sample_shape;
  out.target_dim = ds.target_dim;
  if (ds.hasTargets()) {
    out.targets.reserve(indices.size() * ds.target_dim);
  } else {
    out.labels.reserve(indices.size());
  }
  if (ds.hasFeatures()) {
    out.features.resize(indices.size() * ds.feature_dim);
  } else {
    out.images.resize(indices.size() * ds.imageBytes());
  }
  for (size_t j = 0; j < indices.size(); ++j) {
    const uint32_t i = indices[j];
    if (ds.hasTargets()) {
      out.targets.insert(out.targets.end(), ds.target(i), ds.target(i) + ds.target_dim);
    } else {
      out.labels.push_back(ds.labels[i]);
    }
    if (ds.hasFeatures()) {
      std::memcpy(out.features.data() + j * ds.feature_dim, ds.feature(i),
                  ds.feature_dim * sizeof(float));
    } else {
      std::memcpy(out.images.data() + j * ds.imageBytes(), ds.image(i), ds.imageBytes());
    }
  }
  return out;
}

Result<TrainTest> holdOut(const Dataset& ds, double fraction, uint64_t seed) {
  const size_t n = ds.size();
  const size_t n_test = static_cast<size_t>(std::llround(fraction * static_cast<double>(n)));
  if (!(fraction > 0) || n_test == 0 || n_test >= n) {
    return invalidArgument("holding out " + std::to_string(fraction) + " of " + std::to_string(n) +
                           " samples leaves " +
                           (n_test == 0 ? "no test samples" : "no training samples") +
                           ": choose data.holdout_fraction in (0, 1) so that both keep some, or "
                           "name a test file (data.test_path)");
  }
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937_64 rng(seed ^ 0x686f6c646f7574ull);  // "holdout"
  for (size_t i = 0; i < n_test; ++i) {  // partial Fisher-Yates: the first n_test are the draw
    std::uniform_int_distribution<size_t> pick(i, n - 1);
    std::swap(order[i], order[pick(rng)]);
  }
  std::vector<uint32_t> test(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n_test));
  std::vector<uint32_t> train(order.begin() + static_cast<std::ptrdiff_t>(n_test), order.end());
  std::sort(test.begin(), test.end());
  std::sort(train.begin(), train.end());
  TrainTest out;
  out.train = subsetOf(ds, train);
  out.test = subsetOf(ds, test);
  return out;
}

namespace {

// image-folder: what the training folder fixes for the test folder.
struct TrainingFolder {
  std::vector<std::string> classes;
  uint32_t rows = 0, cols = 0;
};

// "" when both folders hold the same class names, else what differs.
std::string classDifference(const std::vector<std::string>& train,
                            const std::vector<std::string>& test) {
  const size_t n = std::min(train.size(), test.size());
  for (size_t i = 0; i < n; ++i) {
    if (train[i] != test[i]) {
      return "class " + std::to_string(i) + " is '" + train[i] + "' in the one, '" + test[i] +
             "' in the other";
    }
  }
  if (train.size() == test.size()) return "";
  const bool train_longer = train.size() > test.size();
  return "only the " + std::string(train_longer ? "training" : "test") + " folder has '" +
         (train_longer ? train : test)[n] + "'";
}

Result<Dataset> readImageFolder(const FileSource& s, bool train, TrainingFolder& training) {
  ImageFolderOptions options = s.image_folder;
  if (!train && options.rows == 0) {
    options.rows = training.rows;
    options.cols = training.cols;
  }
  FEDFLEET_ASSIGN_OR_RETURN(
      ImageFolder folder,
      loadImageFolder(train ? s.path : s.test_path, options, train ? s.train_limit : 0));
  const Dataset& ds = folder.data;
  if (train) {
    training.classes = std::move(folder.classes);
    training.rows = ds.hasFeatures() ? ds.sample_shape[1] : ds.rows;
    training.cols = ds.hasFeatures() ? ds.sample_shape[2] : ds.cols;
    return std::move(folder.data);
  }
  const std::string difference = classDifference(training.classes, folder.classes);
  if (!difference.empty()) {
    return invalidArgument("the training folder ('" + s.path + "') and the test folder ('" +
                           s.test_path + "') must hold class folders of the same names (" +
                           "their order gives the labels): " + difference);
  }
  return std::move(folder.data);
}

Result<Dataset> readSplit(const FileSource& s, bool train, TrainingFolder& training) {
  const size_t limit = train ? s.train_limit : 0;
  switch (s.format) {
    case DataFormat::kFashionMnist:
      return loadFashionMnist(s.dir.empty() ? defaultFashionMnistDir() : s.dir, train, limit);
    case DataFormat::kIdx:
      return train ? loadIdx(s.path, s.labels_path, limit)
                   : loadIdx(s.test_path, s.test_labels_path, limit);
    case DataFormat::kCsv:
      return loadCsv(train ? s.path : s.test_path, s.csv, limit);
    case DataFormat::kTensors:
      if (!s.read_tensors) return internalError("no reader for the tensors format");
      return s.read_tensors(train ? s.path : s.test_path, limit);
    case DataFormat::kImageFolder:
      return readImageFolder(s, train, training);
    case DataFormat::kSynthetic:
      break;
  }
  return invalidArgument(std::string("data format ") + dataFormatName(s.format) +
                         " is not read from files");
}

std::string shapeOf(const Dataset& ds) {
  const std::string targets =
      ds.hasTargets() ? " with " + std::to_string(ds.target_dim) + " float targets" : "";
  if (!ds.sample_shape.empty()) {
    std::string s = "samples of shape [";
    for (size_t i = 0; i < ds.sample_shape.size(); ++i) {
      s += (i ? ", " : "") + std::to_string(ds.sample_shape[i]);
    }
    return s + "]" + targets;
  }
  if (ds.hasFeatures()) return std::to_string(ds.feature_dim) + " features" + targets;
  return std::to_string(ds.rows) + "x" + std::to_string(ds.cols) + " images";
}

}  // namespace

Result<TrainTest> loadTrainTest(const FileSource& source) {
  TrainTest out;
  TrainingFolder training;
  // Every reader's error names its file; this names the key that chose it as well.
  auto keyOf = [&](bool train) {
    if (source.format == DataFormat::kFashionMnist) return std::string("data.dir");
    return train ? source.train_key : source.test_key;
  };
  auto read = [&](bool train) -> Result<Dataset> {
    Result<Dataset> ds = readSplit(source, train, training);
    if (!ds.isOk()) return ds.status().withContext(keyOf(train));
    return ds;
  };
  FEDFLEET_ASSIGN_OR_RETURN(out.train, read(/*train=*/true));
  const bool test_file = source.format == DataFormat::kFashionMnist || !source.test_path.empty();
  if (test_file) {
    FEDFLEET_ASSIGN_OR_RETURN(out.test, read(/*train=*/false));
    const Dataset& a = out.train;
    const Dataset& b = out.test;
    if (a.feature_dim != b.feature_dim || a.rows != b.rows || a.cols != b.cols ||
        a.sample_shape != b.sample_shape || a.target_dim != b.target_dim) {
      return invalidArgument("the training data ('" + source.path + "') holds " + shapeOf(a) +
                             ", the test data ('" + source.test_path + "') " + shapeOf(b) +
                             ": both must have the same sample shape");
    }
  } else if (source.holdout_fraction > 0) {
    FEDFLEET_ASSIGN_OR_RETURN(out, holdOut(out.train, source.holdout_fraction, source.seed));
  }
  if (source.test_limit > 0 && out.test.size() > source.test_limit) {
    std::vector<uint32_t> first(source.test_limit);
    std::iota(first.begin(), first.end(), 0u);
    out.test = subsetOf(out.test, first);
  }
  const uint32_t classes = out.test.size() > 0
                               ? std::max(out.train.num_classes, out.test.num_classes)
                               : out.train.num_classes;
  out.train.num_classes = classes;
  out.test.num_classes = classes;
  return out;
}

Status appendSamples(Dataset& into, const Dataset& more, const std::string& file) {
  if (into.size() == 0) {
    into = more;  // its shape and classes; the pixels copied, wherever they live
    into.shared_images.reset();
    into.images.assign(more.pixels(), more.pixels() + more.pixelBytes());
    return Status::ok();
  }
  if (into.feature_dim != more.feature_dim || into.rows != more.rows || into.cols != more.cols ||
      into.sample_shape != more.sample_shape || into.target_dim != more.target_dim) {
    return invalidArgument(file + " holds " + shapeOf(more) + ", the files before it " +
                           shapeOf(into) + ": every client's file must have the same sample shape");
  }
  into.features.insert(into.features.end(), more.features.begin(), more.features.end());
  into.images.insert(into.images.end(), more.pixels(), more.pixels() + more.pixelBytes());
  into.labels.insert(into.labels.end(), more.labels.begin(), more.labels.end());
  into.targets.insert(into.targets.end(), more.targets.begin(), more.targets.end());
  into.num_classes = std::max(into.num_classes, more.num_classes);
  return Status::ok();
}

namespace {

// Channels of `ds` for normalisation, and the size of each channel's block in a sample.
std::pair<size_t, size_t> channelsOf(const Dataset& ds) {
  if (!ds.sample_shape.empty() && ds.sample_shape[0] > 0) {
    return {ds.sample_shape[0], ds.feature_dim / ds.sample_shape[0]};
  }
  return {ds.feature_dim, 1};
}

}  // namespace

Result<ChannelStats> channelStats(const Dataset& ds) {
  if (!ds.hasFeatures() || ds.size() == 0) {
    return invalidArgument("data.normalize = \"computed\": no feature samples to compute from");
  }
  const auto [channels, per] = channelsOf(ds);
  std::vector<double> sum(channels, 0), sq(channels, 0);
  for (size_t i = 0; i < ds.size(); ++i) {
    const float* x = ds.feature(i);
    for (size_t j = 0; j < ds.feature_dim; ++j) {
      const double v = x[j];
      sum[j / per] += v;
      sq[j / per] += v * v;
    }
  }
  const double n = static_cast<double>(ds.size()) * static_cast<double>(per);
  ChannelStats out;
  for (size_t c = 0; c < channels; ++c) {
    const double mean = sum[c] / n;
    const double var = std::max(0.0, sq[c] / n - mean * mean);
    out.mean.push_back(mean);
    out.stddev.push_back(var > 0 ? std::sqrt(var) : 1.0);
  }
  return out;
}

Status normalizeFeatures(Dataset& ds, const ChannelStats& stats, const std::string& what) {
  if (ds.size() == 0) return Status::ok();
  if (!ds.hasFeatures()) {
    return invalidArgument(what + ": data.normalize applies to feature samples, not images");
  }
  const auto [channels, per] = channelsOf(ds);
  const size_t given = stats.mean.size();
  if (given != stats.stddev.size() || (given != 1 && given != channels)) {
    return invalidArgument(
        what + " has " + std::to_string(channels) + " channels: data.mean and data.std need 1 or " +
        std::to_string(channels) + " values each, got " + std::to_string(stats.mean.size()) +
        " and " + std::to_string(stats.stddev.size()));
  }
  for (size_t i = 0; i < ds.size(); ++i) {
    float* x = ds.features.data() + i * ds.feature_dim;
    for (size_t j = 0; j < ds.feature_dim; ++j) {
      const size_t c = given == 1 ? 0 : j / per;
      x[j] = static_cast<float>((x[j] - stats.mean[c]) / stats.stddev[c]);
    }
  }
  return Status::ok();
}

}  // namespace fedfleet::data
