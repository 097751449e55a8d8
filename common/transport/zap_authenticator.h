// The ZAP handler (ZeroMQ RFC 27) behind a CURVE server socket: admits clients whose public key
// has a `*.key` file in the allow-list directory, refuses the rest and records each refusal.
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
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"
#include "common/transport/transport.h"

namespace fedfleet::transport {

class ZapAuthenticator {
 public:
  // Refusals kept for takeEvents(); beyond this the oldest are dropped.
  static constexpr size_t kMaxEvents = 1024;

  // Loads the allow-list from `allow_dir`, binds the ZAP endpoint in `context` and starts the
  // handler thread, so that it answers before any socket of `context` binds. kNotFound when
  // `allow_dir` does not exist; kInvalidArgument when it is not a directory; kUnavailable when
  // `context` already has a ZAP handler.
  static Result<std::unique_ptr<ZapAuthenticator>> start(zmq::context_t& context,
                                                         const std::string& allow_dir);

  // Stops and joins the handler thread (within ~kPollMs), closing its socket. The context must
  // still be open (or shut down, which makes the thread stop at once).
  ~ZapAuthenticator();

  ZapAuthenticator(const ZapAuthenticator&) = delete;
  ZapAuthenticator& operator=(const ZapAuthenticator&) = delete;

  // Thread safe: returns and clears the refusals recorded since the last call.
  std::vector<AuthEvent> takeEvents();

 private:
  static constexpr int kPollMs = 100;
  // An unknown key re-reads the directory when its modification time changed, or at the latest
  // this long after the last read (catches edits in place, coarse file-system clocks).
  static constexpr std::chrono::milliseconds kRereadAfter{1000};

  ZapAuthenticator(zmq::socket_t socket, std::string allow_dir, std::set<std::string> allowed);

  void run();
  // Builds the reply frames (status code, status text, user id) for one request.
  void answer(const std::vector<zmq::message_t>& request, std::vector<std::string>& reply);
  bool isAllowed(const std::string& key);
  void recordRefusal(AuthEvent event);

  const std::string allow_dir_;
  zmq::socket_t socket_;           // handler thread only, once started
  std::set<std::string> allowed_;  // handler thread only
  std::filesystem::file_time_type allow_dir_mtime_{};
  std::chrono::steady_clock::time_point last_read_{};
  std::set<std::string> warned_files_;  // handler thread only: bad key files already logged

  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::deque<AuthEvent> events_;  // guarded by mu_

  std::thread thread_;
};

// Reads the Z85 public keys of all `*.key` files in `dir`. Files that do not hold a key are
// logged (once per path in `warned`) and skipped. kNotFound / kInvalidArgument / kIoError when
// the directory itself cannot be read.
Result<std::set<std::string>> loadAllowList(const std::string& dir, std::set<std::string>* warned);

}  // namespace fedfleet::transport
