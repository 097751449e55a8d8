// ZAP handler: see common/transport/zap_authenticator.h.
//
// A ZAP request (RFC 27) arrives on the REP socket as the frames
//   version "1.0" | request id | domain | peer address | routing id | mechanism | credentials...
// and is answered with
//   version "1.0" | request id | status code | status text | user id | metadata
// For CURVE the one credential is the client's 32-byte public key; the reply's user id is its
// Z85 text, which libzmq attaches to every message of that connection as the "User-Id"
// property (read by the server's receive()).

#include "common/transport/zap_authenticator.h"

#include <spdlog/spdlog.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <system_error>
#include <utility>

#include "common/transport/key_files.h"

namespace fedfleet::transport {
namespace {

namespace fs = std::filesystem;

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
constexpr std::string_view kZapVersion = "1.0";

std::string frameText(const zmq::message_t& m) { return std::string(m.data<char>(), m.size()); }

}  // namespace

Result<AllowList> loadAllowList(const std::string& dir, std::set<std::string>* warned) {
  std::error_code ec;
  const auto status = fs::status(dir, ec);
  if (!fs::exists(status)) return notFound("allow-list directory " + dir + " not found");
  if (!fs::is_directory(status)) {
    return invalidArgument("allow-list path " + dir + " is not a directory");
  }
  auto skip = [&](const fs::path& path, const std::string& why) {
    if (warned->insert(path.string() + "\n" + why).second) {
      spdlog::warn("allow-list: skipping {}: {}", path.string(), why);
    }
  };
  std::map<std::string, std::vector<fs::path>> files_of_key;
  AllowList keys;
  fs::directory_iterator it(dir, ec);
  if (ec) return ioError("cannot read allow-list directory " + dir + ": " + ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return ioError("cannot read allow-list directory " + dir + ": " + ec.message());
    const fs::path& path = it->path();
    if (path.extension() != ".key") continue;
    const std::string id = path.stem().string();
    if (!isValidClientId(id)) {
      skip(path, "the file name is not a client id (1-128 characters of [A-Za-z0-9._@-])");
      continue;
    }
    if (Status trusted = checkAllowedKeyFile(path.string()); !trusted.isOk()) {
      skip(path, trusted.message());
      continue;
    }
    Result<std::string> key = readPublicKeyFile(path.string());
    if (!key.isOk()) {
      skip(path, key.status().toString());
      continue;
    }
    files_of_key[*key].push_back(path);
    keys.emplace(std::move(key).value(), id);
  }
  for (const auto& [key, paths] : files_of_key) {
    if (paths.size() < 2) continue;
    std::string names;
    for (const auto& p : paths) names += (names.empty() ? "" : ", ") + p.filename().string();
    for (const auto& p : paths) {
      skip(p, "the same key is in " + names + "; one key is one client, remove all but one");
    }
    keys.erase(key);
  }
  return keys;
}

Result<std::unique_ptr<ZapAuthenticator>> ZapAuthenticator::start(zmq::context_t& context,
                                                                  const std::string& allow_dir) {
  FEDFLEET_ASSIGN_OR_RETURN(FileIdentity dir_id,
                            checkKeyPath(allow_dir, KeyPathKind::kAllowListDir));
  std::set<std::string> warned;
  FEDFLEET_ASSIGN_OR_RETURN(AllowList allowed, loadAllowList(allow_dir, &warned));
  if (allowed.empty()) {
    spdlog::warn(
        "allow-list directory {} holds no keys: every client is refused until one is added",
        allow_dir);
  }
  zmq::socket_t socket;
  try {
    socket = zmq::socket_t(context, zmq::socket_type::rep);
    socket.set(zmq::sockopt::linger, 0);
    socket.bind(kZapEndpoint);
  } catch (const zmq::error_t& e) {
    return unavailable(std::string("cannot bind ZAP handler at ") + kZapEndpoint + ": " + e.what());
  }
  std::unique_ptr<ZapAuthenticator> zap(
      new ZapAuthenticator(std::move(socket), allow_dir, dir_id, std::move(allowed)));
  zap->warned_files_ = std::move(warned);
  zap->watch();
  zap->thread_ = std::thread([raw = zap.get()] { raw->run(); });
  return zap;
}

ZapAuthenticator::ZapAuthenticator(zmq::socket_t socket, std::string allow_dir,
                                   FileIdentity allow_dir_id, AllowList allowed)
    : allow_dir_(std::move(allow_dir)),
      socket_(std::move(socket)),
      allowed_(std::move(allowed)),
      allow_dir_id_(allow_dir_id) {
  last_read_ = std::chrono::steady_clock::now();
  std::error_code ec;
  allow_dir_mtime_ = fs::last_write_time(allow_dir_, ec);
}

void ZapAuthenticator::watch() {
  if (inotify_fd_ < 0) {
    inotify_fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (inotify_fd_ < 0) {
      spdlog::warn("allow-list: inotify unavailable ({}); re-reading {} every {} ms",
                   std::strerror(errno), allow_dir_, kRereadAfter.count());
      return;
    }
  }
  if (watch_id_ >= 0) ::inotify_rm_watch(inotify_fd_, watch_id_);  // the replaced directory's
  const uint32_t mask = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_CLOSE_WRITE |
                        IN_ATTRIB | IN_MODIFY | IN_DELETE_SELF | IN_MOVE_SELF;
  watch_id_ = ::inotify_add_watch(inotify_fd_, allow_dir_.c_str(), mask);
  if (watch_id_ < 0) {
    spdlog::warn("allow-list: cannot watch {} ({}); re-reading it every {} ms", allow_dir_,
                 std::strerror(errno), kRereadAfter.count());
  }
}

void ZapAuthenticator::drainWatch() {
  alignas(struct inotify_event) char buf[4096];
  while (::read(inotify_fd_, buf, sizeof buf) > 0) {
  }
  change_pending_ = true;
  changed_at_ = std::chrono::steady_clock::now();
}

void ZapAuthenticator::refusePath(const Status& why) {
  // What the path names now, for the report: a directory put in the place of the one read.
  Result<FileIdentity> seen = identityOf(allow_dir_);
  const bool replaced = seen.isOk() && *seen != allow_dir_id_;
  std::string state = why.message();
  if (replaced) {
    state.push_back('\n');
    state += seen->toString();
  }
  if (state == path_refused_) return;  // said already
  path_refused_ = state;
  AuthEvent e;
  e.kind = AuthEvent::kAllowListRefused;
  e.reason = (replaced ? "allow-list directory " + allow_dir_ +
                             " is another directory now (inode " + allow_dir_id_.toString() +
                             " -> " + seen->toString() + "), and its path fails the check: "
                       : std::string()) +
             why.message() + "; its keys are not read: the last list that passed (" +
             std::to_string(allowed_.size()) +
             " keys) stays in force, no key is added or revoked, until the path passes again";
  recordEvent(std::move(e));
}

void ZapAuthenticator::reread() {
  last_read_ = std::chrono::steady_clock::now();
  std::error_code ec;
  allow_dir_mtime_ = fs::last_write_time(allow_dir_, ec);
  change_pending_ = false;
  // StrictModes first: what a directory someone else can change holds is not read at all.
  Result<FileIdentity> checked = checkKeyPath(allow_dir_, KeyPathKind::kAllowListDir);
  if (!checked.isOk()) return refusePath(checked.status());
  const bool replaced = *checked != allow_dir_id_;
  Result<AllowList> fresh = loadAllowList(allow_dir_, &warned_files_);
  if (!fresh.isOk()) {
    // Keep the last good list: a directory briefly unreadable must not lock everyone out.
    spdlog::warn("allow-list: {}", fresh.status().toString());
    return;
  }
  if (replaced) {
    AuthEvent e;
    e.kind = AuthEvent::kAllowListReplaced;
    e.reason = "allow-list directory " + allow_dir_ + " is another directory now (inode " +
               allow_dir_id_.toString() + " -> " + checked->toString() +
               "): its path passed the checks and its " + std::to_string(fresh->size()) +
               " keys replace the " + std::to_string(allowed_.size()) + " read before";
    recordEvent(std::move(e));
    allow_dir_id_ = *checked;
    watch();
  }
  if (!path_refused_.empty()) {
    AuthEvent e;
    e.kind = AuthEvent::kAllowListRestored;
    e.reason = "allow-list directory " + allow_dir_ + " passes its path checks again; its " +
               std::to_string(fresh->size()) + " keys are in force";
    recordEvent(std::move(e));
    path_refused_.clear();
  }
  for (const auto& [key, id] : allowed_) {
    auto now_id = fresh->find(key);
    if (now_id != fresh->end() && now_id->second == id) continue;
    AuthEvent e;
    e.kind = AuthEvent::kRevoked;
    e.public_key = key;
    e.client_id = id;
    e.reason = now_id == fresh->end()
                   ? "key removed from allow-list " + allow_dir_
                   : "key now belongs to client id '" + now_id->second + "' in " + allow_dir_;
    recordEvent(std::move(e));
  }
  if (fresh->size() != allowed_.size() || *fresh != allowed_) {
    spdlog::info("allow-list {}: {} keys", allow_dir_, fresh->size());
  }
  allowed_ = std::move(fresh).value();
}

ZapAuthenticator::~ZapAuthenticator() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (inotify_fd_ >= 0) ::close(inotify_fd_);  // its watches with it
}

std::vector<AuthEvent> ZapAuthenticator::takeEvents() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<AuthEvent> out(std::make_move_iterator(events_.begin()),
                             std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

void ZapAuthenticator::recordEvent(AuthEvent event) {
  if (event.kind == AuthEvent::kAllowListRefused) {
    spdlog::error("allow-list: {}", event.reason);
  } else if (event.kind == AuthEvent::kAllowListReplaced ||
             event.kind == AuthEvent::kAllowListRestored) {
    spdlog::warn("allow-list: {}", event.reason);
  } else if (event.kind == AuthEvent::kRevoked) {
    spdlog::warn("revoked client {} (key {}): {}", event.client_id, event.public_key, event.reason);
  } else {
    spdlog::warn("refused connection from {} (key {}): {}", event.peer_address,
                 event.public_key.empty() ? "-" : event.public_key, event.reason);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() >= kMaxEvents) events_.pop_front();
  events_.push_back(std::move(event));
}

void ZapAuthenticator::answer(const std::vector<zmq::message_t>& request,
                              std::vector<std::string>& reply) {
  // reply = {status code, status text, user id, metadata}
  if (request.size() < 6 || frameText(request[0]) != kZapVersion) {
    reply = {"500", "malformed ZAP request", "", ""};
    return;
  }
  const std::string address = frameText(request[3]);
  const std::string mechanism = frameText(request[5]);
  if (mechanism != "CURVE" || request.size() != 7 || request[6].size() != 32) {
    recordEvent(
        {AuthEvent::kRefused, address, "", "", "mechanism " + mechanism + " is not allowed"});
    reply = {"400", "CURVE required", "", ""};
    return;
  }
  char z85[kZ85KeyChars + 1] = {};
  if (zmq_z85_encode(z85, request[6].data<uint8_t>(), 32) == nullptr) {
    reply = {"500", "cannot encode key", "", ""};
    return;
  }
  const std::string key(z85, kZ85KeyChars);
  auto found = allowed_.find(key);
  if (found == allowed_.end()) {
    // A key added a moment ago: do not make its first handshake wait for the watch. At most
    // one re-read per kSettle unless the directory changed, so a storm of unknown keys costs
    // no more than that.
    std::error_code ec;
    const auto mtime = fs::last_write_time(allow_dir_, ec);
    if ((!ec && mtime != allow_dir_mtime_) ||
        std::chrono::steady_clock::now() - last_read_ >= kSettle) {
      reread();
      found = allowed_.find(key);
    }
  }
  if (found == allowed_.end()) {
    recordEvent(
        {AuthEvent::kRefused, address, key, "", "public key not in allow-list " + allow_dir_});
    reply = {"400", "key not allowed", "", ""};
    return;
  }
  // ZMTP metadata: name length (1 byte), name, value length (4 bytes, network order), value.
  const std::string& id = found->second;
  std::string metadata;
  const std::string name = kClientIdProperty;
  metadata.push_back(static_cast<char>(name.size()));
  metadata += name;
  const uint32_t n = static_cast<uint32_t>(id.size());
  for (int shift = 24; shift >= 0; shift -= 8) metadata.push_back(static_cast<char>(n >> shift));
  metadata += id;
  reply = {"200", "OK", key, metadata};
}

// The loop only ends on stop_ or a terminated context: libzmq 4.3 (without the draft
// ZMQ_ZAP_ENFORCE_DOMAIN) admits every CURVE client when no ZAP handler is bound, so the handler
// must outlive the server socket. The server's receive() also drops messages that carry no
// User-Id, in case a connection got past ZAP anyway.
void ZapAuthenticator::run() {
  while (!stop_.load()) {
    try {
      const auto now = std::chrono::steady_clock::now();
      if (reload_.exchange(false) || (change_pending_ && now - changed_at_ >= kSettle) ||
          now - last_read_ >= kRereadAfter) {
        reread();
      }
      zmq_pollitem_t items[2] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                                 {nullptr, inotify_fd_, ZMQ_POLLIN, 0}};
      const int timeout = change_pending_ ? static_cast<int>(kSettle.count()) / 3 : kPollMs;
      if (zmq_poll(items, inotify_fd_ >= 0 ? 2 : 1, timeout) < 0) {
        if (zmq_errno() == ETERM) break;
        if (zmq_errno() != EINTR) {
          spdlog::error("ZAP handler: poll: {}", zmq_strerror(zmq_errno()));
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        continue;
      }
      if (inotify_fd_ >= 0 && (items[1].revents & ZMQ_POLLIN)) drainWatch();
      if ((items[0].revents & ZMQ_POLLIN) == 0) continue;

      std::vector<zmq::message_t> request;
      do {
        zmq::message_t frame;
        if (!socket_.recv(frame, zmq::recv_flags::dontwait)) break;
        request.push_back(std::move(frame));
      } while (request.back().more());
      if (request.empty()) continue;

      std::vector<std::string> reply;
      try {
        answer(request, reply);
      } catch (const std::exception& e) {
        spdlog::error("ZAP handler: {}", e.what());
        reply = {"500", "internal error", "", ""};
      }
      const std::string request_id = request.size() > 1 ? frameText(request[1]) : std::string();
      socket_.send(zmq::buffer(kZapVersion), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(request_id), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(reply[0]), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(reply[1]), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(reply[2]), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(reply[3]), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
      if (e.num() != EINTR) {
        spdlog::error("ZAP handler: {}", e.what());
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    } catch (const std::exception& e) {
      spdlog::error("ZAP handler: {}", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  socket_.close();
}

}  // namespace fedfleet::transport
