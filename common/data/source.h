// Data sources read from files: which format (data.format), where the training and test data
// are, and the held-out split when there is no test file. The simulator partitions the
// training set over its virtual clients and evaluates on the test set.
//
//   fashion-mnist  the Debian package dataset-fashion-mnist (or data.dir): IDX files
//   idx            any IDX image/label pair (uint8 images of any size, up to 256 classes)
//   csv            numeric feature columns and a label column under a header (csv_source.h)
//   tensors        a torch.save({"x": X, "y": Y}) file, any sample shape (read through
//                  FileSource::read_tensors: LibTorch's unpickler lives in common/model)
//   image-folder   root/<class name>/<image>.png|.jpg|.jpeg, as torchvision's ImageFolder
//                  (image_folder.h)
//   synthetic      FedProx's Synthetic(alpha, beta), generated per client (synthetic.h)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/data/csv_source.h"
#include "common/data/dataset.h"
#include "common/data/image_folder.h"
#include "common/status.h"

namespace fedfleet::data {

enum class DataFormat { kFashionMnist, kIdx, kCsv, kTensors, kImageFolder, kSynthetic };

// "fashion-mnist", "idx", "csv", "tensors", "image-folder", "synthetic"; kInvalidArgument
// listing them otherwise.
Result<DataFormat> parseDataFormat(std::string_view name);
const char* dataFormatName(DataFormat format);
// Whether the format is read from files the user names (idx, csv, tensors, image-folder).
inline bool readsUserFiles(DataFormat f) {
  return f == DataFormat::kIdx || f == DataFormat::kCsv || f == DataFormat::kTensors ||
         f == DataFormat::kImageFolder;
}

// Reads one data file of the tensors format: (path, limit) -> the data set, as
// model::loadTensorFile does.
using TensorFileReader = std::function<Result<Dataset>(const std::string&, size_t)>;

struct FileSource {
  DataFormat format = DataFormat::kFashionMnist;  // any but kSynthetic
  std::string dir;               // fashion-mnist: the package's directory ("": the default)
  std::string path;              // idx: training images; csv, tensors: the training file;
                                 // image-folder: the training folder
  std::string labels_path;       // idx: training labels
  std::string test_path;         // idx: test images; csv, tensors: the test file; image-folder: the
                                 // test folder ("": see holdout)
  std::string test_labels_path;  // idx: test labels
  CsvColumns csv;
  TensorFileReader read_tensors;  // tensors: the reader (required for that format)
  // image-folder: channels and size. Unset size: the test folder takes the training images'.
  ImageFolderOptions image_folder;
  // No test file: this fraction of the training samples, drawn with `seed`, is held out as
  // the test set (0: no test set).
  double holdout_fraction = 0;
  uint64_t seed = 0;
  size_t train_limit = 0;  // > 0: only the first train_limit training samples
  size_t test_limit = 0;   // > 0: only the first test_limit test samples
  // The config keys that named the training and test paths, for messages ("data.path: cannot
  // open ..."); fashion-mnist's files are named by data.dir.
  std::string train_key = "data.path";
  std::string test_key = "data.test_path";
};

struct TrainTest {
  Dataset train;
  Dataset test;  // empty when there is no test file and nothing is held out
};

// Reads the training and test sets `source` names. Both get the same num_classes (the larger)
// and must agree on the sample shape (image size or feature count); an image-folder test folder
// must hold the training folder's class folders, by the same names. train_limit applies before
// the hold-out split, test_limit after it. Errors: the reader's (each naming the file), a shape
// or class-name mismatch naming both files or folders, a hold-out that leaves either side empty.
Result<TrainTest> loadTrainTest(const FileSource& source);

// Normalisation of a feature-vector set (data.normalize): x <- (x - mean[c]) / std[c] over
// channels c: the first dimension of shaped samples (an image-folder's [C, H, W]), each feature
// of a plain vector; one value stands for every channel.
struct ChannelStats {
  std::vector<double> mean;
  std::vector<double> stddev;
};
// The mean and (population) standard deviation of each channel of `ds`'s samples; a channel
// that is constant gets std 1 (it is only centred). kInvalidArgument for an image set or an
// empty one.
Result<ChannelStats> channelStats(const Dataset& ds);
// Normalises `ds` (read from `what`) in place. kInvalidArgument, naming `what`, when it is not a
// feature-vector set or the statistics have neither 1 nor its channel count of values.
Status normalizeFeatures(Dataset& ds, const ChannelStats& stats, const std::string& what);

// Appends the samples of `more` (read from `file`) to `into`: both must hold samples of the same
// kind and shape (an empty `into` takes the shape of `more`); num_classes becomes the larger.
// kInvalidArgument naming `file` otherwise.
Status appendSamples(Dataset& into, const Dataset& more, const std::string& file);

// The samples `indices` of `ds` (in that order) as a data set of their own.
Dataset subsetOf(const Dataset& ds, const std::vector<uint32_t>& indices);

// The hold-out split: round(fraction * size) samples drawn uniformly without replacement with
// `seed` go to `.test`, the rest to `.train`, each in the original order. kInvalidArgument
// when either side would be empty.
Result<TrainTest> holdOut(const Dataset& ds, double fraction, uint64_t seed);

}  // namespace fedfleet::data
