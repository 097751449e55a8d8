// Shamir secret sharing (Shamir, CACM 1979) of byte strings over the prime field GF(2^61 - 1),
// for secure aggregation's self-mask seeds and mask keys. A secret of up to 32 bytes is cut into
// kSecretWords words of 7 bytes (each below the prime); each word is the constant term of its
// own random polynomial of degree t - 1, and holder x receives the polynomials' values at x.
// Any t shares give the secret back (Lagrange interpolation at 0); t - 1 or fewer are uniformly
// distributed whatever the secret, so they say nothing of it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/crypto/keyed_stream.h"
#include "common/status.h"

namespace fedfleet::secagg {

inline constexpr uint64_t kFieldPrime = (uint64_t{1} << 61) - 1;
inline constexpr size_t kSecretWords = 5;                    // 5 x 7 bytes >= 32
inline constexpr size_t kMaxSecretBytes = 7 * kSecretWords;  // 35
inline constexpr size_t kShareBytes = 4 + 8 * kSecretWords;  // x, then the words

struct Share {
  uint32_t x = 0;  // the holder's evaluation point, >= 1
  std::array<uint64_t, kSecretWords> y{};

  // 4 bytes of x then 8 per word, little-endian.
  std::string toBytes() const;
  // kCorrupt when `bytes` is not kShareBytes long, x is 0 or a word is not below the prime.
  static Result<Share> fromBytes(std::string_view bytes);
};

// a * b mod p and a^e mod p, for a, b < p.
uint64_t fieldMul(uint64_t a, uint64_t b);
uint64_t fieldPow(uint64_t a, uint64_t e);

// Shares of `secret` (at most kMaxSecretBytes bytes) for the holders at points `xs` (distinct,
// >= 1), any `threshold` of which reconstruct it; the polynomials' coefficients come from
// `random`. kInvalidArgument when the points or the threshold do not allow it.
Result<std::vector<Share>> splitSecret(std::string_view secret, size_t threshold,
                                       const std::vector<uint32_t>& xs,
                                       crypto::KeyedStream& random);
// The `secret_bytes`-byte secret from `shares` (points distinct). The caller must hold at least
// the threshold's count: fewer give a wrong secret, not an error, since the shares themselves
// cannot tell. kInvalidArgument for no shares or repeated points; kCorrupt when the words do
// not decode to `secret_bytes` bytes (too few shares, or a false one).
Result<std::string> combineShares(const std::vector<Share>& shares, size_t secret_bytes);

}  // namespace fedfleet::secagg
