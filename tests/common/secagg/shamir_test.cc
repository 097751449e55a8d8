// Shamir sharing over GF(2^61 - 1): field arithmetic against 128-bit arithmetic, every t-subset
// reconstructs, t - 1 shares do not (and are consistent with any other secret), and hostile
// share bytes are refused.
#include "common/secagg/shamir.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace fedfleet::secagg {
namespace {

crypto::KeyedStream stream(uint64_t id) {
  return crypto::KeyedStream(crypto::streamKeyFromSeed("shamir test", id), 0, 0);
}

TEST(Shamir, FieldArithmeticMatchesWideIntegers) {
  auto s = stream(1);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t a = s.next64() % kFieldPrime, b = s.next64() % kFieldPrime;
    const unsigned __int128 want = static_cast<unsigned __int128>(a) * b % kFieldPrime;
    EXPECT_EQ(fieldMul(a, b), static_cast<uint64_t>(want));
  }
  EXPECT_EQ(fieldMul(kFieldPrime - 1, kFieldPrime - 1), 1u);  // (-1)^2
  EXPECT_EQ(fieldPow(3, kFieldPrime - 1), 1u);                // Fermat
}

TEST(Shamir, EverySubsetOfThresholdSizeReconstructs) {
  const std::string secret = "thirty-two bytes of a mask seed!";
  ASSERT_EQ(secret.size(), 32u);
  auto s = stream(2);
  const std::vector<uint32_t> xs = {3, 9, 12, 17, 40};
  auto shares = splitSecret(secret, 3, xs, s);
  ASSERT_TRUE(shares.isOk()) << shares.status().toString();
  for (size_t a = 0; a < xs.size(); ++a) {
    for (size_t b = a + 1; b < xs.size(); ++b) {
      for (size_t c = b + 1; c < xs.size(); ++c) {
        auto got = combineShares({(*shares)[a], (*shares)[b], (*shares)[c]}, 32);
        ASSERT_TRUE(got.isOk()) << got.status().toString();
        EXPECT_EQ(*got, secret);
      }
    }
  }
  auto all = combineShares(*shares, 32);  // more than t: the same polynomial
  ASSERT_TRUE(all.isOk());
  EXPECT_EQ(*all, secret);
}

TEST(Shamir, BelowThresholdSharesDoNotReconstruct) {
  const std::string secret(32, '\x5a');
  for (uint64_t trial = 0; trial < 20; ++trial) {
    auto s = stream(100 + trial);
    auto shares = splitSecret(secret, 4, {1, 2, 3, 4, 5, 6}, s);
    ASSERT_TRUE(shares.isOk());
    std::vector<Share> three(shares->begin(), shares->begin() + 3);
    auto got = combineShares(three, 32);
    EXPECT_TRUE(!got.isOk() || *got != secret) << "trial " << trial;
  }
}

// t - 1 shares are consistent with every secret: through two real shares of a 3-of-n sharing
// and any other secret at 0 passes a polynomial of degree 2; its value at a third point, with
// the two real shares, reconstructs that other secret. So two shares cannot tell the secrets
// apart.
TEST(Shamir, BelowThresholdSharesAreConsistentWithAnyOtherSecret) {
  const std::string secret(32, '\x01'), other(32, '\x7e');
  auto s = stream(3);
  auto shares = splitSecret(secret, 3, {1, 2, 3}, s);
  ASSERT_TRUE(shares.isOk());
  Share forged;
  forged.x = 3;
  for (size_t w = 0; w < kSecretWords; ++w) {
    uint64_t word = 0;
    for (int i = 0; i < 7; ++i) {
      const size_t at = 7 * w + i;
      if (at < other.size())
        word |= static_cast<uint64_t>(static_cast<unsigned char>(other[at])) << (8 * i);
    }
    // Lagrange at x = 3 through (0, word), (1, y1), (2, y2): l0 = 1, l1 = -3, l2 = 3.
    const uint64_t y1 = (*shares)[0].y[w], y2 = (*shares)[1].y[w];
    const uint64_t minus3y1 = fieldMul(kFieldPrime - 3, y1);
    forged.y[w] = (word + minus3y1 % kFieldPrime + fieldMul(3, y2)) % kFieldPrime;
  }
  auto got = combineShares({(*shares)[0], (*shares)[1], forged}, 32);
  ASSERT_TRUE(got.isOk()) << got.status().toString();
  EXPECT_EQ(*got, other);
}

TEST(Shamir, RefusesBadArgumentsAndHostileBytes) {
  auto s = stream(4);
  EXPECT_EQ(splitSecret("x", 0, {1, 2}, s).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(splitSecret("x", 3, {1, 2}, s).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(splitSecret("x", 2, {1, 1}, s).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(splitSecret("x", 1, {0, 1}, s).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(splitSecret(std::string(36, 'a'), 1, {1}, s).status().code(),
            StatusCode::kInvalidArgument);

  auto shares = splitSecret("abc", 2, {5, 6}, s);
  ASSERT_TRUE(shares.isOk());
  const std::string bytes = (*shares)[0].toBytes();
  auto back = Share::fromBytes(bytes);
  ASSERT_TRUE(back.isOk());
  EXPECT_EQ(back->x, 5u);
  EXPECT_EQ(back->y, (*shares)[0].y);
  EXPECT_EQ(Share::fromBytes(bytes.substr(1)).status().code(), StatusCode::kCorrupt);
  std::string zero_x = bytes;
  zero_x[0] = zero_x[1] = zero_x[2] = zero_x[3] = 0;
  EXPECT_EQ(Share::fromBytes(zero_x).status().code(), StatusCode::kCorrupt);
  std::string big = bytes;
  for (int i = 4; i < 12; ++i) big[i] = '\xff';
  EXPECT_EQ(Share::fromBytes(big).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(combineShares({(*shares)[0], (*shares)[0]}, 3).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(combineShares({}, 3).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedfleet::secagg
