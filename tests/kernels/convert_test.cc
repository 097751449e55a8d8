// fp16/bf16 conversion against independent references: every fp16 and bf16 pattern decodes to
// the value its fields say, and encoding rounds to the nearest representable value, ties to
// even, found by comparing with the exact midpoint in double. The fused decode-and-fold loops
// must equal decode then weightedAccumulate bit for bit.
#include "kernels/convert.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/accumulate.h"

namespace fedfleet::kernels {
namespace {

uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

float floatOf(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

// The value of an fp16 pattern from its fields (sign, 5-bit exponent, 10-bit mantissa).
double fp16Reference(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else if (exp == 31) {
    v = mant == 0 ? std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(1024 + mant, exp - 25);
  }
  return sign ? -v : v;
}

uint16_t toFp16(float f) {
  uint16_t h;
  floatToFp16(&f, 1, &h);
  return h;
}
float fromFp16(uint16_t h) {
  float f;
  fp16ToFloat(&h, 1, &f);
  return f;
}
uint16_t toBf16(float f) {
  uint16_t h;
  floatToBf16(&f, 1, &h);
  return h;
}
float fromBf16(uint16_t h) {
  float f;
  bf16ToFloat(&h, 1, &f);
  return f;
}

// Nearest of the sorted non-negative finite values `grid` to |f| (f finite, |f| <= grid.back()),
// ties to the even pattern; returns the pattern. grid[i] has pattern i.
uint16_t nearestEven(const std::vector<double>& grid, double a) {
  const size_t hi = std::lower_bound(grid.begin(), grid.end(), a) - grid.begin();
  if (grid[hi] == a) return static_cast<uint16_t>(hi);
  const size_t lo = hi - 1;
  const double mid = (grid[lo] + grid[hi]) / 2;  // exact: both have few mantissa bits
  if (a < mid) return static_cast<uint16_t>(lo);
  if (a > mid) return static_cast<uint16_t>(hi);
  return static_cast<uint16_t>(lo % 2 == 0 ? lo : hi);
}

TEST(Fp16, EveryPatternDecodesToItsValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const double want = fp16Reference(static_cast<uint16_t>(h));
    const float got = fromFp16(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << std::hex << h;
      EXPECT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;
    }
  }
}

TEST(Fp16, EveryNonNanPatternRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) {  // NaN: stays NaN, becomes quiet
      const uint16_t back = toFp16(fromFp16(static_cast<uint16_t>(h)));
      EXPECT_EQ(back & 0x7e00, 0x7e00) << std::hex << h;
      continue;
    }
    EXPECT_EQ(toFp16(fromFp16(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(Fp16, RoundsToNearestEvenAndSaturates) {
  std::vector<double> grid(0x7c00);  // non-negative finite fp16 values, in pattern order
  for (uint32_t h = 0; h < 0x7c00; ++h) grid[h] = fp16Reference(static_cast<uint16_t>(h));
  std::mt19937 gen(7);
  std::vector<float> samples;
  // Random bit patterns over the whole float range, plus values dense around fp16's range and
  // exact midpoints between neighbours (the ties).
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) samples.push_back(floatOf(bits(gen) & 0x7fffffffu));
  std::uniform_real_distribution<float> near(0.0f, 70000.0f);
  for (int i = 0; i < 100000; ++i) samples.push_back(near(gen));
  for (uint32_t h = 0; h + 1 < 0x7c00; h += 7) {
    samples.push_back(static_cast<float>((grid[h] + grid[h + 1]) / 2));
  }
  samples.insert(samples.end(), {0.0f, 0x1p-25f, 0x1.000002p-25f, 0x1p-24f, 65504.0f, 65519.0f,
                                 65519.996f, 65520.0f, 1e10f, 3.4e38f});
  size_t bad = 0;
  for (float f : samples) {
    if (!std::isfinite(f)) continue;  // NaN and infinity are checked below
    for (float s : {f, -f}) {
      const double a = std::fabs(static_cast<double>(s));
      const uint16_t want_mag = a >= 65504.0 ? 0x7bff : nearestEven(grid, a);  // saturates
      const uint16_t want = static_cast<uint16_t>((std::signbit(s) ? 0x8000 : 0) | want_mag);
      if (toFp16(s) != want) {
        if (++bad < 10) ADD_FAILURE() << s << ": got " << std::hex << toFp16(s) << " want " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(toFp16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(toFp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(toFp16(std::numeric_limits<float>::quiet_NaN()) & 0x7fff, 0x7e00);
  // Ties to even, by hand: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(toFp16(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(toFp16(1.0f + 3 * 0x1p-11f), 0x3c02);
}

TEST(Bf16, EveryPatternRoundTripsAndDecodesExactly) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fromBf16(static_cast<uint16_t>(h));
    EXPECT_EQ(bitsOf(f), h << 16);
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(std::isnan(fromBf16(toBf16(f))));
    } else {
      EXPECT_EQ(toBf16(f), h) << std::hex << h;
    }
  }
}

TEST(Bf16, RoundsToNearestEvenAndSaturates) {
  std::mt19937 gen(8);
  std::uniform_int_distribution<uint32_t> bits;
  size_t bad = 0;
  for (int i = 0; i < 300000; ++i) {
    uint32_t b = bits(gen) & 0x7fffffffu;
    if (i % 3 == 0) b = (b & 0xffff0000u) | 0x8000u;  // exact ties
    const float f = floatOf(b);
    if (!std::isfinite(f)) continue;
    const uint32_t lo = b >> 16;  // truncation and the next pattern bracket f
    const double a = f, vlo = floatOf(lo << 16), vhi = floatOf((lo + 1) << 16);
    uint32_t want;
    if (lo == 0x7f7f && a > vlo) {
      want = 0x7f7f;  // beyond the largest finite bf16: saturates
    } else {
      const double mid = (vlo + vhi) / 2;
      want = a < mid ? lo : a > mid ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
      if (want > 0x7f7f) want = 0x7f7f;
    }
    for (float s : {f, -f}) {
      const uint16_t w = static_cast<uint16_t>((s < 0 ? 0x8000 : 0) | want);
      if (toBf16(s) != w && ++bad < 10) ADD_FAILURE() << s << " got " << toBf16(s) << " want " << w;
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(toBf16(std::numeric_limits<float>::max()), 0x7f7f);
  EXPECT_EQ(toBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE((toBf16(std::numeric_limits<float>::quiet_NaN()) & 0x7fff) > 0x7f80);
  EXPECT_EQ(toBf16(1.0f + 0x1p-8f), 0x3f80);      // tie, to even (down)
  EXPECT_EQ(toBf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie, to even (up)
}

std::vector<float> randomFloats(size_t n, uint32_t seed, float range) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-range, range);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

class ConvertSizeTest : public ::testing::TestWithParam<size_t> {};

TEST_P(ConvertSizeTest, VectorLoopsMatchOneElementCalls) {
  const size_t n = GetParam();
  const std::vector<float> x = randomFloats(n, 3, 100.0f);
  // One byte of offset: packed buffers are unaligned on the wire.
  std::vector<unsigned char> h(2 * n + 1), b(2 * n + 1);
  floatToFp16(x.data(), n, h.data() + 1);
  floatToBf16(x.data(), n, b.data() + 1);
  std::vector<float> hf(n), bf(n);
  fp16ToFloat(h.data() + 1, n, hf.data());
  bf16ToFloat(b.data() + 1, n, bf.data());
  for (size_t i = 0; i < n; ++i) {
    uint16_t hi, bi;
    std::memcpy(&hi, h.data() + 1 + 2 * i, 2);
    std::memcpy(&bi, b.data() + 1 + 2 * i, 2);
    ASSERT_EQ(hi, toFp16(x[i])) << i;
    ASSERT_EQ(bi, toBf16(x[i])) << i;
    ASSERT_EQ(bitsOf(hf[i]), bitsOf(fromFp16(hi))) << i;
    ASSERT_EQ(bitsOf(bf[i]), bitsOf(fromBf16(bi))) << i;
  }
}

TEST_P(ConvertSizeTest, FusedAccumulateEqualsDecodeThenWeightedAccumulate) {
  const size_t n = GetParam();
  const std::vector<float> x = randomFloats(n, 4, 10.0f);
  const std::vector<float> acc0 = randomFloats(n, 5, 10.0f);
  const float w = 0.3183099f;
  std::vector<unsigned char> f32(4 * n + 3), f16(2 * n + 3), b16(2 * n + 3);
  if (n > 0) std::memcpy(f32.data() + 3, x.data(), 4 * n);
  floatToFp16(x.data(), n, f16.data() + 3);
  floatToBf16(x.data(), n, b16.data() + 3);
  struct Case {
    void (*fused)(float*, const void*, float, size_t);
    void (*decode)(const void*, size_t, float*);
    const unsigned char* in;
  };
  const auto decode32 = [](const void* in, size_t m, float* out) {
    if (m > 0) std::memcpy(out, in, 4 * m);
  };
  const Case cases[] = {{accumulateFp32, decode32, f32.data() + 3},
                        {accumulateFp16, fp16ToFloat, f16.data() + 3},
                        {accumulateBf16, bf16ToFloat, b16.data() + 3}};
  for (const Case& c : cases) {
    std::vector<float> fused = acc0, plain = acc0, dense(n);
    c.fused(fused.data(), c.in, w, n);
    c.decode(c.in, n, dense.data());
    weightedAccumulate(plain.data(), dense.data(), w, n);
    size_t mismatches = 0;
    for (size_t i = 0; i < n; ++i) mismatches += bitsOf(fused[i]) != bitsOf(plain[i]);
    EXPECT_EQ(mismatches, 0u);
  }
}

TEST_P(ConvertSizeTest, AllFiniteFindsOneBadValueAnywhere) {
  const size_t n = GetParam();
  const std::vector<float> x = randomFloats(n, 6, 1000.0f);
  std::vector<unsigned char> f32(4 * n + 1), f16(2 * n + 1), b16(2 * n + 1);
  if (n > 0) std::memcpy(f32.data() + 1, x.data(), 4 * n);
  floatToFp16(x.data(), n, f16.data() + 1);
  floatToBf16(x.data(), n, b16.data() + 1);
  EXPECT_TRUE(allFiniteFp32(f32.data() + 1, n));
  EXPECT_TRUE(allFiniteFp16(f16.data() + 1, n));
  EXPECT_TRUE(allFiniteBf16(b16.data() + 1, n));
  if (n == 0) return;
  // One position in each of the four segments the check reads at once, and in the tail.
  for (size_t pos : {size_t{0}, n / 4, n / 2 + 1, 3 * n / 4, n - 2, n - 1}) {
    if (pos >= n) continue;
    const uint32_t inf32 = 0x7f800000u, nan32 = 0x7fc00001u;
    const uint16_t inf16 = 0x7c00, nan16 = 0xfe01, infb = 0xff80, nanb = 0x7fc1;
    for (uint32_t bad : {inf32, nan32}) {
      std::vector<unsigned char> c = f32;
      std::memcpy(c.data() + 1 + 4 * pos, &bad, 4);
      EXPECT_FALSE(allFiniteFp32(c.data() + 1, n)) << pos;
    }
    for (uint16_t bad : {inf16, nan16}) {
      std::vector<unsigned char> c = f16;
      std::memcpy(c.data() + 1 + 2 * pos, &bad, 2);
      EXPECT_FALSE(allFiniteFp16(c.data() + 1, n)) << pos;
    }
    for (uint16_t bad : {infb, nanb}) {
      std::vector<unsigned char> c = b16;
      std::memcpy(c.data() + 1 + 2 * pos, &bad, 2);
      EXPECT_FALSE(allFiniteBf16(c.data() + 1, n)) << pos;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ConvertSizeTest,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{33},
                                           size_t{4097}, size_t{100003}));

}  // namespace
}  // namespace fedfleet::kernels
