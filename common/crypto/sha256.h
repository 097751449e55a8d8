// SHA-256 through OpenSSL's EVP interface (no hand-written crypto).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fedfleet::crypto {

using Digest = std::array<uint8_t, 32>;

// SHA-256 of `size` bytes at `data`. Aborts only if OpenSSL itself fails (a broken invariant).
Digest sha256(const void* data, size_t size);
inline Digest sha256(std::string_view bytes) { return sha256(bytes.data(), bytes.size()); }

// Lower-case hex, 64 characters.
std::string toHex(const Digest& digest);

}  // namespace fedfleet::crypto
