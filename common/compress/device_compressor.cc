#include "common/compress/device_compressor.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string_view>

#include "common/check.h"
#include "kernels/convert.h"
#include "kernels/quantize.h"
#include "kernels/sparse.h"

#if FEDFLEET_HAVE_CUDA
#include "kernels/accumulate_cuda.h"
#include "kernels/compress_cuda.h"
#endif

namespace fedfleet::compress {

#if FEDFLEET_HAVE_CUDA
namespace {

namespace cuda = kernels::cuda;

// A failed runtime call (its message in `error`).
Status cudaFailed(const std::string& error) { return internalError("CUDA: " + error); }
// A failed launch (its cudaError_t code).
Status launchFailed(const char* what, int code) {
  return internalError(std::string("CUDA: ") + what + ": " + cuda::errorString(code));
}

// Calls fn(args..., &error), a kernels::cuda runtime wrapper; returns INTERNAL when it fails.
#define FEDFLEET_CUDA_CALL(fn, ...)                                     \
  do {                                                                  \
    std::string cuda_error_;                                            \
    if (!fn(__VA_ARGS__, &cuda_error_)) return cudaFailed(cuda_error_); \
  } while (0)
// Evaluates a kernel launch (0 or a cudaError_t code); returns INTERNAL when it failed.
#define FEDFLEET_CUDA_LAUNCH(what, call)                        \
  do {                                                          \
    const int cuda_code_ = (call);                              \
    if (cuda_code_ != 0) return launchFailed(what, cuda_code_); \
  } while (0)

unsigned char* grow(std::string* out, size_t bytes) {
  const size_t at = out->size();
  out->resize(at + bytes);
  return reinterpret_cast<unsigned char*>(out->data()) + at;
}

size_t residualElementBytes(ResidualStorage s) { return s == ResidualStorage::kFp32 ? 4 : 2; }

// Scratch slots of a compressor.
enum Slot : size_t { kBody, kIndices, kCount, kCompensated, kDecoded, kSlots };

}  // namespace

bool DeviceCompressor::available() { return cuda::deviceAvailable(); }

Result<std::unique_ptr<DeviceCompressor>> DeviceCompressor::create(int device) {
  if (!available()) return unavailable("compress on the GPU: the CUDA runtime sees no device");
  std::unique_ptr<DeviceCompressor> c(new DeviceCompressor(device));
  std::string error;
  if (!cuda::setDevice(device, &error) || !cuda::streamCreate(&c->stream_, &error)) {
    return unavailable("compress on the GPU: device " + std::to_string(device) + ": " + error);
  }
  c->scratch_.resize(kSlots);
  return c;
}

DeviceCompressor::~DeviceCompressor() {
  std::string error;  // nothing to do about a failure while tearing down
  if (stream_ == nullptr) return;
  cuda::setDevice(device_, &error);
  cuda::streamSynchronize(stream_, &error);
  for (Buffer& b : scratch_) {
    if (b.data != nullptr) cuda::deviceFree(b.data, &error);
  }
  cuda::streamDestroy(stream_, &error);
}

Result<void*> DeviceCompressor::scratch(size_t slot, size_t bytes) {
  Buffer& b = scratch_[slot];
  if (b.bytes < bytes) {
    const size_t want = std::max(bytes, b.bytes + b.bytes / 2);
    std::string error;
    if (b.data != nullptr) {
      // The stream may still read the old buffer.
      if (!cuda::streamSynchronize(stream_, &error) || !cuda::deviceFree(b.data, &error)) {
        return cudaFailed(error);
      }
      b = Buffer{};
    }
    if (!cuda::deviceAlloc(&b.data, want, &error)) return cudaFailed(error);
    b.bytes = want;
  }
  return b.data;
}

Result<uint64_t> DeviceCompressor::countNonFinite(const float* x, size_t n) {
  FEDFLEET_CUDA_CALL(cuda::setDevice, device_);
  FEDFLEET_ASSIGN_OR_RETURN(void* count, scratch(kCount, sizeof(unsigned long long)));
  auto* d_count = static_cast<unsigned long long*>(count);
  // magnitudeKey orders NaN above infinity: the elements at or above +inf are the non-finite.
  FEDFLEET_CUDA_LAUNCH(
      "count non-finite",
      cuda::countAtLeastDevice(x, n, std::numeric_limits<float>::infinity(), d_count, stream_));
  unsigned long long host = 0;
  FEDFLEET_CUDA_CALL(cuda::copyToHostAsync, &host, d_count, sizeof(host), stream_);
  FEDFLEET_CUDA_CALL(cuda::streamSynchronize, stream_);
  return static_cast<uint64_t>(host);
}

Status DeviceCompressor::selectTopK(const float* x, size_t n, size_t k, std::vector<uint32_t>* idx,
                                    std::vector<float>* values) {
  idx->clear();
  values->clear();
  if (k == 0) return Status::ok();
  size_t count = 0;
  const size_t m = std::max<size_t>(1024, n / 100);
  if (k < n && m < n / 4) {
    // The threshold, as compress::selectTopK estimates it, from m magnitudes taken every
    // n / m elements (one strided copy; the selection below is exact whatever the sample).
    const size_t stride = n / m;
    host_floats_.resize(m);
    FEDFLEET_CUDA_CALL(cuda::copyStridedToHostAsync, host_floats_.data(), x, m, stride, stream_);
    FEDFLEET_CUDA_CALL(cuda::streamSynchronize, stream_);
    host_keys_.resize(m);
    for (size_t j = 0; j < m; ++j) host_keys_[j] = kernels::magnitudeKey(host_floats_[j]);
    const double expected =
        static_cast<double>(m) * static_cast<double>(k) / static_cast<double>(n);
    const size_t r =
        std::min(m - 1, static_cast<size_t>(expected + 4.0 * std::sqrt(expected) + 4.0));
    std::nth_element(host_keys_.begin(), host_keys_.begin() + r, host_keys_.end(),
                     std::greater<uint32_t>());
    const float threshold = std::bit_cast<float>(host_keys_[r]);
    const double want =
        (static_cast<double>(r) + 1.0) * static_cast<double>(n) / static_cast<double>(m);
    size_t capacity = std::min(n, static_cast<size_t>(want * 1.5) + 64);
    FEDFLEET_ASSIGN_OR_RETURN(void* count_buf, scratch(kCount, sizeof(unsigned long long)));
    auto* d_count = static_cast<unsigned long long*>(count_buf);
    for (int attempt = 0; attempt < 2; ++attempt) {
      FEDFLEET_ASSIGN_OR_RETURN(void* d_idx, scratch(kIndices, capacity * sizeof(uint32_t)));
      FEDFLEET_CUDA_LAUNCH("top-k select",
                           cuda::selectAtLeastDevice(x, n, threshold, static_cast<uint32_t*>(d_idx),
                                                     capacity, d_count, stream_));
      unsigned long long total = 0;
      FEDFLEET_CUDA_CALL(cuda::copyToHostAsync, &total, d_count, sizeof(total), stream_);
      FEDFLEET_CUDA_CALL(cuda::streamSynchronize, stream_);
      count = static_cast<size_t>(total);
      if (count <= capacity) break;
      capacity = count;  // every candidate fits the second time
    }
    if (count > capacity) {
      return internalError("top-k on the GPU: the candidate count changed between two passes");
    }
    if (count >= k) {
      FEDFLEET_ASSIGN_OR_RETURN(void* d_idx, scratch(kIndices, capacity * sizeof(uint32_t)));
      FEDFLEET_ASSIGN_OR_RETURN(void* d_vals, scratch(kBody, count * sizeof(float)));
      FEDFLEET_CUDA_LAUNCH("top-k gather",
                           cuda::gatherDevice(x, static_cast<const uint32_t*>(d_idx), count,
                                              static_cast<float*>(d_vals), stream_));
      host_idx_.resize(count);
      host_floats_.resize(count);
      FEDFLEET_CUDA_CALL(cuda::copyToHostAsync, host_idx_.data(), d_idx, count * sizeof(uint32_t),
                         stream_);
      FEDFLEET_CUDA_CALL(cuda::copyToHostAsync, host_floats_.data(), d_vals, count * sizeof(float),
                         stream_);
      FEDFLEET_CUDA_CALL(cuda::streamSynchronize, stream_);
    }
  }
  if (count < k) {
    // No estimate (small n) or too few passed: select over a host copy, as the host codec does.
    host_floats_.resize(n);
    FEDFLEET_CUDA_CALL(cuda::copyToHostAsync, host_floats_.data(), x, n * sizeof(float), stream_);
    FEDFLEET_CUDA_CALL(cuda::streamSynchronize, stream_);
    compress::selectTopK(host_floats_.data(), n, k, 0, idx);
    values->resize(k);
    for (size_t j = 0; j < k; ++j) (*values)[j] = host_floats_[(*idx)[j]];
    return Status::ok();
  }
  trimToTopK(host_idx_.data(), host_floats_.data(), count, k, idx, values);
  return Status::ok();
}

Status DeviceCompressor::encode(const Codec& codec, const float* x, size_t n, uint64_t seed,
                                std::string* out) {
  FEDFLEET_CHECK_MSG(n <= kMaxPayloadElements, "encode more than 2^32 - 1 elements in chunks");
  if (!encodesOnDevice(codec.spec())) {
    return invalidArgument("codec " + toString(codec.spec()) +
                           " is not encoded on a GPU: compress the update on the host");
  }
  FEDFLEET_CUDA_CALL(cuda::setDevice, device_);
  const CodecSpec& spec = codec.spec();
  const size_t before = out->size();
  // Runs `body` (which appends to *out); on failure *out is restored.
  const auto guarded = [&](auto&& body) -> Status {
    Status st = body();
    if (!st.isOk()) out->resize(before);
    return st;
  };
  PayloadHeader h;
  h.n = static_cast<uint32_t>(n);
  if (spec.name == "none") {
    return guarded([&]() -> Status {
      appendPayloadHeader(h, out);
      unsigned char* body = grow(out, 4 * n);
      FEDFLEET_CUDA_CALL(cuda::copyToHostAsync, body, x, 4 * n, stream_);
      FEDFLEET_CUDA_CALL(cuda::streamSynchronize, stream_);
      return Status::ok();
    });
  }
  if (spec.name == "fp16" || spec.name == "bf16") {
    const bool fp16 = spec.name == "fp16";
    h.kind = fp16 ? CodecKind::kFp16 : CodecKind::kBf16;
    return guarded([&]() -> Status {
      FEDFLEET_ASSIGN_OR_RETURN(void* d_body, scratch(kBody, 2 * n));
      FEDFLEET_CUDA_LAUNCH("convert", fp16 ? cuda::floatToFp16Device(x, n, d_body, stream_)
                                           : cuda::floatToBf16Device(x, n, d_body, stream_));
      appendPayloadHeader(h, out);
      unsigned char* body = grow(out, 2 * n);
      FEDFLEET_CUDA_CALL(cuda::copyToHostAsync, body, d_body, 2 * n, stream_);
      FEDFLEET_CUDA_CALL(cuda::streamSynchronize, stream_);
      return Status::ok();
    });
  }
  if (spec.name == "qsgd" || spec.name == "sign") {
    const bool qsgd = spec.name == "qsgd";
    h.kind = qsgd ? CodecKind::kQsgd : CodecKind::kSign;
    h.bits = qsgd ? spec.bits : 0;
    h.param = spec.bucket;
    const size_t scale_bytes = 4 * kernels::bucketCount(n, spec.bucket);
    const size_t body_bytes =
        scale_bytes + (qsgd ? kernels::qsgdLevelBytes(n, spec.bits) : kernels::signBytes(n));
    return guarded([&]() -> Status {
      FEDFLEET_ASSIGN_OR_RETURN(void* d_body, scratch(kBody, body_bytes));
      auto* d_bytes = static_cast<unsigned char*>(d_body);
      if (qsgd) {
        FEDFLEET_CUDA_LAUNCH("qsgd quantise",
                             cuda::qsgdQuantizeDevice(x, n, spec.bits, spec.bucket, seed, d_bytes,
                                                      d_bytes + scale_bytes, stream_));
      } else {
        FEDFLEET_CUDA_LAUNCH(
            "sign quantise",
            cuda::signQuantizeDevice(x, n, spec.bucket, d_bytes, d_bytes + scale_bytes, stream_));
      }
      appendPayloadHeader(h, out);
      unsigned char* body = grow(out, body_bytes);
      FEDFLEET_CUDA_CALL(cuda::copyToHostAsync, body, d_body, body_bytes, stream_);
      FEDFLEET_CUDA_CALL(cuda::streamSynchronize, stream_);
      return Status::ok();
    });
  }
  FEDFLEET_CHECK_MSG(spec.name == "topk", "unknown codec");
  const size_t k = topkCount(n, spec.ratio);
  std::vector<uint32_t> idx;
  std::vector<float> values;
  FEDFLEET_RETURN_IF_ERROR(selectTopK(x, n, k, &idx, &values));
  h.kind = CodecKind::kTopk;
  h.param = static_cast<uint32_t>(k);
  appendPayloadHeader(h, out);
  kernels::floatToFp16(values.data(), k, grow(out, 2 * k));
  appendTopkIndices(idx.data(), k, out);
  return Status::ok();
}

Status DeviceCompressor::encode(const Codec& codec, DeviceResidual* residual, size_t offset,
                                const float* x, size_t len, uint64_t seed, std::string* out) {
  FEDFLEET_CHECK(residual != nullptr && residual->device() == device_);
  FEDFLEET_CHECK(offset <= residual->size() && len <= residual->size() - offset);
  if (!encodesOnDevice(codec.spec())) {
    return invalidArgument("codec " + toString(codec.spec()) +
                           " is not encoded on a GPU: compress the update on the host");
  }
  FEDFLEET_CUDA_CALL(cuda::setDevice, device_);
  FEDFLEET_RETURN_IF_ERROR(residual->allocate(stream_));
  const size_t eb = residualElementBytes(residual->storage());
  void* r = static_cast<unsigned char*>(residual->data_) + offset * eb;
  FEDFLEET_ASSIGN_OR_RETURN(void* p_buf, scratch(kCompensated, len * sizeof(float)));
  auto* p = static_cast<float*>(p_buf);
  switch (residual->storage()) {
    case ResidualStorage::kFp32:
      FEDFLEET_CUDA_LAUNCH("add residual", cuda::addResidualFp32Device(
                                               p, x, static_cast<const float*>(r), len, stream_));
      break;
    case ResidualStorage::kBf16:
      FEDFLEET_CUDA_LAUNCH(
          "add residual",
          cuda::addResidualBf16Device(p, x, static_cast<const uint16_t*>(r), len, stream_));
      break;
    case ResidualStorage::kFp16:
      FEDFLEET_CUDA_LAUNCH(
          "add residual",
          cuda::addResidualFp16Device(p, x, static_cast<const uint16_t*>(r), len, stream_));
      break;
  }
  const size_t before = out->size();
  FEDFLEET_RETURN_IF_ERROR(encode(codec, p, len, seed, out));
  // The decoded values, by the coordinator's decoder, back on the device.
  host_floats_.resize(len);
  const Status st = codec.decode(std::string_view(*out).substr(before), len, host_floats_.data());
  if (!st.isOk()) {
    out->resize(before);
    return invalidArgument("error feedback: update plus residual does not encode (" + st.message() +
                           ")");
  }
  const auto restore = [&](Status failed) {
    out->resize(before);
    return failed;
  };
  auto decoded_buf = scratch(kDecoded, len * sizeof(float));
  if (!decoded_buf.isOk()) return restore(decoded_buf.status());
  auto* d = static_cast<float*>(*decoded_buf);
  std::string error;
  if (!cuda::copyToDeviceAsync(d, host_floats_.data(), len * sizeof(float), stream_, &error)) {
    return restore(cudaFailed(error));
  }
  int code = 0;
  switch (residual->storage()) {
    case ResidualStorage::kFp32:
      code = cuda::storeResidualFp32Device(static_cast<float*>(r), p, d, len, stream_);
      break;
    case ResidualStorage::kBf16:
      code = cuda::storeResidualBf16Device(static_cast<uint16_t*>(r), p, d, len, stream_);
      break;
    case ResidualStorage::kFp16:
      code = cuda::storeResidualFp16Device(static_cast<uint16_t*>(r), p, d, len, stream_);
      break;
  }
  if (code != 0) return restore(launchFailed("store residual", code));
  if (!cuda::streamSynchronize(stream_, &error)) return restore(cudaFailed(error));
  return Status::ok();
}

DeviceResidual::DeviceResidual(size_t n, ResidualStorage storage, int device)
    : n_(n), storage_(storage), device_(device) {}

DeviceResidual::~DeviceResidual() { reset(); }

size_t DeviceResidual::memoryBytes() const {
  return data_ == nullptr ? 0 : n_ * residualElementBytes(storage_);
}

Status DeviceResidual::allocate(void* stream) {
  if (data_ != nullptr) return Status::ok();
  const size_t bytes = n_ * residualElementBytes(storage_);
  std::string error;
  if (!cuda::deviceAlloc(&data_, bytes, &error)) {
    data_ = nullptr;
    return cudaFailed(error);
  }
  // +0 in fp32, bf16 and fp16 alike.
  if (!cuda::memsetAsync(data_, 0, bytes, stream, &error)) return cudaFailed(error);
  return Status::ok();
}

Status DeviceResidual::residual(size_t offset, size_t len, float* out) const {
  FEDFLEET_CHECK(offset <= n_ && len <= n_ - offset);
  if (data_ == nullptr) {
    std::fill(out, out + len, 0.0f);
    return Status::ok();
  }
  FEDFLEET_CUDA_CALL(cuda::setDevice, device_);
  const size_t eb = residualElementBytes(storage_);
  const auto* src = static_cast<const unsigned char*>(data_) + offset * eb;
  if (storage_ == ResidualStorage::kFp32) {
    FEDFLEET_CUDA_CALL(cuda::copyToHost, out, src, len * eb);
    return Status::ok();
  }
  std::vector<uint16_t> half(len);
  FEDFLEET_CUDA_CALL(cuda::copyToHost, half.data(), src, len * eb);
  if (storage_ == ResidualStorage::kBf16) {
    kernels::bf16ToFloat(half.data(), len, out);
  } else {
    kernels::fp16ToFloat(half.data(), len, out);
  }
  return Status::ok();
}

void DeviceResidual::reset() {
  if (data_ == nullptr) return;
  std::string error;  // a failure to free leaks at worst
  cuda::setDevice(device_, &error);
  cuda::deviceSynchronize(&error);  // no stream may still use it
  cuda::deviceFree(data_, &error);
  data_ = nullptr;
}

#else  // !FEDFLEET_HAVE_CUDA: nothing to run on.

bool DeviceCompressor::available() { return false; }

Result<std::unique_ptr<DeviceCompressor>> DeviceCompressor::create(int device) {
  return unavailable("compress on the GPU: this build has no CUDA kernels (nvcc was not found)");
}

DeviceCompressor::~DeviceCompressor() = default;

Result<void*> DeviceCompressor::scratch(size_t, size_t) { return unavailable("no CUDA"); }

Result<uint64_t> DeviceCompressor::countNonFinite(const float*, size_t) {
  return unavailable("no CUDA");
}

Status DeviceCompressor::selectTopK(const float*, size_t, size_t, std::vector<uint32_t>*,
                                    std::vector<float>*) {
  return unavailable("no CUDA");
}

Status DeviceCompressor::encode(const Codec&, const float*, size_t, uint64_t, std::string*) {
  return unavailable("no CUDA");
}

Status DeviceCompressor::encode(const Codec&, DeviceResidual*, size_t, const float*, size_t,
                                uint64_t, std::string*) {
  return unavailable("no CUDA");
}

DeviceResidual::DeviceResidual(size_t n, ResidualStorage storage, int device)
    : n_(n), storage_(storage), device_(device) {}
DeviceResidual::~DeviceResidual() = default;
size_t DeviceResidual::memoryBytes() const { return 0; }
Status DeviceResidual::allocate(void*) { return unavailable("no CUDA"); }
Status DeviceResidual::residual(size_t offset, size_t len, float* out) const {
  FEDFLEET_CHECK(offset <= n_ && len <= n_ - offset);
  std::fill(out, out + len, 0.0f);
  return Status::ok();
}
void DeviceResidual::reset() {}

#endif

}  // namespace fedfleet::compress
