// X25519 key agreement (RFC 7748) through OpenSSL's EVP interface, for secure aggregation's
// pairwise secrets. Keys are raw 32-byte strings; a private key is any 32 bytes (clamped by
// X25519 itself), so a key pair can come from a CSPRNG or, in the simulator, from a seeded
// stream.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace fedfleet::crypto {

inline constexpr size_t kX25519KeyBytes = 32;

struct X25519KeyPair {
  std::string private_key;  // 32 bytes
  std::string public_key;   // 32 bytes
};

// The key pair whose private key is `private_key` (exactly 32 bytes: a broken invariant
// otherwise).
X25519KeyPair x25519KeyPair(std::string_view private_key);
// The public key of `private_key`.
std::string x25519PublicKey(std::string_view private_key);
// The shared secret of `private_key` and a peer's `peer_public` (32 bytes). kInvalidArgument
// when `peer_public` is not 32 bytes or is a low-order point (the all-zero secret RFC 7748 says
// to refuse): a peer's key is network input.
Result<std::string> x25519Agree(std::string_view private_key, std::string_view peer_public);

// A private key imported once for agreements with several peers: each x25519Agree call imports
// its key again, which costs OpenSSL a scalar multiplication (it derives the public key), as much
// as the agreement itself. The same secrets as x25519Agree.
class X25519Agreement {
 public:
  explicit X25519Agreement(std::string_view private_key);  // 32 bytes, else a broken invariant
  ~X25519Agreement();
  X25519Agreement(X25519Agreement&&) noexcept;
  X25519Agreement& operator=(X25519Agreement&&) noexcept;

  // The shared secret with `peer_public`, refused as x25519Agree refuses it.
  Result<std::string> with(std::string_view peer_public) const;

 private:
  struct Key;
  std::unique_ptr<Key> key_;
};

}  // namespace fedfleet::crypto
