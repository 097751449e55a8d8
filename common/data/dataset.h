// Labelled data sets held in memory (grey-scale images as bytes, or float feature vectors), and
// the IDX reader that fills the image kind.
//
// A Dataset is plain memory (no LibTorch types) so that partitioners, the simulator and the
// coordinator can hold and slice it without linking LibTorch; common/model/batch.h turns a set of
// its samples into tensors. Fashion-MNIST (the default data set) comes from the Debian package
// dataset-fashion-mnist as gzip-compressed IDX files; feature-vector sets such as FedProx's
// Synthetic(alpha, beta) come from common/data/synthetic.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace fedfleet::data {

// A class id. Any number of classes up to kMaxClasses (the partitioners keep one index list per
// class, so the bound keeps a hostile or mistyped label from asking for gigabytes).
using Label = int64_t;
inline constexpr Label kMaxClasses = Label{1} << 20;

// A labelled set of samples of one of two kinds:
//  - images (feature_dim == 0): grey-scale, rows x cols bytes each, normalised when batched;
//  - feature vectors (feature_dim > 0): feature_dim floats each, already normalised and batched
//    as they are; rows = cols = 0 and the image fields stay empty.
// Its samples carry either class labels (classification: `labels`, each < num_classes) or float
// targets (regression: target_dim > 0, `targets` holds target_dim floats per sample and
// `labels` stays empty); a regression set is always a feature-vector set.
struct Dataset {
  uint32_t rows = 0, cols = 0, num_classes = 10;
  uint32_t feature_dim = 0;  // > 0: this is a feature-vector data set
  // Feature-vector sets: the shape one sample has for the model (a tensors file's [3, 32, 32],
  // say), its product feature_dim; empty: a plain vector, [feature_dim].
  std::vector<uint32_t> sample_shape;
  std::vector<float> features;  // size() * feature_dim floats, sample after sample
  std::vector<uint8_t> images;  // size() * rows * cols bytes, row-major, sample after sample;
                                // empty when the pixels are shared (see shareImages)
  std::vector<Label> labels;    // one label per sample, each < num_classes
  uint32_t target_dim = 0;      // > 0: a regression set
  std::vector<float> targets;   // size() * target_dim floats, sample after sample
  std::shared_ptr<const uint8_t> shared_images;  // read-only mapping of a cache file, or null

  size_t size() const { return target_dim > 0 ? targets.size() / target_dim : labels.size(); }
  bool hasFeatures() const { return feature_dim > 0; }
  bool hasTargets() const { return target_dim > 0; }
  // Precondition: hasTargets(), i < size().
  const float* target(size_t i) const { return targets.data() + i * target_dim; }
  // Precondition: hasFeatures(), i < size().
  const float* feature(size_t i) const { return features.data() + i * feature_dim; }
  size_t imageBytes() const { return static_cast<size_t>(rows) * cols; }
  // All pixels, wherever they live.
  const uint8_t* pixels() const { return shared_images ? shared_images.get() : images.data(); }
  size_t pixelBytes() const { return shared_images ? size() * imageBytes() : images.size(); }
  // Precondition: i < size().
  const uint8_t* image(size_t i) const { return pixels() + i * imageBytes(); }
};

// OK when the sample storage of `ds` matches its labels: a feature-vector set holds at least
// size() * feature_dim floats; an image set has a non-empty rows x cols shape and at least
// size() * rows * cols pixel bytes. kInvalidArgument saying which otherwise. Batching code
// (common/model/batch.h) assumes this holds.
Status checkSampleStorage(const Dataset& ds);

// File names of the Fashion-MNIST package.
inline constexpr const char* kFashionMnistTrainImages = "train-images-idx3-ubyte.gz";
inline constexpr const char* kFashionMnistTrainLabels = "train-labels-idx1-ubyte.gz";
inline constexpr const char* kFashionMnistTestImages = "t10k-images-idx3-ubyte.gz";
inline constexpr const char* kFashionMnistTestLabels = "t10k-labels-idx1-ubyte.gz";

// $FEDFLEET_FASHION_MNIST_DIR when set and non-empty, else /usr/share/datasets/fashion-mnist.
std::string defaultFashionMnistDir();

// Reads an IDX image file (magic 0x00000803: uint8, 3 dimensions count x rows x cols) and an IDX
// label file (magic 0x00000801: uint8, 1 dimension count). Each file may be gzip-compressed or
// plain (zlib reads both). Validates the magic numbers, that dimensions are non-zero, that both
// files hold the same count, that each file holds exactly the bytes its header announces (no
// less, no more). `limit` > 0 keeps only the first `limit` samples (the whole files are still
// read and validated). num_classes is largest kept label + 1 (at least 2); loadFashionMnist sets
// it to 10 and refuses a label above 9.
// Failures: kNotFound when a file does not exist; kCorrupt (message names the file) for a bad
// magic number, zero or absurd dimensions, a count mismatch, a truncated or over-long file, or a
// damaged gzip stream; kIoError when a file exists but cannot be read.
Result<Dataset> loadIdx(const std::string& images_path, const std::string& labels_path,
                        size_t limit = 0);

// loadIdx over the two files' contents already in memory (what loadIdx runs once it has read
// them): each may be gzip-compressed or plain, told apart as zlib's gzread does (bytes starting
// with the gzip magic 1f 8b are inflated, member after member, bytes after a member that do not
// start another are ignored; anything else is taken as it is). The same checks and kCorrupt
// failures as loadIdx, the messages naming `images_name` and `labels_name` where loadIdx names
// the paths; kResourceExhausted when memory runs out. Never throws or aborts, whatever the bytes.
Result<Dataset> parseIdx(std::string_view images, std::string_view labels, size_t limit = 0,
                         const std::string& images_name = "images",
                         const std::string& labels_name = "labels");

// Loads Fashion-MNIST from `dir`: train=true reads train-images-idx3-ubyte.gz and
// train-labels-idx1-ubyte.gz (60000 samples), train=false the t10k-* files (10000 samples).
// Failures as for loadIdx.
Result<Dataset> loadFashionMnist(const std::string& dir, bool train, size_t limit = 0);

// Moves the pixels of `ds` into a file under `cache_dir` (created if needed) and maps it
// read-only, so that every process on the host that shares the same data maps the same pages:
// ten client processes then hold one copy of Fashion-MNIST (47 MB) instead of ten. `key` names
// the content (the same key must mean the same pixels); the file is written once, atomically
// (temporary file + rename), and reused when it exists with the right size. On failure (no
// space, unwritable directory) returns the Status and leaves `ds` as it was. A feature-vector data
// set has no pixels: nothing is shared and the call returns OK.
Status shareImages(Dataset& ds, const std::string& cache_dir, const std::string& key);

// $FEDFLEET_CACHE_DIR, else $XDG_CACHE_HOME/fedfleet, else $HOME/.cache/fedfleet, else
// /tmp/fedfleet-cache.
std::string defaultCacheDir();

}  // namespace fedfleet::data
