// The keyed AES-256-CTR stream: NIST's counter-mode vectors, determinism, independence of
// streams, and uniform doubles that are never 0 or 1.
#include "common/crypto/keyed_stream.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "tests/common/crypto/hex.h"

namespace fedfleet::crypto {
namespace {

std::string bytesOf(KeyedStream& s, size_t n) {
  std::string out(n, '\0');
  s.fill(out.data(), n);
  return out;
}

// NIST SP 800-38A, F.5.5 (CTR-AES256.Encrypt): the output blocks of counters f0f1...feff and
// f0f1...ff00 are the key stream (the encryption of zeros).
TEST(KeyedStream, MatchesNistCounterModeOutputBlocks) {
  const std::string key =
      fromHex("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4");
  KeyedStream s(key, 0xf0f1f2f3f4f5f6f7ull, 0xf8f9fafbfcfdfeffull);
  EXPECT_EQ(bytesOf(s, 32), fromHex("0bdf7df1591716335e9a8b15c860c502"
                                    "5a6e699d536119065433863c8f657b94"));
}

TEST(KeyedStream, SameKeyAndIdSameBytesInAnyPiecesOtherIdsOtherBytes) {
  const std::string key = streamKeyFromSeed("test", 7);
  KeyedStream whole(key, 3, 0);
  const std::string all = bytesOf(whole, 30000);  // whole 4096-byte buffers written directly
  KeyedStream pieces(key, 3, 0);
  std::string joined;
  // Within the buffer, to its end, whole buffers from its end, across it into whole buffers.
  for (size_t n : {1, 4095, 8192, 5, 12288, 3000, 2419}) joined += bytesOf(pieces, n);
  EXPECT_EQ(joined, all);
  KeyedStream small(key, 3, 0);
  std::string thousands;
  for (int i = 0; i < 30000; i += 1000) thousands += bytesOf(small, 1000);
  EXPECT_EQ(thousands, all);

  KeyedStream other_id(key, 4, 0);
  KeyedStream other_key(streamKeyFromSeed("test", 8), 3, 0);
  KeyedStream other_label(streamKeyFromSeed("tesu", 7), 3, 0);
  EXPECT_NE(bytesOf(other_id, 64), all.substr(0, 64));
  EXPECT_NE(bytesOf(other_key, 64), all.substr(0, 64));
  EXPECT_NE(bytesOf(other_label, 64), all.substr(0, 64));
}

TEST(KeyedStream, KeysFromSeedsAreFixedAndRandomKeysDiffer) {
  EXPECT_EQ(streamKeyFromSeed("fedfleet dp noise", 1).size(), kStreamKeyBytes);
  EXPECT_EQ(streamKeyFromSeed("fedfleet dp noise", 1), streamKeyFromSeed("fedfleet dp noise", 1));
  EXPECT_NE(streamKeyFromSeed("fedfleet dp noise", 1), streamKeyFromSeed("fedfleet dp noise", 2));
  const std::string a = randomStreamKey(), b = randomStreamKey();
  EXPECT_EQ(a.size(), kStreamKeyBytes);
  EXPECT_NE(a, b);
}

TEST(KeyedStream, OpenUnitDoublesAreInsideTheIntervalAndSpreadEvenly) {
  KeyedStream s(streamKeyFromSeed("unit", 1), 0, 0);
  constexpr int kN = 100000;
  std::vector<int> bins(10, 0);
  double sum = 0;
  for (int i = 0; i < kN; ++i) {
    const double u = s.nextOpenUnit();
    ASSERT_GT(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    ++bins[static_cast<int>(u * 10)];
  }
  EXPECT_NEAR(sum / kN, 0.5, 5 * std::sqrt(1.0 / 12 / kN));
  // Chi-square with 9 degrees of freedom: 27.88 is its 0.999 quantile.
  double chi2 = 0;
  for (int b : bins) chi2 += (b - kN / 10.0) * (b - kN / 10.0) / (kN / 10.0);
  EXPECT_LT(chi2, 27.88);
}

}  // namespace
}  // namespace fedfleet::crypto
