// CURVE key pairs and their files.
//
// File format (ZeroMQ-like text, one key per `name = "value"` line, `#` starts a comment):
//   <name>.key         public-key = "<40 Z85 chars>"                      mode 0644
//   <name>.key_secret  public-key = "..." and secret-key = "<40 chars>"   mode 0600
// readPublicKeyFile also accepts a bare 40-character key on its own line, and ignores other
// lines (so czmq zcert public files, whose key sits in a `curve` section, read too).

#include "common/transport/key_files.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "common/transport/transport.h"

namespace fedfleet::transport {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kZ85Alphabet =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
constexpr std::uintmax_t kMaxKeyFileBytes = 64 * 1024;  // key files are ~200 bytes

std::string errnoText(int err) { return std::strerror(err); }

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// The value of a `name = "value"` (or `name = value`) line, or nullopt if the line is not an
// assignment to `name`.
std::optional<std::string_view> assignedValue(std::string_view line, std::string_view name) {
  if (line.substr(0, name.size()) != name) return std::nullopt;
  std::string_view rest = trim(line.substr(name.size()));
  if (rest.empty() || rest.front() != '=') return std::nullopt;
  rest = trim(rest.substr(1));
  if (rest.size() >= 2 && rest.front() == '"' && rest.back() == '"') {
    rest = rest.substr(1, rest.size() - 2);
  }
  return rest;
}

// Reads a whole (small) text file. kNotFound if it does not exist.
Result<std::string> readSmallFile(const std::string& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) return notFound("key file " + path + " not found");
  if (!fs::is_regular_file(status)) return corrupt("key file " + path + " is not a regular file");
  const auto size = fs::file_size(path, ec);
  if (ec) return ioError("cannot stat key file " + path + ": " + ec.message());
  if (size > kMaxKeyFileBytes) {
    return corrupt("key file " + path + " is " + std::to_string(size) + " bytes; not a key file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return ioError("cannot open key file " + path + ": " + errnoText(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return ioError("cannot read key file " + path);
  return text.str();
}

// Finds the value of `name` in a key file's text. A bare key line counts when `bare_ok`.
Result<std::string> findKey(const std::string& text, std::string_view name, bool bare_ok,
                            const std::string& path) {
  std::istringstream lines(text);
  std::string raw;
  while (std::getline(lines, raw)) {
    std::string_view line = trim(raw);
    if (line.empty() || line.front() == '#') continue;
    if (auto value = assignedValue(line, name)) {
      if (!isZ85Key(*value)) {
        return corrupt("key file " + path + ": " + std::string(name) +
                       " is not a 40-character Z85 key");
      }
      return std::string(*value);
    }
    if (bare_ok && isZ85Key(line)) return std::string(line);
  }
  return corrupt("key file " + path + " holds no " + std::string(name));
}

Status checkName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return invalidArgument("bad key name '" + name + "': must be a plain file name");
  }
  return Status::ok();
}

Status writeAll(int fd, const std::string& content, const std::string& path) {
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ioError("cannot write " + path + ": " + errnoText(errno));
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

// Writes `content` to `path` with exactly `mode` (whatever the umask). Without `overwrite`, fails
// if the file exists; with it, replaces the file atomically (temporary file + rename).
Status writeKeyFile(const std::string& path, const std::string& content, mode_t mode,
                    bool overwrite) {
  const std::string target = overwrite ? path + ".tmp" : path;
  if (overwrite) ::unlink(target.c_str());
  int fd = ::open(target.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST) {
      return failedPrecondition("key file " + target + " exists; refusing to overwrite it");
    }
    return ioError("cannot create " + target + ": " + errnoText(errno));
  }
  Status st = writeAll(fd, content, target);
  if (st.isOk() && ::fchmod(fd, mode) != 0) {
    st = ioError("cannot set mode of " + target + ": " + errnoText(errno));
  }
  if (st.isOk() && ::fsync(fd) != 0)
    st = ioError("cannot sync " + target + ": " + errnoText(errno));
  if (::close(fd) != 0 && st.isOk())
    st = ioError("cannot close " + target + ": " + errnoText(errno));
  if (st.isOk() && overwrite && ::rename(target.c_str(), path.c_str()) != 0) {
    st = ioError("cannot rename " + target + " to " + path + ": " + errnoText(errno));
  }
  if (!st.isOk()) ::unlink(target.c_str());
  return st;
}

}  // namespace

bool isZ85Key(std::string_view key) {
  if (key.size() != kZ85KeyChars) return false;
  for (char c : key) {
    if (kZ85Alphabet.find(c) == std::string_view::npos) return false;
  }
  uint8_t raw[32];
  const std::string terminated(key);
  return zmq_z85_decode(raw, terminated.c_str()) != nullptr;
}

bool isValidClientId(std::string_view id) {
  if (id.empty() || id.size() > 128 || id.front() == '.') return false;
  for (unsigned char ch : id) {
    if (!(std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '@')) return false;
  }
  return true;
}

namespace {

// kPermissionDenied when `path` has any of the `forbidden` mode bits, naming the fix.
Status checkMode(const std::string& path, const char* what, mode_t forbidden, const char* fix) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return notFound(std::string(what) + " " + path + " not found");
    return ioError("cannot stat " + path + ": " + errnoText(errno));
  }
  if ((st.st_mode & forbidden) == 0) return Status::ok();
  char mode[8];
  std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
  return permissionDenied(std::string(what) + " " + path + " has mode " + mode + ": others could " +
                          ((forbidden & 044) != 0 ? "read or replace it" : "add keys to it") +
                          "; fix with `chmod " + fix + " " + path + "`");
}

}  // namespace

Status checkSecretKeyFile(const std::string& path) {
  return checkMode(path, "secret key file", 077, "600");
}

Status checkAllowListDir(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    return invalidArgument("allow-list path " + dir + " is not a directory");
  }
  return checkMode(dir, "allow-list directory", 022, "go-w");
}

Result<std::string> publicKeyOf(const std::string& secret_key) {
  if (!isZ85Key(secret_key)) return invalidArgument("secret key is not a 40-character Z85 key");
  char public_key[kZ85KeyChars + 1] = {};
  if (zmq_curve_public(public_key, secret_key.c_str()) != 0) {
    return internalError(std::string("zmq_curve_public: ") + zmq_strerror(zmq_errno()));
  }
  return std::string(public_key, kZ85KeyChars);
}

Status checkKeyPair(const KeyPair& keys, const std::string& what) {
  if (!isZ85Key(keys.public_key)) {
    return invalidArgument(what + ": public key is not a 40-character Z85 key");
  }
  if (!isZ85Key(keys.secret_key)) {
    return invalidArgument(what + ": secret key is not a 40-character Z85 key");
  }
  Result<std::string> derived = publicKeyOf(keys.secret_key);
  if (!derived.isOk()) return derived.status().withContext(what);
  if (*derived != keys.public_key) {
    return invalidArgument(what + ": public key does not belong to the secret key");
  }
  return Status::ok();
}

Result<KeyPair> generateKeyPair() {
  char public_key[kZ85KeyChars + 1] = {};
  char secret_key[kZ85KeyChars + 1] = {};
  if (zmq_curve_keypair(public_key, secret_key) != 0) {
    return internalError(std::string("zmq_curve_keypair: ") + zmq_strerror(zmq_errno()) +
                         " (libzmq built without CURVE?)");
  }
  return KeyPair{std::string(public_key, kZ85KeyChars), std::string(secret_key, kZ85KeyChars)};
}

Status writeKeyPair(const std::string& dir, const std::string& name, const KeyPair& keys,
                    bool overwrite) {
  FEDFLEET_RETURN_IF_ERROR(checkName(name));
  FEDFLEET_RETURN_IF_ERROR(checkKeyPair(keys, "writeKeyPair"));
  if (dir.empty()) return invalidArgument("writeKeyPair: empty directory");

  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec) return ioError("cannot create key directory " + dir + ": " + ec.message());
    fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
    if (ec) return ioError("cannot set mode of " + dir + ": " + ec.message());
  } else if (!fs::is_directory(dir, ec)) {
    return invalidArgument("key directory " + dir + " is not a directory");
  }

  const std::string public_path = (fs::path(dir) / (name + ".key")).string();
  const std::string secret_path = (fs::path(dir) / (name + ".key_secret")).string();
  if (!overwrite) {
    for (const auto& path : {public_path, secret_path}) {
      if (fs::exists(fs::symlink_status(path, ec))) {
        return failedPrecondition("key file " + path +
                                  " exists; refusing to overwrite it (pass overwrite to replace)");
      }
    }
  }
  const std::string public_text =
      "# fedfleet CURVE public key (ZeroMQ Z85). Safe to share: copy it into the coordinator's\n"
      "# allow-list directory to admit this client.\n"
      "public-key = \"" +
      keys.public_key + "\"\n";
  const std::string secret_text =
      "# fedfleet CURVE secret key (ZeroMQ Z85). Keep it private; never copy it off this host.\n"
      "public-key = \"" +
      keys.public_key +
      "\"\n"
      "secret-key = \"" +
      keys.secret_key + "\"\n";
  // Secret first: a half-written pair then never advertises a public key without its secret.
  FEDFLEET_RETURN_IF_ERROR(writeKeyFile(secret_path, secret_text, 0600, overwrite));
  return writeKeyFile(public_path, public_text, 0644, overwrite);
}

Result<std::string> readPublicKeyFile(const std::string& path) {
  FEDFLEET_ASSIGN_OR_RETURN(std::string text, readSmallFile(path));
  return findKey(text, "public-key", /*bare_ok=*/true, path);
}

Result<KeyPair> readKeyPair(const std::string& dir, const std::string& name) {
  FEDFLEET_RETURN_IF_ERROR(checkName(name));
  const std::string public_path = (fs::path(dir) / (name + ".key")).string();
  const std::string secret_path = (fs::path(dir) / (name + ".key_secret")).string();
  FEDFLEET_ASSIGN_OR_RETURN(std::string public_key, readPublicKeyFile(public_path));
  FEDFLEET_ASSIGN_OR_RETURN(std::string secret_text, readSmallFile(secret_path));
  FEDFLEET_ASSIGN_OR_RETURN(std::string secret_key,
                            findKey(secret_text, "secret-key", /*bare_ok=*/false, secret_path));
  KeyPair keys{std::move(public_key), std::move(secret_key)};
  if (!checkKeyPair(keys, name).isOk()) {
    return corrupt("key files " + public_path + " and " + secret_path + " do not form a pair");
  }
  struct stat st;
  if (::stat(secret_path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    spdlog::warn("secret key file {} is readable by group or others (mode {:o}); chmod 600 it",
                 secret_path, st.st_mode & 0777);
  }
  return keys;
}

}  // namespace fedfleet::transport
