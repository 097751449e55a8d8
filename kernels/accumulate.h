// Hot loops of aggregation on the CPU: the weighted running sum the aggregators build, scaling,
// a finiteness check for incoming updates and the squared norm used by clipping and reports.
//
// This header has no CUDA types; kernels/accumulate_cuda.h has the GPU version of
// weightedAccumulate, which kernels/accumulate_cpu.cc (this header's implementation) serves as
// the reference for. The loops are plain, vectorised by the compiler; on x86-64 with GCC each
// function is also built for x86-64-v3 (AVX2 + FMA) and picked at load time (target_clones),
// without -march=native, so one binary runs everywhere.
//
// Results do not depend on which build runs: every function either rounds once per element or
// sums in a fixed order, so CPU and GPU, old and new processors, agree bit for bit.
// All functions accept n == 0 (then pointers may be null) and never fail.
#pragma once

#include <cstddef>

namespace fedfleet::kernels {

// acc[i] = fma(w, x[i], acc[i]) for i < n: the product and the sum rounded once, as
// std::fmaf does and as the CUDA kernel does (__fmaf_rn). `x` and `acc` may be the same array
// but must not otherwise overlap.
void weightedAccumulate(float* acc, const float* x, float w, size_t n);

// x[i] *= s for i < n.
void scale(float* x, float s, size_t n);

// True when no x[i] (i < n) is NaN or infinite; true for n == 0.
bool allFinite(const float* x, size_t n);

// The sum of x[i]^2 (i < n), each square exact in double and summed in double in a fixed
// order (eight interleaved partial sums, then combined pairwise), so the result is the same on
// every machine. NaN if some x[i] is NaN, infinity if some x[i] is infinite.
double squaredNorm(const float* x, size_t n);

}  // namespace fedfleet::kernels
