// checkClientMessage (common/wire/limits.h): the bounds on every variable field of a message a
// client sends.

#include "common/wire/limits.h"

#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

namespace fedfleet::wire {
namespace {

// The Z85 alphabet (ZeroMQ RFC 32). common/transport/key_files.cc decodes keys with libzmq;
// this library does not link it, and the alphabet is all a bound needs.
constexpr std::string_view kZ85Alphabet =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

bool isClientIdChar(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '@' || c == '-';
}

bool isPrintableAscii(unsigned char c) { return c >= 0x20 && c <= 0x7e; }

// Free text: anything but control characters, tab and newline excepted.
bool isTextByte(unsigned char c) { return c == '\t' || c == '\n' || (c >= 0x20 && c != 0x7f); }

bool isZ85Char(unsigned char c) {
  return kZ85Alphabet.find(static_cast<char>(c)) != kZ85Alphabet.npos;
}

Status tooLong(const char* field, size_t size, size_t limit) {
  return invalidArgument(std::string(field) + " is " + std::to_string(size) + " bytes, limit " +
                         std::to_string(limit));
}

// kInvalidArgument naming the first byte of `value` that `allowed` refuses, or OK.
template <typename Allowed>
Status checkChars(const char* field, std::string_view value, Allowed allowed,
                  const char* what_is_allowed) {
  for (size_t i = 0; i < value.size(); ++i) {
    const auto c = static_cast<unsigned char>(value[i]);
    if (!allowed(c)) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02x", c);
      return invalidArgument(std::string(field) + " (" + std::to_string(value.size()) +
                             " bytes) has byte " + hex + " at " + std::to_string(i) + ", not " +
                             what_is_allowed);
    }
  }
  return Status::ok();
}

Status check(const Hello& m) {
  if (m.client_id.empty()) {
    return invalidArgument("Hello.client_id is empty, must be 1-" +
                           std::to_string(kMaxClientIdBytes) + " characters");
  }
  if (m.client_id.size() > kMaxClientIdBytes) {
    return tooLong("Hello.client_id", m.client_id.size(), kMaxClientIdBytes);
  }
  FEDFLEET_RETURN_IF_ERROR(
      checkChars("Hello.client_id", m.client_id, isClientIdChar, "one of [A-Za-z0-9._@-]"));
  if (!m.public_key.empty()) {
    if (m.public_key.size() != kPublicKeyChars) {
      return invalidArgument("Hello.public_key is " + std::to_string(m.public_key.size()) +
                             " bytes, must be empty or " + std::to_string(kPublicKeyChars) +
                             " (a Z85 CURVE key)");
    }
    FEDFLEET_RETURN_IF_ERROR(
        checkChars("Hello.public_key", m.public_key, isZ85Char, "in the Z85 alphabet"));
  }
  if (m.device_name.size() > kMaxDeviceNameBytes) {
    return tooLong("Hello.device_name", m.device_name.size(), kMaxDeviceNameBytes);
  }
  FEDFLEET_RETURN_IF_ERROR(
      checkChars("Hello.device_name", m.device_name, isPrintableAscii, "printable ASCII"));
  if (m.cores > kMaxCores) {
    return invalidArgument("Hello.cores is " + std::to_string(m.cores) + ", limit " +
                           std::to_string(kMaxCores));
  }
  if (m.memory_bytes > kMaxMemoryBytes) {
    return invalidArgument("Hello.memory_bytes is " + std::to_string(m.memory_bytes) + ", limit " +
                           std::to_string(kMaxMemoryBytes));
  }
  if (m.requested_partition < -1) {
    return invalidArgument("Hello.requested_partition is " + std::to_string(m.requested_partition) +
                           ", must be -1 (any) or >= 0");
  }
  return Status::ok();
}

Status check(const Bye& m) {
  if (m.reason.size() > kMaxReasonBytes) {
    return tooLong("Bye.reason", m.reason.size(), kMaxReasonBytes);
  }
  return checkChars("Bye.reason", m.reason, isTextByte, "text (a control character)");
}

Status check(const Error& m) {
  if (!isClientErrorCode(m.code)) {
    return invalidArgument("Error.code " + std::to_string(static_cast<int>(m.code)) +
                           " is not one a client sends (REJECTED or INTERNAL)");
  }
  if (m.message.size() > kMaxReasonBytes) {
    return tooLong("Error.message", m.message.size(), kMaxReasonBytes);
  }
  return checkChars("Error.message", m.message, isTextByte, "text (a control character)");
}

// No variable field a constant could bound (see limits.h).
Status check(const Chunk&) { return Status::ok(); }
Status check(const Summary&) { return Status::ok(); }
Status check(const UploadRequest&) { return Status::ok(); }
Status check(const Heartbeat&) { return Status::ok(); }

Status check(const SecAgg& m) {
  if (m.step != SecAggStep::kAdvert && m.step != SecAggStep::kShares &&
      m.step != SecAggStep::kReveal) {
    return invalidArgument(std::string("SecAgg step ") + secAggStepName(m.step) +
                           " is not one a client sends");
  }
  if (!m.request.survivors.empty() || !m.request.dropped.empty()) {
    return invalidArgument("SecAgg survivors and dropped are the coordinator's to send");
  }
  const bool advert = m.step == SecAggStep::kAdvert, shares = m.step == SecAggStep::kShares,
             reveal = m.step == SecAggStep::kReveal;
  if ((!advert && !m.adverts.empty()) || (!shares && !m.shares.empty()) ||
      (!reveal && !m.revealed.empty())) {
    return invalidArgument(std::string("SecAgg step ") + secAggStepName(m.step) +
                           " carries a list of another step");
  }
  const size_t entries = m.adverts.size() + m.shares.size() + m.revealed.size();
  if (entries > kMaxSecAggEntries) {
    return invalidArgument("SecAgg has " + std::to_string(entries) + " entries, limit " +
                           std::to_string(kMaxSecAggEntries));
  }
  for (const auto& a : m.adverts) {
    if (a.encryption_key.size() != 32 || a.mask_key.size() != 32 || a.seed_digest.size() != 32) {
      return invalidArgument("SecAgg keys must be 32 bytes each");
    }
  }
  for (const auto& sh : m.shares) {
    if (sh.sealed.size() != secagg::kSealedSharesBytes) {
      return invalidArgument("SecAgg sealed shares are " + std::to_string(sh.sealed.size()) +
                             " bytes, must be " + std::to_string(secagg::kSealedSharesBytes));
    }
  }
  for (const auto& r : m.revealed) {
    if (r.share.size() != 44) {
      return invalidArgument("SecAgg revealed shares are " + std::to_string(r.share.size()) +
                             " bytes, must be 44");
    }
  }
  return Status::ok();
}

}  // namespace

bool isClientErrorCode(ErrorCode code) {
  return code == ErrorCode::kRejected || code == ErrorCode::kInternal;
}

Status checkClientMessage(const Message& message) {
  return std::visit(
      [&](const auto& m) -> Status {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Task> || std::is_same_v<T, Cancel> ||
                      std::is_same_v<T, UploadGrant>) {
          return invalidArgument(std::string(messageName(message)) +
                                 " is not a message a client sends");
        } else {
          return check(m);
        }
      },
      message);
}

}  // namespace fedfleet::wire
