#include "common/data/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>

namespace fedfleet::data {
namespace {

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // uint8 data, 3 dimensions
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // uint8 data, 1 dimension
// Anything larger is taken as a damaged header rather than a data set we mean to hold.
constexpr uint64_t kMaxIdxPayloadBytes = uint64_t{1} << 34;
constexpr uint64_t kMaxItemBytes = uint64_t{1} << 24;
// Read granularity: the payload vector grows as bytes really arrive, so a damaged header that
// announces terabytes costs nothing before the short read is noticed.
constexpr size_t kReadChunk = size_t{16} << 20;

struct GzCloser {
  void operator()(gzFile_s* f) const {
    if (f != nullptr) gzclose(f);
  }
};
using GzHandle = std::unique_ptr<gzFile_s, GzCloser>;

struct IdxFile {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> payload;  // the first keep_items items only
};

class IdxReader {
 public:
  explicit IdxReader(std::string path) : path_(std::move(path)) {}

  Status open() {
    std::error_code ec;
    const auto st = std::filesystem::status(path_, ec);
    if (ec || !std::filesystem::exists(st)) return notFound("IDX file not found: " + path_);
    if (std::filesystem::is_directory(st)) return ioError("IDX path is a directory: " + path_);
    errno = 0;
    file_.reset(gzopen(path_.c_str(), "rb"));
    if (!file_) {
      return ioError("cannot open IDX file " + path_ + ": " +
                     (errno != 0 ? std::strerror(errno) : "zlib could not allocate"));
    }
    gzbuffer(file_.get(), 1 << 17);
    return Status::ok();
  }

  // Reads exactly `n` bytes into `dst` (nullptr: into a scratch buffer, discarding them).
  Status readExact(uint8_t* dst, uint64_t n, const char* what) {
    std::vector<uint8_t> scratch;
    if (dst == nullptr) scratch.resize(static_cast<size_t>(std::min<uint64_t>(n, 1 << 20)));
    uint64_t done = 0;
    while (done < n) {
      const uint64_t want = std::min<uint64_t>(n - done, dst ? (1u << 30) : scratch.size());
      const int got =
          gzread(file_.get(), dst ? dst + done : scratch.data(), static_cast<unsigned>(want));
      if (got < 0) return streamError(what);
      if (got == 0) {
        int err = Z_OK;
        gzerror(file_.get(), &err);
        if (err != Z_OK && err != Z_BUF_ERROR) return streamError(what);
        return corrupt(path_ + ": truncated while reading " + what + " (" + std::to_string(done) +
                       " of " + std::to_string(n) + " bytes)");
      }
      done += static_cast<uint64_t>(got);
    }
    return Status::ok();
  }

  Status expectEnd() {
    uint8_t extra[16];
    const int got = gzread(file_.get(), extra, sizeof(extra));
    if (got < 0) return streamError("end of file");
    if (got > 0) return corrupt(path_ + ": longer than its header announces");
    return Status::ok();
  }

  Result<uint32_t> readBigEndian32(const char* what) {
    uint8_t b[4];
    FEDFLEET_RETURN_IF_ERROR(readExact(b, 4, what));
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
  }

  const std::string& path() const { return path_; }

 private:
  Status streamError(const char* what) {
    int err = Z_OK;
    const char* msg = gzerror(file_.get(), &err);
    return corrupt(path_ + ": damaged stream while reading " + what + ": " +
                   (msg != nullptr ? msg : "unknown zlib error"));
  }

  std::string path_;
  GzHandle file_;
};

// Reads an IDX file of uint8 data with `ndims` dimensions; keeps the first `keep_items` items
// (0 = all) of its payload, but reads and checks the rest.
Result<IdxFile> readIdx(const std::string& path, uint32_t magic, size_t ndims, size_t keep_items) {
  IdxReader reader(path);
  FEDFLEET_RETURN_IF_ERROR(reader.open());
  FEDFLEET_ASSIGN_OR_RETURN(const uint32_t got_magic, reader.readBigEndian32("magic number"));
  if (got_magic != magic) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), ": bad magic number 0x%08x (expected 0x%08x)", got_magic,
                  magic);
    return corrupt(path + buf);
  }
  IdxFile out;
  uint64_t item_bytes = 1;
  for (size_t d = 0; d < ndims; ++d) {
    FEDFLEET_ASSIGN_OR_RETURN(const uint32_t dim, reader.readBigEndian32("dimensions"));
    if (dim == 0) return corrupt(path + ": dimension " + std::to_string(d) + " is zero");
    out.dims.push_back(dim);
    if (d > 0) {
      item_bytes *= dim;
      if (item_bytes > kMaxItemBytes) return corrupt(path + ": absurd item size in header");
    }
  }
  const uint64_t count = out.dims[0];
  const uint64_t total = count * item_bytes;
  if (total > kMaxIdxPayloadBytes) return corrupt(path + ": absurd payload size in header");
  const uint64_t keep = (keep_items == 0 ? count : std::min<uint64_t>(count, keep_items));
  const uint64_t keep_bytes = keep * item_bytes;
  uint64_t done = 0;
  while (done < keep_bytes) {
    const uint64_t n = std::min<uint64_t>(keep_bytes - done, kReadChunk);
    out.payload.resize(static_cast<size_t>(done + n));
    FEDFLEET_RETURN_IF_ERROR(reader.readExact(out.payload.data() + done, n, "data"));
    done += n;
  }
  FEDFLEET_RETURN_IF_ERROR(reader.readExact(nullptr, total - keep_bytes, "data"));
  FEDFLEET_RETURN_IF_ERROR(reader.expectEnd());
  return out;
}

}  // namespace

Status checkSampleStorage(const Dataset& ds) {
  if (ds.hasFeatures()) {
    if (ds.features.size() / ds.feature_dim < ds.size()) {
      return invalidArgument("data set holds " + std::to_string(ds.features.size()) +
                             " feature values, fewer than its " + std::to_string(ds.size()) +
                             " labels need at dimension " + std::to_string(ds.feature_dim));
    }
    return Status::ok();
  }
  if (ds.imageBytes() == 0) return invalidArgument("data set has an empty image shape");
  if (ds.pixelBytes() / ds.imageBytes() < ds.size()) {
    return invalidArgument("data set holds fewer image bytes than its " +
                           std::to_string(ds.size()) + " labels need");
  }
  return Status::ok();
}

std::string defaultFashionMnistDir() {
  const char* env = std::getenv("FEDFLEET_FASHION_MNIST_DIR");
  if (env != nullptr && env[0] != '\0') return env;
  return "/usr/share/datasets/fashion-mnist";
}

Result<Dataset> loadIdx(const std::string& images_path, const std::string& labels_path,
                        size_t limit) {
  try {
    FEDFLEET_ASSIGN_OR_RETURN(IdxFile labels, readIdx(labels_path, kIdxLabelsMagic, 1, limit));
    FEDFLEET_ASSIGN_OR_RETURN(IdxFile images, readIdx(images_path, kIdxImagesMagic, 3, limit));
    if (images.dims[0] != labels.dims[0]) {
      return corrupt(images_path + " holds " + std::to_string(images.dims[0]) + " images but " +
                     labels_path + " holds " + std::to_string(labels.dims[0]) + " labels");
    }
    Dataset ds;
    ds.rows = images.dims[1];
    ds.cols = images.dims[2];
    ds.images = std::move(images.payload);
    ds.labels = std::move(labels.payload);
    uint32_t max_label = 0;
    for (uint8_t l : ds.labels) max_label = std::max<uint32_t>(max_label, l);
    ds.num_classes = std::max<uint32_t>(10, max_label + 1);
    return ds;
  } catch (const std::bad_alloc&) {
    return resourceExhausted("out of memory loading " + images_path);
  } catch (const std::exception& e) {
    return internalError("loading " + images_path + ": " + e.what());
  }
}

Result<Dataset> loadFashionMnist(const std::string& dir, bool train, size_t limit) {
  const std::string base = dir.empty() ? std::string(".") : dir;
  return loadIdx(base + "/" + (train ? kFashionMnistTrainImages : kFashionMnistTestImages),
                 base + "/" + (train ? kFashionMnistTrainLabels : kFashionMnistTestLabels), limit);
}

std::string defaultCacheDir() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v && *v ? std::string(v) : std::string();
  };
  if (auto d = env("FEDFLEET_CACHE_DIR"); !d.empty()) return d;
  if (auto d = env("XDG_CACHE_HOME"); !d.empty()) return d + "/fedfleet";
  if (auto d = env("HOME"); !d.empty()) return d + "/.cache/fedfleet";
  return "/tmp/fedfleet-cache";
}

Status shareImages(Dataset& ds, const std::string& cache_dir, const std::string& key) {
  const size_t bytes = ds.pixelBytes();
  if (ds.shared_images || bytes == 0) return Status::ok();
  std::error_code ec;
  std::filesystem::create_directories(cache_dir, ec);
  if (ec) return ioError("cache directory " + cache_dir + ": " + ec.message());
  std::string name;
  for (char ch : key) name.push_back(std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_');
  const std::string path = cache_dir + "/" + name + ".pixels";

  auto sizeOf = [](const std::string& p) -> std::optional<size_t> {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) return std::nullopt;
    return static_cast<size_t>(st.st_size);
  };
  if (sizeOf(path) != bytes) {
    // A unique name (mkstemp), not the pid: processes in different containers sharing the
    // cache volume can have the same pid.
    std::string tmp = path + ".tmp.XXXXXX";
    int fd = ::mkstemp(tmp.data());
    if (fd < 0) return ioError("cannot create " + tmp + ": " + std::strerror(errno));
    ::fchmod(fd, 0644);
    size_t done = 0;
    while (done < bytes) {
      ssize_t n = ::write(fd, ds.images.data() + done, bytes - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = n < 0 ? std::strerror(errno) : "short write";
        ::close(fd);
        ::unlink(tmp.c_str());
        return ioError("writing " + tmp + ": " + why);
      }
      done += static_cast<size_t>(n);
    }
    if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      ::unlink(tmp.c_str());
      return ioError("publishing " + path + ": " + why);
    }
  }
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return ioError("cannot open " + path + ": " + std::strerror(errno));
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return ioError("cannot map " + path + ": " + std::strerror(errno));
  // A file rewritten by another writer between our size check and the map cannot change under
  // us: writers only ever rename a complete new file over the name, the mapping keeps the old.
  if (std::memcmp(map, ds.images.data(), bytes) != 0) {
    ::munmap(map, bytes);
    return corrupt(path + " does not hold the pixels of key '" + key + "' (stale cache file?)");
  }
  ds.shared_images = std::shared_ptr<const uint8_t>(
      static_cast<const uint8_t*>(map),
      [bytes](const uint8_t* p) { ::munmap(const_cast<uint8_t*>(p), bytes); });
  std::vector<uint8_t>().swap(ds.images);
  return Status::ok();
}

}  // namespace fedfleet::data
