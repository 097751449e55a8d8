// Helpers of the GPU tests: an array in CUDA device memory made from (and read back into) a host
// vector, freed on destruction (failures of the runtime calls are test failures), and seeded
// test data. Include it only in *_gpu_test.cc files (they link fedfleet_kernels_cuda).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/compress_cuda.h"

namespace fedfleet::kernels {

// n standard normal values from std::mt19937(seed).
inline std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    std::string error;
    EXPECT_TRUE(cuda::deviceAlloc(&ptr_, bytes(), &error)) << error;
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    std::string error;
    EXPECT_TRUE(cuda::copyToDevice(ptr_, host.data(), bytes(), &error)) << error;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cuda::deviceFree(ptr_, nullptr); }
  T* get() const { return static_cast<T*>(ptr_); }
  std::vector<T> toHost() const {
    std::vector<T> out(n_);
    std::string error;
    EXPECT_TRUE(cuda::deviceSynchronize(&error)) << error;
    EXPECT_TRUE(cuda::copyToHost(out.data(), ptr_, bytes(), &error)) << error;
    return out;
  }

 private:
  size_t bytes() const { return n_ * sizeof(T); }
  void* ptr_ = nullptr;
  size_t n_;
};

}  // namespace fedfleet::kernels
