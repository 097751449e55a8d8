#include "common/crypto/hkdf.h"

#include <openssl/evp.h>
#include <openssl/kdf.h>

#include "common/check.h"

namespace fedfleet::crypto {

std::string hkdfSha256(std::string_view ikm, std::string_view salt, std::string_view info,
                       size_t length) {
  FEDFLEET_CHECK(length > 0 && length <= 255 * 32);
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  FEDFLEET_CHECK(ctx != nullptr);
  auto u = [](std::string_view s) { return reinterpret_cast<const unsigned char*>(s.data()); };
  std::string out(length, '\0');
  size_t len = length;
  const bool ok = EVP_PKEY_derive_init(ctx) == 1 &&
                  EVP_PKEY_CTX_set_hkdf_md(ctx, EVP_sha256()) == 1 &&
                  EVP_PKEY_CTX_set1_hkdf_salt(ctx, u(salt), static_cast<int>(salt.size())) == 1 &&
                  EVP_PKEY_CTX_set1_hkdf_key(ctx, u(ikm), static_cast<int>(ikm.size())) == 1 &&
                  EVP_PKEY_CTX_add1_hkdf_info(ctx, u(info), static_cast<int>(info.size())) == 1 &&
                  EVP_PKEY_derive(ctx, reinterpret_cast<unsigned char*>(out.data()), &len) == 1;
  EVP_PKEY_CTX_free(ctx);
  FEDFLEET_CHECK(ok && len == length);
  return out;
}

}  // namespace fedfleet::crypto
