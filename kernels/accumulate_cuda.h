// The CUDA version of weightedAccumulate (kernels/accumulate.h), for a coordinator that keeps
// its running aggregate on a GPU.
//
// Host-only header: no CUDA types, so plain C++ can include it. The implementation,
// kernels/accumulate.cu, is in the fedfleet_kernels_cuda target, which exists only when CUDA is
// on and then defines FEDFLEET_HAVE_CUDA=1 for whoever links it; code that may be built without
// CUDA includes this header under `#if FEDFLEET_HAVE_CUDA`.
//
// Each element is computed as __fmaf_rn(w, x[i], acc[i]): one rounding, the same as the CPU
// reference's fmaf, so GPU and CPU results are equal bit for bit.
//
// Errors are returned, never thrown or ignored: device functions return 0 or a cudaError_t
// value (errorString names it); host functions return false and describe the failure.
#pragma once

#include <cstddef>
#include <string>

namespace fedfleet::kernels::cuda {

// True when the CUDA runtime sees at least one device. False (not an error) on a machine with
// no GPU or no driver; the runtime's error from the probe is cleared.
bool deviceAvailable();

// What a code returned by this header's device functions means ("no error" for 0).
const char* errorString(int code);

// Enqueues d_acc[i] = fma(w, d_x[i], d_acc[i]) for i < n on `stream` (a cudaStream_t; nullptr
// is the default stream) and returns without waiting. d_acc and d_x are device pointers to n
// floats; they may be equal but must not otherwise overlap. Returns 0 when the launch was
// accepted, else the cudaError_t value (cudaErrorInvalidValue for a null pointer with n > 0).
// A fault while the kernel runs shows on the stream's next synchronising call.
int weightedAccumulateDevice(float* d_acc, const float* d_x, float w, size_t n, void* stream);

// Runs weightedAccumulate on the current device for host arrays: copies acc and x to the
// device, runs the kernel, copies acc back and frees the device memory. For tests and one-off
// use (it synchronises). Returns true on success. On failure returns false and, when `error`
// is not null, sets it to the failing call and CUDA's message; `acc` is then unchanged if the
// failure came before the copy back, else unspecified.
bool weightedAccumulateHost(float* acc, const float* x, float w, size_t n, std::string* error);

}  // namespace fedfleet::kernels::cuda
