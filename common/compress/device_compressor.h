// DeviceCompressor: a codec's encoder, and error feedback, for an update that lives on a CUDA
// device, run on a stream of the compressor's own, so that a client training on a GPU ships
// only the compressed bytes across PCIe and leaves the host's cores to the uplink.
//
// Same bytes as the host: encode() appends exactly what Codec::encode appends for a host copy of
// the same values and seed, and encode() with a DeviceResidual exactly what ErrorFeedback::encode
// appends, leaving the same residual. That holds because every element-wise step runs the
// kernels of kernels/compress_cuda.h, which compute the CPU reference's bits, and the rest is
// host code shared with the CPU path:
//   none           the values copied down as they are
//   fp16, bf16     converted on the device, copied down
//   qsgd, sign     scales and levels / sign bits made on the device (seeded as on the host)
//   topk           threshold from a strided sample copied down, candidates selected on the
//                  device, their indices and values copied down; the exact trim to k (ties to
//                  the lower index) and the index coding on the host. The top k are a function
//                  of the values alone, so this is the host's selection; a threshold that
//                  passes fewer than k falls back to selecting over a host copy of the chunk
//   error feedback p = x + r on the device; the payload is decoded on the host by the decoder
//                  the coordinator runs, copied back up, and r = p - decoded on the device
// The residual path therefore moves the chunk up once more (4 bytes an element); the encoders
// alone move only the payload (and, for topk, the sample and the candidates) down.
//
// Streams: the compressor's stream does not synchronise with the legacy default stream, so
// whoever produced the input on another stream must have finished (for LibTorch:
// torch::cuda::synchronize() after the delta is computed) before encode() is called. Every call
// returns with its stream drained: the payload is complete and the host buffers reusable.
//
// Without CUDA (the build found no nvcc, or the runtime sees no device) available() is false and
// create() says so; nothing else may be called then.
//
// Not thread-safe: one owner thread (a client's upload pipeline encoder) uses a compressor and
// its residuals; the device is selected on that thread at every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/compress/codec.h"
#include "common/compress/error_feedback.h"
#include "common/status.h"

namespace fedfleet::compress {

// The error-feedback residual of one model, on the device: the host ErrorFeedback's twin (same
// storage kinds and rounding). Allocated (zero) on first use; freed by reset() and on
// destruction.
class DeviceResidual {
 public:
  DeviceResidual(size_t n, ResidualStorage storage, int device);
  ~DeviceResidual();
  DeviceResidual(const DeviceResidual&) = delete;
  DeviceResidual& operator=(const DeviceResidual&) = delete;

  size_t size() const { return n_; }
  ResidualStorage storage() const { return storage_; }
  int device() const { return device_; }
  // Device bytes held now: 0 until the first encode, then 4n (fp32) or 2n.
  size_t memoryBytes() const;
  // Copies the residual of [offset, offset + len) to out (as fp32; zeros before the first
  // encode). UNAVAILABLE / INTERNAL on a CUDA error.
  Status residual(size_t offset, size_t len, float* out) const;
  // Zero again; the device memory is freed.
  void reset();

 private:
  friend class DeviceCompressor;
  Status allocate(void* stream);

  size_t n_;
  ResidualStorage storage_;
  int device_;
  void* data_ = nullptr;  // n floats (fp32) or n uint16 (bf16, fp16), device memory
};

class DeviceCompressor {
 public:
  // True when this build has the CUDA kernels and the runtime sees at least one device.
  static bool available();
  // A compressor on `device` (a CUDA device index) with a new non-blocking stream.
  // UNAVAILABLE when !available() or the device cannot be used (CUDA's message included).
  static Result<std::unique_ptr<DeviceCompressor>> create(int device);

  ~DeviceCompressor();
  DeviceCompressor(const DeviceCompressor&) = delete;
  DeviceCompressor& operator=(const DeviceCompressor&) = delete;

  int device() const { return device_; }

  // How many of x[0, n) (device memory) are NaN or infinite.
  Result<uint64_t> countNonFinite(const float* x, size_t n);

  // Appends to *out codec.encode(x[0, n)) for device memory x (see the header's comment).
  // x must be finite, as for Codec::encode. INTERNAL on a CUDA error (*out then as before);
  // INVALID_ARGUMENT for a codec not encoded on a GPU (encodesOnDevice false: lowrank).
  Status encode(const Codec& codec, const float* x, size_t n, uint64_t seed, std::string* out);

  // ErrorFeedback::encode with the residual on the device: appends the payload of
  // codec.encode(x + r) for the elements [offset, offset + len) (x points at element `offset`'s
  // value, on the device) and sets their residual to (x + r) - decoded. INVALID_ARGUMENT when
  // x + r is not finite, INTERNAL on a CUDA error; either way *out and the residual are left as
  // they were. The residual must be on this compressor's device; offset + len <= size()
  // (checked: a violation aborts).
  Status encode(const Codec& codec, DeviceResidual* residual, size_t offset, const float* x,
                size_t len, uint64_t seed, std::string* out);

 private:
  explicit DeviceCompressor(int device) : device_(device) {}
  // Device scratch of at least `bytes` in slot `slot` (grown, never shrunk).
  Result<void*> scratch(size_t slot, size_t bytes);
  Status selectTopK(const float* x, size_t n, size_t k, std::vector<uint32_t>* idx,
                    std::vector<float>* values);

  int device_;
  void* stream_ = nullptr;
  struct Buffer {
    void* data = nullptr;
    size_t bytes = 0;
  };
  std::vector<Buffer> scratch_;
  std::vector<float> host_floats_;  // decoded chunk, sample, fallback copy
  std::vector<uint32_t> host_keys_;
  std::vector<uint32_t> host_idx_;
};

}  // namespace fedfleet::compress
