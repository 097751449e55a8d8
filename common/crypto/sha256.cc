#include "common/crypto/sha256.h"

#include <openssl/evp.h>

#include <memory>

#include "common/check.h"

namespace fedfleet::crypto {

Digest sha256(const void* data, size_t size) {
  Digest out{};
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  FEDFLEET_CHECK(ctx != nullptr);
  unsigned int len = 0;
  FEDFLEET_CHECK(EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1);
  FEDFLEET_CHECK(EVP_DigestUpdate(ctx.get(), data, size) == 1);
  FEDFLEET_CHECK(EVP_DigestFinal_ex(ctx.get(), out.data(), &len) == 1);
  FEDFLEET_CHECK(len == out.size());
  return out;
}

std::string toHex(const Digest& digest) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  s.reserve(64);
  for (uint8_t b : digest) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

}  // namespace fedfleet::crypto
