#include "common/crypto/random.h"

#include <gtest/gtest.h>

#include <set>

namespace fedfleet::crypto {
namespace {

TEST(RandomToken, NonZeroAndDistinct) {
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t t = randomToken();
    EXPECT_NE(t, 0u);
    seen.insert(t);
  }
  // 1000 draws of 64 bits: a repeat has probability about 3e-14.
  EXPECT_EQ(seen.size(), 1000u);
}

}  // namespace
}  // namespace fedfleet::crypto
