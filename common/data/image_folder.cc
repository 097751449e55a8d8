#include "common/data/image_folder.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <limits>
#include <new>
#include <thread>

#include "common/atomic_file.h"
#include "common/data/image_codec.h"

namespace fedfleet::data {
namespace {

namespace fs = std::filesystem;

constexpr size_t kChunk = 32;  // images a decoding thread takes at a time

struct ImageFile {
  std::string path;
  Label label = 0;
};

struct Listing {
  std::vector<std::string> classes;
  std::vector<ImageFile> files;  // class after class, by name within each
};

bool hasImageExtension(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  std::string ext = name.substr(dot + 1);
  for (char& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return ext == "png" || ext == "jpg" || ext == "jpeg";
}

// The names of the sub-folders of `dir` (folders = true) or of its image files, in byte order.
Result<std::vector<std::string>> sortedEntries(const fs::path& dir, bool folders) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;  // an entry that cannot be stat'ed counts as a file
    const bool is_folder = it->is_directory(type_ec);
    std::string name = it->path().filename().string();
    if (folders ? is_folder : (!is_folder && hasImageExtension(name))) {
      names.push_back(std::move(name));
    }
  }
  if (ec) return ioError("cannot list the folder '" + dir.string() + "': " + ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

Result<Listing> listImageFolder(const std::string& root) {
  std::error_code ec;
  const fs::file_status st = fs::status(root, ec);
  if (st.type() == fs::file_type::not_found) {
    return notFound("image folder '" + root + "' does not exist");
  }
  if (ec) return ioError("cannot read the image folder '" + root + "': " + ec.message());
  if (!fs::is_directory(st)) {
    return invalidArgument("'" + root +
                           "' is not a folder: an image folder holds one folder of images a "
                           "class (root/<class name>/<image>.png)");
  }
  Listing listing;
  FEDFLEET_ASSIGN_OR_RETURN(listing.classes, sortedEntries(root, /*folders=*/true));
  if (listing.classes.empty()) {
    return invalidArgument("image folder '" + root +
                           "' holds no class folder: put the images of each class in a folder "
                           "of its own (root/<class name>/<image>.png)");
  }
  if (listing.classes.size() > static_cast<size_t>(kMaxClasses)) {
    return invalidArgument("image folder '" + root + "' holds " +
                           std::to_string(listing.classes.size()) + " class folders, more than " +
                           std::to_string(kMaxClasses));
  }
  for (size_t label = 0; label < listing.classes.size(); ++label) {
    const fs::path dir = fs::path(root) / listing.classes[label];
    FEDFLEET_ASSIGN_OR_RETURN(std::vector<std::string> names,
                              sortedEntries(dir, /*folders=*/false));
    if (names.empty()) {
      return invalidArgument("class folder '" + dir.string() +
                             "' holds no .png, .jpg or .jpeg file");
    }
    for (const std::string& name : names) {
      listing.files.push_back({(dir / name).string(), static_cast<Label>(label)});
    }
  }
  return listing;
}

Status decodeFile(const std::string& path, uint32_t channels, Image& out) {
  FEDFLEET_ASSIGN_OR_RETURN(std::string bytes, readWholeFile(path));
  return decodeImage(bytes, channels, path, out);
}

// Where the decoded images go: sample i of `ds`, every one rows x cols.
class SampleWriter {
 public:
  SampleWriter(Dataset& ds, uint32_t rows, uint32_t cols) : ds_(ds), rows_(rows), cols_(cols) {}

  // Stores `image` (of the set's channels, any size) as sample i, resampled through `scratch`
  // when its size differs. Samples are disjoint: threads may store different ones at once.
  void store(const Image& image, size_t i, Image& scratch) const {
    const Image* src = &image;
    if (image.rows != rows_ || image.cols != cols_) {
      resizeImage(image, rows_, cols_, scratch);
      src = &scratch;
    }
    const size_t plane = static_cast<size_t>(rows_) * cols_;
    const uint8_t* px = src->pixels.data();
    if (!ds_.hasFeatures()) {
      std::copy_n(px, plane, ds_.images.data() + i * plane);
      return;
    }
    float* out = ds_.features.data() + i * ds_.feature_dim;  // [3, rows, cols]
    for (size_t p = 0; p < plane; ++p) {
      for (size_t c = 0; c < 3; ++c) out[c * plane + p] = static_cast<float>(px[p * 3 + c]) / 255;
    }
  }

 private:
  Dataset& ds_;
  const uint32_t rows_, cols_;
};

// Decodes files [begin, size) into `writer` on `threads` threads. Chunks of kChunk files are
// handed out in order; after a failure no new chunk is taken, but every thread finishes the
// chunk it holds, so each chunk before the failing one is decoded and the failure reported is
// the first in file order, however the threads ran.
Status decodeAll(const std::vector<ImageFile>& files, size_t begin, uint32_t channels,
                 const SampleWriter& writer, size_t threads) {
  struct Failure {
    size_t index = std::numeric_limits<size_t>::max();
    Status status;
  };
  std::vector<Failure> failures(threads);
  std::atomic<size_t> next{begin};
  std::atomic<bool> failed{false};
  auto work = [&](Failure& failure) {
    Image decoded, scratch;
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t lo = next.fetch_add(kChunk);
      if (lo >= files.size()) return;
      for (size_t i = lo; i < std::min(lo + kChunk, files.size()); ++i) {
        Status status = decodeFile(files[i].path, channels, decoded);
        if (!status.isOk()) {
          failure = {i, std::move(status)};
          failed.store(true);
          return;
        }
        writer.store(decoded, i, scratch);
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, std::ref(failures[t]));
  work(failures[0]);
  for (std::thread& t : pool) t.join();
  const auto first =
      std::min_element(failures.begin(), failures.end(),
                       [](const Failure& a, const Failure& b) { return a.index < b.index; });
  return first->status;
}

Status checkOptions(const ImageFolderOptions& o) {
  if (o.channels != 1 && o.channels != 3) {
    return invalidArgument("image folders are read with 1 (grey) or 3 (RGB) channels, not " +
                           std::to_string(o.channels));
  }
  if ((o.rows == 0) != (o.cols == 0) || o.rows > kMaxImageSide || o.cols > kMaxImageSide) {
    return invalidArgument("image size " + std::to_string(o.rows) + "x" + std::to_string(o.cols) +
                           ": both sides must be 1 to " + std::to_string(kMaxImageSide) +
                           " (or both 0: the first image's)");
  }
  return Status::ok();
}

}  // namespace

Result<ImageFolder> loadImageFolder(const std::string& root, const ImageFolderOptions& options,
                                    size_t limit) {
  FEDFLEET_RETURN_IF_ERROR(checkOptions(options));
  FEDFLEET_ASSIGN_OR_RETURN(Listing listing, listImageFolder(root));
  std::vector<ImageFile>& files = listing.files;
  if (limit > 0 && files.size() > limit) files.resize(limit);
  // The first image fixes the size when none is configured.
  Image first;
  FEDFLEET_RETURN_IF_ERROR(decodeFile(files[0].path, options.channels, first));
  const uint32_t rows = options.rows > 0 ? options.rows : first.rows;
  const uint32_t cols = options.cols > 0 ? options.cols : first.cols;

  ImageFolder out;
  Dataset& ds = out.data;
  ds.num_classes = static_cast<uint32_t>(listing.classes.size());
  const size_t n = files.size(), plane = static_cast<size_t>(rows) * cols;
  try {
    ds.labels.resize(n);
    if (options.channels == 1) {
      ds.rows = rows;
      ds.cols = cols;
      ds.images.resize(n * plane);
    } else {
      ds.feature_dim = static_cast<uint32_t>(3 * plane);
      ds.sample_shape = {3, rows, cols};
      ds.features.resize(n * ds.feature_dim);
    }
  } catch (const std::bad_alloc&) {
    return resourceExhausted("image folder '" + root + "': no memory for " + std::to_string(n) +
                             " images of " + std::to_string(rows) + "x" + std::to_string(cols));
  }
  for (size_t i = 0; i < n; ++i) ds.labels[i] = files[i].label;

  const SampleWriter writer(ds, rows, cols);
  Image scratch;
  writer.store(first, 0, scratch);
  const size_t cores =
      options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = std::clamp<size_t>((n - 1 + kChunk - 1) / kChunk, 1, cores);
  FEDFLEET_RETURN_IF_ERROR(decodeAll(files, 1, options.channels, writer, threads));
  out.classes = std::move(listing.classes);
  return out;
}

}  // namespace fedfleet::data
