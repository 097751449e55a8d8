// CUDA implementation of kernels/compress_cuda.h. The arithmetic is the shared scalar code of
// kernels/scalar.h (compiled with --fmad=false, see kernels/CMakeLists.txt), so every result
// equals the CPU reference's bit for bit. Every runtime call's result is checked.

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/compress_cuda.h"
#include "kernels/scalar.h"

namespace fedfleet::kernels::cuda {
namespace {

constexpr unsigned kBlockSize = 256;
constexpr unsigned kWarpsPerBlock = kBlockSize / 32;
// Enough blocks to fill any current GPU several times over; grid-stride loops cover the rest.
constexpr size_t kMaxBlocks = 4096;
constexpr unsigned kFullMask = 0xffffffffu;

cudaStream_t asStream(void* stream) { return static_cast<cudaStream_t>(stream); }

unsigned blocksFor(size_t items) {
  return static_cast<unsigned>(std::min(kMaxBlocks, (items + kBlockSize - 1) / kBlockSize));
}

unsigned warpBlocksFor(size_t warps) {
  return static_cast<unsigned>(std::min(kMaxBlocks, (warps + kWarpsPerBlock - 1) / kWarpsPerBlock));
}

int launched() { return static_cast<int>(cudaGetLastError()); }

int invalid() { return static_cast<int>(cudaErrorInvalidValue); }

bool badShape(uint32_t bucket) { return bucket == 0 || bucket % 8 != 0; }

__device__ size_t globalThread() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ size_t gridThreads() { return static_cast<size_t>(blockDim.x) * gridDim.x; }

// --- convert -------------------------------------------------------------------------------------

__global__ void floatToFp16Kernel(const float* x, size_t n, uint16_t* out) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) out[i] = scalar::floatToFp16(x[i]);
}
__global__ void fp16ToFloatKernel(const uint16_t* in, size_t n, float* out) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) out[i] = scalar::fp16ToFloat(in[i]);
}
__global__ void floatToBf16Kernel(const float* x, size_t n, uint16_t* out) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) out[i] = scalar::floatToBf16(x[i]);
}
__global__ void bf16ToFloatKernel(const uint16_t* in, size_t n, float* out) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) out[i] = scalar::bf16ToFloat(in[i]);
}
__global__ void accumulateFp16Kernel(float* acc, const uint16_t* in, float w, size_t n) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) {
    acc[i] = __fmaf_rn(w, scalar::fp16ToFloat(in[i]), acc[i]);
  }
}
__global__ void accumulateBf16Kernel(float* acc, const uint16_t* in, float w, size_t n) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) {
    acc[i] = __fmaf_rn(w, scalar::bf16ToFloat(in[i]), acc[i]);
  }
}

// --- bucket reductions ---------------------------------------------------------------------------

// The CPU's lane order: lane j sums elements j, j + 32, ... of the bucket in double; then
// lane t += lane t ^ h for h = 16 .. 1 (lane t and t ^ h compute a + b and b + a, equal), which
// leaves every lane with the CPU's lanes[0].
__device__ double bucketSum(const float* v, size_t len, unsigned lane, bool squares) {
  double s = 0.0;
  for (size_t i = lane; i < len; i += 32) {
    const double d = v[i];
    s += squares ? d * d : fabs(d);
  }
  for (int h = scalar::kReductionLanes / 2; h >= 1; h /= 2) s += __shfl_xor_sync(kFullMask, s, h);
  return __shfl_sync(kFullMask, s, 0);
}

// --- QSGD ----------------------------------------------------------------------------------------

__global__ void qsgdQuantizeKernel(const float* x, size_t n, uint32_t bits, uint32_t bucket,
                                   scalar::RandomKey key, float* scales, uint8_t* levels) {
  const unsigned lane = threadIdx.x % 32;
  const size_t warp = globalThread() / 32, warps = gridThreads() / 32;
  const size_t buckets = (n + bucket - 1) / bucket;
  const int32_t s = bits == 8 ? 127 : 7;
  const float fs = static_cast<float>(s);
  for (size_t b = warp; b < buckets; b += warps) {
    const size_t start = b * bucket;
    const size_t len = min(static_cast<size_t>(bucket), n - start);
    const float* v = x + start;
    const float norm = static_cast<float>(sqrt(bucketSum(v, len, lane, true)));
    const bool usable = norm > 0.0f && norm <= 3.40282347e38f;
    const float inverse = usable ? fs / norm : 0.0f;
    if (lane == 0) scales[b] = norm / fs;
    if (bits == 8) {
      for (size_t i = lane; i < len; i += 32) {
        const float u = scalar::uniform01(key, static_cast<uint32_t>(start + i));
        levels[start + i] =
            static_cast<uint8_t>(static_cast<int8_t>(scalar::qsgdLevel(v[i], inverse, u, 127)));
      }
    } else {
      const size_t pairs = (len + 1) / 2;
      for (size_t p = lane; p < pairs; p += 32) {
        const size_t i = 2 * p;
        const int32_t lo = scalar::qsgdLevel(
            v[i], inverse, scalar::uniform01(key, static_cast<uint32_t>(start + i)), 7);
        int32_t hi = 0;
        if (i + 1 < len) {
          hi = scalar::qsgdLevel(v[i + 1], inverse,
                                 scalar::uniform01(key, static_cast<uint32_t>(start + i + 1)), 7);
        }
        levels[start / 2 + p] = static_cast<uint8_t>((lo & 0xf) | ((hi & 0xf) << 4));
      }
    }
  }
}

__device__ int32_t qsgdLevelAt(const uint8_t* levels, size_t i, uint32_t bits) {
  if (bits == 8) return static_cast<int8_t>(levels[i]);
  const uint8_t byte = levels[i / 2];
  return (i % 2 == 0)
             ? (static_cast<int32_t>(static_cast<int8_t>(static_cast<uint8_t>(byte << 4))) >> 4)
             : (static_cast<int32_t>(static_cast<int8_t>(byte)) >> 4);
}

__global__ void qsgdDequantizeKernel(float* acc, const float* scales, const uint8_t* levels,
                                     size_t n, uint32_t bits, uint32_t bucket, float w,
                                     bool accumulate) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) {
    const float d = __fmul_rn(scales[i / bucket], static_cast<float>(qsgdLevelAt(levels, i, bits)));
    acc[i] = accumulate ? __fmaf_rn(w, d, acc[i]) : d;
  }
}

// --- scaled sign ---------------------------------------------------------------------------------

__global__ void signScaleKernel(const float* x, size_t n, uint32_t bucket, float* scales) {
  const unsigned lane = threadIdx.x % 32;
  const size_t warp = globalThread() / 32, warps = gridThreads() / 32;
  const size_t buckets = (n + bucket - 1) / bucket;
  for (size_t b = warp; b < buckets; b += warps) {
    const size_t start = b * bucket;
    const size_t len = min(static_cast<size_t>(bucket), n - start);
    const double sum = bucketSum(x + start, len, lane, false);
    if (lane == 0) scales[b] = static_cast<float>(sum / static_cast<double>(len));
  }
}

// One warp per 32 elements: the ballot is the 32 sign bits, LSB first, as the CPU packs them.
__global__ void signBitsKernel(const float* x, size_t n, uint8_t* signs) {
  const unsigned lane = threadIdx.x % 32;
  const size_t groups = (n + 31) / 32;
  for (size_t g = globalThread() / 32; g < groups; g += gridThreads() / 32) {
    const size_t i = g * 32 + lane;
    const unsigned bits = __ballot_sync(kFullMask, i < n && x[i] < 0.0f);
    const size_t bytes = min(static_cast<size_t>(4), (n - g * 32 + 7) / 8);
    if (lane < bytes) signs[g * 4 + lane] = static_cast<uint8_t>(bits >> (8 * lane));
  }
}

__global__ void signDequantizeAccumulateKernel(float* acc, const float* scales,
                                               const uint8_t* signs, size_t n, uint32_t bucket,
                                               float w) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) {
    const uint32_t pos = scalar::bitsOf(scales[i / bucket]);
    const bool negative = ((signs[i >> 3] >> (i & 7)) & 1u) != 0;
    acc[i] = __fmaf_rn(w, scalar::floatOf(negative ? (pos | 0x80000000u) : pos), acc[i]);
  }
}

// --- sparse --------------------------------------------------------------------------------------

__device__ bool atLeast(float v, uint32_t t) { return (scalar::bitsOf(v) & 0x7fffffffu) >= t; }

__global__ void countAtLeastKernel(const float* x, size_t n, uint32_t t,
                                   unsigned long long* count) {
  unsigned long long mine = 0;
  for (size_t i = globalThread(); i < n; i += gridThreads()) mine += atLeast(x[i], t);
  for (int h = 16; h >= 1; h /= 2) mine += __shfl_xor_sync(kFullMask, mine, h);
  if (threadIdx.x % 32 == 0 && mine != 0) atomicAdd(count, mine);
}

// Warp-aggregated append: one atomic per warp and step, each selected lane writes at its rank.
__global__ void selectAtLeastKernel(const float* x, size_t n, uint32_t t, uint32_t* idx,
                                    size_t capacity, unsigned long long* count) {
  const unsigned lane = threadIdx.x % 32;
  // Every lane of a warp runs the same number of steps, so the ballots are complete.
  const size_t stride = gridThreads();
  const size_t first = globalThread() - lane;  // the warp's first thread
  for (size_t base = first; base < n; base += stride) {
    const size_t i = base + lane;
    const bool take = i < n && atLeast(x[i], t);
    const unsigned ballot = __ballot_sync(kFullMask, take);
    if (ballot == 0) continue;
    unsigned long long start = 0;
    if (lane == 0) start = atomicAdd(count, static_cast<unsigned long long>(__popc(ballot)));
    start = __shfl_sync(kFullMask, start, 0);
    if (take) {
      const unsigned long long slot = start + __popc(ballot & ((1u << lane) - 1u));
      if (slot < capacity) idx[slot] = static_cast<uint32_t>(i);
    }
  }
}

__global__ void gatherFp16Kernel(const float* x, const uint32_t* idx, size_t k, uint16_t* out) {
  for (size_t j = globalThread(); j < k; j += gridThreads())
    out[j] = scalar::floatToFp16(x[idx[j]]);
}

__global__ void gatherKernel(const float* x, const uint32_t* idx, size_t k, float* out) {
  for (size_t j = globalThread(); j < k; j += gridThreads()) out[j] = x[idx[j]];
}

__global__ void scatterAddKernel(float* acc, const uint32_t* idx, const float* v, float w,
                                 size_t k) {
  for (size_t j = globalThread(); j < k; j += gridThreads()) {
    acc[idx[j]] = __fmaf_rn(w, v[j], acc[idx[j]]);
  }
}

__global__ void scatterAddFp16Kernel(float* acc, const uint32_t* idx, const uint16_t* v, float w,
                                     size_t k) {
  for (size_t j = globalThread(); j < k; j += gridThreads()) {
    acc[idx[j]] = __fmaf_rn(w, scalar::fp16ToFloat(v[j]), acc[idx[j]]);
  }
}

// --- error feedback ------------------------------------------------------------------------------

__global__ void addResidualFp32Kernel(float* p, const float* x, const float* r, size_t n) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) p[i] = __fadd_rn(x[i], r[i]);
}
__global__ void addResidualBf16Kernel(float* p, const float* x, const uint16_t* r, size_t n) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) {
    p[i] = __fadd_rn(x[i], scalar::bf16ToFloat(r[i]));
  }
}
__global__ void addResidualFp16Kernel(float* p, const float* x, const uint16_t* r, size_t n) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) {
    p[i] = __fadd_rn(x[i], scalar::fp16ToFloat(r[i]));
  }
}
__global__ void storeResidualFp32Kernel(float* r, const float* p, const float* d, size_t n) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) r[i] = __fsub_rn(p[i], d[i]);
}
__global__ void storeResidualBf16Kernel(uint16_t* r, const float* p, const float* d, size_t n) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) {
    r[i] = scalar::floatToBf16(__fsub_rn(p[i], d[i]));
  }
}
__global__ void storeResidualFp16Kernel(uint16_t* r, const float* p, const float* d, size_t n) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) {
    r[i] = scalar::floatToFp16(__fsub_rn(p[i], d[i]));
  }
}

bool fail(std::string* error, const char* what, cudaError_t err) {
  // Consumed here: a later launch's cudaGetLastError() must not report this call's error.
  (void)cudaGetLastError();
  if (error != nullptr) {
    *error = std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
  }
  return false;
}

}  // namespace

// --- device memory -------------------------------------------------------------------------------

bool deviceAlloc(void** ptr, size_t bytes, std::string* error) {
  const cudaError_t err = cudaMalloc(ptr, bytes == 0 ? 1 : bytes);
  return err == cudaSuccess || fail(error, "cudaMalloc", err);
}

bool deviceFree(void* ptr, std::string* error) {
  const cudaError_t err = cudaFree(ptr);
  return err == cudaSuccess || fail(error, "cudaFree", err);
}

bool copyToDevice(void* device_dst, const void* host_src, size_t bytes, std::string* error) {
  if (bytes == 0) return true;
  const cudaError_t err = cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice);
  return err == cudaSuccess || fail(error, "cudaMemcpy(host to device)", err);
}

bool copyToHost(void* host_dst, const void* device_src, size_t bytes, std::string* error) {
  if (bytes == 0) return true;
  const cudaError_t err = cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost);
  return err == cudaSuccess || fail(error, "cudaMemcpy(device to host)", err);
}

bool deviceSynchronize(std::string* error) {
  const cudaError_t err = cudaDeviceSynchronize();
  return err == cudaSuccess || fail(error, "cudaDeviceSynchronize", err);
}

// --- streams and asynchronous copies -----------------------------------------------------------

bool setDevice(int device, std::string* error) {
  const cudaError_t err = cudaSetDevice(device);
  return err == cudaSuccess || fail(error, "cudaSetDevice", err);
}

bool streamCreate(void** stream, std::string* error) {
  cudaStream_t s = nullptr;
  const cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err != cudaSuccess) return fail(error, "cudaStreamCreateWithFlags", err);
  *stream = s;
  return true;
}

bool streamDestroy(void* stream, std::string* error) {
  const cudaError_t err = cudaStreamDestroy(asStream(stream));
  return err == cudaSuccess || fail(error, "cudaStreamDestroy", err);
}

bool streamSynchronize(void* stream, std::string* error) {
  const cudaError_t err = cudaStreamSynchronize(asStream(stream));
  return err == cudaSuccess || fail(error, "cudaStreamSynchronize", err);
}

bool copyToHostAsync(void* host_dst, const void* device_src, size_t bytes, void* stream,
                     std::string* error) {
  if (bytes == 0) return true;
  const cudaError_t err =
      cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, asStream(stream));
  return err == cudaSuccess || fail(error, "cudaMemcpyAsync(device to host)", err);
}

bool copyToDeviceAsync(void* device_dst, const void* host_src, size_t bytes, void* stream,
                       std::string* error) {
  if (bytes == 0) return true;
  const cudaError_t err =
      cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, asStream(stream));
  return err == cudaSuccess || fail(error, "cudaMemcpyAsync(host to device)", err);
}

bool copyStridedToHostAsync(float* host_dst, const float* device_src, size_t count, size_t stride,
                            void* stream, std::string* error) {
  if (count == 0) return true;
  // One float a row, rows `stride` floats apart on the device and packed on the host.
  const cudaError_t err =
      cudaMemcpy2DAsync(host_dst, sizeof(float), device_src, stride * sizeof(float), sizeof(float),
                        count, cudaMemcpyDeviceToHost, asStream(stream));
  return err == cudaSuccess || fail(error, "cudaMemcpy2DAsync(device to host)", err);
}

bool memsetAsync(void* device_dst, int value, size_t bytes, void* stream, std::string* error) {
  if (bytes == 0) return true;
  const cudaError_t err = cudaMemsetAsync(device_dst, value, bytes, asStream(stream));
  return err == cudaSuccess || fail(error, "cudaMemsetAsync", err);
}

// --- launches ------------------------------------------------------------------------------------

#define FEDFLEET_ELEMENTWISE(kernel, n, ...)                                \
  do {                                                                      \
    if ((n) == 0) return 0;                                                 \
    kernel<<<blocksFor(n), kBlockSize, 0, asStream(stream)>>>(__VA_ARGS__); \
    return launched();                                                      \
  } while (0)

int floatToFp16Device(const float* x, size_t n, void* out, void* stream) {
  if (n > 0 && (x == nullptr || out == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(floatToFp16Kernel, n, x, n, static_cast<uint16_t*>(out));
}
int fp16ToFloatDevice(const void* in, size_t n, float* out, void* stream) {
  if (n > 0 && (in == nullptr || out == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(fp16ToFloatKernel, n, static_cast<const uint16_t*>(in), n, out);
}
int floatToBf16Device(const float* x, size_t n, void* out, void* stream) {
  if (n > 0 && (x == nullptr || out == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(floatToBf16Kernel, n, x, n, static_cast<uint16_t*>(out));
}
int bf16ToFloatDevice(const void* in, size_t n, float* out, void* stream) {
  if (n > 0 && (in == nullptr || out == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(bf16ToFloatKernel, n, static_cast<const uint16_t*>(in), n, out);
}
int accumulateFp16Device(float* acc, const void* in, float w, size_t n, void* stream) {
  if (n > 0 && (acc == nullptr || in == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(accumulateFp16Kernel, n, acc, static_cast<const uint16_t*>(in), w, n);
}
int accumulateBf16Device(float* acc, const void* in, float w, size_t n, void* stream) {
  if (n > 0 && (acc == nullptr || in == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(accumulateBf16Kernel, n, acc, static_cast<const uint16_t*>(in), w, n);
}

int qsgdQuantizeDevice(const float* x, size_t n, uint32_t bits, uint32_t bucket, uint64_t seed,
                       void* scales, void* levels, void* stream) {
  if (badShape(bucket) || (bits != 8 && bits != 4)) return invalid();
  if (n == 0) return 0;
  if (x == nullptr || scales == nullptr || levels == nullptr) return invalid();
  const size_t buckets = (n + bucket - 1) / bucket;
  qsgdQuantizeKernel<<<warpBlocksFor(buckets), kBlockSize, 0, asStream(stream)>>>(
      x, n, bits, bucket, scalar::randomKey(seed), static_cast<float*>(scales),
      static_cast<uint8_t*>(levels));
  return launched();
}

int qsgdDequantizeDevice(const void* scales, const void* levels, size_t n, uint32_t bits,
                         uint32_t bucket, float* out, void* stream) {
  if (badShape(bucket) || (bits != 8 && bits != 4)) return invalid();
  if (n > 0 && (scales == nullptr || levels == nullptr || out == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(qsgdDequantizeKernel, n, out, static_cast<const float*>(scales),
                       static_cast<const uint8_t*>(levels), n, bits, bucket, 0.0f, false);
}

int qsgdDequantizeAccumulateDevice(float* acc, const void* scales, const void* levels, size_t n,
                                   uint32_t bits, uint32_t bucket, float w, void* stream) {
  if (badShape(bucket) || (bits != 8 && bits != 4)) return invalid();
  if (n > 0 && (scales == nullptr || levels == nullptr || acc == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(qsgdDequantizeKernel, n, acc, static_cast<const float*>(scales),
                       static_cast<const uint8_t*>(levels), n, bits, bucket, w, true);
}

int signQuantizeDevice(const float* x, size_t n, uint32_t bucket, void* scales, void* signs,
                       void* stream) {
  if (badShape(bucket)) return invalid();
  if (n == 0) return 0;
  if (x == nullptr || scales == nullptr || signs == nullptr) return invalid();
  const size_t buckets = (n + bucket - 1) / bucket;
  signScaleKernel<<<warpBlocksFor(buckets), kBlockSize, 0, asStream(stream)>>>(
      x, n, bucket, static_cast<float*>(scales));
  const int err = launched();
  if (err != 0) return err;
  signBitsKernel<<<warpBlocksFor((n + 31) / 32), kBlockSize, 0, asStream(stream)>>>(
      x, n, static_cast<uint8_t*>(signs));
  return launched();
}

int signDequantizeAccumulateDevice(float* acc, const void* scales, const void* signs, size_t n,
                                   uint32_t bucket, float w, void* stream) {
  if (badShape(bucket)) return invalid();
  if (n > 0 && (acc == nullptr || scales == nullptr || signs == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(signDequantizeAccumulateKernel, n, acc, static_cast<const float*>(scales),
                       static_cast<const uint8_t*>(signs), n, bucket, w);
}

int countAtLeastDevice(const float* x, size_t n, float threshold, unsigned long long* d_count,
                       void* stream) {
  if (d_count == nullptr || (n > 0 && x == nullptr)) return invalid();
  cudaError_t err = cudaMemsetAsync(d_count, 0, sizeof(*d_count), asStream(stream));
  if (err != cudaSuccess) return static_cast<int>(err);
  FEDFLEET_ELEMENTWISE(countAtLeastKernel, n, x, n, scalar::bitsOf(threshold) & 0x7fffffffu,
                       d_count);
}

int selectAtLeastDevice(const float* x, size_t n, float threshold, uint32_t* idx, size_t capacity,
                        unsigned long long* d_count, void* stream) {
  if (d_count == nullptr || (n > 0 && x == nullptr) || (capacity > 0 && idx == nullptr)) {
    return invalid();
  }
  cudaError_t err = cudaMemsetAsync(d_count, 0, sizeof(*d_count), asStream(stream));
  if (err != cudaSuccess) return static_cast<int>(err);
  FEDFLEET_ELEMENTWISE(selectAtLeastKernel, n, x, n, scalar::bitsOf(threshold) & 0x7fffffffu, idx,
                       capacity, d_count);
}

int gatherFp16Device(const float* x, const uint32_t* idx, size_t k, void* out, void* stream) {
  if (k > 0 && (x == nullptr || idx == nullptr || out == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(gatherFp16Kernel, k, x, idx, k, static_cast<uint16_t*>(out));
}

int gatherDevice(const float* x, const uint32_t* idx, size_t k, float* out, void* stream) {
  if (k > 0 && (x == nullptr || idx == nullptr || out == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(gatherKernel, k, x, idx, k, out);
}

int scatterAddDevice(float* acc, const uint32_t* idx, const float* v, float w, size_t k,
                     void* stream) {
  if (k > 0 && (acc == nullptr || idx == nullptr || v == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(scatterAddKernel, k, acc, idx, v, w, k);
}

int scatterAddFp16Device(float* acc, const uint32_t* idx, const void* values, float w, size_t k,
                         void* stream) {
  if (k > 0 && (acc == nullptr || idx == nullptr || values == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(scatterAddFp16Kernel, k, acc, idx, static_cast<const uint16_t*>(values), w,
                       k);
}

int addResidualFp32Device(float* p, const float* x, const float* r, size_t n, void* stream) {
  if (n > 0 && (p == nullptr || x == nullptr || r == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(addResidualFp32Kernel, n, p, x, r, n);
}
int addResidualBf16Device(float* p, const float* x, const uint16_t* r, size_t n, void* stream) {
  if (n > 0 && (p == nullptr || x == nullptr || r == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(addResidualBf16Kernel, n, p, x, r, n);
}
int addResidualFp16Device(float* p, const float* x, const uint16_t* r, size_t n, void* stream) {
  if (n > 0 && (p == nullptr || x == nullptr || r == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(addResidualFp16Kernel, n, p, x, r, n);
}
int storeResidualFp32Device(float* r, const float* p, const float* d, size_t n, void* stream) {
  if (n > 0 && (p == nullptr || d == nullptr || r == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(storeResidualFp32Kernel, n, r, p, d, n);
}
int storeResidualBf16Device(uint16_t* r, const float* p, const float* d, size_t n, void* stream) {
  if (n > 0 && (p == nullptr || d == nullptr || r == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(storeResidualBf16Kernel, n, r, p, d, n);
}
int storeResidualFp16Device(uint16_t* r, const float* p, const float* d, size_t n, void* stream) {
  if (n > 0 && (p == nullptr || d == nullptr || r == nullptr)) return invalid();
  FEDFLEET_ELEMENTWISE(storeResidualFp16Kernel, n, r, p, d, n);
}

#undef FEDFLEET_ELEMENTWISE

}  // namespace fedfleet::kernels::cuda
