// Image folders (data.format = "image-folder"): root/<class name>/<image>, the layout
// torchvision's datasets.ImageFolder reads. Class folders sorted by name in byte order are the
// labels 0..C-1; the images of a class are the .png, .jpg and .jpeg files (any case) directly in
// its folder, taken in byte order of their names; other files and sub-folders are left alone.
//
// Every image is decoded (common/data/image_codec.h) to the configured channels and resampled
// to one size, on a few threads (decoding is what takes the time). Grey images become an image
// Dataset (rows x cols bytes, normalised when batched as Fashion-MNIST is); RGB images become
// feature vectors of sample shape [3, rows, cols], channel after channel, each value the byte
// / 255 (torchvision's ToTensor), which common/model/batch.h batches as they are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/data/dataset.h"
#include "common/status.h"

namespace fedfleet::data {

struct ImageFolderOptions {
  uint32_t channels = 1;        // 1: grey, 3: RGB
  uint32_t rows = 0, cols = 0;  // every image is resampled to this size; 0: the first image's
  size_t threads = 0;           // decoding threads; 0: one per hardware thread
};

struct ImageFolder {
  Dataset data;
  std::vector<std::string> classes;  // the class folders' names: label i is classes[i]
};

// Reads the image folder at `root`. `limit` > 0 keeps only the first `limit` images (in class
// order, then name order), and only those are decoded. Without a configured size the first
// image's size is taken, and every other image is resampled to it.
// Failures, each naming the folder or the file: kNotFound when `root` does not exist;
// kInvalidArgument when it is not a folder, holds no class folder or more than kMaxClasses, when a
// class folder holds no image file, or for bad options; kCorrupt for a file with an image extension
// that does not decode (damaged, truncated, not an image at all); kIoError when a folder or a
// file cannot be read. When several images fail, the first in order is reported.
Result<ImageFolder> loadImageFolder(const std::string& root, const ImageFolderOptions& options,
                                    size_t limit = 0);

}  // namespace fedfleet::data
