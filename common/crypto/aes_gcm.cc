#include "common/crypto/aes_gcm.h"

#include <openssl/evp.h>

#include "common/check.h"

namespace fedfleet::crypto {
namespace {

const unsigned char* u(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

struct CipherCtx {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  CipherCtx() { FEDFLEET_CHECK(ctx != nullptr); }
  ~CipherCtx() { EVP_CIPHER_CTX_free(ctx); }
};

}  // namespace

std::string aesGcmSeal(std::string_view key, std::string_view nonce, std::string_view aad,
                       std::string_view plaintext) {
  FEDFLEET_CHECK(key.size() == kAesGcmKeyBytes && nonce.size() == kAesGcmNonceBytes);
  CipherCtx c;
  std::string out(plaintext.size() + kAesGcmTagBytes, '\0');
  auto* dst = reinterpret_cast<unsigned char*>(out.data());
  int len = 0;
  FEDFLEET_CHECK(EVP_EncryptInit_ex(c.ctx, EVP_aes_256_gcm(), nullptr, u(key), u(nonce)) == 1);
  if (!aad.empty()) {
    FEDFLEET_CHECK(EVP_EncryptUpdate(c.ctx, nullptr, &len, u(aad), static_cast<int>(aad.size())) ==
                   1);
  }
  FEDFLEET_CHECK(
      EVP_EncryptUpdate(c.ctx, dst, &len, u(plaintext), static_cast<int>(plaintext.size())) == 1);
  int tail = 0;
  FEDFLEET_CHECK(EVP_EncryptFinal_ex(c.ctx, dst + len, &tail) == 1 && tail == 0);
  FEDFLEET_CHECK(EVP_CIPHER_CTX_ctrl(c.ctx, EVP_CTRL_GCM_GET_TAG, kAesGcmTagBytes,
                                     dst + plaintext.size()) == 1);
  return out;
}

Result<std::string> aesGcmOpen(std::string_view key, std::string_view nonce, std::string_view aad,
                               std::string_view sealed) {
  FEDFLEET_CHECK(key.size() == kAesGcmKeyBytes && nonce.size() == kAesGcmNonceBytes);
  if (sealed.size() < kAesGcmTagBytes) return corrupt("sealed message shorter than its tag");
  const size_t n = sealed.size() - kAesGcmTagBytes;
  CipherCtx c;
  std::string out(n, '\0');
  int len = 0;
  FEDFLEET_CHECK(EVP_DecryptInit_ex(c.ctx, EVP_aes_256_gcm(), nullptr, u(key), u(nonce)) == 1);
  if (!aad.empty()) {
    FEDFLEET_CHECK(EVP_DecryptUpdate(c.ctx, nullptr, &len, u(aad), static_cast<int>(aad.size())) ==
                   1);
  }
  FEDFLEET_CHECK(EVP_DecryptUpdate(c.ctx, reinterpret_cast<unsigned char*>(out.data()), &len,
                                   u(sealed), static_cast<int>(n)) == 1);
  std::string tag(sealed.substr(n));
  FEDFLEET_CHECK(EVP_CIPHER_CTX_ctrl(c.ctx, EVP_CTRL_GCM_SET_TAG, kAesGcmTagBytes, tag.data()) ==
                 1);
  int tail = 0;
  if (EVP_DecryptFinal_ex(c.ctx, reinterpret_cast<unsigned char*>(out.data()) + len, &tail) != 1) {
    return corrupt("sealed message does not authenticate (tampered, or not meant for this key)");
  }
  return out;
}

}  // namespace fedfleet::crypto
