// The CPU reference of kernels/quantize.h, built per instruction set (kernels/clones.h). The
// per-element work is the shared scalar code of kernels/scalar.h; the bucket sums run in the
// fixed lane order stated there, so the CUDA kernels reproduce every byte.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/clones.h"
#include "kernels/quantize.h"
#include "kernels/scalar.h"

// Helpers are forced inline so that each target_clones build of a public function gets its own
// instruction set in them too.
#define FEDFLEET_INLINE inline __attribute__((always_inline))

namespace fedfleet::kernels {
namespace {

constexpr int kLanes = scalar::kReductionLanes;

// Lane j sums the squares (or absolute values) of the elements i % kLanes == j in order, in
// double (a float's square is exact in double); then the lanes fold by halves.
FEDFLEET_INLINE double foldLanes(double* lanes) {
  for (int half = kLanes / 2; half >= 1; half /= 2) {
    for (int j = 0; j < half; ++j) lanes[j] += lanes[j + half];
  }
  return lanes[0];
}

FEDFLEET_INLINE double sumSquares(const float* x, size_t len) {
  double lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double v = x[i + j];
      lanes[j] += v * v;
    }
  }
  for (int j = 0; i < len; ++i, ++j) {
    const double v = x[i];
    lanes[j] += v * v;
  }
  return foldLanes(lanes);
}

FEDFLEET_INLINE double sumAbs(const float* x, size_t len) {
  double lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] += std::fabs(static_cast<double>(x[i + j]));
  }
  for (int j = 0; i < len; ++i, ++j) lanes[j] += std::fabs(static_cast<double>(x[i]));
  return foldLanes(lanes);
}

FEDFLEET_INLINE float loadScale(const unsigned char* scales, size_t b) {
  float s;
  std::memcpy(&s, scales + 4 * b, sizeof(s));
  return s;
}

FEDFLEET_INLINE void storeScale(unsigned char* scales, size_t b, float s) {
  std::memcpy(scales + 4 * b, &s, sizeof(s));
}

// A broken precondition is a bug in the caller (the codecs validate specs and payloads first):
// abort with the reason, as FEDFLEET_CHECK does (kernels/ sits below common/ and has its own).
void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fedfleet kernels: %s\n", what);
    std::abort();
  }
}

void checkShape(uint32_t bucket) {
  require(bucket > 0 && bucket % 8 == 0, "bucket must be a positive multiple of 8");
}

// The bucket's scale (||v|| / s) and its inverse (s / ||v||, 0 when the norm is 0 or not
// finite, which keeps the levels in range; the scale then tells the decoder).
struct QsgdScale {
  float scale;
  float inverse;
};
FEDFLEET_INLINE QsgdScale qsgdScale(const float* v, size_t len, int32_t s) {
  const float norm = static_cast<float>(std::sqrt(sumSquares(v, len)));
  const float fs = static_cast<float>(s);
  const bool usable = norm > 0.0f && norm <= 3.40282347e38f;
  return QsgdScale{norm / fs, usable ? fs / norm : 0.0f};
}

// Dequantise one bucket of 8-bit levels into acc (Accumulate) or out.
FEDFLEET_INLINE void dequantize8(float* acc, const signed char* q, size_t len, float scale, float w,
                                 bool accumulate) {
  if (accumulate) {
    for (size_t i = 0; i < len; ++i) {
      acc[i] = std::fma(w, scale * static_cast<float>(q[i]), acc[i]);
    }
  } else {
    for (size_t i = 0; i < len; ++i) acc[i] = scale * static_cast<float>(q[i]);
  }
}

FEDFLEET_INLINE int32_t lowNibble(unsigned char b) {
  return static_cast<int32_t>(static_cast<signed char>(static_cast<unsigned char>(b << 4))) >> 4;
}
FEDFLEET_INLINE int32_t highNibble(unsigned char b) {
  return static_cast<int32_t>(static_cast<signed char>(b)) >> 4;
}

// Dequantise one bucket of 4-bit levels (len may be odd only for the last bucket).
FEDFLEET_INLINE void dequantize4(float* acc, const unsigned char* q, size_t len, float scale,
                                 float w, bool accumulate) {
  const size_t pairs = len / 2;
  if (accumulate) {
    for (size_t j = 0; j < pairs; ++j) {
      acc[2 * j] = std::fma(w, scale * static_cast<float>(lowNibble(q[j])), acc[2 * j]);
      acc[2 * j + 1] = std::fma(w, scale * static_cast<float>(highNibble(q[j])), acc[2 * j + 1]);
    }
    if (len % 2 != 0) {
      acc[len - 1] = std::fma(w, scale * static_cast<float>(lowNibble(q[pairs])), acc[len - 1]);
    }
  } else {
    for (size_t j = 0; j < pairs; ++j) {
      acc[2 * j] = scale * static_cast<float>(lowNibble(q[j]));
      acc[2 * j + 1] = scale * static_cast<float>(highNibble(q[j]));
    }
    if (len % 2 != 0) acc[len - 1] = scale * static_cast<float>(lowNibble(q[pairs]));
  }
}

FEDFLEET_INLINE void quantize8(const float* x, size_t start, size_t len, float inverse,
                               scalar::RandomKey key, signed char* q) {
  for (size_t i = 0; i < len; ++i) {
    const float u = scalar::uniform01(key, static_cast<uint32_t>(start + i));
    q[i] = static_cast<signed char>(scalar::qsgdLevel(x[i], inverse, u, 127));
  }
}

FEDFLEET_INLINE void quantize4(const float* x, size_t start, size_t len, float inverse,
                               scalar::RandomKey key, unsigned char* q) {
  const size_t pairs = len / 2;
  for (size_t j = 0; j < pairs; ++j) {
    const uint32_t i = static_cast<uint32_t>(start + 2 * j);
    const int32_t lo = scalar::qsgdLevel(x[2 * j], inverse, scalar::uniform01(key, i), 7);
    const int32_t hi = scalar::qsgdLevel(x[2 * j + 1], inverse, scalar::uniform01(key, i + 1), 7);
    q[j] = static_cast<unsigned char>((lo & 0xf) | ((hi & 0xf) << 4));
  }
  if (len % 2 != 0) {
    const uint32_t i = static_cast<uint32_t>(start + len - 1);
    q[pairs] = static_cast<unsigned char>(
        scalar::qsgdLevel(x[len - 1], inverse, scalar::uniform01(key, i), 7) & 0xf);
  }
}

FEDFLEET_INLINE void packSigns(const float* x, size_t n, unsigned char* out) {
  const size_t full = n / 8;
  for (size_t b = 0; b < full; ++b) {
    unsigned v = 0;
    for (unsigned j = 0; j < 8; ++j) v |= static_cast<unsigned>(x[8 * b + j] < 0.0f) << j;
    out[b] = static_cast<unsigned char>(v);
  }
  if (n % 8 != 0) {
    unsigned v = 0;
    for (size_t i = 8 * full; i < n; ++i) v |= static_cast<unsigned>(x[i] < 0.0f) << (i % 8);
    out[full] = static_cast<unsigned char>(v);
  }
}

// Elements [start, start + len) of one bucket into acc[0, len): start is a multiple of the
// bucket size, so of 8, and the bucket's bits begin at byte start / 8.
FEDFLEET_INLINE void unpackSigns(float* acc, const unsigned char* signs, size_t start, size_t len,
                                 float scale, float w, bool accumulate) {
  const uint32_t pos = scalar::bitsOf(scale);
  const uint32_t neg = pos | 0x80000000u;
  const unsigned char* bytes = signs + start / 8;
  const size_t full = len / 8;
  // Whole bytes: eight elements from one byte, a shape the vectoriser takes (SLP).
  if (accumulate) {
    for (size_t b = 0; b < full; ++b) {
      const uint32_t byte = bytes[b];
      for (uint32_t j = 0; j < 8; ++j) {
        const float d = scalar::floatOf(scalar::selectBits(((byte >> j) & 1u) != 0, neg, pos));
        acc[8 * b + j] = std::fma(w, d, acc[8 * b + j]);
      }
    }
  } else {
    for (size_t b = 0; b < full; ++b) {
      const uint32_t byte = bytes[b];
      for (uint32_t j = 0; j < 8; ++j) {
        acc[8 * b + j] = scalar::floatOf(scalar::selectBits(((byte >> j) & 1u) != 0, neg, pos));
      }
    }
  }
  for (size_t k = 8 * full; k < len; ++k) {
    const float d =
        scalar::floatOf(scalar::selectBits(((bytes[k >> 3] >> (k & 7)) & 1u) != 0, neg, pos));
    acc[k] = accumulate ? std::fma(w, d, acc[k]) : d;
  }
}

}  // namespace

size_t bucketCount(size_t n, uint32_t bucket) {
  return bucket == 0 ? 0 : (n + bucket - 1) / bucket;
}

size_t qsgdLevelBytes(size_t n, uint32_t bits) { return bits == 4 ? (n + 1) / 2 : n; }

int32_t qsgdLevels(uint32_t bits) { return bits == 4 ? 7 : 127; }

size_t signBytes(size_t n) { return (n + 7) / 8; }

FEDFLEET_KERNEL_CLONES
void qsgdQuantize(const float* x, size_t n, uint32_t bits, uint32_t bucket, uint64_t seed,
                  void* scales, void* levels) {
  checkShape(bucket);
  require(bits == 8 || bits == 4, "QSGD bits must be 8 or 4");
  auto* sc = static_cast<unsigned char*>(scales);
  auto* lv = static_cast<unsigned char*>(levels);
  const scalar::RandomKey key = scalar::randomKey(seed);
  const int32_t s = qsgdLevels(bits);
  for (size_t b = 0, start = 0; start < n; ++b, start += bucket) {
    const size_t len = (n - start < bucket) ? n - start : bucket;
    const QsgdScale q = qsgdScale(x + start, len, s);
    storeScale(sc, b, q.scale);
    if (bits == 8) {
      quantize8(x + start, start, len, q.inverse, key, reinterpret_cast<signed char*>(lv + start));
    } else {
      quantize4(x + start, start, len, q.inverse, key, lv + start / 2);
    }
  }
}

namespace {

// Every bucket's levels times its scale: written to `out` (accumulate false) or added to it
// times `w`. Inlined into each clone of the two kernels below.
FEDFLEET_INLINE void dequantizeBuckets(float* out, const void* scales, const void* levels, size_t n,
                                       uint32_t bits, uint32_t bucket, float w, bool accumulate) {
  checkShape(bucket);
  require(bits == 8 || bits == 4, "QSGD bits must be 8 or 4");
  const auto* sc = static_cast<const unsigned char*>(scales);
  const auto* lv = static_cast<const unsigned char*>(levels);
  for (size_t b = 0, start = 0; start < n; ++b, start += bucket) {
    const size_t len = (n - start < bucket) ? n - start : bucket;
    if (bits == 8) {
      dequantize8(out + start, reinterpret_cast<const signed char*>(lv + start), len,
                  loadScale(sc, b), w, accumulate);
    } else {
      dequantize4(out + start, lv + start / 2, len, loadScale(sc, b), w, accumulate);
    }
  }
}

}  // namespace

FEDFLEET_KERNEL_CLONES
void qsgdDequantize(const void* scales, const void* levels, size_t n, uint32_t bits,
                    uint32_t bucket, float* out) {
  dequantizeBuckets(out, scales, levels, n, bits, bucket, 0.0f, false);
}

FEDFLEET_KERNEL_CLONES
void qsgdDequantizeAccumulate(float* acc, const void* scales, const void* levels, size_t n,
                              uint32_t bits, uint32_t bucket, float w) {
  dequantizeBuckets(acc, scales, levels, n, bits, bucket, w, true);
}

FEDFLEET_KERNEL_CLONES
void signQuantize(const float* x, size_t n, uint32_t bucket, void* scales, void* signs) {
  checkShape(bucket);
  auto* sc = static_cast<unsigned char*>(scales);
  for (size_t b = 0, start = 0; start < n; ++b, start += bucket) {
    const size_t len = (n - start < bucket) ? n - start : bucket;
    storeScale(sc, b, static_cast<float>(sumAbs(x + start, len) / static_cast<double>(len)));
  }
  packSigns(x, n, static_cast<unsigned char*>(signs));
}

FEDFLEET_KERNEL_CLONES
void signDequantize(const void* scales, const void* signs, size_t n, uint32_t bucket, float* out) {
  checkShape(bucket);
  const auto* sc = static_cast<const unsigned char*>(scales);
  const auto* sg = static_cast<const unsigned char*>(signs);
  for (size_t b = 0, start = 0; start < n; ++b, start += bucket) {
    const size_t len = (n - start < bucket) ? n - start : bucket;
    unpackSigns(out + start, sg, start, len, loadScale(sc, b), 0.0f, false);
  }
}

FEDFLEET_KERNEL_CLONES
void signDequantizeAccumulate(float* acc, const void* scales, const void* signs, size_t n,
                              uint32_t bucket, float w) {
  checkShape(bucket);
  const auto* sc = static_cast<const unsigned char*>(scales);
  const auto* sg = static_cast<const unsigned char*>(signs);
  for (size_t b = 0, start = 0; start < n; ++b, start += bucket) {
    const size_t len = (n - start < bucket) ? n - start : bucket;
    unpackSigns(acc + start, sg, start, len, loadScale(sc, b), w, true);
  }
}

}  // namespace fedfleet::kernels
