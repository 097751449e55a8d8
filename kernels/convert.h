// fp16 and bf16 conversion, and the dense decode-and-fold loops of the fp32, fp16 and bf16
// codecs (common/compress/). CPU reference; kernels/compress_cuda.h has the GPU versions.
//
// Packed buffers (`const void*` / `void*`) may have any alignment and hold little-endian
// values, as payloads on the wire do; float arrays are ordinary aligned `float*`. Conversions
// are exact from fp16/bf16 and round to nearest even into them; finite values beyond the target
// range saturate to its largest finite value (+-65504 for fp16) instead of becoming infinite,
// infinities stay infinite and NaN stays NaN (made quiet). Every function accepts n == 0 (then
// pointers may be null) and never fails.
#pragma once

#include <cstddef>

namespace fedfleet::kernels {

// out[i] (2n bytes) = fp16(x[i]), round to nearest even, saturating.
void floatToFp16(const float* x, size_t n, void* out);
// out[i] = the fp16 value in[i], exactly.
void fp16ToFloat(const void* in, size_t n, float* out);
// out[i] (2n bytes) = bf16(x[i]), round to nearest even, saturating.
void floatToBf16(const float* x, size_t n, void* out);
// out[i] = the bf16 value in[i], exactly.
void bf16ToFloat(const void* in, size_t n, float* out);

// acc[i] = fma(w, v[i], acc[i]) where v[i] is the i-th fp32 / fp16 / bf16 value of `in`: the
// same bits as decoding into a float array and calling weightedAccumulate, without the array.
void accumulateFp32(float* acc, const void* in, float w, size_t n);
void accumulateFp16(float* acc, const void* in, float w, size_t n);
void accumulateBf16(float* acc, const void* in, float w, size_t n);

// Checked folds for payloads from the network: first check that none of the n values is NaN or
// infinite, then fold them as above; returns false, with acc untouched, when one is. (The check
// reads the input as four concurrent streams, so on a cold payload check-then-fold costs about
// 1.2 times the fold alone, not 1.7 times.)
bool accumulateFp32IfFinite(float* acc, const void* in, float w, size_t n);
bool accumulateFp16IfFinite(float* acc, const void* in, float w, size_t n);
bool accumulateBf16IfFinite(float* acc, const void* in, float w, size_t n);

// True when none of the n packed fp32 / fp16 / bf16 values is NaN or infinite.
bool allFiniteFp32(const void* in, size_t n);
bool allFiniteFp16(const void* in, size_t n);
bool allFiniteBf16(const void* in, size_t n);

}  // namespace fedfleet::kernels
