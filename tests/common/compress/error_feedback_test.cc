// Error feedback: what is sent plus what is kept equals what came in, round after round; chunks
// touch only their own residual; compact storages stay close; memory is allocated lazily; a
// non-finite update is refused without changing anything.
#include "common/compress/error_feedback.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace fedfleet::compress {
namespace {

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::unique_ptr<Codec> codecFor(const std::string& text) {
  return std::move(makeCodec(parseCodecSpec(text).value())).value();
}

// (codec, storage)
class ErrorFeedbackTest
    : public ::testing::TestWithParam<std::tuple<std::string, ResidualStorage>> {};

TEST_P(ErrorFeedbackTest, SentPlusResidualEqualsSumOfInputs) {
  const auto& [text, storage] = GetParam();
  const auto codec = codecFor(text);
  const size_t n = 20000;
  const int rounds = 30;
  ErrorFeedback ef(n, storage);
  std::vector<double> inputs(n, 0.0), sent(n, 0.0);
  std::vector<float> decoded(n);
  double scale = 0;
  for (int t = 0; t < rounds; ++t) {
    const std::vector<float> x = gaussian(n, 100 + t, 0.01f);
    std::string payload;
    ASSERT_TRUE(ef.encode(*codec, 0, x.data(), n, t, &payload).isOk());
    ASSERT_TRUE(codec->decode(payload, n, decoded.data()).isOk());
    for (size_t i = 0; i < n; ++i) {
      inputs[i] += x[i];
      sent[i] += decoded[i];
      scale = std::max(scale, std::fabs(inputs[i]));
    }
  }
  std::vector<float> residual(n);
  ef.residual(0, n, residual.data());
  // fp32: float rounding of each p = x + r and r = p - d (a few ulps of the residual's size per
  // round). Compact storages: the residual rounded each round (2^-9 / 2^-12 relative).
  const double rel = storage == ResidualStorage::kFp32   ? 1e-5
                     : storage == ResidualStorage::kBf16 ? 2e-2
                                                         : 3e-3;
  size_t off = 0;
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const double err = std::fabs(sent[i] + residual[i] - inputs[i]);
    worst = std::max(worst, err);
    off += err > rel * scale;
  }
  EXPECT_EQ(off, 0u) << "worst " << worst << " against scale " << scale;
}

TEST_P(ErrorFeedbackTest, ResidualStaysBoundedForARepeatedUpdate) {
  // Without error feedback top-k would send the same k elements forever; with it the residual
  // of the elements not sent grows until they are, so many more than k distinct elements go out,
  // and the residual stops growing.
  const auto& [text, storage] = GetParam();
  const auto codec = codecFor(text);
  const size_t n = 5000;
  const std::vector<float> x = gaussian(n, 7);
  ErrorFeedback ef(n, storage);
  std::vector<float> r(n);
  double norm_at_50 = 0, norm_at_200 = 0;
  std::vector<char> ever_sent(n, 0);
  std::vector<float> d(n);
  for (int t = 1; t <= 200; ++t) {
    std::string payload;
    ASSERT_TRUE(ef.encode(*codec, 0, x.data(), n, t, &payload).isOk());
    ASSERT_TRUE(codec->decode(payload, n, d.data()).isOk());
    for (size_t i = 0; i < n; ++i) ever_sent[i] |= d[i] != 0.0f;
    if (t == 50 || t == 200) {
      ef.residual(0, n, r.data());
      double norm = 0;
      for (float v : r) norm += double(v) * v;
      (t == 50 ? norm_at_50 : norm_at_200) = std::sqrt(norm);
    }
  }
  EXPECT_LT(norm_at_200, 2.0 * norm_at_50 + 1.0) << "residual keeps growing";
  size_t sent = 0;
  for (char c : ever_sent) sent += c != 0;
  const size_t k = codec->spec().name == "topk" ? topkCount(n, codec->spec().ratio) : n;
  EXPECT_GE(sent, std::min(n, 5 * k));
}

INSTANTIATE_TEST_SUITE_P(
    BiasedCodecs, ErrorFeedbackTest,
    ::testing::Combine(::testing::Values("topk:0.01", "topk:0.1", "sign", "sign,bucket=64"),
                       ::testing::Values(ResidualStorage::kFp32, ResidualStorage::kBf16,
                                         ResidualStorage::kFp16)),
    [](const auto& info) {
      std::string name =
          std::get<0>(info.param) + "_" + residualStorageName(std::get<1>(info.param));
      for (char& c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

TEST(ErrorFeedback, ExactBookkeepingWithDyadicValues) {
  // Values with few significant bits make every float operation exact, so the identity holds
  // with no tolerance: sum of decoded + residual == sum of inputs.
  const auto codec = codecFor("topk:0.25");
  const size_t n = 64;
  ErrorFeedback ef(n);
  std::vector<float> inputs(n, 0.0f), sent(n, 0.0f), d(n);
  std::mt19937 gen(3);
  for (int t = 0; t < 10; ++t) {
    std::vector<float> x(n);
    for (float& v : x) v = static_cast<float>(static_cast<int>(gen() % 64) - 32) / 8.0f;
    std::string payload;
    ASSERT_TRUE(ef.encode(*codec, 0, x.data(), n, 0, &payload).isOk());
    ASSERT_TRUE(codec->decode(payload, n, d.data()).isOk());
    for (size_t i = 0; i < n; ++i) inputs[i] += x[i], sent[i] += d[i];
  }
  std::vector<float> r(n);
  ef.residual(0, n, r.data());
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(sent[i] + r[i], inputs[i]) << i;
}

TEST(ErrorFeedback, ChunksTouchOnlyTheirOwnResidual) {
  const auto codec = codecFor("sign");
  const size_t n = 3000;
  const std::vector<float> x = gaussian(n, 4);
  ErrorFeedback whole(n), chunked(n);
  std::string a, b;
  ASSERT_TRUE(whole.encode(*codec, 1000, x.data() + 1000, 1000, 9, &a).isOk());
  ASSERT_TRUE(chunked.encode(*codec, 1000, x.data() + 1000, 1000, 9, &b).isOk());
  EXPECT_EQ(a, b);
  std::vector<float> r(n);
  chunked.residual(0, n, r.data());
  for (size_t i = 0; i < n; ++i) {
    if (i < 1000 || i >= 2000) {
      ASSERT_EQ(r[i], 0.0f) << i;
    }
  }
  // The residual of [1000, 2000) is x minus the decoded chunk.
  std::vector<float> d(1000);
  ASSERT_TRUE(codec->decode(b, 1000, d.data()).isOk());
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(r[1000 + i], x[1000 + i] - d[i]) << i;
}

TEST(ErrorFeedback, MemoryIsLazyAndCompactStoragesHalveIt) {
  const auto codec = codecFor("topk");
  const size_t n = 10000;
  const std::vector<float> x = gaussian(n, 5);
  for (auto [storage, bytes] :
       {std::pair{ResidualStorage::kFp32, 4 * n}, std::pair{ResidualStorage::kBf16, 2 * n},
        std::pair{ResidualStorage::kFp16, 2 * n}}) {
    ErrorFeedback ef(n, storage);
    EXPECT_EQ(ef.memoryBytes(), 0u);
    std::vector<float> r(n, 1.0f);
    ef.residual(0, n, r.data());
    EXPECT_EQ(r, std::vector<float>(n, 0.0f));
    std::string payload;
    ASSERT_TRUE(ef.encode(*codec, 0, x.data(), n, 1, &payload).isOk());
    EXPECT_EQ(ef.memoryBytes(), bytes);
    ef.reset();
    EXPECT_EQ(ef.memoryBytes(), 0u);
    ef.residual(0, n, r.data());
    EXPECT_EQ(r, std::vector<float>(n, 0.0f));
  }
}

TEST(ErrorFeedback, NonFiniteUpdateIsRefusedAndChangesNothing) {
  const auto codec = codecFor("topk:0.1");
  const size_t n = 100;
  std::vector<float> x = gaussian(n, 6);
  ErrorFeedback ef(n);
  std::string payload = "kept";
  ASSERT_TRUE(ef.encode(*codec, 0, x.data(), n, 1, &payload).isOk());
  std::vector<float> before(n), after(n);
  ef.residual(0, n, before.data());
  payload = "kept";
  x[50] = std::numeric_limits<float>::infinity();  // the largest magnitude: top-k keeps it
  const Status st = ef.encode(*codec, 0, x.data(), n, 2, &payload);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), ::testing::HasSubstr("not encode"));
  EXPECT_EQ(payload, "kept");
  ef.residual(0, n, after.data());
  EXPECT_EQ(before, after);
}

TEST(ErrorFeedback, StorageNames) {
  for (ResidualStorage s :
       {ResidualStorage::kFp32, ResidualStorage::kBf16, ResidualStorage::kFp16}) {
    EXPECT_EQ(parseResidualStorage(residualStorageName(s)).value(), s);
  }
  EXPECT_EQ(parseResidualStorage("fp8").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedfleet::compress
