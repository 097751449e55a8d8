#include "client/control_variate.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/crypto/sha256.h"
#include "kernels/convert.h"

namespace fedfleet::client {
namespace {

static_assert(std::endian::native == std::endian::little, "the file format is little endian");

constexpr char kMagic[8] = {'F', 'F', 'C', 'T', 'L', 'V', '0', '1'};
constexpr size_t kHeaderBytes = sizeof(kMagic) + sizeof(uint64_t);
constexpr size_t kDigestBytes = 32;
// Half-precision values are converted through a float buffer of this many elements.
constexpr size_t kBlock = 1024;

void toFloat(compress::ResidualStorage storage, const uint16_t* in, size_t n, float* out) {
  if (storage == compress::ResidualStorage::kBf16) {
    kernels::bf16ToFloat(in, n, out);
  } else {
    kernels::fp16ToFloat(in, n, out);
  }
}

void fromFloat(compress::ResidualStorage storage, const float* in, size_t n, uint16_t* out) {
  if (storage == compress::ResidualStorage::kBf16) {
    kernels::floatToBf16(in, n, out);
  } else {
    kernels::floatToFp16(in, n, out);
  }
}

}  // namespace

ControlVariate::ControlVariate(size_t n, compress::ResidualStorage storage)
    : n_(n), storage_(storage) {}

size_t ControlVariate::memoryBytes() const {
  return fp32_.size() * sizeof(float) + half_.size() * sizeof(uint16_t);
}

std::vector<float> ControlVariate::values() const {
  std::vector<float> out(n_);
  values(0, n_, out.data());
  return out;
}

void ControlVariate::values(size_t offset, size_t len, float* out) const {
  FEDFLEET_CHECK_MSG(offset <= n_ && len <= n_ - offset, "control variate range out of bounds");
  if (!allocated()) {
    std::fill_n(out, len, 0.0f);
  } else if (storage_ == compress::ResidualStorage::kFp32) {
    std::copy_n(fp32_.data() + offset, len, out);
  } else {
    toFloat(storage_, half_.data() + offset, len, out);
  }
}

void ControlVariate::apply(const std::vector<float>& delta) { apply(delta.data(), delta.size()); }

void ControlVariate::apply(const float* delta, size_t n) {
  FEDFLEET_CHECK_MSG(n == n_, "control delta of another size than the control variate");
  if (storage_ == compress::ResidualStorage::kFp32) {
    if (fp32_.size() != n_) fp32_.assign(n_, 0.0f);
    for (size_t i = 0; i < n; ++i) fp32_[i] += delta[i];
    return;
  }
  if (half_.size() != n_) half_.assign(n_, 0);  // +0 in both bf16 and fp16
  float buf[kBlock];
  for (size_t lo = 0; lo < n; lo += kBlock) {
    const size_t len = std::min(kBlock, n - lo);
    toFloat(storage_, half_.data() + lo, len, buf);
    for (size_t i = 0; i < len; ++i) buf[i] += delta[lo + i];
    fromFloat(storage_, buf, len, half_.data() + lo);
  }
}

void ControlVariate::reset(size_t n) {
  n_ = n;
  std::vector<float>().swap(fp32_);
  std::vector<uint16_t>().swap(half_);
}

Status ControlVariate::save(const std::string& path) const {
  std::string bytes(kHeaderBytes + n_ * sizeof(float), '\0');
  std::memcpy(bytes.data(), kMagic, sizeof(kMagic));
  const uint64_t n = n_;
  std::memcpy(bytes.data() + sizeof(kMagic), &n, sizeof(n));
  float* out = reinterpret_cast<float*>(bytes.data() + kHeaderBytes);  // 16: float aligned
  values(0, n_, out);
  const crypto::Digest digest = crypto::sha256(bytes);
  bytes.append(reinterpret_cast<const char*>(digest.data()), digest.size());

  return writeFileAtomically(path, bytes);
}

Result<ControlVariate> ControlVariate::load(const std::string& path,
                                            compress::ResidualStorage storage) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) return notFound(path + " not found");
    return ioError("cannot open " + path + ": " + std::strerror(errno));
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return ioError("cannot read " + path);
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return corrupt(path + " is not a control variate file (no FFCTLV01 header)");
  }
  if (bytes.size() < kHeaderBytes + kDigestBytes) {
    return corrupt(path + " is truncated (" + std::to_string(bytes.size()) + " bytes)");
  }
  uint64_t n = 0;
  std::memcpy(&n, bytes.data() + sizeof(kMagic), sizeof(n));
  const uint64_t body = bytes.size() - kHeaderBytes - kDigestBytes;
  if (body % sizeof(float) != 0 || n != body / sizeof(float)) {
    return corrupt(path + " announces " + std::to_string(n) + " values but holds " +
                   std::to_string(body) + " bytes of them");
  }
  const size_t signed_bytes = bytes.size() - kDigestBytes;
  const crypto::Digest digest = crypto::sha256(bytes.data(), signed_bytes);
  if (std::memcmp(digest.data(), bytes.data() + signed_bytes, kDigestBytes) != 0) {
    return corrupt(path + ": checksum mismatch");
  }
  std::vector<float> values(n);
  std::memcpy(values.data(), bytes.data() + kHeaderBytes, n * sizeof(float));
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return corrupt(path + ": value " + std::to_string(i) + " is not finite");
    }
  }
  ControlVariate cv(n, storage);
  if (std::any_of(values.begin(), values.end(), [](float v) { return v != 0; })) cv.apply(values);
  return cv;
}

ControlVariate ControlVariate::loadOrZeros(const std::string& path, size_t n,
                                           compress::ResidualStorage storage) {
  if (path.empty()) return ControlVariate(n, storage);
  Result<ControlVariate> loaded = load(path, storage);
  if (loaded.isOk() && loaded->size() == n) {
    spdlog::info("SCAFFOLD control variate: {} values from {}", n, path);
    return std::move(loaded).value();
  }
  if (loaded.isOk()) {
    spdlog::warn(
        "SCAFFOLD control variate file {} holds {} values, the model has {}: starting "
        "from zero",
        path, loaded->size(), n);
  } else if (loaded.status().code() == StatusCode::kNotFound) {
    spdlog::info("SCAFFOLD control variate: no file {} yet, starting from zero", path);
  } else {
    spdlog::warn("SCAFFOLD control variate file {} unusable ({}): starting from zero", path,
                 loaded.status().toString());
  }
  return ControlVariate(n, storage);
}

}  // namespace fedfleet::client
