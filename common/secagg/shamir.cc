#include "common/secagg/shamir.h"

#include <set>

namespace fedfleet::secagg {
namespace {

uint64_t fieldAdd(uint64_t a, uint64_t b) {
  uint64_t s = a + b;  // < 2^62: no overflow
  return s >= kFieldPrime ? s - kFieldPrime : s;
}
uint64_t fieldSub(uint64_t a, uint64_t b) { return a >= b ? a - b : a + kFieldPrime - b; }
uint64_t fieldInv(uint64_t a) { return fieldPow(a, kFieldPrime - 2); }

// Uniform in [0, p): rejection of 61-bit draws at or above p.
uint64_t randomElement(crypto::KeyedStream& random) {
  for (;;) {
    const uint64_t v = random.next64() & kFieldPrime;
    if (v < kFieldPrime) return v;
  }
}

}  // namespace

uint64_t fieldMul(uint64_t a, uint64_t b) {
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  // 2^61 = 1 mod p: fold the high bits onto the low ones.
  uint64_t lo = static_cast<uint64_t>(p & kFieldPrime);
  uint64_t hi = static_cast<uint64_t>(p >> 61);
  return fieldAdd(lo, hi);
}

uint64_t fieldPow(uint64_t a, uint64_t e) {
  uint64_t r = 1;
  while (e > 0) {
    if (e & 1) r = fieldMul(r, a);
    a = fieldMul(a, a);
    e >>= 1;
  }
  return r;
}

std::string Share::toBytes() const {
  std::string out;
  out.reserve(kShareBytes);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(x >> (8 * i)));
  for (uint64_t w : y) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(w >> (8 * i)));
  }
  return out;
}

Result<Share> Share::fromBytes(std::string_view bytes) {
  if (bytes.size() != kShareBytes) {
    return corrupt("a secret share is " + std::to_string(kShareBytes) + " bytes, got " +
                   std::to_string(bytes.size()));
  }
  auto b = [&](size_t i) { return static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])); };
  Share s;
  for (int i = 0; i < 4; ++i) s.x |= static_cast<uint32_t>(b(i) << (8 * i));
  for (size_t w = 0; w < kSecretWords; ++w) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= b(4 + 8 * w + i) << (8 * i);
    if (v >= kFieldPrime) return corrupt("a secret share's value is outside the field");
    s.y[w] = v;
  }
  if (s.x == 0) return corrupt("a secret share's point is 0 (the secret itself)");
  return s;
}

Result<std::vector<Share>> splitSecret(std::string_view secret, size_t threshold,
                                       const std::vector<uint32_t>& xs,
                                       crypto::KeyedStream& random) {
  if (secret.size() > kMaxSecretBytes) return invalidArgument("secret longer than 35 bytes");
  if (threshold < 1 || threshold > xs.size()) {
    return invalidArgument("threshold " + std::to_string(threshold) + " with " +
                           std::to_string(xs.size()) + " holders");
  }
  std::set<uint32_t> seen;
  for (uint32_t x : xs) {
    if (x == 0 || !seen.insert(x).second) {
      return invalidArgument("share points must be distinct and non-zero");
    }
  }
  std::vector<Share> shares(xs.size());
  for (size_t h = 0; h < xs.size(); ++h) shares[h].x = xs[h];
  std::vector<uint64_t> coeffs(threshold);
  for (size_t w = 0; w < kSecretWords; ++w) {
    uint64_t word = 0;
    for (size_t i = 0; i < 7; ++i) {
      const size_t at = 7 * w + i;
      if (at < secret.size()) {
        word |= static_cast<uint64_t>(static_cast<unsigned char>(secret[at])) << (8 * i);
      }
    }
    coeffs[0] = word;
    for (size_t c = 1; c < threshold; ++c) coeffs[c] = randomElement(random);
    for (Share& s : shares) {
      uint64_t acc = 0;  // Horner
      for (size_t c = threshold; c-- > 0;) acc = fieldAdd(fieldMul(acc, s.x), coeffs[c]);
      s.y[w] = acc;
    }
  }
  return shares;
}

Result<std::string> combineShares(const std::vector<Share>& shares, size_t secret_bytes) {
  if (shares.empty()) return invalidArgument("no shares to combine");
  if (secret_bytes > kMaxSecretBytes) return invalidArgument("secret longer than 35 bytes");
  std::set<uint32_t> seen;
  for (const Share& s : shares) {
    if (s.x == 0 || !seen.insert(s.x).second) {
      return invalidArgument("shares to combine must have distinct non-zero points");
    }
  }
  // Lagrange basis at 0: l_i = prod_{j != i} x_j / (x_j - x_i).
  std::vector<uint64_t> basis(shares.size());
  for (size_t i = 0; i < shares.size(); ++i) {
    uint64_t num = 1, den = 1;
    for (size_t j = 0; j < shares.size(); ++j) {
      if (j == i) continue;
      num = fieldMul(num, shares[j].x);
      den = fieldMul(den, fieldSub(shares[j].x, shares[i].x));
    }
    basis[i] = fieldMul(num, fieldInv(den));
  }
  std::string out;
  out.reserve(kMaxSecretBytes);
  for (size_t w = 0; w < kSecretWords; ++w) {
    uint64_t word = 0;
    for (size_t i = 0; i < shares.size(); ++i) {
      word = fieldAdd(word, fieldMul(basis[i], shares[i].y[w]));
    }
    if (word >> 56) return corrupt("the shares do not combine to a secret (too few, or false)");
    for (int i = 0; i < 7; ++i) out.push_back(static_cast<char>(word >> (8 * i)));
  }
  for (size_t i = secret_bytes; i < out.size(); ++i) {
    if (out[i] != 0) return corrupt("the shares do not combine to a secret (too few, or false)");
  }
  out.resize(secret_bytes);
  return out;
}

}  // namespace fedfleet::secagg
