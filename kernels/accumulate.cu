// CUDA implementation of kernels/accumulate_cuda.h. Every runtime call's result is checked.

#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/accumulate_cuda.h"

namespace fedfleet::kernels::cuda {
namespace {

constexpr unsigned kBlockSize = 256;
// Enough blocks to fill any current GPU several times over (an H100/H200 holds 132 SMs x 8 such
// blocks); larger arrays are covered by the grid-stride loop.
constexpr size_t kMaxBlocks = 4096;

// Grid-stride loop: coalesced accesses, any n with one launch.
__global__ void weightedAccumulateKernel(float* acc, const float* x, float w, size_t n) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    acc[i] = __fmaf_rn(w, x[i], acc[i]);  // explicit: independent of --fmad
  }
}

// Device memory freed on every path; free() reports the error the destructor cannot.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);  // error path only: the first error is already kept
  }
  cudaError_t allocate(size_t n) {
    return cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(float));
  }
  cudaError_t free() {
    cudaError_t err = cudaFree(ptr_);
    ptr_ = nullptr;
    return err;
  }
  float* get() const { return ptr_; }

 private:
  float* ptr_ = nullptr;
};

bool fail(std::string* error, const char* what, cudaError_t err) {
  if (error != nullptr) {
    *error = std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
  }
  return false;
}

}  // namespace

bool deviceAvailable() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear it, so later calls do not report the probe's error
    return false;
  }
  return count > 0;
}

const char* errorString(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int weightedAccumulateDevice(float* d_acc, const float* d_x, float w, size_t n, void* stream) {
  if (n == 0) return 0;
  if (d_acc == nullptr || d_x == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  const size_t blocks = std::min(kMaxBlocks, (n + kBlockSize - 1) / kBlockSize);
  weightedAccumulateKernel<<<static_cast<unsigned>(blocks), kBlockSize, 0,
                             static_cast<cudaStream_t>(stream)>>>(d_acc, d_x, w, n);
  return static_cast<int>(cudaGetLastError());
}

bool weightedAccumulateHost(float* acc, const float* x, float w, size_t n, std::string* error) {
  if (n == 0) return true;
  if (acc == nullptr || x == nullptr)
    return fail(error, "weightedAccumulateHost", cudaErrorInvalidValue);
  const size_t bytes = n * sizeof(float);
  DeviceBuffer d_acc;
  DeviceBuffer d_x;
  cudaError_t err = d_acc.allocate(n);
  if (err != cudaSuccess) return fail(error, "cudaMalloc(acc)", err);
  err = d_x.allocate(n);
  if (err != cudaSuccess) return fail(error, "cudaMalloc(x)", err);
  err = cudaMemcpy(d_acc.get(), acc, bytes, cudaMemcpyHostToDevice);
  if (err != cudaSuccess) return fail(error, "cudaMemcpy(acc, host to device)", err);
  err = cudaMemcpy(d_x.get(), x, bytes, cudaMemcpyHostToDevice);
  if (err != cudaSuccess) return fail(error, "cudaMemcpy(x, host to device)", err);
  err = static_cast<cudaError_t>(weightedAccumulateDevice(d_acc.get(), d_x.get(), w, n, nullptr));
  if (err != cudaSuccess) return fail(error, "weightedAccumulateKernel launch", err);
  err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return fail(error, "weightedAccumulateKernel", err);
  err = cudaMemcpy(acc, d_acc.get(), bytes, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) return fail(error, "cudaMemcpy(acc, device to host)", err);
  err = d_x.free();
  if (err != cudaSuccess) return fail(error, "cudaFree(x)", err);
  err = d_acc.free();
  if (err != cudaSuccess) return fail(error, "cudaFree(acc)", err);
  return true;
}

}  // namespace fedfleet::kernels::cuda
