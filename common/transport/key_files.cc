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
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

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

// Symbolic links followed at most while checking one key path (Linux's MAXSYMLINKS).
constexpr int kMaxSymlinks = 40;

bool trustedOwner(uid_t uid) { return uid == 0 || uid == ::geteuid(); }

std::string modeText(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, (mode & 07000) != 0 ? "%04o" : "%03o",
                static_cast<unsigned>(mode & 07777));
  return text;
}

const char* nameOf(KeyPathKind kind) {
  switch (kind) {
    case KeyPathKind::kSecretKeyFile:
      return "secret key file";
    case KeyPathKind::kAllowListDir:
      return "allow-list directory";
    case KeyPathKind::kAllowedKeyFile:
      return "allow-list key file";
  }
  return "key path";
}

Status notTrustedOwner(const std::string& what, const std::string& path, uid_t uid) {
  return permissionDenied(what + " " + path + " is owned by uid " + std::to_string(uid) +
                          ": only root or uid " + std::to_string(::geteuid()) +
                          " (the user this runs as) may own it; fix with `chown " +
                          std::to_string(::geteuid()) + " " + path + "`");
}

// A directory that `target`'s path passes through. `holds_keys`: it holds the key files
// themselves, which the sticky bit does not make safe (others could still add names to it).
Status checkDirectoryOnPath(const std::string& dir, const struct stat& st,
                            const std::string& target, const char* what, bool holds_keys) {
  if (!S_ISDIR(st.st_mode)) {
    return invalidArgument(std::string(what) + " " + target + ": " + dir +
                           " on its path is not a directory");
  }
  if (!trustedOwner(st.st_uid)) {
    return notTrustedOwner("directory", dir, st.st_uid)
        .withContext(std::string("the path to ") + what + " " + target);
  }
  if ((st.st_mode & 022) == 0) return Status::ok();
  if (!holds_keys && (st.st_mode & S_ISVTX) != 0) return Status::ok();
  return permissionDenied(std::string("directory ") + dir + " on the path to " + what + " " +
                          target + " has mode " + modeText(st.st_mode) +
                          ": others could rename or replace what it holds; fix with `chmod go-w " +
                          dir + "`");
}

// The final file of a key path, by its kind's rule.
Status checkKeyFileItself(const std::string& path, const struct stat& st, KeyPathKind kind) {
  const char* what = nameOf(kind);
  if (kind == KeyPathKind::kAllowListDir) {
    if (!S_ISDIR(st.st_mode)) {
      return invalidArgument("allow-list path " + path + " is not a directory");
    }
  } else if (!S_ISREG(st.st_mode)) {
    return invalidArgument(std::string(what) + " " + path + " is not a regular file");
  }
  if (!trustedOwner(st.st_uid)) return notTrustedOwner(what, path, st.st_uid);
  const mode_t forbidden = kind == KeyPathKind::kSecretKeyFile ? 077 : 022;
  if ((st.st_mode & forbidden) == 0) return Status::ok();
  const char* risk = kind == KeyPathKind::kSecretKeyFile  ? "read or replace it"
                     : kind == KeyPathKind::kAllowListDir ? "add keys to it"
                                                          : "replace the key it holds";
  const char* fix = kind == KeyPathKind::kSecretKeyFile ? "600" : "go-w";
  return permissionDenied(std::string(what) + " " + path + " has mode " + modeText(st.st_mode) +
                          ": others could " + risk + "; fix with `chmod " + fix + " " + path + "`");
}

void pushComponents(std::string_view path, std::deque<std::string>* pending) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    std::string_view part = path.substr(start, end - start);
    if (!part.empty() && part != ".") parts.emplace_back(part);
    start = end + 1;
  }
  pending->insert(pending->begin(), parts.begin(), parts.end());
}

std::string joinPath(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += "/" + p;
  return out.empty() ? "/" : out;
}

}  // namespace

std::string FileIdentity::toString() const {
  return std::to_string(device) + ":" + std::to_string(inode);
}

Result<FileIdentity> identityOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return notFound(path + " not found");
    return ioError("cannot stat " + path + ": " + errnoText(errno));
  }
  return FileIdentity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

Result<FileIdentity> checkKeyPath(const std::string& path, KeyPathKind kind) {
  const char* what = nameOf(kind);
  if (path.empty()) return invalidArgument(std::string(what) + ": empty path");
  std::deque<std::string> pending;
  pushComponents(path, &pending);
  if (path.front() != '/') {
    std::error_code ec;
    const fs::path cwd = fs::current_path(ec);
    if (ec) return ioError("cannot read the working directory: " + ec.message());
    pushComponents(cwd.string(), &pending);
  }
  auto lstatOf = [&](const std::string& p, struct stat* st) -> Status {
    if (::lstat(p.c_str(), st) == 0) return Status::ok();
    if (errno == ENOENT) {
      return notFound(std::string(what) + " " + path + " not found" +
                      (p == path ? "" : " (" + p + " does not exist)"));
    }
    return ioError("cannot stat " + p + " (on the path to " + path + "): " + errnoText(errno));
  };
  // Resolved components so far: every one a checked directory.
  std::vector<std::string> resolved;
  struct stat st;
  FEDFLEET_RETURN_IF_ERROR(lstatOf("/", &st));
  FEDFLEET_RETURN_IF_ERROR(checkDirectoryOnPath("/", st, path, what, /*holds_keys=*/false));
  int links = 0;
  std::string final_path = "/";
  while (!pending.empty()) {
    const std::string part = std::move(pending.front());
    pending.pop_front();
    if (part == "..") {
      if (!resolved.empty()) resolved.pop_back();
      final_path = joinPath(resolved);
      continue;
    }
    std::vector<std::string> next_parts = resolved;
    next_parts.push_back(part);
    const std::string next = joinPath(next_parts);
    FEDFLEET_RETURN_IF_ERROR(lstatOf(next, &st));
    if (S_ISLNK(st.st_mode)) {
      if (++links > kMaxSymlinks) {
        return invalidArgument(std::string(what) + " " + path + ": more than " +
                               std::to_string(kMaxSymlinks) + " symbolic links on its path");
      }
      if (!trustedOwner(st.st_uid)) {
        return notTrustedOwner("symbolic link", next, st.st_uid)
            .withContext(std::string("the path to ") + what + " " + path);
      }
      std::string target(PATH_MAX, '\0');
      const ssize_t n = ::readlink(next.c_str(), target.data(), target.size());
      if (n < 0) return ioError("cannot read symbolic link " + next + ": " + errnoText(errno));
      target.resize(static_cast<size_t>(n));
      if (!target.empty() && target.front() == '/') resolved.clear();
      pushComponents(target, &pending);
      final_path = joinPath(resolved);
      continue;
    }
    final_path = next;
    if (pending.empty()) break;  // the file itself: checked below
    FEDFLEET_RETURN_IF_ERROR(checkDirectoryOnPath(next, st, path, what, /*holds_keys=*/false));
    resolved = std::move(next_parts);
  }
  // The file itself (stat again: the path may have ended in ".." or a link to a directory).
  // Without links on the way the path as given names it best; with them, where it really is.
  FEDFLEET_RETURN_IF_ERROR(lstatOf(final_path, &st));
  FEDFLEET_RETURN_IF_ERROR(checkKeyFileItself(links == 0 ? path : final_path, st, kind));
  if (kind == KeyPathKind::kSecretKeyFile) {
    // The directory holding the secret key: no name in it may be added by others.
    const std::string holder = fs::path(final_path).parent_path().string();
    struct stat holder_st;
    FEDFLEET_RETURN_IF_ERROR(lstatOf(holder, &holder_st));
    FEDFLEET_RETURN_IF_ERROR(
        checkDirectoryOnPath(holder, holder_st, path, what, /*holds_keys=*/true));
  }
  return FileIdentity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

Status checkAllowedKeyFile(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return notFound("allow-list key file " + path + " not found");
    return ioError("cannot stat " + path + ": " + errnoText(errno));
  }
  if (S_ISLNK(st.st_mode)) return checkKeyPath(path, KeyPathKind::kAllowedKeyFile).status();
  return checkKeyFileItself(path, st, KeyPathKind::kAllowedKeyFile);
}

Status checkSecretKeyFile(const std::string& path) {
  return checkKeyPath(path, KeyPathKind::kSecretKeyFile).status();
}

Status checkAllowListDir(const std::string& dir) {
  return checkKeyPath(dir, KeyPathKind::kAllowListDir).status();
}

const char* allowListEventName(AuthEvent::Kind kind) {
  switch (kind) {
    case AuthEvent::kAllowListReplaced:
      return "allow_list_replaced";
    case AuthEvent::kAllowListRefused:
      return "allow_list_refused";
    case AuthEvent::kAllowListRestored:
      return "allow_list_restored";
    default:
      return nullptr;
  }
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
