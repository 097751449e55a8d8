// CUDA versions of the compression kernels (kernels/convert.h, quantize.h, sparse.h,
// error_feedback.h), for a client that compresses on its GPU and a coordinator that keeps its
// running sum there. Each computes exactly what its CPU reference computes, bit for bit (the
// shared scalar code of kernels/scalar.h, one rounding per operation, --fmad=false), except
// selectAtLeastDevice, whose output order is unspecified (sort it to compare).
//
// Host-only header (no CUDA types), implemented in kernels/compress.cu in the
// fedfleet_kernels_cuda target, like kernels/accumulate_cuda.h, whose deviceAvailable() and
// errorString() apply here too. Include it under `#if FEDFLEET_HAVE_CUDA`.
//
// Device functions take device pointers, enqueue on `stream` (a cudaStream_t; nullptr is the
// default stream) and return without waiting: 0 when the launch was accepted, else the
// cudaError_t value (cudaErrorInvalidValue for a null pointer with a non-zero length, or a bad
// shape). Faults show on the stream's next synchronising call. Packed buffers must be
// naturally aligned on the device: 4 bytes for scales, 2 for fp16/bf16 values; a payload copied
// whole to a 4-byte-aligned device address satisfies that (its 12-byte header keeps the body
// aligned). Shapes are those of the CPU kernels: bits 8 or 4, bucket a positive multiple of 8.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fedfleet::kernels::cuda {

// --- device memory for callers without CUDA headers (tests, tools) ---------------------------
// Each returns true on success, else false with the failing call and CUDA's message in *error
// (when not null).
bool deviceAlloc(void** ptr, size_t bytes, std::string* error);
bool deviceFree(void* ptr, std::string* error);
bool copyToDevice(void* device_dst, const void* host_src, size_t bytes, std::string* error);
bool copyToHost(void* host_dst, const void* device_src, size_t bytes, std::string* error);
bool deviceSynchronize(std::string* error);

// --- streams and asynchronous copies -----------------------------------------------------------
// The device the calling thread's CUDA calls go to (the current device is per host thread).
bool setDevice(int device, std::string* error);
// A new stream that does not synchronise with the legacy default stream (cudaStreamNonBlocking):
// its work overlaps whatever else runs on the device; order it against other streams explicitly.
bool streamCreate(void** stream, std::string* error);
bool streamDestroy(void* stream, std::string* error);
bool streamSynchronize(void* stream, std::string* error);
// Enqueued on `stream`; a pageable host buffer makes the copy synchronous with the host, a
// pinned one does not, so wait on the stream before reading or reusing the host side.
bool copyToHostAsync(void* host_dst, const void* device_src, size_t bytes, void* stream,
                     std::string* error);
bool copyToDeviceAsync(void* device_dst, const void* host_src, size_t bytes, void* stream,
                       std::string* error);
// host_dst[j] = device_src[j * stride] for j < count (one strided copy, for a sample).
bool copyStridedToHostAsync(float* host_dst, const float* device_src, size_t count, size_t stride,
                            void* stream, std::string* error);
bool memsetAsync(void* device_dst, int value, size_t bytes, void* stream, std::string* error);

// --- kernels/convert.h -------------------------------------------------------------------------
int floatToFp16Device(const float* x, size_t n, void* out, void* stream);
int fp16ToFloatDevice(const void* in, size_t n, float* out, void* stream);
int floatToBf16Device(const float* x, size_t n, void* out, void* stream);
int bf16ToFloatDevice(const void* in, size_t n, float* out, void* stream);
// acc[i] = fma(w, value_i, acc[i]) from packed fp16 / bf16 values.
int accumulateFp16Device(float* acc, const void* in, float w, size_t n, void* stream);
int accumulateBf16Device(float* acc, const void* in, float w, size_t n, void* stream);

// --- kernels/quantize.h --------------------------------------------------------------------------
// One warp a bucket: the norm is summed in the CPU's lane order (kernels/scalar.h), so scales and
// levels are the CPU's bytes.
int qsgdQuantizeDevice(const float* x, size_t n, uint32_t bits, uint32_t bucket, uint64_t seed,
                       void* scales, void* levels, void* stream);
int qsgdDequantizeDevice(const void* scales, const void* levels, size_t n, uint32_t bits,
                         uint32_t bucket, float* out, void* stream);
int qsgdDequantizeAccumulateDevice(float* acc, const void* scales, const void* levels, size_t n,
                                   uint32_t bits, uint32_t bucket, float w, void* stream);
int signQuantizeDevice(const float* x, size_t n, uint32_t bucket, void* scales, void* signs,
                       void* stream);
int signDequantizeAccumulateDevice(float* acc, const void* scales, const void* signs, size_t n,
                                   uint32_t bucket, float w, void* stream);

// --- kernels/sparse.h --------------------------------------------------------------------------
// *d_count (device) = the number of i < n with magnitudeKey(x[i]) >= magnitudeKey(threshold).
int countAtLeastDevice(const float* x, size_t n, float threshold, unsigned long long* d_count,
                       void* stream);
// Writes the indices i with magnitudeKey(x[i]) >= magnitudeKey(threshold), in an unspecified
// order, at most `capacity` of them, to idx, and their total number to *d_count (which may
// exceed capacity). The exact trim to k and the sort are done on the few candidates after.
int selectAtLeastDevice(const float* x, size_t n, float threshold, uint32_t* idx, size_t capacity,
                        unsigned long long* d_count, void* stream);
int gatherFp16Device(const float* x, const uint32_t* idx, size_t k, void* out, void* stream);
// out[j] = x[idx[j]] for j < k.
int gatherDevice(const float* x, const uint32_t* idx, size_t k, float* out, void* stream);
// acc[idx[j]] = fma(w, v_j, acc[idx[j]]); the indices must be distinct (a top-k payload's are:
// threads write in parallel).
int scatterAddDevice(float* acc, const uint32_t* idx, const float* v, float w, size_t k,
                     void* stream);
int scatterAddFp16Device(float* acc, const uint32_t* idx, const void* values, float w, size_t k,
                         void* stream);

// --- kernels/error_feedback.h ------------------------------------------------------------------
int addResidualFp32Device(float* p, const float* x, const float* r, size_t n, void* stream);
int addResidualBf16Device(float* p, const float* x, const uint16_t* r, size_t n, void* stream);
int addResidualFp16Device(float* p, const float* x, const uint16_t* r, size_t n, void* stream);
int storeResidualFp32Device(float* r, const float* p, const float* d, size_t n, void* stream);
int storeResidualBf16Device(uint16_t* r, const float* p, const float* d, size_t n, void* stream);
int storeResidualFp16Device(uint16_t* r, const float* p, const float* d, size_t n, void* stream);

}  // namespace fedfleet::kernels::cuda
