#include "common/crypto/x25519.h"

#include <openssl/evp.h>

#include <memory>

#include "common/check.h"

namespace fedfleet::crypto {
namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using PkeyCtx = std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree>;

const unsigned char* bytes(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

Pkey privateKey(std::string_view private_key) {
  FEDFLEET_CHECK(private_key.size() == kX25519KeyBytes);
  Pkey key(EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, bytes(private_key),
                                        private_key.size()));
  FEDFLEET_CHECK(key != nullptr);
  return key;
}

}  // namespace

std::string x25519PublicKey(std::string_view private_key) {
  Pkey key = privateKey(private_key);
  std::string pub(kX25519KeyBytes, '\0');
  size_t len = pub.size();
  FEDFLEET_CHECK(EVP_PKEY_get_raw_public_key(
                     key.get(), reinterpret_cast<unsigned char*>(pub.data()), &len) == 1 &&
                 len == kX25519KeyBytes);
  return pub;
}

X25519KeyPair x25519KeyPair(std::string_view private_key) {
  return {std::string(private_key), x25519PublicKey(private_key)};
}

struct X25519Agreement::Key {
  Pkey own;
};

X25519Agreement::X25519Agreement(std::string_view private_key)
    : key_(std::make_unique<Key>(Key{privateKey(private_key)})) {}
X25519Agreement::~X25519Agreement() = default;
X25519Agreement::X25519Agreement(X25519Agreement&&) noexcept = default;
X25519Agreement& X25519Agreement::operator=(X25519Agreement&&) noexcept = default;

Result<std::string> X25519Agreement::with(std::string_view peer_public) const {
  if (peer_public.size() != kX25519KeyBytes) {
    return invalidArgument("an X25519 public key is 32 bytes, got " +
                           std::to_string(peer_public.size()));
  }
  Pkey peer(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, bytes(peer_public),
                                        peer_public.size()));
  if (peer == nullptr) return invalidArgument("the peer's X25519 public key is not usable");
  PkeyCtx ctx(EVP_PKEY_CTX_new(key_->own.get(), nullptr));
  FEDFLEET_CHECK(ctx != nullptr);
  FEDFLEET_CHECK(EVP_PKEY_derive_init(ctx.get()) == 1);
  if (EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) != 1) {
    return invalidArgument("the peer's X25519 public key is not usable");
  }
  std::string secret(kX25519KeyBytes, '\0');
  size_t len = secret.size();
  // OpenSSL refuses an all-zero result (a low-order peer point) here.
  if (EVP_PKEY_derive(ctx.get(), reinterpret_cast<unsigned char*>(secret.data()), &len) != 1 ||
      len != kX25519KeyBytes) {
    return invalidArgument("the peer's X25519 public key is a low-order point");
  }
  bool all_zero = true;
  for (char c : secret) all_zero = all_zero && c == 0;
  if (all_zero) return invalidArgument("the peer's X25519 public key is a low-order point");
  return secret;
}

Result<std::string> x25519Agree(std::string_view private_key, std::string_view peer_public) {
  return X25519Agreement(private_key).with(peer_public);
}

}  // namespace fedfleet::crypto
