// KeyedStream: a deterministic stream of pseudo-random bytes, AES-256 in counter mode through
// OpenSSL's EVP interface, under a 32-byte key and a 128-bit stream id (the initial counter
// block). The same key and id give the same bytes on every machine; without the key the bytes
// cannot be told from uniform ones (AES as a pseudo-random permutation, as counter-mode PRGs
// rely on). Streams of one key with different ids never overlap as long as each stays under
// 2^64 blocks (the id's low word is the block counter's start; callers give ids whose high words
// differ). Used for differential-privacy noise, whose draws must not be predictable by clients
// yet must be reproducible in the simulator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace fedfleet::crypto {

inline constexpr size_t kStreamKeyBytes = 32;

class KeyedStream {
 public:
  // `key`: exactly kStreamKeyBytes bytes (checked: a broken invariant otherwise). The stream id
  // is (id_high, id_low) as the big-endian initial counter block.
  KeyedStream(std::string_view key, uint64_t id_high, uint64_t id_low);
  ~KeyedStream();
  KeyedStream(KeyedStream&&) noexcept;
  KeyedStream& operator=(KeyedStream&&) noexcept;

  // The next `n` bytes of the stream.
  void fill(void* out, size_t n);
  // The next 8 bytes as a little-endian integer.
  uint64_t next64();
  // A double uniform in (0, 1): 53 random bits, never 0 or 1.
  double nextOpenUnit();

 private:
  void refill();

  struct Cipher;
  std::unique_ptr<Cipher> cipher_;
  unsigned char buf_[4096];
  size_t pos_ = sizeof(buf_);
};

// A stream key derived from a seed: SHA-256 of `label`, a zero byte and the seed's 8
// little-endian bytes. For reproducible runs (the simulator), where secrecy from clients is not
// the point.
std::string streamKeyFromSeed(std::string_view label, uint64_t seed);
// A fresh key from OpenSSL's CSPRNG (RAND_bytes), for a real coordinator's noise.
std::string randomStreamKey();

}  // namespace fedfleet::crypto
