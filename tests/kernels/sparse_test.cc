// Threshold select, gather and scatter-add against naive loops, including ties at the
// threshold, signed zeros, NaN, a capacity smaller than the result, and unaligned fp16 values;
// the index varints of top-k payloads against a naive coder, with gaps of every length (1 to 5
// bytes), an index at the end of the range, and every kind of malformed input.
#include "kernels/sparse.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/convert.h"

namespace fedfleet::kernels {
namespace {

uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

std::vector<float> randomFloats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<uint32_t> naiveSelect(const std::vector<float>& x, float t) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::fabs(x[i]) >= std::fabs(t))
      out.push_back(static_cast<uint32_t>(i));
  }
  return out;
}

class SelectTest : public ::testing::TestWithParam<size_t> {};

TEST_P(SelectTest, MatchesNaiveLoopWithEnoughCapacity) {
  const size_t n = GetParam();
  std::vector<float> x = randomFloats(n, 1);
  // Ties at the threshold, both signs, must be selected.
  for (size_t i = 0; i < n; i += 97) x[i] = (i % 2 == 0) ? 1.5f : -1.5f;
  for (float t : {0.0f, 1.5f, -1.5f, 2.5f, 100.0f}) {
    const std::vector<uint32_t> want = naiveSelect(x, t);
    std::vector<uint32_t> got(n + 1, 0xdeadbeef);
    const size_t count = selectAtLeast(x.data(), n, t, got.data(), n);
    ASSERT_EQ(count, want.size()) << "threshold " << t;
    got.resize(count);
    EXPECT_EQ(got, want) << "threshold " << t;
    EXPECT_EQ(countAtLeast(x.data(), n, t), want.size());
  }
}

TEST_P(SelectTest, CapacityBoundsWhatIsWrittenNotWhatIsCounted) {
  const size_t n = GetParam();
  const std::vector<float> x = randomFloats(n, 2);
  const std::vector<uint32_t> want = naiveSelect(x, 0.5f);
  for (size_t capacity : {size_t{0}, want.size() / 3, want.size() > 0 ? want.size() - 1 : 0}) {
    std::vector<uint32_t> got(capacity + 1, 0xdeadbeef);  // one guard entry
    EXPECT_EQ(selectAtLeast(x.data(), n, 0.5f, got.data(), capacity), want.size());
    for (size_t j = 0; j < capacity; ++j) ASSERT_EQ(got[j], want[j]) << j;
    EXPECT_EQ(got[capacity], 0xdeadbeefu) << "wrote past capacity " << capacity;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, SelectTest,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{9}, size_t{1024},
                                           size_t{1025}, size_t{70001}));

TEST(Select, MagnitudeOrderTreatsZerosAlikeAndNanAsLargest) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {0.0f, -0.0f, 1.0f, -inf, nan, 3.0f};
  std::vector<uint32_t> idx(6);
  EXPECT_EQ(selectAtLeast(x.data(), 6, -0.0f, idx.data(), 6), 6u);  // everything >= |0|
  EXPECT_EQ(selectAtLeast(x.data(), 6, inf, idx.data(), 6), 2u);
  EXPECT_EQ(idx[0], 3u);
  EXPECT_EQ(idx[1], 4u);
  EXPECT_EQ(selectAtLeast(x.data(), 6, nan, idx.data(), 6), 1u);
  EXPECT_EQ(idx[0], 4u);
  EXPECT_EQ(magnitudeKey(-0.0f), magnitudeKey(0.0f));
  EXPECT_GT(magnitudeKey(nan), magnitudeKey(inf));
  EXPECT_GT(magnitudeKey(-2.0f), magnitudeKey(1.0f));
}

TEST(Sample, DrawsMagnitudesOfTheInputDeterministically) {
  // x[i] = i + 0.5 (negated for odd i): a key names its position, so the draw can be checked.
  const size_t n = 1000, m = 20000;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * (static_cast<float>(i) + 0.5f);
  std::vector<uint32_t> a(m), b(m), c(m);
  sampleMagnitudeKeys(x.data(), n, m, 42, a.data());
  sampleMagnitudeKeys(x.data(), n, m, 42, b.data());
  sampleMagnitudeKeys(x.data(), n, m, 43, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::vector<size_t> hits(n, 0);
  for (uint32_t key : a) {
    float f;
    std::memcpy(&f, &key, sizeof(f));
    const size_t i = static_cast<size_t>(f);
    ASSERT_LT(i, n);
    ASSERT_EQ(key, magnitudeKey(x[i]));
    ++hits[i];
  }
  // Uniform: 20 expected hits per position; every position seen, none far too often.
  EXPECT_EQ(*std::min_element(hits.begin(), hits.end()) > 0, true);
  EXPECT_LT(*std::max_element(hits.begin(), hits.end()), 50u);
}

TEST(Scatter, AddMatchesNaiveLoopWithFp16AndFp32Values) {
  const size_t n = 100000, k = 3001;
  const std::vector<float> acc0 = randomFloats(n, 3);
  const std::vector<float> values = randomFloats(k, 4);
  std::vector<uint32_t> idx(k);
  std::mt19937 gen(5);
  for (size_t j = 0; j < k; ++j) idx[j] = static_cast<uint32_t>(gen() % n);
  idx[7] = idx[8];  // a repeated index adds twice, in order
  const float w = -0.37f;

  std::vector<float> got = acc0, want = acc0;
  scatterAdd(got.data(), idx.data(), values.data(), w, k);
  for (size_t j = 0; j < k; ++j) want[idx[j]] = std::fma(w, values[j], want[idx[j]]);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(bitsOf(got[i]), bitsOf(want[i])) << i;

  std::vector<unsigned char> packed(2 * k + 1);  // unaligned by one byte
  gatherFp16(values.data(),
             std::vector<uint32_t>([&] {
               std::vector<uint32_t> iota(k);
               for (size_t j = 0; j < k; ++j) iota[j] = static_cast<uint32_t>(j);
               return iota;
             }())
                 .data(),
             k, packed.data() + 1);
  std::vector<float> halves(k);
  fp16ToFloat(packed.data() + 1, k, halves.data());
  got = acc0;
  want = acc0;
  scatterAddFp16(got.data(), idx.data(), packed.data() + 1, w, k);
  scatterAdd(want.data(), idx.data(), halves.data(), w, k);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(bitsOf(got[i]), bitsOf(want[i])) << i;

  std::vector<float> dense(n, 7.0f), dense_want(n, 7.0f);
  scatterFp16(dense.data(), idx.data(), packed.data() + 1, k);
  for (size_t j = 0; j < k; ++j) dense_want[idx[j]] = halves[j];  // a repeat overwrites
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(bitsOf(dense[i]), bitsOf(dense_want[i])) << i;
}

TEST(Gather, Fp16OfTheNamedElements) {
  const std::vector<float> x = {1.0f, -2.0f, 65519.0f, 1e9f, 0.1f};
  const std::vector<uint32_t> idx = {4, 0, 3, 1};
  std::vector<unsigned char> out(8);
  gatherFp16(x.data(), idx.data(), idx.size(), out.data());
  std::vector<float> back(4);
  fp16ToFloat(out.data(), 4, back.data());
  EXPECT_EQ(back[0], 0.0999755859375f);  // fp16 nearest to 0.1
  EXPECT_EQ(back[1], 1.0f);
  EXPECT_EQ(back[2], 65504.0f);  // saturated, not infinite
  EXPECT_EQ(back[3], -2.0f);
  gatherFp16(nullptr, nullptr, 0, nullptr);
  scatterAdd(nullptr, nullptr, nullptr, 1.0f, 0);
  EXPECT_EQ(selectAtLeast(nullptr, 0, 1.0f, nullptr, 0), 0u);
}

// The LEB128 gap coding of kernels/sparse.h, written out the plain way.
std::vector<unsigned char> naiveGapBytes(const std::vector<uint32_t>& idx) {
  std::vector<unsigned char> out;
  uint64_t next = 0;
  for (uint32_t i : idx) {
    uint64_t v = i - next;
    next = static_cast<uint64_t>(i) + 1;
    do {
      out.push_back(static_cast<unsigned char>((v & 0x7f) | (v >= 0x80 ? 0x80 : 0)));
      v >>= 7;
    } while (v != 0);
  }
  return out;
}

// Increasing indices below n: mostly short gaps (density `p`), with some gaps of each varint
// length up to 5 bytes where n leaves room, and n - 1 as the last index.
std::vector<uint32_t> mixedIndices(uint64_t n, double p, uint32_t seed) {
  std::mt19937_64 gen(seed);
  std::geometric_distribution<uint64_t> short_gap(p);
  const uint64_t long_gaps[] = {127, 128, 16383, 16384, 2097151, 2097152, 268435455, 268435456};
  std::vector<uint32_t> idx;
  uint64_t next = 0;
  for (size_t j = 0;; ++j) {
    uint64_t gap = short_gap(gen);
    if (j % 97 == 13) gap = long_gaps[(j / 97) % 8];
    if (next + gap >= n - 1) break;
    idx.push_back(static_cast<uint32_t>(next + gap));
    next += gap + 1;
  }
  idx.push_back(static_cast<uint32_t>(n - 1));
  return idx;
}

class IndexGapsTest : public ::testing::TestWithParam<std::tuple<uint64_t, double>> {};

TEST_P(IndexGapsTest, RoundTripMatchesNaiveCoderWithAndWithoutPrefetch) {
  const auto [n, p] = GetParam();
  const std::vector<uint32_t> idx = mixedIndices(n, p, 7);
  const size_t k = idx.size();
  std::vector<unsigned char> bytes(5 * k);
  const size_t size = encodeIndexGaps(idx.data(), k, bytes.data());
  bytes.resize(size);
  ASSERT_EQ(bytes, naiveGapBytes(idx));
  std::vector<float> acc(1 << 16);  // prefetch is a hint: any address will do
  for (const float* prefetch :
       {static_cast<const float*>(nullptr), static_cast<const float*>(acc.data())}) {
    std::vector<uint32_t> got(k + 1, 0xdeadbeef);
    const IndexGapDecode r = decodeIndexGaps(bytes.data(), size, k, n, got.data(), prefetch);
    ASSERT_EQ(r.code, IndexGapDecode::kOk) << "entry " << r.entry;
    EXPECT_EQ(got[k], 0xdeadbeefu) << "wrote past k";
    got.resize(k);
    EXPECT_EQ(got, idx);
  }
  // The last index is n - 1: one element fewer puts it out of range, and says which.
  std::vector<uint32_t> got(k);
  const IndexGapDecode r = decodeIndexGaps(bytes.data(), size, k, n - 1, got.data(), nullptr);
  EXPECT_EQ(r.code, IndexGapDecode::kOutOfRange);
  EXPECT_EQ(r.entry, k - 1);
  EXPECT_EQ(r.index, n - 1);
  EXPECT_TRUE(std::equal(idx.begin(), idx.end() - 1, got.begin()));  // the ones before it
}

INSTANTIATE_TEST_SUITE_P(Densities, IndexGapsTest,
                         ::testing::Combine(::testing::Values(uint64_t{300}, uint64_t{262144},
                                                              uint64_t{1} << 31,
                                                              uint64_t{0xffffffff}),
                                            ::testing::Values(0.9, 0.01, 0.0001)));

TEST(IndexGaps, EmptyAndSingleIndices) {
  uint32_t idx[2] = {7, 7};
  EXPECT_EQ(encodeIndexGaps(nullptr, 0, nullptr), 0u);
  EXPECT_EQ(decodeIndexGaps(nullptr, 0, 0, 0, nullptr, nullptr).code, IndexGapDecode::kOk);
  const unsigned char zero = 0;
  EXPECT_EQ(decodeIndexGaps(&zero, 1, 0, 10, idx, nullptr).code, IndexGapDecode::kTrailing);
  EXPECT_EQ(decodeIndexGaps(&zero, 1, 1, 1, idx, nullptr).code, IndexGapDecode::kOk);
  EXPECT_EQ(idx[0], 0u);
  EXPECT_EQ(decodeIndexGaps(&zero, 1, 1, 0, idx, nullptr).code, IndexGapDecode::kOutOfRange);
  // The largest index a payload can name: 0xfffffffe, five bytes.
  const uint32_t last = 0xfffffffe;
  unsigned char five[5];
  ASSERT_EQ(encodeIndexGaps(&last, 1, five), 5u);
  EXPECT_EQ(decodeIndexGaps(five, 5, 1, 0xffffffff, idx, nullptr).code, IndexGapDecode::kOk);
  EXPECT_EQ(idx[0], last);
}

// Malformed varint streams, with the fault early (where the 8-byte fast path reads) and in the
// last bytes (where the general loop does): the code, the entry, and the indices before it.
TEST(IndexGaps, RefusesMalformedStreamsNamingTheEntry) {
  const uint64_t n = 100000;
  std::vector<uint32_t> idx(200);
  for (size_t j = 0; j < idx.size(); ++j) idx[j] = static_cast<uint32_t>(j * 400);  // 2 bytes
  const std::vector<unsigned char> good = naiveGapBytes(idx);
  for (size_t at : {size_t{3}, size_t{100}, idx.size() - 1}) {
    SCOPED_TRACE("fault at entry " + std::to_string(at));
    // The byte offset where entry `at` starts.
    const size_t offset =
        naiveGapBytes(std::vector<uint32_t>(idx.begin(), idx.begin() + at)).size();
    auto check = [&](const std::vector<unsigned char>& bad, size_t k, IndexGapDecode::Code code,
                     size_t entry) {
      std::vector<uint32_t> got(k, 0xdeadbeef);
      const IndexGapDecode r = decodeIndexGaps(bad.data(), bad.size(), k, n, got.data(), nullptr);
      EXPECT_EQ(r.code, code);
      EXPECT_EQ(r.entry, entry);
      for (size_t j = 0; j < std::min(entry, k); ++j) ASSERT_EQ(got[j], idx[j]) << j;
    };
    // Out of range: entry `at` jumps past n (a 3-byte gap).
    std::vector<unsigned char> far(good.begin(), good.begin() + offset);
    for (unsigned char b : naiveGapBytes({static_cast<uint32_t>(n)})) far.push_back(b);
    check(far, at + 1, IndexGapDecode::kOutOfRange, at);
    // Out of range by one, in a 2-byte gap (the fast path's case when bytes follow): the
    // range ends at the index entry `at` names.
    {
      std::vector<uint32_t> got(idx.size(), 0xdeadbeef);
      const IndexGapDecode r =
          decodeIndexGaps(good.data(), good.size(), idx.size(), idx[at], got.data(), nullptr);
      EXPECT_EQ(r.code, IndexGapDecode::kOutOfRange);
      EXPECT_EQ(r.entry, at);
      EXPECT_EQ(r.index, idx[at]);
      for (size_t j = 0; j < at; ++j) ASSERT_EQ(got[j], idx[j]) << j;
    }
    // Overlong: six bytes for entry `at`, then more good bytes.
    std::vector<unsigned char> overlong(good.begin(), good.begin() + offset);
    overlong.insert(overlong.end(), {0x80, 0x80, 0x80, 0x80, 0x80, 0x00});
    overlong.insert(overlong.end(), good.begin() + offset, good.end());
    check(overlong, idx.size(), IndexGapDecode::kOverlong, at);
    // Truncated inside entry `at` (its first byte continues).
    std::vector<unsigned char> cut(good.begin(), good.begin() + offset + 1);
    check(cut, idx.size(), IndexGapDecode::kTruncated, at);
    // Ends before entry `at`.
    std::vector<unsigned char> short_stream(good.begin(), good.begin() + offset);
    check(short_stream, idx.size(), IndexGapDecode::kTruncated, at);
  }
  // Bytes after the k-th index.
  std::vector<unsigned char> extra = good;
  extra.push_back(0);
  std::vector<uint32_t> got(idx.size());
  EXPECT_EQ(decodeIndexGaps(extra.data(), extra.size(), idx.size(), n, got.data(), nullptr).code,
            IndexGapDecode::kTrailing);
  EXPECT_EQ(decodeIndexGaps(good.data(), good.size(), idx.size() - 1, n, got.data(), nullptr).code,
            IndexGapDecode::kTrailing);
}

}  // namespace
}  // namespace fedfleet::kernels
