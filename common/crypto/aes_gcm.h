// AES-256-GCM authenticated encryption through OpenSSL, for secrets sent through a party that
// must not read them (secure aggregation routes clients' key shares through the coordinator).
// A key must never seal two messages under one nonce; callers derive a key per message or pass
// distinct nonces.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace fedfleet::crypto {

inline constexpr size_t kAesGcmKeyBytes = 32;
inline constexpr size_t kAesGcmNonceBytes = 12;
inline constexpr size_t kAesGcmTagBytes = 16;

// The ciphertext of `plaintext` followed by its 16-byte tag, authenticating `aad` too. `key`
// is 32 bytes and `nonce` 12 (a broken invariant otherwise).
std::string aesGcmSeal(std::string_view key, std::string_view nonce, std::string_view aad,
                       std::string_view plaintext);
// The plaintext of aesGcmSeal's output; kCorrupt when it is too short or does not
// authenticate under this key, nonce and `aad` (tampered, or meant for someone else).
Result<std::string> aesGcmOpen(std::string_view key, std::string_view nonce, std::string_view aad,
                               std::string_view sealed);

}  // namespace fedfleet::crypto
