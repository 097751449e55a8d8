// HKDF with SHA-256 (RFC 5869) through OpenSSL, to turn a key-agreement secret into keys for
// distinct purposes (a mask seed, a share-encryption key), each bound to its `info`.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace fedfleet::crypto {

// `length` bytes (at most 255 x 32) of HKDF-SHA256(ikm, salt, info). Aborts only when OpenSSL
// fails, a broken invariant.
std::string hkdfSha256(std::string_view ikm, std::string_view salt, std::string_view info,
                       size_t length);

}  // namespace fedfleet::crypto
