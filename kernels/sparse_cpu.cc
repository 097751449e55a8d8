// The CPU reference of kernels/sparse.h, built per instruction set (kernels/clones.h).

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/clones.h"
#include "kernels/scalar.h"
#include "kernels/sparse.h"

namespace fedfleet::kernels {
namespace {

inline uint16_t load16(const unsigned char* p, size_t j) {
  uint16_t v;
  std::memcpy(&v, p + 2 * j, sizeof(v));
  return v;
}

// How far ahead scatter-add prefetches its accumulator lines. A top-k payload touches about one
// cache line per kept value, spread over the whole accumulator, so the loop is bound by memory
// latency; prefetching this many entries ahead keeps enough misses in flight for a core.
constexpr size_t kPrefetchDistance = 16;

// selectAtLeast works through blocks; a block whose every element could be selected without
// passing `capacity` runs the branch-free loop (write the index, advance when selected).
constexpr size_t kSelectBlock = 1024;

}  // namespace

uint32_t magnitudeKey(float x) { return scalar::bitsOf(x) & 0x7fffffffu; }

void sampleMagnitudeKeys(const float* x, size_t n, size_t m, uint64_t seed, uint32_t* keys) {
  const scalar::RandomKey key = scalar::randomKey(seed);
  for (size_t j = 0; j < m; ++j) {
    const uint32_t h = scalar::hash32(scalar::hash32(static_cast<uint32_t>(j) + key.k0) ^ key.k1);
    keys[j] = magnitudeKey(x[(static_cast<uint64_t>(h) * n) >> 32]);  // h * n / 2^32 < n
  }
}

FEDFLEET_KERNEL_CLONES
size_t countAtLeast(const float* x, size_t n, float threshold) {
  const uint32_t t = magnitudeKey(threshold);
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) count += (scalar::bitsOf(x[i]) & 0x7fffffffu) >= t;
  return count;
}

FEDFLEET_KERNEL_CLONES
size_t selectAtLeast(const float* x, size_t n, float threshold, uint32_t* idx, size_t capacity) {
  const uint32_t t = magnitudeKey(threshold);
  size_t count = 0;
  for (size_t start = 0; start < n; start += kSelectBlock) {
    const size_t end = (n - start < kSelectBlock) ? n : start + kSelectBlock;
    if (count + (end - start) <= capacity) {
      for (size_t i = start; i < end; ++i) {
        idx[count] = static_cast<uint32_t>(i);
        count += (scalar::bitsOf(x[i]) & 0x7fffffffu) >= t;
      }
    } else {
      for (size_t i = start; i < end; ++i) {
        if ((scalar::bitsOf(x[i]) & 0x7fffffffu) >= t) {
          if (count < capacity) idx[count] = static_cast<uint32_t>(i);
          ++count;
        }
      }
    }
  }
  return count;
}

FEDFLEET_KERNEL_CLONES
void gatherFp16(const float* x, const uint32_t* idx, size_t k, void* out) {
  auto* o = static_cast<unsigned char*>(out);
  for (size_t j = 0; j < k; ++j) {
    const uint16_t h = scalar::floatToFp16(x[idx[j]]);
    std::memcpy(o + 2 * j, &h, sizeof(h));
  }
}

FEDFLEET_KERNEL_CLONES
void scatterAdd(float* acc, const uint32_t* idx, const float* v, float w, size_t k) {
  for (size_t j = 0; j < k; ++j) {
    if (j + kPrefetchDistance < k) __builtin_prefetch(acc + idx[j + kPrefetchDistance], 1);
    acc[idx[j]] = std::fma(w, v[j], acc[idx[j]]);
  }
}

FEDFLEET_KERNEL_CLONES
void scatterAddFp16(float* acc, const uint32_t* idx, const void* values, float w, size_t k) {
  const auto* p = static_cast<const unsigned char*>(values);
  for (size_t j = 0; j < k; ++j) {
    if (j + kPrefetchDistance < k) __builtin_prefetch(acc + idx[j + kPrefetchDistance], 1);
    acc[idx[j]] = std::fma(w, scalar::fp16ToFloat(load16(p, j)), acc[idx[j]]);
  }
}

FEDFLEET_KERNEL_CLONES
void scatterFp16(float* out, const uint32_t* idx, const void* values, size_t k) {
  const auto* p = static_cast<const unsigned char*>(values);
  for (size_t j = 0; j < k; ++j) out[idx[j]] = scalar::fp16ToFloat(load16(p, j));
}

size_t encodeIndexGaps(const uint32_t* idx, size_t k, void* out) {
  auto* o = static_cast<unsigned char*>(out);
  unsigned char* p = o;
  uint32_t next = 0;
  for (size_t j = 0; j < k; ++j) {
    uint32_t v = idx[j] - next;
    next = idx[j] + 1;
    while (v >= 0x80) {
      *p++ = static_cast<unsigned char>(v | 0x80);
      v >>= 7;
    }
    *p++ = static_cast<unsigned char>(v);
  }
  return static_cast<size_t>(p - o);
}

// One- and two-byte varints (gaps below 16384: all but a few of a 1% selection) decode without
// a branch on the data from an 8-byte little-endian load; longer ones and the last few bytes,
// where an 8-byte load would pass the end, take the general loop.
FEDFLEET_KERNEL_CLONES
IndexGapDecode decodeIndexGaps(const void* data, size_t size, size_t k, uint64_t n, uint32_t* idx,
                               const float* prefetch) {
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + size;
  IndexGapDecode r;
  uint64_t next = 0;  // the smallest value the next index may take
  for (size_t j = 0; j < k; ++j) {
    uint64_t gap = 0;
    bool decoded = false;
    if (end - p >= 8) {
      uint64_t w;
      std::memcpy(&w, p, sizeof(w));
      if ((w & 0x8080) != 0x8080) {         // at most two bytes
        const uint64_t two = (w >> 7) & 1;  // the first byte continues
        gap = (w & 0x7f) | (((w >> 1) & 0x3f80) & (0 - two));
        p += 1 + two;
        decoded = true;
      }
    }
    if (!decoded) {
      for (int shift = 0;; shift += 7) {
        if (shift > 28) {
          r.code = IndexGapDecode::kOverlong;
          r.entry = j;
          return r;
        }
        if (p == end) {
          r.code = IndexGapDecode::kTruncated;
          r.entry = j;
          return r;
        }
        const uint64_t b = *p++;
        gap |= (b & 0x7f) << shift;
        if (b < 0x80) break;
      }
    }
    const uint64_t index = next + gap;
    if (index >= n) {
      r.code = IndexGapDecode::kOutOfRange;
      r.entry = j;
      r.index = index;
      return r;
    }
    idx[j] = static_cast<uint32_t>(index);
    if (prefetch != nullptr) __builtin_prefetch(prefetch + index, 1, 3);
    next = index + 1;
  }
  if (p != end) r.code = IndexGapDecode::kTrailing;
  return r;
}

}  // namespace fedfleet::kernels
