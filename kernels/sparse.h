// Sparse kernels of the top-k codec (common/compress/): threshold select on the encoder side,
// gather of the kept values, and the scatter-add that folds a sparse update into the running
// sum. CPU reference; kernels/compress_cuda.h has the GPU versions.
//
// Magnitudes are compared on their bit patterns (|x| as an unsigned integer), which orders
// non-negative floats exactly as their values, +0 and -0 alike, and puts NaN above infinity:
// a total order, so selection is deterministic for every input. Packed fp16 buffers may have
// any alignment (little-endian); conversion is that of kernels/convert.h. Index arrays must
// hold valid positions (< the dense length): the codecs check payloads before calling these.
// k == 0 / n == 0 are accepted (then pointers may be null); nothing here fails.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fedfleet::kernels {

// |x| as its bit pattern: the key every magnitude comparison here uses.
uint32_t magnitudeKey(float x);

// The top-k threshold sample: keys[j] = magnitudeKey(x[p_j]) for j < m, with positions p_j
// drawn uniformly from [0, n) (with replacement) by a pure function of (seed, j). n > 0.
void sampleMagnitudeKeys(const float* x, size_t n, size_t m, uint64_t seed, uint32_t* keys);

// Number of i < n with magnitudeKey(x[i]) >= magnitudeKey(threshold).
size_t countAtLeast(const float* x, size_t n, float threshold);

// Writes, in increasing order, the indices i < n with magnitudeKey(x[i]) >=
// magnitudeKey(threshold) into idx, at most `capacity` of them, and returns how many there are
// in all (which may exceed capacity: then only the first `capacity` are written).
size_t selectAtLeast(const float* x, size_t n, float threshold, uint32_t* idx, size_t capacity);

// out (2k bytes) = fp16(x[idx[j]]) for j < k (round to nearest even, saturating).
void gatherFp16(const float* x, const uint32_t* idx, size_t k, void* out);

// Index coding of top-k payloads: k increasing indices as LEB128 varints of the gaps (the first
// index, then idx[j] - idx[j-1] - 1), 7 bits a byte, low bits first.
//
// Writes the varints of idx[0, k) (increasing; checked only by the decoder) to out, which must
// have room for 5k bytes, and returns the number of bytes written.
size_t encodeIndexGaps(const uint32_t* idx, size_t k, void* out);

struct IndexGapDecode {
  enum Code {
    kOk,
    kTruncated,   // the bytes end inside a varint or before the k-th index
    kOverlong,    // a varint longer than 5 bytes
    kOutOfRange,  // an index >= n
    kTrailing,    // bytes left after the k-th index
  };
  Code code = kOk;
  size_t entry = 0;    // which index failed (kTruncated, kOverlong, kOutOfRange)
  uint64_t index = 0;  // its value (kOutOfRange)
};

// Decodes exactly k indices from `size` bytes into idx[0, k), checking every one (complete,
// at most 5 bytes, below n) and that no byte is left over. When `prefetch` is not null, the
// line of prefetch[idx[j]] is requested for writing as each index is decoded (a hint only, it
// changes no memory), so that a scatter-add into that accumulator which follows finds its lines
// in cache: the decode loop has no dependent loads and keeps many misses in flight, which the
// scatter loop alone cannot. On failure idx holds the indices decoded so far.
IndexGapDecode decodeIndexGaps(const void* data, size_t size, size_t k, uint64_t n, uint32_t* idx,
                               const float* prefetch);

// acc[idx[j]] = fma(w, v[j], acc[idx[j]]) for j < k, in order of j (repeated indices therefore
// add up; the codecs never repeat one).
void scatterAdd(float* acc, const uint32_t* idx, const float* v, float w, size_t k);
// The same with v[j] the j-th fp16 value of `values` (2k bytes).
void scatterAddFp16(float* acc, const uint32_t* idx, const void* values, float w, size_t k);
// out[idx[j]] = the j-th fp16 value of `values`, exactly (other elements untouched).
void scatterFp16(float* out, const uint32_t* idx, const void* values, size_t k);

}  // namespace fedfleet::kernels
