// GPU kernel bandwidth against the device's own copy bandwidth, measured in the same run.
//
// On arrays of N = 2^28 floats (1 GiB each; --elements to change), timed with CUDA events,
// medians over --reps (20) launches after a warm-up:
//   copy        cudaMemcpyAsync device to device: 8 bytes an element (read + write)
//   accumulate  weightedAccumulateDevice, acc = fma(w, x, acc): 12 bytes an element
//   quantize    qsgdQuantizeDevice, 8 bits, buckets of 512: reads 4 bytes an element, writes 1
//               (+ 4 bytes a bucket)
//   topk        selectAtLeastDevice with a threshold that keeps about 1% (the top-k encoder's
//               pass over the whole update): reads 4 bytes an element, writes 4 a kept index
// RESULT keys: accumulate_bw_ratio, quantize_bw_ratio, topk_bw_ratio (each kernel's bytes per
// second over the copy's); goal >= 0.7 each, exit 0 when all hold, else 1. Without a GPU it
// says "no GPU" and exits 1.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/accumulate_cuda.h"
#include "kernels/compress_cuda.h"

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "kernels_gpu: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(2);
  }
}

void checkLaunch(int code, const char* what) { check(static_cast<cudaError_t>(code), what); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// Median seconds of `reps` runs of body, each timed with events on the default stream.
double timeIt(const std::function<void()>& body, int reps) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  body();  // warm-up
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> s;
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(start), "cudaEventRecord");
    body();
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    s.push_back(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(s);
}

}  // namespace

int main(int argc, char** argv) {
  size_t n = size_t{1} << 28;
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--elements") == 0) n = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  }
  if (!fedfleet::kernels::cuda::deviceAvailable()) {
    std::printf("kernels_gpu: no GPU: the CUDA runtime sees no device; nothing measured\n");
    return 1;
  }
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("kernels_gpu: %s, %zu elements (%.2f GiB an fp32 array), %d reps\n", prop.name, n,
              n * 4.0 / (1 << 30), reps);

  float *x, *acc, *copy_dst;
  uint8_t *levels, *scales;
  uint32_t* idx;
  unsigned long long* count;
  const size_t buckets = (n + 511) / 512;
  check(cudaMalloc(&x, n * 4), "cudaMalloc(x)");
  check(cudaMalloc(&acc, n * 4), "cudaMalloc(acc)");
  check(cudaMalloc(&copy_dst, n * 4), "cudaMalloc(copy)");
  check(cudaMalloc(&levels, n), "cudaMalloc(levels)");
  check(cudaMalloc(&scales, buckets * 4), "cudaMalloc(scales)");
  const size_t capacity = n / 50;  // room for 2%: the 1% threshold keeps about half of it
  check(cudaMalloc(&idx, capacity * 4), "cudaMalloc(idx)");
  check(cudaMalloc(&count, sizeof(*count)), "cudaMalloc(count)");
  {
    // Standard normal data, made on the host in slices and copied.
    std::mt19937 gen(1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> slice(size_t{1} << 22);
    for (size_t off = 0; off < n; off += slice.size()) {
      const size_t len = std::min(slice.size(), n - off);
      for (size_t i = 0; i < len; ++i) slice[i] = dist(gen);
      check(cudaMemcpy(x + off, slice.data(), len * 4, cudaMemcpyHostToDevice), "cudaMemcpy(x)");
    }
    check(cudaMemset(acc, 0, n * 4), "cudaMemset(acc)");
  }
  // |x| >= 2.5758 keeps 1% of a standard normal.
  const float threshold = 2.5758f;

  const double N = static_cast<double>(n);
  const double copy_s = timeIt(
      [&] {
        check(cudaMemcpyAsync(copy_dst, x, n * 4, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
      },
      reps);
  const double acc_s = timeIt(
      [&] {
        checkLaunch(fedfleet::kernels::cuda::weightedAccumulateDevice(acc, x, 0.5f, n, nullptr),
                    "weightedAccumulateDevice");
      },
      reps);
  const double q_s = timeIt(
      [&] {
        checkLaunch(
            fedfleet::kernels::cuda::qsgdQuantizeDevice(x, n, 8, 512, 7, scales, levels, nullptr),
            "qsgdQuantizeDevice");
      },
      reps);
  const double sel_s = timeIt(
      [&] {
        checkLaunch(fedfleet::kernels::cuda::selectAtLeastDevice(x, n, threshold, idx, capacity,
                                                                 count, nullptr),
                    "selectAtLeastDevice");
      },
      reps);
  unsigned long long kept = 0;
  check(cudaMemcpy(&kept, count, sizeof(kept), cudaMemcpyDeviceToHost), "cudaMemcpy(count)");

  const double copy_bw = 8.0 * N / copy_s;
  const double acc_bw = 12.0 * N / acc_s;
  const double q_bw = (5.0 * N + 4.0 * static_cast<double>(buckets)) / q_s;
  const double sel_bw = (4.0 * N + 4.0 * static_cast<double>(kept)) / sel_s;
  std::printf("copy        %8.1f GB/s  (%.3f ms)\n", copy_bw / 1e9, copy_s * 1e3);
  std::printf("accumulate  %8.1f GB/s  (%.3f ms)\n", acc_bw / 1e9, acc_s * 1e3);
  std::printf("quantize    %8.1f GB/s  (%.3f ms, qsgd 8-bit, buckets of 512)\n", q_bw / 1e9,
              q_s * 1e3);
  std::printf("topk select %8.1f GB/s  (%.3f ms, kept %llu = %.2f%%)\n", sel_bw / 1e9, sel_s * 1e3,
              kept, 100.0 * static_cast<double>(kept) / N);
  const double ra = acc_bw / copy_bw, rq = q_bw / copy_bw, rt = sel_bw / copy_bw;
  const bool ok = ra >= 0.7 && rq >= 0.7 && rt >= 0.7;
  std::printf("RESULT accumulate_bw_ratio=%.3f quantize_bw_ratio=%.3f topk_bw_ratio=%.3f\n", ra, rq,
              rt);
  return ok ? 0 : 1;
}
