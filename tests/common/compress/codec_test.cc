// Codecs end to end: round trips (exact where lossless, bounded and unbiased for QSGD, exact
// top-k selection, sign scales), decodeAccumulate equal to decode + weighted add bit for bit,
// determinism, sizes, and refusal of every kind of malformed payload without touching the
// output.
#include "common/compress/codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/accumulate.h"
#include "kernels/sparse.h"

namespace fedfleet::compress {
namespace {

using ::testing::HasSubstr;

uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::unique_ptr<Codec> codecFor(const std::string& text) {
  Result<CodecSpec> spec = parseCodecSpec(text);
  EXPECT_TRUE(spec.isOk()) << spec.status().toString();
  Result<std::unique_ptr<Codec>> codec = makeCodec(spec.value());
  EXPECT_TRUE(codec.isOk()) << codec.status().toString();
  return std::move(codec).value();
}

std::string encode(const Codec& codec, const std::vector<float>& x, uint64_t seed = 1) {
  std::string out;
  codec.encode(x.data(), x.size(), seed, &out);
  return out;
}

std::vector<float> decode(const Codec& codec, const std::string& payload, size_t n) {
  std::vector<float> out(n);
  const Status st = codec.decode(payload, n, out.data());
  EXPECT_TRUE(st.isOk()) << st.toString();
  return out;
}

const std::vector<std::string> kAllCodecs = {
    "none",      "fp16",     "bf16", "qsgd8",        "qsgd4", "qsgd8,bucket=64",
    "topk:0.01", "topk:0.5", "sign", "sign,bucket=8"};

// (codec text, n)
class CodecTest : public ::testing::TestWithParam<std::tuple<std::string, size_t>> {};

TEST_P(CodecTest, DecodeAccumulateEqualsDecodeThenWeightedAdd) {
  const auto& [text, n] = GetParam();
  const auto codec = codecFor(text);
  const std::vector<float> x = gaussian(n, 1);
  const std::string payload = encode(*codec, x, 99);
  const std::vector<float> dense = decode(*codec, payload, n);
  std::vector<float> fused = gaussian(n, 2), plain = fused;
  ASSERT_TRUE(codec->decodeAccumulate(payload, n, 0.37f, fused.data()).isOk());
  kernels::weightedAccumulate(plain.data(), dense.data(), 0.37f, n);
  size_t mismatches = 0;
  for (size_t i = 0; i < n; ++i) mismatches += bitsOf(fused[i]) != bitsOf(plain[i]);
  EXPECT_EQ(mismatches, 0u);
  // The free functions decode any codec's payload the same way.
  std::vector<float> any(n);
  ASSERT_TRUE(decodePayload(payload, n, any.data()).isOk());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(bitsOf(any[i]), bitsOf(dense[i])) << i;
}

TEST_P(CodecTest, SameSeedSameBytesAndSizeAsPromised) {
  const auto& [text, n] = GetParam();
  const auto codec = codecFor(text);
  const std::vector<float> x = gaussian(n, 3);
  const std::string a = encode(*codec, x, 5), b = encode(*codec, x, 5);
  EXPECT_EQ(a, b);
  EXPECT_LE(a.size(), codec->maxEncodedBytes(n));
  if (codec->spec().name != "topk") {
    EXPECT_EQ(a.size(), codec->maxEncodedBytes(n));
  }
  // Appending: encode adds to what *out holds.
  std::string both = "prefix";
  codec->encode(x.data(), n, 5, &both);
  EXPECT_EQ(both, "prefix" + a);
  // Every decoded value is finite.
  for (float v : decode(*codec, a, n)) ASSERT_TRUE(std::isfinite(v));
}

TEST_P(CodecTest, RefusesTruncatedExtendedAndWrongLengthPayloads) {
  const auto& [text, n] = GetParam();
  const auto codec = codecFor(text);
  const std::vector<float> x = gaussian(n, 4);
  const std::string payload = encode(*codec, x);
  const std::vector<float> acc0 = gaussian(n + 1, 5);
  auto refused = [&](const std::string& bad, size_t m, const char* what) {
    std::vector<float> out = acc0, acc = acc0;
    const Status d = codec->decode(bad, m, out.data());
    const Status a = codec->decodeAccumulate(bad, m, 1.0f, acc.data());
    EXPECT_EQ(d.code(), StatusCode::kCorrupt) << what << ": " << d.toString();
    EXPECT_EQ(a.code(), StatusCode::kCorrupt) << what << ": " << a.toString();
    EXPECT_EQ(out, acc0) << what << ": output touched";
    EXPECT_EQ(acc, acc0) << what << ": accumulator touched";
  };
  // Every prefix for short payloads, a spread of them for long ones.
  const size_t step = std::max<size_t>(1, payload.size() / 200);
  for (size_t len = 0; len < payload.size(); len += step) {
    refused(payload.substr(0, len), n, "truncated");
  }
  refused(payload.substr(0, payload.size() - 1), n, "one byte short");
  refused(payload + '\0', n, "one byte extra");
  refused(payload, n + 1, "n too large");
  if (n > 0) refused(payload, n - 1, "n too small");
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CodecTest,
                         ::testing::Combine(::testing::ValuesIn(kAllCodecs),
                                            ::testing::Values(size_t{0}, size_t{1}, size_t{7},
                                                              size_t{8}, size_t{513}, size_t{4099},
                                                              size_t{100003})),
                         [](const ::testing::TestParamInfo<CodecTest::ParamType>& info) {
                           std::string name = std::get<0>(info.param) + "_" +
                                              std::to_string(std::get<1>(info.param));
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

TEST(NoneCodec, RoundTripIsExact) {
  const auto codec = codecFor("none");
  std::vector<float> x = gaussian(1001, 6);
  x[0] = -0.0f;
  x[1] = 1e-45f;  // subnormal
  x[2] = 3.4e38f;
  const std::vector<float> back = decode(*codec, encode(*codec, x), x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bitsOf(back[i]), bitsOf(x[i])) << i;
}

TEST(HalfCodecs, RepresentableValuesAreExactOthersRoundToNearestEven) {
  const auto fp16 = codecFor("fp16");
  const auto bf16 = codecFor("bf16");
  // Representable in both: small integers, powers of two, their negatives, zeros.
  std::vector<float> exact = {0.0f, -0.0f, 1.0f, -2.0f, 0.5f, 0.375f, 96.0f, -1024.0f, 0x1p-14f};
  for (const Codec* codec : {fp16.get(), bf16.get()}) {
    const std::vector<float> back = decode(*codec, encode(*codec, exact), exact.size());
    for (size_t i = 0; i < exact.size(); ++i) EXPECT_EQ(bitsOf(back[i]), bitsOf(exact[i])) << i;
  }
  // fp16: every 16-bit pattern that is finite round-trips; 2049 is halfway between 2048 and
  // 2050 (ties to even: 2048), 2051 between 2050 and 2052 (to 2052); 1e6 saturates at 65504.
  const std::vector<float> fp16_in = {2049.0f, 2051.0f, 1e6f, -1e6f, 0.1f, 6e-8f};
  const std::vector<float> fp16_want = {2048.0f,   2052.0f,          65504.0f,
                                        -65504.0f, 0.0999755859375f, 5.9604644775390625e-08f};
  EXPECT_EQ(decode(*fp16, encode(*fp16, fp16_in), 6), fp16_want);
  // bf16 keeps 8 significant bits: 257 is a tie between 256 and 258 (to 256), 259 rounds to
  // 260; 1/3 to 0.333984375.
  const std::vector<float> bf16_in = {257.0f, 259.0f, 1.0f / 3.0f, 3.4028235e38f};
  const std::vector<float> bf16_want = {256.0f, 260.0f, 0.333984375f, 0x1.fep127f};  // saturated
  const std::vector<float> got = decode(*bf16, encode(*bf16, bf16_in), 4);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got[i], bf16_want[i]) << i;
  EXPECT_EQ(encode(*fp16, fp16_in).size(), kPayloadHeaderBytes + 12);
}

TEST(QsgdCodec, ErrorBoundedByOneLevelAndUnbiasedOverSeeds) {
  for (const std::string text : {"qsgd8", "qsgd4"}) {
    const auto codec = codecFor(text);
    const uint32_t bits = codec->spec().bits;
    const float s = bits == 8 ? 127.0f : 7.0f;
    const size_t n = 1000;
    const std::vector<float> x = gaussian(n, 7);
    std::vector<double> mean(n, 0.0);
    const int seeds = 4000;
    double max_step = 0;
    for (int seed = 0; seed < seeds; ++seed) {
      const std::vector<float> d = decode(*codec, encode(*codec, x, seed), n);
      for (size_t b = 0; b < n; b += 512) {
        const size_t end = std::min(n, b + 512);
        double norm2 = 0;
        for (size_t i = b; i < end; ++i) norm2 += double(x[i]) * x[i];
        const double step = std::sqrt(norm2) / s;  // one quantisation level
        max_step = std::max(max_step, step);
        for (size_t i = b; i < end; ++i) {
          ASSERT_LE(std::fabs(d[i] - x[i]), step * (1 + 1e-5)) << text << " element " << i;
        }
      }
      for (size_t i = 0; i < n; ++i) mean[i] += d[i] / seeds;
    }
    // Each draw is one of the two levels around x_i: variance at most step^2 / 4; allow five
    // standard errors.
    const double tolerance = 5.0 * (max_step / 2.0) / std::sqrt(double(seeds));
    size_t off = 0;
    for (size_t i = 0; i < n; ++i) off += std::fabs(mean[i] - x[i]) > tolerance;
    EXPECT_EQ(off, 0u) << text;
  }
}

TEST(QsgdCodec, CompressesAsDocumented) {
  const std::vector<float> x = gaussian(1 << 20, 8);
  const double fp32 = 4.0 * x.size();
  EXPECT_GT(fp32 / encode(*codecFor("qsgd8"), x).size(), 3.9);
  EXPECT_GT(fp32 / encode(*codecFor("qsgd4"), x).size(), 7.8);
  EXPECT_GT(fp32 / encode(*codecFor("sign"), x).size(), 30.0);
  EXPECT_GT(fp32 / encode(*codecFor("topk:0.01"), x).size(), 50.0);
}

std::vector<uint32_t> referenceTopK(const std::vector<float>& x, size_t k) {
  std::vector<uint32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return std::fabs(x[a]) > std::fabs(x[b]);  // stable: equal magnitudes keep lower index first
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

TEST(TopkCodec, KeepsExactlyTheKLargestMagnitudes) {
  for (size_t n : {size_t{1}, size_t{50}, size_t{5000}, size_t{1000003}}) {
    for (double ratio : {0.001, 0.01, 0.1, 1.0}) {
      std::vector<float> x = gaussian(n, static_cast<uint32_t>(n));
      const size_t k = topkCount(n, ratio);
      ASSERT_EQ(k, std::clamp<size_t>(static_cast<size_t>(std::llround(ratio * n)), 1, n));
      const std::vector<uint32_t> want = referenceTopK(x, k);
      for (uint64_t seed : {0ull, 77ull}) {
        std::vector<uint32_t> got;
        selectTopK(x.data(), n, k, seed, &got);
        ASSERT_EQ(got, want) << "n " << n << " ratio " << ratio << " seed " << seed;
      }
      // Decoded: the kept elements carry fp16(x), all others are zero.
      CodecSpec spec;
      spec.name = "topk";
      spec.ratio = ratio;
      const auto codec = std::move(makeCodec(spec)).value();
      const std::string payload = encode(*codec, x, 3);
      EXPECT_EQ(payload, encode(*codec, x, 4)) << "the seed changes only the time taken";
      const std::vector<float> d = decode(*codec, payload, n);
      std::vector<char> kept(n, 0);
      for (uint32_t i : want) kept[i] = 1;
      for (size_t i = 0; i < n; ++i) {
        if (kept[i]) {  // fp16: 11 significant bits, absolute 2^-25 in the subnormal range
          ASSERT_NEAR(d[i], x[i], std::max(std::fabs(x[i]) * 0x1p-11f, 0x1p-25f)) << i;
        } else {
          ASSERT_EQ(d[i], 0.0f) << i;
        }
      }
    }
  }
}

TEST(TopkCodec, TiesKeepTheLowerIndices) {
  // 40 elements of magnitude 2 (alternating sign) among smaller ones, k = 10: the ten lowest
  // indices of the tie group are kept, whatever the seed's threshold sample saw.
  const size_t n = 200000;
  std::vector<float> x = gaussian(n, 9, 0.1f);
  std::vector<uint32_t> ties;
  for (size_t i = 1000; ties.size() < 40; i += 4111) {
    x[i] = (ties.size() % 2) ? -2.0f : 2.0f;
    ties.push_back(static_cast<uint32_t>(i));
  }
  for (uint64_t seed = 0; seed < 5; ++seed) {
    std::vector<uint32_t> got;
    selectTopK(x.data(), n, 10, seed, &got);
    EXPECT_EQ(got, std::vector<uint32_t>(ties.begin(), ties.begin() + 10));
  }
  // A mass of equal values (the sampled threshold lands inside a huge tie group).
  std::vector<float> flat(n, 1.0f);
  flat[n - 1] = 5.0f;
  std::vector<uint32_t> got;
  selectTopK(flat.data(), n, 2000, 1, &got);
  ASSERT_EQ(got.size(), 2000u);
  for (size_t j = 0; j < 1999; ++j) ASSERT_EQ(got[j], j);
  EXPECT_EQ(got.back(), n - 1);
}

// The GPU's top-k path trims candidates (every element at or above a threshold, in whatever
// order the device wrote them) with trimToTopK: it must pick what selectTopK picks.
TEST(TopkCodec, TrimmingShuffledCandidatesAboveAThresholdIsSelectTopK) {
  const size_t n = 50000;
  std::vector<float> x = gaussian(n, 21, 1.0f);
  for (size_t i = 0; i < n; i += 97) x[i] = (i % 2) ? -1.5f : 1.5f;  // a tie group
  // A k whose boundary falls inside the tie group: ties decide which of them are kept.
  size_t above = 0;
  for (float v : x) above += std::abs(v) > 1.5f;
  std::mt19937 gen(4);
  for (float threshold : {1.5f, 1.0f, 0.5f}) {
    std::vector<uint32_t> idx;
    std::vector<float> values;
    for (size_t i = 0; i < n; ++i) {
      if (std::abs(x[i]) >= threshold) {
        idx.push_back(static_cast<uint32_t>(i));
        values.push_back(x[i]);
      }
    }
    std::vector<size_t> perm(idx.size());
    std::iota(perm.begin(), perm.end(), size_t{0});
    std::shuffle(perm.begin(), perm.end(), gen);
    std::vector<uint32_t> shuffled_idx(idx.size());
    std::vector<float> shuffled_values(idx.size());
    for (size_t j = 0; j < perm.size(); ++j) {
      shuffled_idx[j] = idx[perm[j]];
      shuffled_values[j] = values[perm[j]];
    }
    for (size_t k : {size_t{0}, size_t{1}, size_t{100}, above + 10, idx.size() / 2, idx.size()}) {
      SCOPED_TRACE("threshold " + std::to_string(threshold) + ", k " + std::to_string(k));
      std::vector<uint32_t> want;
      selectTopK(x.data(), n, k, 3, &want);
      std::vector<uint32_t> got;
      std::vector<float> got_values;
      trimToTopK(shuffled_idx.data(), shuffled_values.data(), idx.size(), k, &got, &got_values);
      ASSERT_EQ(got, want);
      for (size_t j = 0; j < k; ++j) ASSERT_EQ(got_values[j], x[got[j]]);
    }
  }
}

TEST(SignCodec, DecodesToPlusMinusMeanAbsolutePerBucket) {
  const auto codec = codecFor("sign,bucket=8");
  const std::vector<float> x = {1, -2, 3, -4, 0, 0, 5, -6, /* bucket 2: */ 0.5f, -0.25f};
  const std::vector<float> d = decode(*codec, encode(*codec, x), x.size());
  const float s1 = 21.0f / 8.0f, s2 = 0.375f;
  const std::vector<float> want = {s1, -s1, s1, -s1, s1, s1, s1, -s1, s2, -s2};
  EXPECT_EQ(d, want);
  // 10 elements: 12 header bytes, 2 scales, 2 bytes of bits.
  EXPECT_EQ(encode(*codec, x).size(), kPayloadHeaderBytes + 8 + 2);
}

// Overwrites `bytes` at `at` in a copy of the payload.
std::string patched(std::string p, size_t at, const std::string& bytes) {
  p.replace(at, bytes.size(), bytes);
  return p;
}

std::string le32(uint32_t v) {
  std::string s(4, '\0');
  std::memcpy(s.data(), &v, 4);
  return s;
}

// A topk payload from its parts (values and varint bytes given raw).
std::string topkPayload(uint32_t n, uint32_t k, const std::string& values,
                        const std::string& varints) {
  PayloadHeader h;
  h.kind = CodecKind::kTopk;
  h.param = k;
  h.n = n;
  std::string p;
  appendPayloadHeader(h, &p);
  return p + values + varints;
}

TEST(Payload, RefusesBadHeadersAndBodiesWithReasons) {
  const size_t n = 100;
  std::vector<float> x = gaussian(n, 10);
  struct Case {
    std::string codec, payload, reason;
  };
  const std::string none = encode(*codecFor("none"), x);
  const std::string fp16 = encode(*codecFor("fp16"), x);
  const std::string bf16 = encode(*codecFor("bf16"), x);
  const std::string q8 = encode(*codecFor("qsgd8,bucket=64"), x);
  const std::string q4 =
      encode(*codecFor("qsgd4,bucket=64"), std::vector<float>(x.begin(), x.begin() + 99));
  const std::string topk = encode(*codecFor("topk:0.05"), x);
  const std::string sign =
      encode(*codecFor("sign,bucket=64"), std::vector<float>(x.begin(), x.begin() + 99));
  const float nan = std::nanf(""), inf = INFINITY, neg = -1.0f;
  std::string nan32(4, '\0'), inf32(4, '\0'), neg32(4, '\0');
  std::memcpy(nan32.data(), &nan, 4);
  std::memcpy(inf32.data(), &inf, 4);
  std::memcpy(neg32.data(), &neg, 4);
  const size_t h = kPayloadHeaderBytes;
  const std::vector<Case> cases = {
      {"none", patched(none, 0, "\x01"), "magic"},
      {"none", patched(none, 1, "\x09"), "unknown codec"},
      {"none", patched(none, 3, "\x01"), "reserved"},
      {"none", patched(none, 2, "\x08"), "bits"},
      {"none", patched(none, 4, le32(5)), "param"},
      {"none", patched(none, 8, le32(99)), "holds 99 elements, expected 100"},
      {"none", patched(none, h + 4 * 17, nan32), "NaN or infinity"},
      {"none", patched(none, h + 4 * 99, inf32), "NaN or infinity"},
      {"fp16", patched(fp16, h + 2 * 50, std::string("\x00\x7c", 2)), "NaN or infinity"},
      {"bf16", patched(bf16, h + 2 * 3, std::string("\xc1\xff", 2)), "NaN or infinity"},
      {"qsgd8,bucket=64", patched(q8, 2, "\x05"), "bits 5"},
      {"qsgd8,bucket=64", patched(q8, 4, le32(60)), "bucket 60"},
      {"qsgd8,bucket=64", patched(q8, 4, le32(0)), "bucket 0"},
      {"qsgd8,bucket=64", patched(q8, h + 4, nan32), "scale 1"},
      {"qsgd8,bucket=64", patched(q8, h, neg32), "scale 0"},
      {"qsgd8,bucket=64", patched(q8, h, le32(0x7f000000u)), "scale 0"},  // * 128 overflows
      {"qsgd4,bucket=64", patched(q4, q4.size() - 1, "\xf0"), "padding nibble"},
      {"qsgd4,bucket=64", patched(q4, 2, "\x08"), "expected"},  // 8-bit levels: wrong size
      {"sign,bucket=64", patched(sign, h, inf32), "scale 0"},
      {"sign,bucket=64", patched(sign, sign.size() - 1, "\xff"), "padding bits"},
      {"topk:0.05", patched(topk, 4, le32(101)), "keeps 101 of 100"},
      {"topk:0.05", patched(topk, 4, le32(6)), "too short for 6 entries"},
      {"topk:0.05", topk.substr(0, topk.size() - 1), "too short for 5 entries"},
      {"topk:0.05", topk + '\0', "bytes after its 5 indices"},
      {"topk:0.05", patched(topk, h, std::string("\x00\xfc", 2)), "NaN or infinity"},
      // Hand-made: two values (1.0 in fp16), then index varints.
      {"topk:0.05",
       topkPayload(100, 2, std::string("\x00\x3c\x00\x3c", 4), std::string("\x63\x00", 2)),
       "index 1 is 100, past the 100 elements"},
      {"topk:0.05",
       topkPayload(100, 2, std::string("\x00\x3c\x00\x3c", 4), std::string("\x80\x00", 2)),
       "ends after 1 of 2"},
      {"topk:0.05", topkPayload(100, 2, std::string("\x00\x3c\x00\x3c", 4), "\x01\x80\x80"),
       "truncated inside index 1"},
      {"topk:0.05", topkPayload(100, 1, std::string("\x00\x3c", 2), "\xff\xff\xff\xff\xff\x01"),
       "overlong"},
      {"topk:0.05", topkPayload(100, 1, std::string("\x00\x3c", 2), "\xff\xff\xff\xff\x0f"),
       "past the 100 elements"},
  };
  for (const Case& c : cases) {
    const auto codec = codecFor(c.codec);
    const size_t m = c.codec.rfind("qsgd4", 0) == 0 || c.codec.rfind("sign", 0) == 0 ? 99 : n;
    std::vector<float> out(m, 7.0f), acc(m, 7.0f);
    const Status d = codec->decode(c.payload, m, out.data());
    const Status a = decodeAccumulatePayload(c.payload, m, 1.0f, acc.data());
    EXPECT_EQ(d.code(), StatusCode::kCorrupt) << c.codec << " / " << c.reason;
    EXPECT_THAT(d.message(), HasSubstr(c.reason)) << c.codec;
    EXPECT_EQ(a.code(), StatusCode::kCorrupt) << c.codec << " / " << c.reason;
    EXPECT_EQ(out, std::vector<float>(m, 7.0f)) << c.reason << ": output touched";
    EXPECT_EQ(acc, std::vector<float>(m, 7.0f)) << c.reason << ": accumulator touched";
  }
}

// Top-k payloads made by hand (kernels::encodeIndexGaps), with gaps of 1- to 4-byte varints
// (tests/kernels/sparse_test.cc covers 5) and the last element of the range kept, folded by
// decodeAccumulatePayload: the same bits as the reference, decode to dense then add each kept value
// with one fma.
TEST(Payload, TopkFoldEqualsDecodeThenScatterOnLongGapsAndRangeEnds) {
  std::mt19937 gen(21);
  for (const uint32_t n : {1u, 5u, 1000u, 262144u, 5000000u}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::vector<uint32_t> idx;
    const uint32_t long_gaps[] = {200, 20000, 3000000};
    for (uint64_t next = gen() % 3, j = 0; next < n; ++j) {
      idx.push_back(static_cast<uint32_t>(next));
      next += 1 + (j % 5 == 4 ? long_gaps[(j / 5) % 3] : gen() % 150);
    }
    if (idx.back() != n - 1) idx.push_back(n - 1);
    const size_t k = idx.size();
    std::vector<float> values = gaussian(k, 22);
    values[0] = 65504.0f;  // the largest fp16
    std::vector<unsigned char> halves(2 * k), gaps(5 * k);
    std::vector<uint32_t> iota(k);
    std::iota(iota.begin(), iota.end(), 0u);
    kernels::gatherFp16(values.data(), iota.data(), k, halves.data());
    gaps.resize(kernels::encodeIndexGaps(idx.data(), k, gaps.data()));
    PayloadHeader h;
    h.kind = CodecKind::kTopk;
    h.param = static_cast<uint32_t>(k);
    h.n = n;
    std::string payload;
    appendPayloadHeader(h, &payload);
    payload.append(reinterpret_cast<const char*>(halves.data()), halves.size());
    payload.append(reinterpret_cast<const char*>(gaps.data()), gaps.size());

    std::vector<float> dense(n), acc(n, 0.25f), want(n, 0.25f);
    ASSERT_TRUE(decodePayload(payload, n, dense.data()).isOk());
    ASSERT_TRUE(decodeAccumulatePayload(payload, n, -0.3f, acc.data()).isOk());
    for (size_t j = 0; j < k; ++j) {
      want[idx[j]] = std::fma(-0.3f, dense[idx[j]], want[idx[j]]);
      ASSERT_NE(dense[idx[j]], 0.0f) << "entry " << j;
    }
    for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(bitsOf(acc[i]), bitsOf(want[i])) << i;
    EXPECT_EQ(dense[n - 1], dense[idx[k - 1]]);

    // The same payload for one element fewer is refused, and nothing is folded, although every
    // index but the last is in range.
    if (n > 1) {
      std::string shorter = payload;
      const uint32_t m = n - 1;
      std::memcpy(shorter.data() + 8, &m, sizeof(m));
      std::vector<float> untouched(m, 0.25f);
      const Status st = decodeAccumulatePayload(shorter, m, 1.0f, untouched.data());
      EXPECT_EQ(st.code(), StatusCode::kCorrupt);
      EXPECT_THAT(st.message(), HasSubstr("index " + std::to_string(k - 1) + " is"));
      EXPECT_EQ(untouched, std::vector<float>(m, 0.25f));
    }
  }
}

// An update cut into chunks as the client's upload pipeline cuts it (the last one shorter),
// each chunk its own topk payload, folded chunk by chunk into one accumulator: the same bits as
// decoding each chunk to dense and adding it with weightedAccumulate.
TEST(Payload, ChunkedTopkFoldEqualsDenseReference) {
  const size_t n = 1000003, chunk = 262144;  // 4 chunks, the last 213571 elements
  const auto codec = codecFor("topk:0.01");
  std::vector<float> acc = gaussian(n, 23), want = acc;
  for (uint32_t u = 0; u < 3; ++u) {
    const std::vector<float> x = gaussian(n, 30 + u, 0.01f * static_cast<float>(u + 1));
    const float w = 1.0f / static_cast<float>(u + 2);
    for (size_t off = 0; off < n; off += chunk) {
      const size_t len = std::min(chunk, n - off);
      std::string payload;
      codec->encode(x.data() + off, len, u * 10 + off / chunk, &payload);
      std::vector<float> dense(len);
      ASSERT_TRUE(decodePayload(payload, len, dense.data()).isOk());
      kernels::weightedAccumulate(want.data() + off, dense.data(), w, len);
      ASSERT_TRUE(decodeAccumulatePayload(payload, len, w, acc.data() + off).isOk());
    }
  }
  size_t mismatches = 0;
  for (size_t i = 0; i < n; ++i) mismatches += bitsOf(acc[i]) != bitsOf(want[i]);
  EXPECT_EQ(mismatches, 0u);
}

TEST(Payload, CodecRefusesAnotherCodecsPayloadButTheFreeFunctionsTakeAny) {
  const std::vector<float> x = gaussian(64, 11);
  const std::string q8 = encode(*codecFor("qsgd8"), x);
  std::vector<float> out(64);
  const Status st = codecFor("topk")->decode(q8, 64, out.data());
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_THAT(st.message(), HasSubstr("made by codec qsgd, not topk"));
  // qsgd4's codec decodes an 8-bit qsgd payload: the payload's parameters rule.
  EXPECT_TRUE(codecFor("qsgd4")->decode(q8, 64, out.data()).isOk());
  EXPECT_TRUE(decodePayload(q8, 64, out.data()).isOk());
  Result<PayloadHeader> header = readPayloadHeader(q8);
  ASSERT_TRUE(header.isOk());
  EXPECT_EQ(header->kind, CodecKind::kQsgd);
  EXPECT_EQ(header->bits, 8u);
  EXPECT_EQ(header->param, 512u);
  EXPECT_EQ(header->n, 64u);
}

TEST(Payload, RandomCorruptionNeverCrashesAndNeverYieldsNonFiniteValues) {
  std::mt19937 gen(12);
  size_t refused = 0, accepted = 0;
  for (const std::string& text : kAllCodecs) {
    const auto codec = codecFor(text);
    const size_t n = 777;
    const std::string payload = encode(*codec, gaussian(n, 13));
    for (int trial = 0; trial < 400; ++trial) {
      std::string bad = payload;
      const int flips = 1 + trial % 4;
      for (int f = 0; f < flips; ++f) {
        bad[gen() % bad.size()] = static_cast<char>(gen());
      }
      std::vector<float> out(n, 3.0f), acc(n, 3.0f);
      const Status d = decodePayload(bad, n, out.data());
      const Status a = decodeAccumulatePayload(bad, n, 0.5f, acc.data());
      ASSERT_EQ(d.isOk(), a.isOk()) << text;
      if (d.isOk()) {
        ++accepted;
        for (size_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(out[i]) && std::isfinite(acc[i]));
      } else {
        ++refused;
        ASSERT_EQ(d.code(), StatusCode::kCorrupt);
        ASSERT_EQ(out, std::vector<float>(n, 3.0f));
        ASSERT_EQ(acc, std::vector<float>(n, 3.0f));
      }
    }
  }
  EXPECT_GT(refused, 100u);
  EXPECT_GT(accepted, 100u);  // flips inside values are valid payloads with other values
}

TEST(Codec, ConcurrentUseGivesTheSerialResults) {
  const size_t n = 300000;
  const std::vector<float> x = gaussian(n, 14);
  for (const std::string& text : {std::string("topk:0.01"), std::string("qsgd4")}) {
    const auto codec = codecFor(text);
    std::vector<std::string> serial(8);
    for (int t = 0; t < 8; ++t) serial[t] = encode(*codec, x, t);
    std::vector<std::string> parallel(8);
    std::vector<std::vector<float>> decoded(8, std::vector<float>(n));
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        parallel[t] = encode(*codec, x, t);
        (void)codec->decode(parallel[t], n, decoded[t].data());
      });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(parallel[t], serial[t]) << text << " thread " << t;
      EXPECT_EQ(decoded[t], decode(*codec, serial[t], n)) << text << " thread " << t;
    }
  }
}

TEST(Codec, MakeCodecRefusesInvalidSpecs) {
  CodecSpec spec;
  spec.name = "qsgd";
  spec.bits = 3;
  const Result<std::unique_ptr<Codec>> r = makeCodec(spec);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(codecFor("topk")->biased());
  EXPECT_FALSE(codecFor("qsgd8")->biased());
}

}  // namespace
}  // namespace fedfleet::compress
