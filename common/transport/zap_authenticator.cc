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
#include <zmq.h>

#include <cerrno>
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

Result<std::set<std::string>> loadAllowList(const std::string& dir, std::set<std::string>* warned) {
  std::error_code ec;
  const auto status = fs::status(dir, ec);
  if (!fs::exists(status)) return notFound("allow-list directory " + dir + " not found");
  if (!fs::is_directory(status)) {
    return invalidArgument("allow-list path " + dir + " is not a directory");
  }
  std::set<std::string> keys;
  fs::directory_iterator it(dir, ec);
  if (ec) return ioError("cannot read allow-list directory " + dir + ": " + ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return ioError("cannot read allow-list directory " + dir + ": " + ec.message());
    const fs::path& path = it->path();
    if (path.extension() != ".key") continue;
    Result<std::string> key = readPublicKeyFile(path.string());
    if (key.isOk()) {
      keys.insert(std::move(key).value());
    } else if (warned->insert(path.string()).second) {
      spdlog::warn("allow-list: skipping {}: {}", path.string(), key.status().toString());
    }
  }
  return keys;
}

Result<std::unique_ptr<ZapAuthenticator>> ZapAuthenticator::start(zmq::context_t& context,
                                                                  const std::string& allow_dir) {
  std::set<std::string> warned;
  FEDFLEET_ASSIGN_OR_RETURN(std::set<std::string> allowed, loadAllowList(allow_dir, &warned));
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
      new ZapAuthenticator(std::move(socket), allow_dir, std::move(allowed)));
  zap->warned_files_ = std::move(warned);
  zap->thread_ = std::thread([raw = zap.get()] { raw->run(); });
  return zap;
}

ZapAuthenticator::ZapAuthenticator(zmq::socket_t socket, std::string allow_dir,
                                   std::set<std::string> allowed)
    : allow_dir_(std::move(allow_dir)), socket_(std::move(socket)), allowed_(std::move(allowed)) {
  std::error_code ec;
  allow_dir_mtime_ = fs::last_write_time(allow_dir_, ec);
  last_read_ = std::chrono::steady_clock::now();
}

ZapAuthenticator::~ZapAuthenticator() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

std::vector<AuthEvent> ZapAuthenticator::takeEvents() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<AuthEvent> out(std::make_move_iterator(events_.begin()),
                             std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

void ZapAuthenticator::recordRefusal(AuthEvent event) {
  spdlog::warn("refused connection from {} (key {}): {}", event.peer_address,
               event.public_key.empty() ? "-" : event.public_key, event.reason);
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() >= kMaxEvents) events_.pop_front();
  events_.push_back(std::move(event));
}

bool ZapAuthenticator::isAllowed(const std::string& key) {
  if (allowed_.count(key) != 0) return true;
  std::error_code ec;
  const auto mtime = fs::last_write_time(allow_dir_, ec);
  const auto now = std::chrono::steady_clock::now();
  if ((!ec && mtime != allow_dir_mtime_) || now - last_read_ >= kRereadAfter) {
    Result<std::set<std::string>> fresh = loadAllowList(allow_dir_, &warned_files_);
    last_read_ = now;
    if (!ec) allow_dir_mtime_ = mtime;
    if (fresh.isOk()) {
      allowed_ = std::move(fresh).value();
    } else {
      // Keep the last good list: a directory briefly unreadable must not lock everyone out.
      spdlog::warn("allow-list: {}", fresh.status().toString());
    }
  }
  return allowed_.count(key) != 0;
}

void ZapAuthenticator::answer(const std::vector<zmq::message_t>& request,
                              std::vector<std::string>& reply) {
  // reply = {status code, status text, user id}
  if (request.size() < 6 || frameText(request[0]) != kZapVersion) {
    reply = {"500", "malformed ZAP request", ""};
    return;
  }
  const std::string address = frameText(request[3]);
  const std::string mechanism = frameText(request[5]);
  if (mechanism != "CURVE" || request.size() != 7 || request[6].size() != 32) {
    recordRefusal({address, "", "mechanism " + mechanism + " is not allowed"});
    reply = {"400", "CURVE required", ""};
    return;
  }
  char z85[kZ85KeyChars + 1] = {};
  if (zmq_z85_encode(z85, request[6].data<uint8_t>(), 32) == nullptr) {
    reply = {"500", "cannot encode key", ""};
    return;
  }
  const std::string key(z85, kZ85KeyChars);
  if (!isAllowed(key)) {
    recordRefusal({address, key, "public key not in allow-list " + allow_dir_});
    reply = {"400", "key not allowed", ""};
    return;
  }
  reply = {"200", "OK", key};
}

// The loop only ends on stop_ or a terminated context: libzmq 4.3 (without the draft
// ZMQ_ZAP_ENFORCE_DOMAIN) admits every CURVE client when no ZAP handler is bound, so the handler
// must outlive the server socket. The server's receive() also drops messages that carry no
// User-Id, in case a connection got past ZAP anyway.
void ZapAuthenticator::run() {
  while (!stop_.load()) {
    try {
      zmq_pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, kPollMs) < 0) {
        if (zmq_errno() == ETERM) break;
        if (zmq_errno() != EINTR) {
          spdlog::error("ZAP handler: poll: {}", zmq_strerror(zmq_errno()));
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        continue;
      }
      if ((item.revents & ZMQ_POLLIN) == 0) continue;

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
        reply = {"500", "internal error", ""};
      }
      const std::string request_id = request.size() > 1 ? frameText(request[1]) : std::string();
      socket_.send(zmq::buffer(kZapVersion), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(request_id), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(reply[0]), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(reply[1]), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(reply[2]), zmq::send_flags::sndmore);
      socket_.send(zmq::message_t(), zmq::send_flags::none);  // no metadata
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
