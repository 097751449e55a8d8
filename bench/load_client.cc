// fedfleet_load_client: many protocol-speaking clients in one process, for load and memory
// benchmarks of a real coordinator (bench/load.sh, bench/memory_soak.sh) and for the test that
// keeps them honest (tests/integration/load_client_test.cc).
//
// Each simulated client is one CURVE connection with its own key pair (`fedfleet keygen --dir
// DIR --coordinator --clients N` writes client-1 .. client-N), and speaks the protocol of
// common/wire/messages.h as fedfleet's client does (client/client_runtime.cc), without
// training:
//   1. Hello (its id, its public key, a session id drawn from --seed), then at once a Heartbeat.
//      The coordinator handles a connection's messages in order, so the Heartbeat's echo says
//      the connection is up, its key passed the ZAP check and its Hello was taken: that moment
//      is the client's handshake time.
//   2. A Heartbeat every --heartbeat-s (the coordinator's liveness_s counts silence).
//   3. On a Task: after --delay-s, an UploadRequest; on its UploadGrant, the update as Chunks
//      of at most chunk_bytes / 4 elements each, encoded with the task's codec, then a Summary.
//      The update is a fake delta of the task's length (the model's P values; 2P for SCAFFOLD,
//      cut so that no chunk holds values of both halves): value i is
//      --scale x (2u - 1), u uniform in [0, 1) from a hash of (--seed, client, round, i), so it
//      is finite, its norm is about scale x sqrt(P / 3) for every client (well inside
//      aggregation.norm_bound), and a rerun sends the same bytes. Chunk and Summary claim
//      --samples samples and --steps local steps (keep them within the smallest partition and
//      the task's plan: the defaults, 1 and 1, always are) and a loss of --loss.
//      Chunks name tensor 0 (the coordinator reads offsets, not tensor indices); served models
//      (block-cyclic runs) are neither kept nor evaluated: the Summary reports none.
//   4. Cancel, Error and Bye as the real client takes them: a cancelled or rejected task is
//      dropped (a rejection is counted and its first few reasons printed), kUnknownClient is
//      answered with a Hello (at most one a second), Bye ends that client.
//
// Transport: one ZeroMQ context (--io-threads, which run CURVE) and one DEALER socket per client
// with the socket options of common/transport/zmq_transport.cc, all served by one thread. This
// file speaks ZeroMQ itself, unlike coordinator and client code, because
// transport::ClientTransport owns a context (and its I/O thread) per connection: a thousand of
// them would be two thousand threads. Frames are as that transport sends them: a message is
// [payload], a Task from the coordinator [payload][model piece]..., the pieces joined again.
// The thread waits in epoll on every socket's ZMQ_FD rather than in zmq_poll, which asks each of
// the N sockets for its state on every call: with a thousand sockets that loop took a good part
// of a core, on the same two cores as the coordinator it measures. ZMQ_FD only says that a
// socket's state may have changed, and a send can consume that signal, so a socket is read until
// EAGAIN whenever its descriptor fires and again after every send on it.
//
// Termination: when every client has its Bye; on SIGINT or SIGTERM (the benchmarks stop it so
// once the coordinator has exited, since a coordinator that exits may not flush every Bye);
// when no message arrived for --exit-idle-s; or at --time-limit-s. Then each client still up
// says Bye and the process prints one line on stdout:
//   LOAD clients=N connected=C handshake_s=T handshakes_per_s=R handshake_p50_s=...
//        handshake_max_s=... tasks=... uploads=... rejected=... cancelled=... errors=...
//        byes=... elapsed_s=... stop=bye|signal|idle|time_limit
// handshake_s: from the first connect to the last handshake; handshakes_per_s = C / that.
// Exit status: 0 when every client connected, no update was rejected, no protocol error was
// seen and the time limit was not reached; 1 otherwise; 2 for bad flags or key files.
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zmq.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/compress/codec.h"
#include "common/compress/codec_spec.h"
#include "common/crypto/sha256.h"
#include "common/splitmix.h"
#include "common/status.h"
#include "common/transport/transport.h"
#include "common/wire/messages.h"

namespace fedfleet::bench {
namespace {

std::atomic<bool> g_stop{false};

void onSignal(int) { g_stop.store(true); }

double steadyNow() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

struct LoadOptions {
  std::string endpoint;
  std::string keys_dir;
  uint32_t clients = 1;
  uint32_t first = 1;  // client ids prefix+first .. prefix+(first + clients - 1)
  std::string prefix = "client-";
  uint64_t seed = 1;
  double delay_s = 0;            // from a Task to its UploadRequest
  double scale = 1e-3;           // fake delta values in [-scale, scale)
  uint64_t samples = 1;          // n_samples claimed by every update
  uint64_t steps = 1;            // local steps claimed by every update
  double loss = 1.0;             // mean loss claimed by every Summary
  double heartbeat_s = 1;        // as client.heartbeat_s
  int zmtp_heartbeat_ms = 1000;  // ZMQ_HEARTBEAT_IVL (0: off), as the real client's transport
  int io_threads = 1;
  double time_limit_s = 900;
  double exit_idle_s = 60;  // 0: never
  double progress_s = 10;   // 0: no progress lines
};

// The fake update of (client, round): n values of options.scale x (2u - 1).
void fakeDelta(const LoadOptions& options, uint32_t client, uint32_t round, size_t n,
               std::vector<float>* out) {
  out->resize(n);
  const uint64_t base = splitMix64(options.seed ^ splitMix64((uint64_t{client} << 32) | round));
  for (size_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(splitMix64(base + i) >> 11) * 0x1.0p-53;
    (*out)[i] = static_cast<float>(options.scale * (2 * u - 1));
  }
}

// One simulated client: its connection and where it is in the protocol (loop thread only).
struct FakeClient {
  enum class TaskState { kNone, kDelaying, kRequested };

  uint32_t index = 0;  // the number in its id
  uint32_t slot = 0;   // its place in LoadClient::clients_
  std::string id;
  transport::KeyPair keys;
  void* socket = nullptr;
  bool pending_read = false;  // in LoadClient::to_read_
  uint64_t session = 0;
  double last_hello = -1e9;
  double next_heartbeat = 0;
  uint64_t heartbeat_seq = 0;
  std::optional<double> handshake_at;  // first Heartbeat echo (seconds after the start)
  bool bye = false;

  // The task in hand (one at a time, as the real client: a new one replaces it).
  TaskState task_state = TaskState::kNone;
  uint64_t task_token = 0;
  uint32_t task_round = 0;
  uint64_t task_elements = 0;  // P: the model's values
  bool task_scaffold = false;  // the update is 2P values
  uint32_t task_chunk_bytes = 0;
  std::string task_codec;
  double task_received_at = 0;
  double request_at = 0;  // when the UploadRequest goes out
};

struct Counters {
  uint64_t tasks = 0;
  uint64_t uploads = 0;
  uint64_t rejected = 0;   // Error about a task we uploaded or held
  uint64_t cancelled = 0;  // Cancel of a task we held
  uint64_t errors = 0;     // anything else the protocol should not produce
  uint64_t messages_in = 0;
  uint64_t bytes_out = 0;
};

class LoadClient {
 public:
  explicit LoadClient(LoadOptions options) : options_(std::move(options)) {}
  ~LoadClient();

  // Reads every key pair and the coordinator's public key, makes the context and the sockets.
  // kNotFound / kCorrupt for key files; kInternal for ZeroMQ.
  Status init();
  // Runs until a stop condition (see the top of this file); returns the exit status.
  int run();

 private:
  Status openSocket(FakeClient& c);
  void send(FakeClient& c, const wire::Message& m);
  void sayHello(FakeClient& c, double now);
  // Reads what `c` has (up to kReadsPerPass messages); true when there may be more.
  bool receiveSome(FakeClient& c, double now);
  void markToRead(FakeClient& c) {
    if (!c.pending_read) to_read_.push_back(c.slot);
    c.pending_read = true;
  }
  void handle(FakeClient& c, wire::Message& m, double now);
  void takeTask(FakeClient& c, wire::Task& task, double now);
  void upload(FakeClient& c);
  void dropTask(FakeClient& c) {
    c.task_state = FakeClient::TaskState::kNone;
    c.task_token = 0;
  }
  void note(const std::string& what);  // prints the first kNotesShown problems to stderr
  Result<const compress::Codec*> codecFor(const std::string& text);
  void printSummary(double now, const char* stop);
  size_t connected() const;

  static constexpr int kNotesShown = 20;
  static constexpr int kReadsPerPass = 16;  // so that one busy socket cannot starve the others

  const LoadOptions options_;
  std::string server_key_;
  void* context_ = nullptr;
  int epoll_fd_ = -1;
  std::vector<FakeClient> clients_;
  std::vector<uint32_t> to_read_;  // slots whose sockets are to be read (markToRead)
  size_t connected_ = 0;           // clients with a handshake_at
  size_t byes_ = 0;                // clients with bye
  std::map<std::string, std::unique_ptr<compress::Codec>> codecs_;
  std::vector<float> delta_;  // scratch: the update being sent
  std::string payload_;       // scratch: one chunk's encoded values
  Counters counters_;
  int notes_ = 0;
  double started_at_ = 0;
};

LoadClient::~LoadClient() {
  for (auto& c : clients_) {
    if (c.socket) zmq_close(c.socket);
  }
  if (context_) zmq_ctx_term(context_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

Status LoadClient::init() {
  auto server_key = transport::readPublicKeyFile(options_.keys_dir + "/coordinator.key");
  if (!server_key.isOk()) return server_key.status().withContext("coordinator public key");
  server_key_ = *server_key;
  clients_.resize(options_.clients);
  for (uint32_t i = 0; i < options_.clients; ++i) {
    FakeClient& c = clients_[i];
    c.index = options_.first + i;
    c.slot = i;
    c.id = options_.prefix + std::to_string(c.index);
    auto keys = transport::readKeyPair(options_.keys_dir, c.id);
    if (!keys.isOk()) {
      return keys.status().withContext("client " + c.id +
                                       " (create keys with `fedfleet keygen --dir " +
                                       options_.keys_dir + " --coordinator --clients N`)");
    }
    c.keys = *keys;
    c.session = splitMix64(options_.seed * 0x100000001b3ull + c.index) | 1;
  }

  // Every socket holds a descriptor for its mailbox and one for its connection.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  const uint64_t fds_needed = 2ull * options_.clients + 64;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < fds_needed) {
    return resourceExhausted("open files limit " + std::to_string(files.rlim_cur) +
                             " is below the " + std::to_string(fds_needed) + " that " +
                             std::to_string(options_.clients) + " connections need (ulimit -n)");
  }

  context_ = zmq_ctx_new();
  if (!context_) return internalError(std::string("zmq_ctx_new: ") + zmq_strerror(zmq_errno()));
  const int limit = zmq_ctx_get(context_, ZMQ_SOCKET_LIMIT);
  const int max_sockets = static_cast<int>(options_.clients) + 16;
  if (limit > 0 && max_sockets > limit) {
    return resourceExhausted("libzmq allows at most " + std::to_string(limit) + " sockets");
  }
  if (zmq_ctx_set(context_, ZMQ_MAX_SOCKETS, max_sockets) != 0 ||
      zmq_ctx_set(context_, ZMQ_IO_THREADS, std::max(1, options_.io_threads)) != 0) {
    return internalError(std::string("zmq_ctx_set: ") + zmq_strerror(zmq_errno()));
  }
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return internalError(std::string("epoll_create1: ") + strerror(errno));
  return Status::ok();
}

Status LoadClient::openSocket(FakeClient& c) {
  c.socket = zmq_socket(context_, ZMQ_DEALER);
  if (!c.socket) return internalError(std::string("zmq_socket: ") + zmq_strerror(zmq_errno()));
  auto set = [&](int option, int value) {
    return zmq_setsockopt(c.socket, option, &value, sizeof value);
  };
  const int64_t max_message = (512ll << 20) + 64;  // the transport's default, CURVE overhead
  int rc = set(ZMQ_LINGER, 0) | set(ZMQ_SNDHWM, 10000) | set(ZMQ_RCVHWM, 10000) |
           set(ZMQ_RECONNECT_IVL, 100) | set(ZMQ_RECONNECT_IVL_MAX, 2000) |
           zmq_setsockopt(c.socket, ZMQ_MAXMSGSIZE, &max_message, sizeof max_message);
  if (options_.zmtp_heartbeat_ms > 0) {
    rc |= set(ZMQ_HEARTBEAT_IVL, options_.zmtp_heartbeat_ms) | set(ZMQ_HEARTBEAT_TIMEOUT, 5000) |
          set(ZMQ_HEARTBEAT_TTL, 5000);
  }
  rc |= zmq_setsockopt(c.socket, ZMQ_CURVE_SERVERKEY, server_key_.data(), server_key_.size()) |
        zmq_setsockopt(c.socket, ZMQ_CURVE_PUBLICKEY, c.keys.public_key.data(),
                       c.keys.public_key.size()) |
        zmq_setsockopt(c.socket, ZMQ_CURVE_SECRETKEY, c.keys.secret_key.data(),
                       c.keys.secret_key.size());
  if (rc != 0) {
    return internalError("client " + c.id + ": socket options: " + zmq_strerror(zmq_errno()));
  }
  if (zmq_connect(c.socket, options_.endpoint.c_str()) != 0) {
    return invalidArgument("connect " + options_.endpoint + ": " + zmq_strerror(zmq_errno()));
  }
  int fd = -1;
  size_t fd_size = sizeof fd;
  if (zmq_getsockopt(c.socket, ZMQ_FD, &fd, &fd_size) != 0) {
    return internalError("client " + c.id + ": ZMQ_FD: " + zmq_strerror(zmq_errno()));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u32 = c.slot;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    return internalError("client " + c.id + ": epoll_ctl: " + strerror(errno));
  }
  return Status::ok();
}

void LoadClient::note(const std::string& what) {
  if (notes_ < kNotesShown) std::fprintf(stderr, "load client: %s\n", what.c_str());
  if (++notes_ == kNotesShown) std::fprintf(stderr, "load client: (further problems not shown)\n");
}

void LoadClient::send(FakeClient& c, const wire::Message& m) {
  const std::string frame = wire::encode(m);
  while (zmq_send(c.socket, frame.data(), frame.size(), ZMQ_DONTWAIT) < 0) {
    if (zmq_errno() == EINTR) continue;
    // The send queue holds 10,000 messages: full means the coordinator stopped reading.
    ++counters_.errors;
    note(c.id + ": send " + wire::messageName(m) + ": " + zmq_strerror(zmq_errno()));
    return;
  }
  counters_.bytes_out += frame.size();
  markToRead(c);  // the send may have taken the descriptor's signal of a message that came in
}

void LoadClient::sayHello(FakeClient& c, double now) {
  c.last_hello = now;
  wire::Hello h;
  h.client_id = c.id;
  h.public_key = c.keys.public_key;
  h.device_kind = wire::DeviceKind::kCpu;
  h.device_name = "fedfleet_load_client";
  h.cores = 1;
  h.session = c.session;
  send(c, h);
  // Its echo is the handshake's end (see the top of this file).
  send(c, wire::Heartbeat{++c.heartbeat_seq});
  c.next_heartbeat = now + options_.heartbeat_s;
}

Result<const compress::Codec*> LoadClient::codecFor(const std::string& text) {
  auto it = codecs_.find(text);
  if (it == codecs_.end()) {
    FEDFLEET_ASSIGN_OR_RETURN(compress::CodecSpec spec, compress::parseCodecSpec(text));
    FEDFLEET_ASSIGN_OR_RETURN(std::unique_ptr<compress::Codec> codec, compress::makeCodec(spec));
    it = codecs_.emplace(text, std::move(codec)).first;
  }
  return it->second.get();
}

void LoadClient::takeTask(FakeClient& c, wire::Task& task, double now) {
  ++counters_.tasks;
  dropTask(c);  // a new task replaces the one in hand, as in the real client
  auto reject = [&](const std::string& why) {
    ++counters_.errors;
    note(c.id + ": round " + std::to_string(task.round) + " task refused: " + why);
    send(c, wire::Error{wire::ErrorCode::kRejected, why, task.task_token});
  };
  if (task.model_bytes.size() % sizeof(float) != 0 ||
      crypto::sha256(task.model_bytes) != task.model_sha256) {
    return reject("model bytes do not match their SHA-256");
  }
  if (auto codec = codecFor(task.codec); !codec.isOk()) {
    return reject("codec: " + codec.status().message());
  }
  c.task_state = FakeClient::TaskState::kDelaying;
  c.task_token = task.task_token;
  c.task_round = task.round;
  c.task_elements = task.model_bytes.size() / sizeof(float);
  c.task_scaffold = task.hparams.scaffold;
  c.task_chunk_bytes = task.chunk_bytes;
  c.task_codec = task.codec;
  c.task_received_at = now;
  c.request_at = now + options_.delay_s;
}

void LoadClient::upload(FakeClient& c) {
  const compress::Codec* codec = codecFor(c.task_codec).value();  // checked in takeTask
  const uint64_t p = c.task_elements;
  fakeDelta(options_, c.index, c.task_round, c.task_scaffold ? 2 * p : p, &delta_);
  const uint64_t per_chunk = std::max<uint64_t>(1, c.task_chunk_bytes / sizeof(float));
  const double t0 = steadyNow();
  // The delta, then (SCAFFOLD) the control delta, each cut on its own.
  const int halves = c.task_scaffold ? 2 : 1;
  for (int half = 0; half < halves; ++half) {
    const uint64_t begin = half * p, end = begin + p;
    uint64_t offset = begin;
    do {
      const uint64_t n = std::min(per_chunk, end - offset);
      payload_.clear();
      codec->encode(delta_.data() + offset, n, splitMix64(options_.seed ^ c.task_token ^ offset),
                    &payload_);
      wire::Chunk m;
      m.task_token = c.task_token;
      m.offset = offset;
      m.elements = n;
      m.payload = payload_;
      m.last = half + 1 == halves && offset + n == end;
      m.n_samples = options_.samples;
      m.steps = options_.steps;
      send(c, m);
      offset += n;
    } while (offset < end);
  }
  wire::Summary s;
  s.task_token = c.task_token;
  s.n_samples = options_.samples;
  s.steps = options_.steps;
  s.mean_loss = options_.loss;
  s.sum_sq_loss = static_cast<double>(options_.samples) * options_.loss * options_.loss;
  s.compute_seconds = options_.delay_s;
  s.encode_seconds = steadyNow() - t0;
  s.upload_seconds = s.encode_seconds;
  send(c, s);
  ++counters_.uploads;
  dropTask(c);
}

void LoadClient::handle(FakeClient& c, wire::Message& message, double now) {
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, wire::Task>) {
          takeTask(c, m, now);
        } else if constexpr (std::is_same_v<T, wire::UploadGrant>) {
          if (c.task_state == FakeClient::TaskState::kRequested && c.task_token == m.task_token) {
            upload(c);
          }
        } else if constexpr (std::is_same_v<T, wire::Heartbeat>) {
          if (!c.handshake_at) {
            c.handshake_at = now - started_at_;
            ++connected_;
          }
        } else if constexpr (std::is_same_v<T, wire::Cancel>) {
          if (c.task_state != FakeClient::TaskState::kNone && c.task_token == m.task_token) {
            ++counters_.cancelled;
            dropTask(c);
          }
        } else if constexpr (std::is_same_v<T, wire::Bye>) {
          if (!c.bye) ++byes_;
          c.bye = true;
          dropTask(c);
        } else if constexpr (std::is_same_v<T, wire::Error>) {
          if (m.code == wire::ErrorCode::kUnknownClient) {
            if (now - c.last_hello > 1.0) sayHello(c, now);
            return;
          }
          if (m.task_token != 0) {
            ++counters_.rejected;
            if (c.task_token == m.task_token) dropTask(c);
          } else {
            ++counters_.errors;  // a refused Hello, a malformed frame: the protocol is off
          }
          note(c.id + ": coordinator error " + std::to_string(static_cast<int>(m.code)) + ": " +
               m.message);
        } else {
          ++counters_.errors;
          note(c.id + ": unexpected " + wire::messageName(message) + " from the coordinator");
        }
      },
      message);
}

bool LoadClient::receiveSome(FakeClient& c, double now) {
  for (int i = 0; i < kReadsPerPass; ++i) {
    zmq_msg_t frame;
    zmq_msg_init(&frame);
    if (zmq_msg_recv(&frame, c.socket, ZMQ_DONTWAIT) < 0) {
      const int err = zmq_errno();
      zmq_msg_close(&frame);
      return err == EINTR;  // EAGAIN: nothing more
    }
    std::string payload(static_cast<const char*>(zmq_msg_data(&frame)), zmq_msg_size(&frame));
    std::optional<std::string> attachment;
    while (zmq_msg_more(&frame)) {
      if (!attachment) attachment.emplace();
      zmq_msg_close(&frame);
      zmq_msg_init(&frame);
      while (zmq_msg_recv(&frame, c.socket, 0) < 0 && zmq_errno() == EINTR) {
      }
      attachment->append(static_cast<const char*>(zmq_msg_data(&frame)), zmq_msg_size(&frame));
    }
    zmq_msg_close(&frame);
    ++counters_.messages_in;
    auto decoded = wire::decodeFrames(payload, std::move(attachment));
    if (!decoded.isOk()) {
      ++counters_.errors;
      note(c.id + ": malformed frame from the coordinator: " + decoded.status().toString());
      continue;
    }
    handle(c, decoded.value(), now);
  }
  return true;
}

size_t LoadClient::connected() const { return connected_; }

void LoadClient::printSummary(double now, const char* stop) {
  std::vector<double> times;
  for (const auto& c : clients_) {
    if (c.handshake_at) times.push_back(*c.handshake_at);
  }
  std::sort(times.begin(), times.end());
  const double last = times.empty() ? 0 : times.back();
  const double p50 = times.empty() ? 0 : times[(times.size() - 1) / 2];
  std::printf(
      "LOAD clients=%u connected=%zu handshake_s=%.3f handshakes_per_s=%.1f handshake_p50_s=%.3f "
      "handshake_max_s=%.3f tasks=%llu uploads=%llu rejected=%llu cancelled=%llu errors=%llu "
      "byes=%zu elapsed_s=%.1f stop=%s\n",
      options_.clients, times.size(), last, last > 0 ? times.size() / last : 0.0, p50, last,
      static_cast<unsigned long long>(counters_.tasks),
      static_cast<unsigned long long>(counters_.uploads),
      static_cast<unsigned long long>(counters_.rejected),
      static_cast<unsigned long long>(counters_.cancelled),
      static_cast<unsigned long long>(counters_.errors), byes_, now - started_at_, stop);
  std::fflush(stdout);
}

int LoadClient::run() {
  started_at_ = steadyNow();
  for (auto& c : clients_) {
    if (Status st = openSocket(c); !st.isOk()) {
      std::fprintf(stderr, "load client: %s\n", st.toString().c_str());
      return 2;
    }
    sayHello(c, steadyNow());
  }
  std::fprintf(stderr, "load client: %zu connections opened in %.3f s\n", clients_.size(),
               steadyNow() - started_at_);
  // Spread the heartbeats over one period rather than sending them all at once.
  for (size_t i = 0; i < clients_.size(); ++i) {
    clients_[i].next_heartbeat =
        started_at_ + options_.heartbeat_s * (1.0 + static_cast<double>(i) / clients_.size());
  }

  constexpr double kTimerSliceS = 0.005;  // timers (heartbeats, delays) are looked at this often
  double now = steadyNow(), last_rx = now, next_timers = now;
  double next_progress = now + options_.progress_s;
  const char* stop = nullptr;
  bool all_connected_reported = false;
  std::vector<epoll_event> events(256);
  std::vector<uint32_t> reading;
  while (!stop) {
    const int wait_ms =
        to_read_.empty() ? std::max(0, static_cast<int>(std::ceil((next_timers - now) * 1e3))) : 0;
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), wait_ms);
    if (n < 0 && errno != EINTR) {
      std::fprintf(stderr, "load client: epoll_wait: %s\n", strerror(errno));
      return 1;
    }
    for (int i = 0; i < n; ++i) markToRead(clients_[events[i].data.u32]);
    now = steadyNow();
    const uint64_t received_before = counters_.messages_in;
    reading.swap(to_read_);
    for (uint32_t slot : reading) clients_[slot].pending_read = false;
    for (uint32_t slot : reading) {
      if (receiveSome(clients_[slot], now)) markToRead(clients_[slot]);
    }
    reading.clear();
    if (counters_.messages_in != received_before) last_rx = now;

    now = steadyNow();
    if (now < next_timers) continue;
    next_timers = now + kTimerSliceS;
    for (auto& c : clients_) {
      if (c.bye) continue;
      if (c.task_state == FakeClient::TaskState::kDelaying && now >= c.request_at) {
        send(c, wire::UploadRequest{c.task_token});
        c.task_state = FakeClient::TaskState::kRequested;
      }
      if (now >= c.next_heartbeat) {
        send(c, wire::Heartbeat{++c.heartbeat_seq});
        c.next_heartbeat = now + options_.heartbeat_s;
      }
    }
    if (!all_connected_reported && connected() == clients_.size()) {
      all_connected_reported = true;
      std::fprintf(stderr, "load client: all %zu clients connected in %.3f s\n", clients_.size(),
                   now - started_at_);
    }
    if (options_.progress_s > 0 && now >= next_progress) {
      next_progress = now + options_.progress_s;
      std::fprintf(stderr,
                   "load client: %.0f s, %zu/%zu connected, %llu tasks, %llu uploads, %llu "
                   "rejected\n",
                   now - started_at_, connected(), clients_.size(),
                   static_cast<unsigned long long>(counters_.tasks),
                   static_cast<unsigned long long>(counters_.uploads),
                   static_cast<unsigned long long>(counters_.rejected));
    }
    if (byes_ == clients_.size()) {
      stop = "bye";
    } else if (g_stop.load()) {
      stop = "signal";
    } else if (options_.exit_idle_s > 0 && now - last_rx > options_.exit_idle_s) {
      stop = "idle";
    } else if (now - started_at_ > options_.time_limit_s) {
      stop = "time_limit";
    }
  }
  for (auto& c : clients_) {
    if (!c.bye) send(c, wire::Bye{"load client stopping"});
  }
  printSummary(now, stop);
  const bool ok = connected() == clients_.size() && counters_.rejected == 0 &&
                  counters_.errors == 0 && std::string(stop) != "time_limit";
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace fedfleet::bench

int main(int argc, char** argv) {
  using fedfleet::bench::LoadOptions;
  LoadOptions o;
  CLI::App app{"fedfleet_load_client: many protocol-speaking clients without training"};
  app.add_option("--coordinator", o.endpoint, "Coordinator address (tcp://HOST:PORT)")->required();
  app.add_option("--keys", o.keys_dir, "Key directory of `fedfleet keygen --clients N`")
      ->required();
  app.add_option("--clients", o.clients, "Simulated clients (connections)")
      ->check(CLI::Range(1u, 100000u));
  app.add_option("--first", o.first, "Number of the first client's key (PREFIX<first>)");
  app.add_option("--prefix", o.prefix, "Client id prefix, as keygen's --prefix");
  app.add_option("--seed", o.seed, "Seeds session ids and the fake updates");
  app.add_option("--delay-s", o.delay_s, "Seconds from a task to its upload request")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--scale", o.scale, "Fake delta values lie in [-scale, scale)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--samples", o.samples, "Samples every update claims (<= smallest partition)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  app.add_option("--steps", o.steps, "Local steps every update claims (<= the task's plan)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  app.add_option("--loss", o.loss, "Mean loss every summary claims")->check(CLI::NonNegativeNumber);
  app.add_option("--heartbeat-s", o.heartbeat_s, "Heartbeat period of each client")
      ->check(CLI::PositiveNumber);
  app.add_option("--zmtp-heartbeat-ms", o.zmtp_heartbeat_ms,
                 "ZeroMQ heartbeat interval of each connection (0: off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--io-threads", o.io_threads, "ZeroMQ I/O threads (they run CURVE)")
      ->check(CLI::Range(1, 64));
  app.add_option("--time-limit-s", o.time_limit_s, "Give up after this long (exit 1)")
      ->check(CLI::PositiveNumber);
  app.add_option("--exit-idle-s", o.exit_idle_s,
                 "Stop when no message arrived for this long (0: never)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--progress-s", o.progress_s, "Progress line on stderr this often (0: none)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  struct sigaction sa {};
  sa.sa_handler = fedfleet::bench::onSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  fedfleet::bench::LoadClient load(o);
  if (fedfleet::Status st = load.init(); !st.isOk()) {
    std::fprintf(stderr, "fedfleet_load_client: %s\n", st.toString().c_str());
    return 2;
  }
  return load.run();
}
