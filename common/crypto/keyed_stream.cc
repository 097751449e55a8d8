#include "common/crypto/keyed_stream.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "common/crypto/sha256.h"

namespace fedfleet::crypto {

struct KeyedStream::Cipher {
  EVP_CIPHER_CTX* ctx = nullptr;
  ~Cipher() { EVP_CIPHER_CTX_free(ctx); }
};

KeyedStream::KeyedStream(std::string_view key, uint64_t id_high, uint64_t id_low)
    : cipher_(std::make_unique<Cipher>()) {
  FEDFLEET_CHECK(key.size() == kStreamKeyBytes);
  unsigned char iv[16];
  for (int i = 0; i < 8; ++i) {
    iv[i] = static_cast<unsigned char>(id_high >> (56 - 8 * i));
    iv[8 + i] = static_cast<unsigned char>(id_low >> (56 - 8 * i));
  }
  cipher_->ctx = EVP_CIPHER_CTX_new();
  FEDFLEET_CHECK(cipher_->ctx != nullptr);
  FEDFLEET_CHECK(EVP_EncryptInit_ex(cipher_->ctx, EVP_aes_256_ctr(), nullptr,
                                    reinterpret_cast<const unsigned char*>(key.data()), iv) == 1);
}

KeyedStream::~KeyedStream() = default;
KeyedStream::KeyedStream(KeyedStream&&) noexcept = default;
KeyedStream& KeyedStream::operator=(KeyedStream&&) noexcept = default;

namespace {

// The key stream is the encryption of zeros.
constexpr unsigned char kZeros[4096] = {};

void encryptZeros(EVP_CIPHER_CTX* ctx, unsigned char* out, size_t n) {
  while (n > 0) {
    const size_t take = std::min(n, sizeof(kZeros));
    int out_len = 0;
    FEDFLEET_CHECK(EVP_EncryptUpdate(ctx, out, &out_len, kZeros, static_cast<int>(take)) == 1);
    FEDFLEET_CHECK(out_len == static_cast<int>(take));
    out += take;
    n -= take;
  }
}

}  // namespace

void KeyedStream::refill() {
  encryptZeros(cipher_->ctx, buf_, sizeof(buf_));
  pos_ = 0;
}

void KeyedStream::fill(void* out, size_t n) {
  auto* dst = static_cast<unsigned char*>(out);
  while (n > 0) {
    if (pos_ == sizeof(buf_)) {
      if (n >= sizeof(buf_)) {
        // Whole buffers' worth straight into the output: the same bytes, without a copy.
        const size_t whole = n - n % sizeof(buf_);
        encryptZeros(cipher_->ctx, dst, whole);
        dst += whole;
        n -= whole;
        continue;
      }
      refill();
    }
    const size_t take = std::min(n, sizeof(buf_) - pos_);
    std::memcpy(dst, buf_ + pos_, take);
    pos_ += take;
    dst += take;
    n -= take;
  }
}

uint64_t KeyedStream::next64() {
  unsigned char b[8];
  fill(b, sizeof(b));
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}

double KeyedStream::nextOpenUnit() {
  // (k + 0.5) / 2^53 for k uniform in [0, 2^53): in (0, 1), exactly representable.
  const uint64_t k = next64() >> 11;
  return (static_cast<double>(k) + 0.5) * 0x1.0p-53;
}

std::string streamKeyFromSeed(std::string_view label, uint64_t seed) {
  std::string material(label);
  material.push_back('\0');
  for (int i = 0; i < 8; ++i) material.push_back(static_cast<char>(seed >> (8 * i)));
  const Digest d = sha256(material);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

std::string randomStreamKey() {
  std::string key(kStreamKeyBytes, '\0');
  FEDFLEET_CHECK(
      RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), static_cast<int>(key.size())) == 1);
  return key;
}

}  // namespace fedfleet::crypto
