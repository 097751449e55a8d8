// The ZAP handler (ZeroMQ RFC 27) behind a CURVE server socket: admits clients whose public key
// has a `*.key` file in the allow-list directory, refuses the rest and records each refusal.
// The file's name (without `.key`) is the client id of that key: the reply names it in the
// connection's metadata (property kClientIdProperty), which libzmq attaches to every message of
// the connection, so the coordinator takes a client's identity from its authenticated key and
// never from what the client says. A key held by two files, a file name that is not a valid
// client id, and a key file that group or others may write (or that root or this user does
// not own) are skipped (logged once).
//
// The directory is watched (inotify; changes are read once they have settled for kSettle, and
// in any case every kRereadAfter) and re-read on reload() (SIGHUP). A key that leaves the list,
// or whose id changes, is reported as revoked (takeEvents, AuthEvent::kRevoked) so that the
// coordinator closes its connection at once: ZAP itself is only asked at the handshake.
//
// Before every read the whole path of the directory is checked as OpenSSH's StrictModes checks
// a user's keys (checkKeyPath, common/transport/key_files.h: every directory up to / owned by
// root or this user and writable by no one else), and the directory is followed by its inode:
// a rename or replacement of it or of a directory above it (`mv clients clients.old; mkdir
// clients`) is seen at the next read (kRereadAfter at the latest; at once when a handshake
// presents a key the list does not hold) and reported (kAllowListReplaced). A path that fails
// the check is reported once per reason (kAllowListRefused) and its directory is not read: the
// handler keeps the last list that passed, so no key is added or revoked through it, until the
// path passes again (kAllowListRestored). Keeping it, rather than refusing everyone, is the
// choice docs/ARCHITECTURE.md ("Keys") argues.
//
// Internal to common/transport/. One handler per ZeroMQ context: it binds
// "inproc://zeromq.zap.01" in that context, which libzmq then asks about every CURVE handshake of
// every socket in the context. The handler thread owns the REP socket; other threads only call
// takeEvents().
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"
#include "common/transport/key_files.h"
#include "common/transport/transport.h"

namespace fedfleet::transport {

// Public key (Z85) -> client id.
using AllowList = std::map<std::string, std::string>;

// The metadata property that names the authenticated client id (ZAP reply metadata; read with
// zmq_msg_gets on every message of the connection).
constexpr const char* kClientIdProperty = "X-Client-Id";

// Reads the allow-list: every `*.key` file of `dir` gives its key the client id of its name
// (`alice.key` -> "alice"). Files that hold no key, whose name is not a valid client id
// (isValidClientId), that group or others may write, or that hold a key another file holds too
// (both are skipped) are logged (once per path and problem in `warned`) and left out.
// kNotFound / kInvalidArgument / kIoError when the directory itself cannot be read.
Result<AllowList> loadAllowList(const std::string& dir, std::set<std::string>* warned);

class ZapAuthenticator {
 public:
  // Refusals kept for takeEvents(); beyond this the oldest are dropped.
  static constexpr size_t kMaxEvents = 1024;

  // Checks the path of `allow_dir` (checkKeyPath), loads the allow-list from it, binds the ZAP
  // endpoint in `context` and starts the handler thread, so that it answers before any socket
  // of `context` binds. kNotFound when `allow_dir` does not exist; kInvalidArgument when it is
  // not a directory; kPermissionDenied when its path fails the check (the message names the
  // path and the fix); kUnavailable when `context` already has a ZAP handler.
  static Result<std::unique_ptr<ZapAuthenticator>> start(zmq::context_t& context,
                                                         const std::string& allow_dir);

  // Stops and joins the handler thread (within ~kPollMs), closing its socket. The context must
  // still be open (or shut down, which makes the thread stop at once).
  ~ZapAuthenticator();

  ZapAuthenticator(const ZapAuthenticator&) = delete;
  ZapAuthenticator& operator=(const ZapAuthenticator&) = delete;

  // Thread safe: returns and clears the refusals and revocations recorded since the last call.
  std::vector<AuthEvent> takeEvents();

  // Thread safe (and async-signal safe): re-read the directory soon (within kPollMs).
  void reload() { reload_.store(true); }

 private:
  static constexpr int kPollMs = 100;
  // The directory is re-read this long after the last change inotify reported (an editor or
  // `cp` writes in steps), and at the latest this long after the last read (catches file
  // systems without inotify and coarse clocks).
  static constexpr std::chrono::milliseconds kSettle{150};
  static constexpr std::chrono::milliseconds kRereadAfter{1000};

  ZapAuthenticator(zmq::socket_t socket, std::string allow_dir, FileIdentity allow_dir_id,
                   AllowList allowed);

  void run();
  // Builds the reply frames (status code, status text, user id, metadata) for one request.
  void answer(const std::vector<zmq::message_t>& request, std::vector<std::string>& reply);
  // Checks the directory's path, then re-reads it; reports a replaced directory, a path that
  // fails its check (the list is kept) and the keys that left it (or changed id) as revoked.
  void reread();
  // Records a failed path check, once per reason and directory.
  void refusePath(const Status& why);
  // Watches the directory the path names now (inotify), instead of the one watched before.
  void watch();
  void drainWatch();
  void recordEvent(AuthEvent event);

  const std::string allow_dir_;
  zmq::socket_t socket_;  // handler thread only, once started

  // Handler thread only, once started.
  AllowList allowed_;          // key -> client id: the last list read from a path that passed
  FileIdentity allow_dir_id_;  // the directory that list was read from
  std::string path_refused_;   // why the path fails its check now (and what it names, when
                               // another directory); empty: it passes
  std::chrono::steady_clock::time_point last_read_{};
  std::filesystem::file_time_type allow_dir_mtime_{};   // at the last read
  std::chrono::steady_clock::time_point changed_at_{};  // last inotify event not yet read
  bool change_pending_ = false;
  int inotify_fd_ = -1;                 // -1: no watch (the periodic re-read still runs)
  int watch_id_ = -1;                   // the watch of the directory in inotify_fd_
  std::set<std::string> warned_files_;  // handler thread only: bad key files already logged

  std::atomic<bool> stop_{false};
  std::atomic<bool> reload_{false};
  std::mutex mu_;
  std::deque<AuthEvent> events_;  // guarded by mu_

  std::thread thread_;
};

}  // namespace fedfleet::transport
