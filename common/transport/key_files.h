// Internal helpers of common/transport/ shared by the key-file code and the sockets: checking and
// deriving Z85 CURVE keys, and checking the paths of key files as OpenSSH's StrictModes does.
// Not part of the public interface (see common/transport/transport.h).
#pragma once

#include <cstdint>
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

// Which file a key path names; each kind has its own rule for the file itself (checkKeyPath).
enum class KeyPathKind {
  kSecretKeyFile,   // a regular file; no access at all for group or others (mode & 077 == 0)
  kAllowListDir,    // a directory; group and others may not write it, sticky or not
  kAllowedKeyFile,  // a public key file of the allow-list; group and others may not write it
};

// A file's identity: the device and inode it has once every symbolic link is followed. The ZAP
// handler follows the allow-list directory by it, so a rename or a replacement is seen.
struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  bool operator==(const FileIdentity&) const = default;
  std::string toString() const;  // "device:inode"
};

// Checks `path` as OpenSSH's StrictModes checks a user's keys, up to the root directory: the
// path is followed component by component as the kernel resolves it (relative paths from the
// working directory, whose own path is checked too), and
//   - every directory passed through must be owned by root or by the user this process runs
//     as (its effective uid), and writable by no one else: group or others' write bit refused;
//     the one exception is a directory with the sticky bit (like /tmp) above the directory that
//     holds the keys, where others may create names but not rename or remove ours;
//   - every symbolic link on the way must be owned by root or that user (its target is then
//     checked the same way);
//   - the directory holding a secret key file may not be sticky-writable either, and the file
//     itself follows the rule of `kind`, owned by root or that user.
// Returns the identity of what the path names. kNotFound when a component does not exist;
// kInvalidArgument when a component is not a directory or the file is not of its kind (or more
// than 40 symbolic links are followed); kPermissionDenied naming the path at fault, its owner or
// mode and the command that fixes it; kIoError when a component cannot be examined.
Result<FileIdentity> checkKeyPath(const std::string& path, KeyPathKind kind);

// A `*.key` file of an allow-list directory that passed checkKeyPath: a plain file must be owned
// by root or this user and not writable by group or others; a symbolic link is checked along its
// whole path (checkKeyPath, kAllowedKeyFile). Errors as checkKeyPath's.
Status checkAllowedKeyFile(const std::string& path);

// The identity of what `path` names now (stat), without the checks. kNotFound / kIoError.
Result<FileIdentity> identityOf(const std::string& path);

}  // namespace fedfleet::transport
