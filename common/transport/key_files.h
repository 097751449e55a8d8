// Internal helpers of common/transport/ shared by the key-file code and the sockets: checking and
// deriving Z85 CURVE keys. Not part of the public interface (see common/transport/transport.h).
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "common/transport/transport.h"

namespace fedfleet::transport {

constexpr size_t kZ85KeyChars = 40;

// True when `key` is exactly 40 characters of the Z85 alphabet that decode to 32 bytes.
bool isZ85Key(std::string_view key);

// The Z85 public key of a Z85 secret key. kInvalidArgument when `secret_key` is not a Z85 key.
Result<std::string> publicKeyOf(const std::string& secret_key);

// OK when both keys are Z85 and `keys.public_key` belongs to `keys.secret_key`; otherwise
// kInvalidArgument naming `what` ("server_keys", ...).
Status checkKeyPair(const KeyPair& keys, const std::string& what);

}  // namespace fedfleet::transport
