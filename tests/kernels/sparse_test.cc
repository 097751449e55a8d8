// Threshold select, gather and scatter-add against naive loops, including ties at the
// threshold, signed zeros, NaN, a capacity smaller than the result, and unaligned fp16 values.
#include "kernels/sparse.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
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

}  // namespace
}  // namespace fedfleet::kernels
