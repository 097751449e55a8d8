// Bring-your-own-data loading (bench/byo_data.sh): the image-folder reader against
// torchvision's ImageFolder + DataLoader on the same PNG files.
//
//   bench_byo_data write IDX_DIR ROOT   Fashion-MNIST's 60,000 training images as
//                                       ROOT/<label>/NNNNN.png (8-bit grey, libpng)
//   bench_byo_data load ROOT            one epoch: common/data/image_folder.h reads and decodes
//                                       every file, then common/model/batch.h's BatchBuilder
//                                       turns them into float batches of 64 in file order;
//                                       prints RESULT load_s=... epoch_s=... samples=...
//                                       label_sum=... (the epoch includes the load)
#include <png.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/data/dataset.h"
#include "common/data/image_folder.h"
#include "common/model/batch.h"

namespace {

using fedfleet::data::Dataset;

int writeFolder(const std::string& idx_dir, const std::string& root) {
  auto train = fedfleet::data::loadFashionMnist(idx_dir, /*train=*/true);
  if (!train.isOk()) {
    std::fprintf(stderr, "%s\n", train.status().toString().c_str());
    return 1;
  }
  const Dataset& ds = *train;
  for (uint32_t c = 0; c < ds.num_classes; ++c) {
    std::filesystem::create_directories(root + "/" + std::to_string(c));
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < ds.size() && !failed;) {
      char name[32];
      std::snprintf(name, sizeof name, "%05zu.png", i);
      const std::string path = root + "/" + std::to_string(ds.labels[i]) + "/" + name;
      png_image image;
      std::memset(&image, 0, sizeof image);
      image.version = PNG_IMAGE_VERSION;
      image.width = ds.cols;
      image.height = ds.rows;
      image.format = PNG_FORMAT_GRAY;
      if (!png_image_write_to_file(&image, path.c_str(), 0, ds.image(i), 0, nullptr)) {
        std::fprintf(stderr, "%s: %s\n", path.c_str(), image.message);
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < std::max(1u, std::thread::hardware_concurrency()); ++t) {
    pool.emplace_back(work);
  }
  work();
  for (auto& t : pool) t.join();
  return failed ? 1 : 0;
}

int loadEpoch(const std::string& root) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto folder = fedfleet::data::loadImageFolder(root, {});
  if (!folder.isOk()) {
    std::fprintf(stderr, "%s\n", folder.status().toString().c_str());
    return 1;
  }
  const Dataset& ds = folder->data;
  const double load_s = std::chrono::duration<double>(Clock::now() - start).count();
  fedfleet::model::BatchBuilder builder(ds, c10::Device(c10::kCPU));
  std::vector<uint32_t> order(ds.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  int64_t label_sum = 0;
  size_t samples = 0;
  constexpr size_t kBatch = 64;
  for (size_t lo = 0; lo < order.size(); lo += kBatch) {
    const size_t n = std::min(kBatch, order.size() - lo);
    auto [x, y] = builder.build(order.data() + lo, n);
    samples += static_cast<size_t>(x.size(0));
    label_sum += y.sum().item<int64_t>();
  }
  const double epoch_s = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("RESULT load_s=%.3f epoch_s=%.3f samples=%zu label_sum=%lld\n", load_s, epoch_s,
              samples, static_cast<long long>(label_sum));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "write" && argc == 4) return writeFolder(argv[2], argv[3]);
  if (mode == "load" && argc == 3) return loadEpoch(argv[2]);
  std::fprintf(stderr, "usage: %s write IDX_DIR ROOT | load ROOT\n", argv[0]);
  return 2;
}
