#include "common/compress/error_feedback.h"

#include <algorithm>

#include "common/check.h"
#include "kernels/convert.h"
#include "kernels/error_feedback.h"

namespace fedfleet::compress {
namespace {

// Per-thread scratch for p = x + r and its decoded value.
struct Scratch {
  std::vector<float> compensated;
  std::vector<float> decoded;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

const char* residualStorageName(ResidualStorage storage) {
  switch (storage) {
    case ResidualStorage::kFp32:
      return "fp32";
    case ResidualStorage::kBf16:
      return "bf16";
    case ResidualStorage::kFp16:
      return "fp16";
  }
  return "unknown";
}

Result<ResidualStorage> parseResidualStorage(std::string_view text) {
  if (text == "fp32") return ResidualStorage::kFp32;
  if (text == "bf16") return ResidualStorage::kBf16;
  if (text == "fp16") return ResidualStorage::kFp16;
  return invalidArgument("residual storage \"" + std::string(text) +
                         "\" is not one of fp32, bf16, fp16");
}

ErrorFeedback::ErrorFeedback(size_t n, ResidualStorage storage) : n_(n), storage_(storage) {}

size_t ErrorFeedback::memoryBytes() const {
  return fp32_.size() * sizeof(float) + half_.size() * sizeof(uint16_t);
}

void ErrorFeedback::allocate() {
  if (storage_ == ResidualStorage::kFp32) {
    if (fp32_.size() != n_) fp32_.assign(n_, 0.0f);
  } else if (half_.size() != n_) {
    half_.assign(n_, 0);  // +0 in both bf16 and fp16
  }
}

Status ErrorFeedback::encode(const Codec& codec, size_t offset, const float* x, size_t len,
                             uint64_t seed, std::string* out, size_t rows) {
  FEDFLEET_CHECK(offset <= n_ && len <= n_ - offset);
  allocate();
  Scratch& s = scratch();
  s.compensated.resize(len);
  s.decoded.resize(len);
  float* p = s.compensated.data();
  switch (storage_) {
    case ResidualStorage::kFp32:
      kernels::addResidualFp32(p, x, fp32_.data() + offset, len);
      break;
    case ResidualStorage::kBf16:
      kernels::addResidualBf16(p, x, half_.data() + offset, len);
      break;
    case ResidualStorage::kFp16:
      kernels::addResidualFp16(p, x, half_.data() + offset, len);
      break;
  }
  const size_t before = out->size();
  codec.encodeRows(p, len, rows, seed, out);
  const Status st = codec.decode(std::string_view(*out).substr(before), len, s.decoded.data());
  if (!st.isOk()) {
    out->resize(before);
    return invalidArgument("error feedback: update plus residual does not encode (" + st.message() +
                           ")");
  }
  switch (storage_) {
    case ResidualStorage::kFp32:
      kernels::storeResidualFp32(fp32_.data() + offset, p, s.decoded.data(), len);
      break;
    case ResidualStorage::kBf16:
      kernels::storeResidualBf16(half_.data() + offset, p, s.decoded.data(), len);
      break;
    case ResidualStorage::kFp16:
      kernels::storeResidualFp16(half_.data() + offset, p, s.decoded.data(), len);
      break;
  }
  return Status::ok();
}

void ErrorFeedback::residual(size_t offset, size_t len, float* out) const {
  FEDFLEET_CHECK(offset <= n_ && len <= n_ - offset);
  if (memoryBytes() == 0) {
    std::fill(out, out + len, 0.0f);
  } else if (storage_ == ResidualStorage::kFp32) {
    std::copy(fp32_.begin() + offset, fp32_.begin() + offset + len, out);
  } else if (storage_ == ResidualStorage::kBf16) {
    kernels::bf16ToFloat(half_.data() + offset, len, out);
  } else {
    kernels::fp16ToFloat(half_.data() + offset, len, out);
  }
}

void ErrorFeedback::reset() {
  std::vector<float>().swap(fp32_);
  std::vector<uint16_t>().swap(half_);
}

}  // namespace fedfleet::compress
