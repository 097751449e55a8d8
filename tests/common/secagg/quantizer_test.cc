// Fixed-point encoding for secure aggregation: sums decode within the stated bound, stochastic
// rounding is unbiased, clipping holds, and ranges that could overflow 2^32 are refused.
#include "common/secagg/quantizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace fedfleet::secagg {
namespace {

crypto::KeyedStream stream(uint64_t id) {
  return crypto::KeyedStream(crypto::streamKeyFromSeed("quantizer test", id), 0, 0);
}

TEST(Quantizer, SumOfEncodingsDecodesWithinOneStepPerClient) {
  const QuantizerOptions o{2.0, 1u << 16};
  const size_t n_clients = 50, n = 500;
  std::vector<uint32_t> sum(n, 0), enc(n);
  std::vector<double> want(n, 0);
  auto values = stream(1);
  auto rounding = stream(2);
  for (size_t c = 0; c < n_clients; ++c) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) {
      v[i] = static_cast<float>(6 * values.nextOpenUnit() - 3);  // some beyond the clip range
      want[i] += std::clamp<double>(v[i], -2.0, 2.0);
    }
    quantize(o, v.data(), n, rounding, enc.data());
    for (size_t i = 0; i < n; ++i) sum[i] += enc[i];
  }
  std::vector<float> got(n);
  dequantizeSum(o, sum.data(), n, n_clients, got.data());
  const double step = 2 * o.clip_range / o.quant_range;
  double sq = 0;
  for (size_t i = 0; i < n; ++i) {
    const double err = got[i] - want[i];
    EXPECT_LE(std::fabs(err), n_clients * step + 1e-4) << i;
    sq += err * err;
  }
  // The error's standard deviation is at most sqrt(n_clients) x step / 2.
  EXPECT_LE(std::sqrt(sq / n), std::sqrt(static_cast<double>(n_clients)) * step / 2 * 1.2);
}

TEST(Quantizer, StochasticRoundingIsUnbiased) {
  const QuantizerOptions o{1.0, 4};  // steps of 0.5: 0.3 lies between 0 and 0.5
  auto rounding = stream(3);
  const float v = 0.3f;
  const int trials = 20000;
  double total = 0;
  for (int t = 0; t < trials; ++t) {
    uint32_t e;
    quantize(o, &v, 1, rounding, &e);
    EXPECT_TRUE(e == 2 || e == 3) << e;  // 0.0 or 0.5 after decoding
    float back;
    dequantizeSum(o, &e, 1, 1, &back);
    total += back;
  }
  // Mean of a Bernoulli(0.6) x 0.5: standard error 0.5 sqrt(0.24 / trials).
  EXPECT_NEAR(total / trials, 0.3, 4 * 0.5 * std::sqrt(0.24 / trials));
}

// The rounding draws are nextOpenUnit's, one a value in order, whatever block size the encoder
// reads the stream in: an encoding written out here value by value is the same to the bit, over
// lengths that end inside and at the edge of its blocks, and the stream is left where it would be.
TEST(Quantizer, DrawsAreTheStreamsOpenUnitsOneAValueInOrder) {
  const QuantizerOptions o{1.5, 1000};
  auto values = stream(4);
  for (size_t n : {1, 7, 511, 512, 513, 1500}) {
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(4 * values.nextOpenUnit() - 2);
    auto ours = stream(5 + n);
    auto theirs = stream(5 + n);
    std::vector<uint32_t> got(n);
    quantize(o, v.data(), n, ours, got.data());
    const double c = o.clip_range, q = o.quant_range;
    for (size_t i = 0; i < n; ++i) {
      const double x = (std::clamp<double>(v[i], -c, c) + c) * q / (2 * c);
      const double lo = std::floor(x);
      const uint32_t want =
          static_cast<uint32_t>(std::min(lo + (theirs.nextOpenUnit() < x - lo ? 1 : 0), q));
      ASSERT_EQ(got[i], want) << "n " << n << " value " << i;
    }
    EXPECT_EQ(ours.next64(), theirs.next64()) << n;
  }
}

TEST(Quantizer, RefusesRangesThatCouldOverflow) {
  EXPECT_TRUE(validateQuantizer({8.0, 1u << 22}, 1023).isOk());
  const Status s = validateQuantizer({8.0, 1u << 22}, 1024);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("at most 4194303"), std::string::npos) << s.message();
  EXPECT_FALSE(validateQuantizer({0.0, 16}, 2).isOk());
  EXPECT_FALSE(validateQuantizer({NAN, 16}, 2).isOk());
  EXPECT_FALSE(validateQuantizer({1.0, 0}, 2).isOk());
}

}  // namespace
}  // namespace fedfleet::secagg
