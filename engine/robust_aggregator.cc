#include "engine/robust_aggregator.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/accumulate.h"

namespace fedfleet::engine {
namespace {

// The gather buffer (block x updates floats) stays within this, however many updates there are:
// the block shrinks for large rounds.
constexpr uint64_t kMaxGatherBytes = 64ull << 20;
// Up to this many updates a sorting network orders the values (vectorised over coordinates);
// beyond, std::nth_element per coordinate is cheaper.
constexpr size_t kMaxNetworkUpdates = 64;
// Coordinates the network sorts at a time: 64 rows of 512 floats (128 KiB) stay in L2.
constexpr size_t kNetworkSlice = 512;

std::string errnoText(int err) {
  if (err == ENOSPC) return "disk is full";
  return std::strerror(err);
}

// Writes all of buf at `offset`, retrying short writes; false with errno set on failure.
bool pwriteAll(int fd, const char* buf, size_t bytes, uint64_t offset) {
  while (bytes > 0) {
    ssize_t w = ::pwrite(fd, buf, bytes, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (w == 0) {
      errno = ENOSPC;
      return false;
    }
    buf += w;
    bytes -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return true;
}

// Reads all of buf from `offset`; false with errno set (EIO for an unexpected end of file).
bool preadAll(int fd, char* buf, size_t bytes, uint64_t offset) {
  while (bytes > 0) {
    ssize_t r = ::pread(fd, buf, bytes, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (r == 0) {
      errno = EIO;
      return false;
    }
    buf += r;
    bytes -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

// Values in ascending order summed in double, divided by their count, rounded once to fp32.
// Sorting first makes the result independent of the order of the updates.
float sortedMean(float* v, size_t m) {
  std::sort(v, v + m);
  double sum = 0.0;
  for (size_t i = 0; i < m; ++i) sum += v[i];
  return static_cast<float>(sum / static_cast<double>(m));
}

// The mean of the two middle values of an even count, in double, rounded once. (+ 0.0f turns
// a -0 into +0: which zero a median picks from {-0, +0, ...} would otherwise depend on the
// order of the updates and on the path; a sum from 0.0 is never -0.)
float middleMean(float lo, float hi) {
  return static_cast<float>(0.5 * (static_cast<double>(lo) + static_cast<double>(hi))) + 0.0f;
}

float median(float* v, size_t m) {
  const size_t k = m / 2;
  std::nth_element(v, v + k, v + m);
  const float hi = v[k];
  if (m % 2 == 1) return hi + 0.0f;
  return middleMean(*std::max_element(v, v + k), hi);  // everything before k is <= v[k]
}

struct Comparator {
  uint32_t lo, hi;
};

// Batcher's odd-even merge sort network for m inputs (the power-of-two network with the
// comparators that touch indices >= m left out, as if those were +infinity): m log^2 m / 4
// comparators, 63 for m = 20.
std::vector<Comparator> sortingNetwork(size_t m) {
  std::vector<Comparator> net;
  for (size_t p = 1; p < m; p <<= 1) {
    for (size_t k = p; k >= 1; k >>= 1) {
      for (size_t j = k % p; j + k < m; j += 2 * k) {
        for (size_t i = 0; i < k && i + j + k < m; ++i) {
          if ((i + j) / (2 * p) == (i + j + k) / (2 * p)) {
            net.push_back({static_cast<uint32_t>(i + j), static_cast<uint32_t>(i + j + k)});
          }
        }
      }
    }
  }
  return net;
}

// Sorts every column j < len of rows[u * stride + j] (u < m) ascending over u. The inputs are
// finite (add() rejects NaN), so min/max order them totally; only +0 and -0, equal, may both
// come out as the same zero, which is why the statistics below turn every zero into +0.
void sortColumns(float* rows, size_t stride, size_t len, const std::vector<Comparator>& net) {
  for (const Comparator& c : net) {
    float* __restrict a = rows + c.lo * stride;
    float* __restrict b = rows + c.hi * stride;
    for (size_t j = 0; j < len; ++j) {
      const float x = a[j], y = b[j];
      a[j] = std::min(x, y);  // std::min/max vectorise (minps/maxps); a ternary does not
      b[j] = std::max(x, y);
    }
  }
}

}  // namespace

Result<std::unique_ptr<RobustAggregator>> RobustAggregator::create(
    const RobustAggregatorOptions& options) {
  if (options.n_params == 0) {
    return invalidArgument("robust aggregation: n_params must be > 0");
  }
  if (options.block_elements == 0) {
    return invalidArgument("robust aggregation: block_elements must be > 0");
  }
  if (!std::isfinite(options.trim_fraction) || options.trim_fraction < 0.0 ||
      options.trim_fraction >= 0.5) {
    return invalidArgument("robust aggregation: trim_fraction must be in [0, 0.5), got " +
                           std::to_string(options.trim_fraction));
  }
  return std::unique_ptr<RobustAggregator>(new RobustAggregator(options));
}

RobustAggregator::~RobustAggregator() {
  if (fd_ >= 0) ::close(fd_);
}

Status RobustAggregator::openSpillFile() {
  std::string dir = options_.spill_dir;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = (tmp != nullptr && *tmp != '\0') ? tmp : "/tmp";
  }
  std::string path = dir + "/fedfleet-robust-XXXXXX";
  int fd = ::mkostemp(path.data(), O_CLOEXEC);
  if (fd < 0) {
    return ioError("robust aggregation: cannot create a spill file in '" + dir +
                   "': " + errnoText(errno));
  }
  ::unlink(path.c_str());  // it vanishes with the descriptor, whatever happens to the process
  fd_ = fd;
  return Status::ok();
}

Status RobustAggregator::add(const float* delta, size_t n) {
  if (n != options_.n_params) {
    return invalidArgument("robust aggregation: an update of " + std::to_string(n) +
                           " elements, the model has " + std::to_string(options_.n_params));
  }
  if (!kernels::allFinite(delta, n)) {
    return invalidArgument("robust aggregation: an update with a NaN or infinite value");
  }
  const uint64_t bytes = static_cast<uint64_t>(n) * sizeof(float);
  Stored s;
  if (memory_bytes_ + bytes <= options_.memory_bound_bytes) {
    s.values.assign(delta, delta + n);
    memory_bytes_ += bytes;
  } else {
    if (fd_ < 0) FEDFLEET_RETURN_IF_ERROR(openSpillFile());
    if (!pwriteAll(fd_, reinterpret_cast<const char*>(delta), bytes, spilled_bytes_)) {
      const int err = errno;
      // Take back whatever part was written, so the file ends where the last update does.
      if (::ftruncate(fd_, static_cast<off_t>(spilled_bytes_)) != 0) {
        // The file is then longer than spilled_bytes_; harmless, later updates overwrite it.
      }
      return ioError("robust aggregation: spilling an update of " + std::to_string(bytes) +
                     " bytes: " + errnoText(err));
    }
    s.file_pos = static_cast<int64_t>(spilled_bytes_);
    spilled_bytes_ += bytes;
  }
  updates_.push_back(std::move(s));
  return Status::ok();
}

size_t RobustAggregator::trimCount(size_t m) const {
  if (options_.kind == RobustKind::kMedian) return 0;
  // floor(beta m); the tiny epsilon keeps a decimal beta such as 0.29 from losing one to
  // rounding (0.29 * 100 is 28.999999999999996 in double).
  return static_cast<size_t>(std::floor(options_.trim_fraction * m + 1e-9));
}

bool RobustAggregator::useMedian(size_t m) const {
  // A trim that would leave nothing cannot happen with beta < 0.5; should it, the median.
  return options_.kind == RobustKind::kMedian || 2 * trimCount(m) >= m;
}

float RobustAggregator::statistic(float* v, size_t m) const {
  if (useMedian(m)) return median(v, m);
  const size_t t = trimCount(m);
  if (t == 0) return sortedMean(v, m);
  std::nth_element(v, v + t, v + m);            // [0, t): the t smallest
  std::nth_element(v + t, v + (m - t), v + m);  // [m - t, m): the t largest
  return sortedMean(v + t, m - 2 * t);
}

Status RobustAggregator::readBlock(size_t u, uint64_t begin, size_t len, float* dst) const {
  const Stored& s = updates_[u];
  if (s.file_pos < 0) {
    std::memcpy(dst, s.values.data() + begin, len * sizeof(float));
    return Status::ok();
  }
  const uint64_t at = static_cast<uint64_t>(s.file_pos) + begin * sizeof(float);
  if (!preadAll(fd_, reinterpret_cast<char*>(dst), len * sizeof(float), at)) {
    return ioError("robust aggregation: reading back a spilled update: " + errnoText(errno));
  }
  return Status::ok();
}

Status RobustAggregator::aggregate(float* out) {
  const size_t m = updates_.size();
  if (m == 0) return failedPrecondition("robust aggregation: no update to aggregate");
  const uint64_t n = options_.n_params;
  const size_t block = static_cast<size_t>(std::max<uint64_t>(
      1, std::min<uint64_t>(options_.block_elements, kMaxGatherBytes / (sizeof(float) * m))));
  const bool median_only = useMedian(m);
  const size_t t = trimCount(m);

  if (m <= kMaxNetworkUpdates) {
    // rows[u * block + j]: coordinate (begin + j) of update u. The sorting network orders every
    // column at once with element-wise min/max over whole rows (vectorised), a slice of
    // kNetworkSlice coordinates at a time so that the slice of all m rows stays in cache.
    const std::vector<Comparator> network = sortingNetwork(m);
    std::vector<float> rows(block * m);
    double sums[kNetworkSlice];
    for (uint64_t begin = 0; begin < n; begin += block) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(block, n - begin));
      for (size_t u = 0; u < m; ++u) {
        FEDFLEET_RETURN_IF_ERROR(readBlock(u, begin, len, rows.data() + u * block));
      }
      for (size_t slice = 0; slice < len; slice += kNetworkSlice) {
        const size_t sl = std::min(kNetworkSlice, len - slice);
        float* base = rows.data() + slice;
        sortColumns(base, block, sl, network);
        float* dst = out + begin + slice;
        if (median_only) {
          const float* hi = base + (m / 2) * block;
          if (m % 2 == 1) {
            for (size_t j = 0; j < sl; ++j) dst[j] = hi[j] + 0.0f;
          } else {
            const float* lo = base + (m / 2 - 1) * block;
            for (size_t j = 0; j < sl; ++j) dst[j] = middleMean(lo[j], hi[j]);
          }
        } else {
          // The kept values in ascending order, summed in double: as sortedMean does.
          std::fill(sums, sums + sl, 0.0);
          for (size_t k = t; k < m - t; ++k) {
            const float* row = base + k * block;
            for (size_t j = 0; j < sl; ++j) sums[j] += static_cast<double>(row[j]);
          }
          const double kept = static_cast<double>(m - 2 * t);
          for (size_t j = 0; j < sl; ++j) dst[j] = static_cast<float>(sums[j] / kept);
        }
      }
    }
    return Status::ok();
  }

  // Many updates: each coordinate's m values made contiguous (gather[j * m + u]), then
  // selected with std::nth_element, O(m) a coordinate instead of the network's O(m log^2 m).
  std::vector<float> gather(block * m);
  std::vector<float> staging(block);
  for (uint64_t begin = 0; begin < n; begin += block) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(block, n - begin));
    for (size_t u = 0; u < m; ++u) {
      FEDFLEET_RETURN_IF_ERROR(readBlock(u, begin, len, staging.data()));
      float* dst = gather.data() + u;
      for (size_t j = 0; j < len; ++j) dst[j * m] = staging[j];
    }
    for (size_t j = 0; j < len; ++j) out[begin + j] = statistic(gather.data() + j * m, m);
  }
  return Status::ok();
}

void RobustAggregator::clear() {
  updates_.clear();
  memory_bytes_ = 0;
  spilled_bytes_ = 0;
  if (fd_ >= 0 && ::ftruncate(fd_, 0) != 0) {
    ::close(fd_);  // a fresh file next time
    fd_ = -1;
  }
}

}  // namespace fedfleet::engine
