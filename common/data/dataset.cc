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
#include <string_view>

#include "common/atomic_file.h"

namespace fedfleet::data {
namespace {

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // uint8 data, 3 dimensions
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // uint8 data, 1 dimension
// Anything larger is taken as a damaged header rather than a data set we mean to hold.
constexpr uint64_t kMaxIdxPayloadBytes = uint64_t{1} << 34;
constexpr uint64_t kMaxItemBytes = uint64_t{1} << 24;
// Read granularity: the payload vector grows as bytes really arrive (from 4 KiB, doubling up to
// 16 MiB), so a damaged header that announces terabytes costs little before the short read is
// noticed.
constexpr size_t kFirstReadChunk = size_t{4} << 10;
constexpr size_t kReadChunk = size_t{16} << 20;
// Bytes read at a time (into a buffer on the stack) when the data past `limit` is only checked,
// not kept.
constexpr size_t kDiscardChunk = size_t{16} << 10;

struct IdxFile {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> payload;  // the first keep_items items only
};

// The content of one IDX file as zlib's gzread delivers it: bytes that start with the gzip magic
// (1f 8b) are inflated, member after member, and bytes after a member that do not start another
// are ignored; anything else is read as it is. A gzip stream that is cut short simply ends (its
// reader then finds the file truncated); a damaged one is CORRUPT.
class IdxStream {
 public:
  IdxStream(std::string_view bytes, std::string name) : rest_(bytes), name_(std::move(name)) {}
  ~IdxStream() {
    if (inflate_ready_) inflateEnd(&z_);
  }
  IdxStream(const IdxStream&) = delete;
  IdxStream& operator=(const IdxStream&) = delete;

  // Reads exactly `n` bytes into `dst` (nullptr: into a scratch buffer, discarding them).
  // CORRUPT naming `what` when the data ends first ("truncated") or the gzip stream is damaged.
  Status readExact(uint8_t* dst, uint64_t n, const char* what) {
    uint8_t scratch[kDiscardChunk];
    uint64_t done = 0;
    while (done < n) {
      const uint64_t want = std::min<uint64_t>(n - done, dst ? (1u << 30) : kDiscardChunk);
      size_t got = 0;
      FEDFLEET_RETURN_IF_ERROR(
          read(dst ? dst + done : scratch, static_cast<size_t>(want), what, &got));
      if (got == 0) {
        return corrupt(name_ + ": truncated while reading " + what + " (" + std::to_string(done) +
                       " of " + std::to_string(n) + " bytes)");
      }
      done += got;
    }
    return Status::ok();
  }

  // OK when no byte is left.
  Status expectEnd() {
    uint8_t extra[16];
    size_t got = 0;
    FEDFLEET_RETURN_IF_ERROR(read(extra, sizeof(extra), "end of file", &got));
    if (got > 0) return corrupt(name_ + ": longer than its header announces");
    return Status::ok();
  }

  Result<uint32_t> readBigEndian32(const char* what) {
    uint8_t b[4];
    FEDFLEET_RETURN_IF_ERROR(readExact(b, 4, what));
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
  }

 private:
  enum class Mode { kLook, kCopy, kInflate, kEnd };

  // Reads up to n bytes into dst, *got of them (fewer only at the end of the data).
  Status read(uint8_t* dst, size_t n, const char* what, size_t* got) {
    *got = 0;
    while (*got < n && mode_ != Mode::kEnd) {
      switch (mode_) {
        case Mode::kLook:
          FEDFLEET_RETURN_IF_ERROR(look(what));
          break;
        case Mode::kCopy: {
          const size_t m = std::min(n - *got, rest_.size());
          if (m > 0) std::memcpy(dst + *got, rest_.data(), m);
          rest_.remove_prefix(m);
          *got += m;
          if (rest_.empty()) mode_ = Mode::kEnd;
          break;
        }
        case Mode::kInflate:
          FEDFLEET_RETURN_IF_ERROR(inflateSome(dst, n, what, got));
          break;
        case Mode::kEnd:
          break;
      }
    }
    return Status::ok();
  }

  // At the start, and after each gzip member: another member, plain bytes, or the end.
  Status look(const char* what) {
    const bool gzip_magic = rest_.size() >= 2 && static_cast<unsigned char>(rest_[0]) == 0x1f &&
                            static_cast<unsigned char>(rest_[1]) == 0x8b;
    if (!gzip_magic) {
      // Plain bytes, unless a gzip member came first: then they are trailing garbage, which
      // gzread ignores.
      mode_ = (inflated_ || rest_.empty()) ? Mode::kEnd : Mode::kCopy;
      return Status::ok();
    }
    const int ret = inflate_ready_ ? inflateReset(&z_) : inflateInit2(&z_, 15 + 16);  // gzip
    if (ret != Z_OK) {
      return ret == Z_MEM_ERROR ? resourceExhausted(name_ + ": out of memory inflating " + what)
                                : internalError(name_ + ": zlib inflateInit2 failed");
    }
    inflate_ready_ = true;
    inflated_ = true;
    mode_ = Mode::kInflate;
    return Status::ok();
  }

  Status inflateSome(uint8_t* dst, size_t n, const char* what, size_t* got) {
    if (rest_.empty()) {  // cut short: gzread's "unexpected end of file" ends the data
      mode_ = Mode::kEnd;
      return Status::ok();
    }
    const uInt avail_in = static_cast<uInt>(std::min<size_t>(rest_.size(), 1u << 30));
    const uInt avail_out = static_cast<uInt>(std::min<size_t>(n - *got, 1u << 30));
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(rest_.data()));
    z_.avail_in = avail_in;
    z_.next_out = dst + *got;
    z_.avail_out = avail_out;
    const int ret = inflate(&z_, Z_NO_FLUSH);
    const size_t used = avail_in - z_.avail_in, made = avail_out - z_.avail_out;
    rest_.remove_prefix(used);
    *got += made;
    switch (ret) {
      case Z_OK:
        return Status::ok();
      case Z_STREAM_END:
        mode_ = Mode::kLook;
        return Status::ok();
      case Z_BUF_ERROR:  // no progress was possible although both buffers had room
        if (used == 0 && made == 0) return damaged(what, "no progress");
        return Status::ok();
      case Z_MEM_ERROR:
        return resourceExhausted(name_ + ": out of memory inflating " + what);
      default:  // Z_DATA_ERROR, Z_NEED_DICT, Z_STREAM_ERROR
        return damaged(what, z_.msg != nullptr ? z_.msg : "compressed data error");
    }
  }

  Status damaged(const char* what, const char* why) {
    return corrupt(name_ + ": damaged stream while reading " + what + ": " + why);
  }

  std::string_view rest_;  // input not consumed yet
  const std::string name_;
  Mode mode_ = Mode::kLook;
  bool inflated_ = false;       // a gzip member has been seen
  bool inflate_ready_ = false;  // z_ is initialised
  z_stream z_{};
};

// Reads an IDX file of uint8 data with `ndims` dimensions; keeps the first `keep_items` items
// (0 = all) of its payload, but reads and checks the rest.
Result<IdxFile> readIdx(std::string_view bytes, const std::string& name, uint32_t magic,
                        size_t ndims, size_t keep_items) {
  IdxStream reader(bytes, name);
  FEDFLEET_ASSIGN_OR_RETURN(const uint32_t got_magic, reader.readBigEndian32("magic number"));
  if (got_magic != magic) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), ": bad magic number 0x%08x (expected 0x%08x)", got_magic,
                  magic);
    return corrupt(name + buf);
  }
  IdxFile out;
  uint64_t item_bytes = 1;
  for (size_t d = 0; d < ndims; ++d) {
    FEDFLEET_ASSIGN_OR_RETURN(const uint32_t dim, reader.readBigEndian32("dimensions"));
    if (dim == 0) return corrupt(name + ": dimension " + std::to_string(d) + " is zero");
    out.dims.push_back(dim);
    if (d > 0) {
      item_bytes *= dim;
      if (item_bytes > kMaxItemBytes) return corrupt(name + ": absurd item size in header");
    }
  }
  const uint64_t count = out.dims[0];
  const uint64_t total = count * item_bytes;
  if (total > kMaxIdxPayloadBytes) return corrupt(name + ": absurd payload size in header");
  const uint64_t keep = (keep_items == 0 ? count : std::min<uint64_t>(count, keep_items));
  const uint64_t keep_bytes = keep * item_bytes;
  uint64_t done = 0;
  uint64_t chunk = kFirstReadChunk;
  while (done < keep_bytes) {
    const uint64_t n = std::min<uint64_t>(keep_bytes - done, chunk);
    out.payload.resize(static_cast<size_t>(done + n));
    FEDFLEET_RETURN_IF_ERROR(reader.readExact(out.payload.data() + done, n, "data"));
    done += n;
    chunk = std::min<uint64_t>(2 * chunk, kReadChunk);
  }
  FEDFLEET_RETURN_IF_ERROR(reader.readExact(nullptr, total - keep_bytes, "data"));
  FEDFLEET_RETURN_IF_ERROR(reader.expectEnd());
  return out;
}

// The whole content of the file at `path` (compressed or not: readIdx tells). kNotFound when it
// does not exist, kIoError when it cannot be read.
Result<std::string> readFileBytes(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) return notFound("IDX file not found: " + path);
  if (std::filesystem::is_directory(st)) return ioError("IDX path is a directory: " + path);
  auto bytes = readWholeFile(path);
  if (!bytes.isOk()) return Status(bytes.status().code(), "IDX file: " + bytes.status().message());
  return bytes;
}

// The data set of an images file and a labels file already read and checked.
Dataset assembleIdx(IdxFile images, IdxFile labels) {
  Dataset ds;
  ds.rows = images.dims[1];
  ds.cols = images.dims[2];
  ds.images = std::move(images.payload);
  ds.labels.assign(labels.payload.begin(), labels.payload.end());
  uint32_t max_label = 0;
  for (Label l : ds.labels) max_label = std::max<uint32_t>(max_label, l);
  ds.num_classes = std::max<uint32_t>(2, max_label + 1);
  return ds;
}

Status countMismatch(const IdxFile& images, const std::string& images_name, const IdxFile& labels,
                     const std::string& labels_name) {
  return corrupt(images_name + " holds " + std::to_string(images.dims[0]) + " images but " +
                 labels_name + " holds " + std::to_string(labels.dims[0]) + " labels");
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

Result<Dataset> parseIdx(std::string_view images, std::string_view labels, size_t limit,
                         const std::string& images_name, const std::string& labels_name) {
  try {
    FEDFLEET_ASSIGN_OR_RETURN(IdxFile label_file,
                              readIdx(labels, labels_name, kIdxLabelsMagic, 1, limit));
    FEDFLEET_ASSIGN_OR_RETURN(IdxFile image_file,
                              readIdx(images, images_name, kIdxImagesMagic, 3, limit));
    if (image_file.dims[0] != label_file.dims[0]) {
      return countMismatch(image_file, images_name, label_file, labels_name);
    }
    return assembleIdx(std::move(image_file), std::move(label_file));
  } catch (const std::bad_alloc&) {
    return resourceExhausted("out of memory parsing " + images_name);
  } catch (const std::exception& e) {
    return internalError("parsing " + images_name + ": " + e.what());
  }
}

Result<Dataset> loadIdx(const std::string& images_path, const std::string& labels_path,
                        size_t limit) {
  // File by file, labels first, as parseIdx checks them: each file's compressed bytes are held
  // only while its own payload is read.
  try {
    IdxFile label_file, image_file;
    {
      FEDFLEET_ASSIGN_OR_RETURN(const std::string bytes, readFileBytes(labels_path));
      FEDFLEET_ASSIGN_OR_RETURN(label_file, readIdx(bytes, labels_path, kIdxLabelsMagic, 1, limit));
    }
    {
      FEDFLEET_ASSIGN_OR_RETURN(const std::string bytes, readFileBytes(images_path));
      FEDFLEET_ASSIGN_OR_RETURN(image_file, readIdx(bytes, images_path, kIdxImagesMagic, 3, limit));
    }
    if (image_file.dims[0] != label_file.dims[0]) {
      return countMismatch(image_file, images_path, label_file, labels_path);
    }
    return assembleIdx(std::move(image_file), std::move(label_file));
  } catch (const std::bad_alloc&) {
    return resourceExhausted("out of memory loading " + images_path);
  } catch (const std::exception& e) {
    return internalError("loading " + images_path + ": " + e.what());
  }
}

Result<Dataset> loadFashionMnist(const std::string& dir, bool train, size_t limit) {
  const std::string base = dir.empty() ? std::string(".") : dir;
  auto ds =
      loadIdx(base + "/" + (train ? kFashionMnistTrainImages : kFashionMnistTestImages),
              base + "/" + (train ? kFashionMnistTrainLabels : kFashionMnistTestLabels), limit);
  if (!ds.isOk()) return ds;
  if (ds->num_classes > 10) {
    return corrupt("the Fashion-MNIST files in " + base + " hold a label above 9");
  }
  ds->num_classes = 10;  // also when a subset happens to miss the last classes
  return ds;
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
