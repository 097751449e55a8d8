// Scalar definitions shared by the CPU reference (*_cpu.cc) and the CUDA kernels (*.cu): fp16
// and bf16 conversion, the counter-based random numbers of stochastic rounding, and the QSGD
// level of one element. Both sides compile exactly this code, so they produce the same bits.
//
// Internal to kernels/: the public headers are accumulate.h, convert.h, quantize.h, sparse.h
// and error_feedback.h. Everything here is plain IEEE single-precision arithmetic with one
// rounding per operation (no fma contraction: the CPU build uses ISO C++, which does not
// contract, and the CUDA target is compiled with --fmad=false), round to nearest even, and
// subnormals kept (no flush to zero).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FEDFLEET_HD __host__ __device__ __forceinline__
#else
#define FEDFLEET_HD inline __attribute__((always_inline))
#endif

namespace fedfleet::kernels::scalar {

FEDFLEET_HD uint32_t bitsOf(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
#endif
}

FEDFLEET_HD float floatOf(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
#endif
}

// cond ? a : b by masks: GCC's vectoriser takes this where it sees a ternary as control flow.
FEDFLEET_HD uint32_t selectBits(bool cond, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return (a & mask) | (b & ~mask);
}

// The largest finite fp16 (65504) and bf16 (0x1.fep127) as bit patterns without sign.
constexpr uint16_t kFp16MaxFinite = 0x7bff;
constexpr uint16_t kBf16MaxFinite = 0x7f7f;

// fp16 -> fp32, exact for every input (subnormals, infinities; a NaN stays a NaN with its
// payload shifted). Branch-free integer and float operations (after Maratyszcza's FP16
// library), so loops over it vectorise without F16C.
FEDFLEET_HD float fp16ToFloat(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  // Normal numbers: move exponent and mantissa into place, then rescale by 2^-112 (exact).
  const float normalized = floatOf((two_w >> 4) + (0xe0u << 23)) * 0x1.0p-112f;
  // Subnormals: build 0.5 + m * 2^-24 and subtract 0.5 (exact).
  const float denormalized = floatOf((two_w >> 17) | (126u << 23)) - 0.5f;
  return floatOf(sign | selectBits(two_w < (1u << 27), bitsOf(denormalized), bitsOf(normalized)));
}

// fp32 -> fp16, round to nearest even. A finite value beyond the fp16 range saturates to
// +-65504 instead of becoming infinite (deltas and top-k values must stay finite; error feedback
// carries the clipped remainder); infinities stay infinite, NaN becomes the quiet NaN 0x7e00
// with the input's sign.
FEDFLEET_HD uint16_t floatToFp16(float f) {
  // Branch-free (selects, no early returns) so that loops over it vectorise.
  const uint32_t w = bitsOf(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign16 = (w & 0x80000000u) >> 16;
  // Rounding by float addition (Maratyszcza): scale so that the fp16 rounding position falls
  // on the float's last mantissa bit, let the FPU round to nearest even, read the bits back.
  float base = (floatOf(w & 0x7fffffffu) * 0x1.0p+112f) * 0x1.0p-110f;
  uint32_t bias = shl1_w & 0xff000000u;
  bias = selectBits(bias < 0x71000000u, 0x71000000u, bias);
  base = floatOf((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = bitsOf(base);
  uint32_t nonsign = ((bits >> 13) & 0x00007c00u) + (bits & 0x00000fffu);
  // A finite input whose rounding reached the infinity pattern (|f| >= 65520): saturate.
  nonsign = selectBits(nonsign > kFp16MaxFinite, kFp16MaxFinite, nonsign);
  nonsign = selectBits(shl1_w == 0xff000000u, 0x7c00u, nonsign);  // infinity
  nonsign = selectBits(shl1_w > 0xff000000u, 0x7e00u, nonsign);   // NaN
  return static_cast<uint16_t>(sign16 | nonsign);
}

// bf16 -> fp32: exact (bf16 is the upper half of an fp32).
FEDFLEET_HD float bf16ToFloat(uint16_t h) { return floatOf(static_cast<uint32_t>(h) << 16); }

// fp32 -> bf16, round to nearest even; finite values beyond the bf16 range saturate to
// +-0x1.fep127 instead of becoming infinite; infinities stay; NaN becomes a quiet NaN (the top
// mantissa bit set) with the input's sign.
FEDFLEET_HD uint16_t floatToBf16(float f) {
  const uint32_t w = bitsOf(f);
  const uint32_t abs = w & 0x7fffffffu;
  const uint32_t sign16 = (w >> 16) & 0x8000u;
  uint32_t rounded = (abs + 0x7fffu + ((abs >> 16) & 1u)) >> 16;
  rounded = selectBits(rounded > kBf16MaxFinite, kBf16MaxFinite, rounded);
  rounded = selectBits(abs == 0x7f800000u, 0x7f80u, rounded);               // infinity
  rounded = selectBits(abs > 0x7f800000u, (abs >> 16) | 0x0040u, rounded);  // NaN, made quiet
  return static_cast<uint16_t>(sign16 | rounded);
}

// lowbias32 (Chris Wellons' integer hash search): a bijection on 32-bit words with a bias
// below 0.2 on the avalanche test; two rounds keyed by the seed feed stochastic rounding.
FEDFLEET_HD uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The two 32-bit keys of a seed: SplitMix64's finaliser, so nearby seeds give unrelated keys.
struct RandomKey {
  uint32_t k0;
  uint32_t k1;
};
FEDFLEET_HD RandomKey randomKey(uint64_t seed) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return RandomKey{static_cast<uint32_t>(z), static_cast<uint32_t>(z >> 32)};
}

// A uniform number in [0, 1) with 24 random bits for element `index` of a payload: a pure
// function of (key, index), so any thread on any device draws the same number for an element.
FEDFLEET_HD float uniform01(RandomKey key, uint32_t index) {
  const uint32_t h = hash32(hash32(index + key.k0) ^ key.k1);
  return static_cast<float>(static_cast<int32_t>(h >> 8)) * 0x1.0p-24f;
}

// QSGD level of one element, signed: with r = |v| * inv_scale (in [0, s] when inv_scale =
// s / ||bucket||), l = floor(r) + 1 with probability r - floor(r), else floor(r); capped at s.
// E[l] = r, so E[l * scale] = |v| up to float rounding. Returns sign(v) * l; zero for v == 0.
FEDFLEET_HD int32_t qsgdLevel(float v, float inv_scale, float u, int32_t levels) {
  // Written with masks and min instead of branches so that loops over it vectorise.
  const float cap = static_cast<float>(levels);
  float r = floatOf(bitsOf(v) & 0x7fffffffu) * inv_scale;
  // Also maps NaN to the cap (its bucket's scale is NaN too: decoders refuse the payload).
  r = floatOf(selectBits(r <= cap, bitsOf(r), bitsOf(cap)));
  // r is in [0, levels], so truncation is floor (and vectorises where floorf does not).
  const int32_t fl = static_cast<int32_t>(r);
  // r - fl is exact: for r >= 1 by Sterbenz's lemma, for r < 1 because fl == 0.
  int32_t l = fl + static_cast<int32_t>(u < r - static_cast<float>(fl));
  l = l < levels ? l : levels;
  const int32_t negative = -static_cast<int32_t>(v < 0.0f);  // all ones or zero
  return (l ^ negative) - negative;
}

// Number of sum lanes in the bucket reductions (QSGD norm, sign scale): lane j sums the
// elements i of the bucket with i % kLanes == j in order, in double; the lanes are then folded
// by halves (lane j += lane j + 16, then + 8, 4, 2, 1). A CUDA warp computes the same sum with
// one lane per thread and shuffle-xor steps, so CPU and GPU agree bit for bit.
constexpr int kReductionLanes = 32;

}  // namespace fedfleet::kernels::scalar
