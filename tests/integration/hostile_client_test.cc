// A participant with a valid key, attacking: a real coordinator over CURVE on 127.0.0.1 with
// honest `fedfleet client` processes beside it, and a hostile client that speaks the protocol
// by hand over its own ZeroMQ socket with its own key ("mallory", in the allow-list). Each test
// sends one kind of attack and asserts the refusal, the rows it leaves in the history and that
// the coordinator keeps completing rounds with the honest clients.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/compress/codec.h"
#include "common/compress/codec_spec.h"
#include "common/history/history.h"
#include "common/transport/transport.h"
#include "common/wire/messages.h"
#include "tests/integration/coordinator_fixture.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

using testing::coordinatorSection;
using testing::kBinary;
using testing::keygen;
using testing::openHistory;
using testing::Process;
using testing::startClient;
using testing::startCoordinator;
using testing::writeConfig;

namespace fs = std::filesystem;

// The hostile client: a DEALER socket with the key pair `name` of `dir`/keys, and any routing
// id it likes.
class Rogue {
 public:
  Rogue(const std::string& dir, const std::string& name, const std::string& endpoint,
        const std::string& routing_id = "") {
    auto keys = transport::readKeyPair(dir + "/keys", name);
    auto server_key = transport::readPublicKeyFile(dir + "/keys/coordinator.key");
    if (!keys.isOk() || !server_key.isOk()) return;
    public_key_ = keys->public_key;
    transport::ClientOptions o;
    o.endpoint = endpoint;
    o.routing_id = routing_id;
    o.client_keys = *keys;
    o.server_public_key = *server_key;
    // Long enough for the CURVE handshake on a loaded machine: a send before it completes
    // waits for it instead of being dropped.
    o.send_timeout_ms = 15000;
    auto t = transport::createClient(o);
    if (t.isOk()) transport_ = std::move(t).value();
  }
  bool ok() const { return transport_ != nullptr; }
  const std::string& publicKey() const { return public_key_; }

  bool send(const wire::Message& m) { return sendRaw(wire::encode(m)); }
  bool sendRaw(const std::string& bytes) { return transport_->send(bytes).isOk(); }

  wire::Hello hello(const std::string& id, const std::string& device = "rogue") const {
    wire::Hello h;
    h.client_id = id;
    h.public_key = public_key_;
    h.device_name = device;
    return h;
  }

  // The next message within `seconds` for which `want` holds (others are counted and
  // skipped); a Task comes with its model bytes.
  std::optional<wire::Message> next(double seconds,
                                    const std::function<bool(const wire::Message&)>& want) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
      auto got = transport_->receive(100);
      if (!got.isOk() || !got->has_value()) continue;
      auto m = wire::decodeFrames((*got)->payload, (*got)->attachment);
      if (!m.isOk()) continue;
      if (std::holds_alternative<wire::Task>(*m)) ++tasks_;
      if (want(*m)) return std::move(m).value();
    }
    return std::nullopt;
  }
  std::optional<wire::Error> nextError(double seconds) {
    auto m = next(seconds,
                  [](const wire::Message& m) { return std::holds_alternative<wire::Error>(m); });
    if (!m) return std::nullopt;
    return std::get<wire::Error>(*m);
  }
  std::optional<wire::Task> nextTask(double seconds) {
    auto m =
        next(seconds, [](const wire::Message& m) { return std::holds_alternative<wire::Task>(m); });
    if (!m) return std::nullopt;
    return std::get<wire::Task>(*m);
  }
  int tasksSeen() const { return tasks_; }

  // Uploads `values` (the whole update, codec "none", one chunk) for `task`, claiming
  // `n_samples` samples and `steps` steps, then the summary.
  bool upload(const wire::Task& task, const std::vector<float>& values, uint64_t n_samples,
              uint64_t steps) {
    auto spec = compress::parseCodecSpec("none");
    if (!spec.isOk()) return false;
    auto codec = compress::makeCodec(*spec);
    if (!codec.isOk()) return false;
    wire::Chunk chunk;
    chunk.task_token = task.task_token;
    chunk.offset = 0;
    chunk.elements = values.size();
    chunk.last = true;
    chunk.n_samples = n_samples;
    chunk.steps = steps;
    (*codec)->encode(values.data(), values.size(), 0, &chunk.payload);
    if (!send(chunk)) return false;
    wire::Summary summary;
    summary.task_token = task.task_token;
    summary.n_samples = n_samples;
    summary.steps = steps;
    summary.mean_loss = 0.5;
    summary.compute_seconds = 0.1;
    return send(summary);
  }

 private:
  std::unique_ptr<transport::ClientTransport> transport_;
  std::string public_key_;
  int tasks_ = 0;
};

std::vector<history::EventRecord> eventsOf(history::HistoryStore& store, const std::string& kind,
                                           const std::string& client = "") {
  std::vector<history::EventRecord> out;
  auto events = store.events(std::nullopt);
  EXPECT_TRUE(events.isOk());
  if (!events.isOk()) return out;
  for (auto& e : *events) {
    if (e.kind == kind && (client.empty() || e.client_id == client)) out.push_back(e);
  }
  return out;
}

// Rounds with status "ok" so far (the history is shared with a running coordinator: SQLite WAL).
int okRounds(const std::string& dir) {
  auto store = history::openSqliteHistory(dir + "/history.db");
  if (!store.isOk()) return 0;
  auto runs = (*store)->runs();
  if (!runs.isOk() || runs->empty()) return 0;
  auto rounds = (*store)->rounds(runs->front().run_id);
  if (!rounds.isOk()) return 0;
  int ok = 0;
  for (const auto& r : *rounds) ok += r.status == "ok";
  return ok;
}

// Keys for the coordinator, client-1..n and mallory.
void makeKeys(const std::string& dir, int clients) {
  ASSERT_EQ(keygen(dir + "/keys", {"--coordinator", "--clients", std::to_string(clients)}), 0);
  ASSERT_EQ(keygen(dir + "/keys", {"--name", "mallory"}), 0);
}

// Every update row of the run, with the client ids that appear.
std::set<std::string> updateClients(history::HistoryStore& store) {
  std::set<std::string> ids;
  auto runs = store.runs();
  if (!runs.isOk() || runs->empty()) return ids;
  auto updates = store.updates(runs->front().run_id, std::nullopt);
  if (!updates.isOk()) return ids;
  for (const auto& u : *updates) ids.insert(u.client_id);
  return ids;
}

TEST(HostileClient, TakeOverByRoutingIdIsRefusedThroughSixtySecondsOfReconnects) {
  const std::string dir = testing::freshDir("hostile-takeover");
  makeKeys(dir, 2);
  const std::string config = writeConfig(dir, coordinatorSection(2, 2, 2, 60));
  std::string endpoint;
  auto coord = startCoordinator(dir, config, {"--rounds", "1000"}, &endpoint);
  ASSERT_FALSE(endpoint.empty()) << coord->log();
  auto c1 = startClient(dir, config, endpoint, "client-1");
  auto c2 = startClient(dir, config, endpoint, "client-2");

  // 60 s of connections re-made every 0.2 s, each with mallory's key and another client's id as
  // its routing id, saying Hello as that client and sending a chunk for a made-up token.
  int connections = 0;
  int tasks = 0;
  int refused_hellos = 0;
  const auto storm_end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::mt19937_64 rng(7);
  while (std::chrono::steady_clock::now() < storm_end) {
    const std::string victim = connections % 2 == 0 ? "client-1" : "client-2";
    Rogue rogue(dir, "mallory", endpoint, victim);
    ASSERT_TRUE(rogue.ok());
    ++connections;
    rogue.send(rogue.hello(victim));
    wire::Chunk chunk;
    chunk.task_token = rng();
    chunk.elements = 4;
    chunk.payload = std::string(16, '\0');
    rogue.send(chunk);
    if (auto e = rogue.nextError(0.2); e && e->code == wire::ErrorCode::kRejected) {
      ++refused_hellos;
    }
    tasks += rogue.tasksSeen();
    ASSERT_TRUE(!coord->waitFor(0).has_value()) << coord->log();
  }
  EXPECT_GE(connections, 200);
  EXPECT_EQ(tasks, 0) << "a take-over connection received a task";
  EXPECT_GT(refused_hellos, 0);
  const int rounds_done = okRounds(dir);
  EXPECT_GE(rounds_done, 3) << "the honest clients must keep completing rounds";
  ASSERT_TRUE(!coord->waitFor(0).has_value()) << coord->log();
  coord->kill(SIGINT);
  ASSERT_TRUE(coord->waitFor(30).has_value());

  auto store = openHistory(dir);
  ASSERT_TRUE(store);
  // Only the honest clients' updates were ever aggregated; mallory is not a client.
  EXPECT_EQ(updateClients(*store), (std::set<std::string>{"client-1", "client-2"}));
  auto clients = store->clients();
  ASSERT_TRUE(clients.isOk());
  for (const auto& c : *clients) EXPECT_NE(c.client_id, "mallory");
  auto refused = eventsOf(*store, "hello_refused", "mallory");
  ASSERT_FALSE(refused.empty());
  EXPECT_NE(refused.front().detail.find("this connection's key is client 'mallory'"),
            std::string::npos)
      << refused.front().detail;
  // Rows about mallory stay within its budget: 30 at once, then one every 10 s, plus the rows
  // that count what was left out.
  auto events = store->events(std::nullopt);
  ASSERT_TRUE(events.isOk());
  int about_mallory = 0;
  for (const auto& e : *events) about_mallory += e.client_id == "mallory";
  EXPECT_LE(about_mallory, 30 + 8 + 8) << "of " << connections << " connections";
  EXPECT_FALSE(eventsOf(*store, "events_left_out", "mallory").empty());
  auto runs = store->runs();
  ASSERT_TRUE(runs.isOk());
  auto rounds = store->rounds(runs->front().run_id);
  ASSERT_TRUE(rounds.isOk());
  for (const auto& r : *rounds) {
    if (r.round == 0) continue;
    if (r.status != "ok") continue;  // the round interrupted by SIGINT is not committed
    EXPECT_EQ(r.completed, 2u) << "round " << r.round;
  }
}

TEST(HostileClient, OneKeyRegistersOneClientAndCannotTakeAnIdAhead) {
  const std::string dir = testing::freshDir("hostile-sybil");
  makeKeys(dir, 3);
  const std::string config = writeConfig(dir, coordinatorSection(2, 2, 2, 60));
  std::string endpoint;
  auto coord = startCoordinator(dir, config, {"--rounds", "2"}, &endpoint);
  ASSERT_FALSE(endpoint.empty()) << coord->log();

  // 100 ids from one connection: refused, and past the Hello rate the connection is closed.
  {
    Rogue rogue(dir, "mallory", endpoint);
    ASSERT_TRUE(rogue.ok());
    for (int i = 0; i < 100; ++i) rogue.send(rogue.hello("sybil-" + std::to_string(i)));
    auto e = rogue.nextError(5);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code, wire::ErrorCode::kRejected);
  }
  // Then a fresh connection per id, and a claim on an id whose client has not come yet.
  for (int i = 0; i < 10; ++i) {
    Rogue rogue(dir, "mallory", endpoint);
    rogue.send(rogue.hello(i == 9 ? "client-3" : "sybil-x" + std::to_string(i)));
    auto e = rogue.nextError(5);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code, wire::ErrorCode::kRejected) << e->message;
    EXPECT_EQ(rogue.tasksSeen(), 0);
  }
  // The real client-3 is not locked out.
  auto c1 = startClient(dir, config, endpoint, "client-1");
  auto c3 = startClient(dir, config, endpoint, "client-3");
  auto rc = coord->waitFor(180);
  ASSERT_TRUE(rc.has_value()) << coord->log();
  ASSERT_EQ(*rc, 0) << coord->log();

  auto store = openHistory(dir);
  ASSERT_TRUE(store);
  auto clients = store->clients();
  ASSERT_TRUE(clients.isOk());
  std::set<std::string> ids;
  for (const auto& c : *clients) ids.insert(c.client_id);
  EXPECT_EQ(ids, (std::set<std::string>{"client-1", "client-3"}));
  EXPECT_EQ(updateClients(*store), (std::set<std::string>{"client-1", "client-3"}));
  EXPECT_EQ(eventsOf(*store, "rate_limited", "mallory").size(), 1u);
  const auto refused = eventsOf(*store, "hello_refused", "mallory");
  EXPECT_GE(refused.size(), 10u);
  EXPECT_LE(refused.size(), 20u);
  EXPECT_EQ(okRounds(dir), 2);
}

TEST(HostileClient, OversizedTextAndAFloodOfBadFramesAreBounded) {
  const std::string dir = testing::freshDir("hostile-flood");
  makeKeys(dir, 1);
  const std::string config = writeConfig(dir, coordinatorSection(1, 1, 1, 60));
  std::string endpoint;
  auto coord = startCoordinator(dir, config, {"--rounds", "1"}, &endpoint);
  ASSERT_FALSE(endpoint.empty()) << coord->log();
  {
    Rogue rogue(dir, "mallory", endpoint);
    ASSERT_TRUE(rogue.ok());
    ASSERT_TRUE(rogue.send(rogue.hello("mallory", std::string(20 << 20, 'x'))));
    auto e = rogue.nextError(20);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code, wire::ErrorCode::kMalformed);
    EXPECT_NE(e->message.find("device_name"), std::string::npos) << e->message;
  }
  {
    Rogue rogue(dir, "mallory", endpoint);
    for (int i = 0; i < 1000; ++i) rogue.sendRaw("\x13\x37 not a frame " + std::to_string(i));
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
  auto good = startClient(dir, config, endpoint, "client-1");
  auto rc = coord->waitFor(120);
  ASSERT_TRUE(rc.has_value()) << coord->log();
  ASSERT_EQ(*rc, 0) << coord->log();

  auto store = openHistory(dir);
  ASSERT_TRUE(store);
  const auto malformed = eventsOf(*store, "malformed_frame", "mallory");
  EXPECT_GE(malformed.size(), 20u);
  EXPECT_LE(malformed.size(), 22u);  // the Hello, then the flood up to the burst
  const auto limited = eventsOf(*store, "rate_limited", "mallory");
  ASSERT_EQ(limited.size(), 1u);
  EXPECT_NE(limited.front().detail.find("bad frames"), std::string::npos);
  for (const auto& e : malformed) EXPECT_LT(e.detail.size(), 2048u);
  auto clients = store->clients();
  ASSERT_TRUE(clients.isOk());
  ASSERT_EQ(clients->size(), 1u);
  EXPECT_EQ(clients->front().client_id, "client-1");
  EXPECT_LT(fs::file_size(dir + "/history.db"), 8u << 20);
}

TEST(HostileClient, AFrameOverTheSizeLimitIsLoggedAndCounted) {
  const std::string dir = testing::freshDir("hostile-big");
  makeKeys(dir, 1);
  const std::string config =
      writeConfig(dir, coordinatorSection(1, 1, 1, 60, "max_message_mib = 4"));
  std::string endpoint;
  auto coord = startCoordinator(dir, config, {"--rounds", "1"}, &endpoint);
  ASSERT_FALSE(endpoint.empty()) << coord->log();
  // The coordinator tells a refused frame from a peer that closed by the input still unread
  // when ZeroMQ drops the connection; a fresh connection tries again should one report be
  // missed (seen in two full runs of the suite, never alone).
  bool logged = false;
  for (int attempt = 0; attempt < 3 && !logged; ++attempt) {
    Rogue rogue(dir, "mallory", endpoint);
    ASSERT_TRUE(rogue.ok());
    ASSERT_TRUE(rogue.sendRaw(std::string(8 << 20, 'z')));
    logged = coord->waitForLog("a frame over the size limit", 10);
  }
  EXPECT_TRUE(logged) << coord->log();
  auto good = startClient(dir, config, endpoint, "client-1");
  auto rc = coord->waitFor(120);
  ASSERT_TRUE(rc.has_value()) << coord->log();
  EXPECT_EQ(*rc, 0) << coord->log();
  EXPECT_EQ(okRounds(dir), 1);
}

TEST(HostileClient, AKeyRemovedFromTheAllowListIsDisconnectedAtOnce) {
  const std::string dir = testing::freshDir("hostile-revoke");
  makeKeys(dir, 2);
  const std::string config = writeConfig(dir, coordinatorSection(2, 1, 1, 60, "liveness_s = 3"));
  std::string endpoint;
  auto coord = startCoordinator(dir, config, {"--rounds", "1000"}, &endpoint);
  ASSERT_FALSE(endpoint.empty()) << coord->log();
  auto c1 = startClient(dir, config, endpoint, "client-1");
  auto c2 = startClient(dir, config, endpoint, "client-2");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (okRounds(dir) < 2 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(okRounds(dir), 2) << coord->log();

  fs::remove(dir + "/keys/clients/client-2.key");
  const auto removed_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(coord->waitForLog("revoked client client-2", 5)) << coord->log();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - removed_at).count();
  EXPECT_LT(seconds, 3.0);
  // client-2 is told and leaves; its reconnects would be refused by the handshake.
  auto c2rc = c2->waitFor(30);
  EXPECT_TRUE(c2rc.has_value()) << c2->log();
  const int rounds_at_revocation = okRounds(dir);
  while (okRounds(dir) < rounds_at_revocation + 2 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GE(okRounds(dir), rounds_at_revocation + 2) << coord->log();
  coord->kill(SIGINT);
  ASSERT_TRUE(coord->waitFor(30).has_value());

  auto store = openHistory(dir);
  ASSERT_TRUE(store);
  const auto revoked = eventsOf(*store, "key_revoked", "client-2");
  ASSERT_EQ(revoked.size(), 1u);
  EXPECT_NE(revoked.front().detail.find("removed from allow-list"), std::string::npos);
  // Rounds committed after the revocation have no update of client-2.
  auto runs = store->runs();
  ASSERT_TRUE(runs.isOk());
  auto rounds = store->rounds(runs->front().run_id);
  ASSERT_TRUE(rounds.isOk());
  for (const auto& r : *rounds) {
    if (r.status != "ok" || r.start_time < revoked.front().time) continue;
    auto updates = store->updates(runs->front().run_id, r.round);
    ASSERT_TRUE(updates.isOk());
    for (const auto& u : *updates) EXPECT_NE(u.client_id, "client-2") << "round " << r.round;
  }
}

TEST(HostileClient, KeyFilesOthersCanWriteStopTheCoordinatorWithTheFix) {
  const std::string dir = testing::freshDir("hostile-perms");
  // keygen under umask 000 still makes private directories and secret files.
  const mode_t old_umask = ::umask(0);
  const int rc = keygen(dir + "/keys", {"--coordinator", "--clients", "1"});
  ::umask(old_umask);
  ASSERT_EQ(rc, 0);
  auto mode = [](const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return st.st_mode & 0777;
  };
  EXPECT_EQ(mode(dir + "/keys"), 0700u);
  EXPECT_EQ(mode(dir + "/keys/clients"), 0700u);
  EXPECT_EQ(mode(dir + "/keys/coordinator.key_secret"), 0600u);
  EXPECT_EQ(mode(dir + "/keys/client-1.key_secret"), 0600u);

  const std::string config = writeConfig(dir, coordinatorSection(1, 1, 1, 60));
  auto refusedWith = [&](const std::string& text) {
    fs::remove(dir + "/endpoint");
    std::string endpoint;
    Process coord({kBinary, "coordinator", "--config", config, "--bind", "tcp://127.0.0.1:*",
                   "--keys", dir + "/keys", "--db", dir + "/history.db", "--rounds", "1"},
                  dir + "/coordinator.log");
    auto code = coord.waitFor(30);
    ASSERT_TRUE(code.has_value());
    EXPECT_NE(*code, 0);
    EXPECT_NE(coord.log().find(text), std::string::npos) << coord.log();
  };
  fs::permissions(dir + "/keys/clients", fs::perms::all, fs::perm_options::replace);
  refusedWith("chmod go-w " + dir + "/keys/clients");
  fs::permissions(dir + "/keys/clients", fs::perms::owner_all, fs::perm_options::replace);
  fs::permissions(dir + "/keys/coordinator.key_secret",
                  fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                      fs::perms::others_read,
                  fs::perm_options::replace);
  refusedWith("chmod 600 " + dir + "/keys/coordinator.key_secret");
}

TEST(HostileClient, AGrantedUploadThatSendsNothingLosesItsGrant) {
  const std::string dir = testing::freshDir("hostile-stall");
  makeKeys(dir, 1);
  // One upload credit; mallory takes it and sends nothing. The deadline is long, so only
  // upload_idle_s can give the credit to the honest client in time.
  const std::string config = writeConfig(
      dir, coordinatorSection(2, 2, 1, 120, "max_concurrent_uploads = 1\nupload_idle_s = 3"));
  std::string endpoint;
  auto coord = startCoordinator(dir, config, {"--rounds", "1"}, &endpoint);
  ASSERT_FALSE(endpoint.empty()) << coord->log();
  Rogue rogue(dir, "mallory", endpoint);
  ASSERT_TRUE(rogue.ok());
  rogue.send(rogue.hello("mallory"));
  auto good = startClient(dir, config, endpoint, "client-1");
  auto task = rogue.nextTask(60);
  ASSERT_TRUE(task.has_value()) << coord->log();
  ASSERT_TRUE(rogue.send(wire::UploadRequest{task->task_token}));
  auto grant = rogue.next(
      10, [](const wire::Message& m) { return std::holds_alternative<wire::UploadGrant>(m); });
  ASSERT_TRUE(grant.has_value()) << "mallory asked first and gets the credit";
  const auto granted_at = std::chrono::steady_clock::now();
  // ... and stalls, heartbeating so that it is not lost.
  while (!coord->waitFor(0).has_value() &&
         std::chrono::steady_clock::now() - granted_at < std::chrono::seconds(100)) {
    rogue.send(wire::Heartbeat{1});
    rogue.next(0.5, [](const wire::Message&) { return false; });
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - granted_at).count();
  auto rc = coord->waitFor(10);
  ASSERT_TRUE(rc.has_value()) << coord->log();
  EXPECT_EQ(*rc, 0) << coord->log();
  EXPECT_LT(seconds, 60) << "the round waited for the stalled grant";

  auto store = openHistory(dir);
  ASSERT_TRUE(store);
  auto runs = store->runs();
  ASSERT_TRUE(runs.isOk());
  auto updates = store->updates(runs->front().run_id, 1);
  ASSERT_TRUE(updates.isOk());
  ASSERT_EQ(updates->size(), 2u);
  for (const auto& u : *updates) {
    EXPECT_EQ(u.status, u.client_id == "mallory" ? "rejected" : "completed") << u.client_id;
  }
  const auto stalled = eventsOf(*store, "update_rejected", "mallory");
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_NE(stalled.front().detail.find("upload_idle_s"), std::string::npos)
      << stalled.front().detail;
}

// The final test accuracy of a 3-round run of client-1..3 on partitions 0..2 of 4 (iid), with
// mallory (partition 3) attacking through `attack` when it is given.
double finalAccuracy(const std::string& dir,
                     const std::function<void(Rogue&, const wire::Task&, int)>& attack) {
  makeKeys(dir, 3);
  const int k = attack ? 4 : 3;
  const std::string config = writeConfig(dir, coordinatorSection(k, k, 3, 90));
  std::string endpoint;
  auto coord = startCoordinator(
      dir, config,
      {"--rounds", "3", "--set", "data.partition=\"iid\"", "--set", "data.partitions=4"},
      &endpoint);
  EXPECT_FALSE(endpoint.empty()) << coord->log();
  if (endpoint.empty()) return -1;
  std::vector<std::unique_ptr<Process>> honest;
  for (int i = 1; i <= 3; ++i) {
    honest.push_back(startClient(dir, config, endpoint, "client-" + std::to_string(i),
                                 {"--partition", std::to_string(i - 1)}));
  }
  std::atomic<bool> done{false};
  std::thread attacker;
  if (attack) {
    attacker = std::thread([&] {
      Rogue rogue(dir, "mallory", endpoint);
      wire::Hello hello = rogue.hello("mallory");
      hello.requested_partition = 3;
      rogue.send(hello);
      int round = 0;
      while (!done.load()) {
        auto task = rogue.nextTask(0.5);
        if (task) attack(rogue, *task, ++round);
      }
    });
  }
  auto rc = coord->waitFor(240);
  done.store(true);
  if (attacker.joinable()) attacker.join();
  EXPECT_TRUE(rc.has_value()) << coord->log();
  if (!rc) return -1;
  EXPECT_EQ(*rc, 0) << coord->log();
  auto store = openHistory(dir);
  auto runs = store->runs();
  auto rounds = store->rounds(runs->front().run_id);
  EXPECT_EQ(rounds->size(), 4u);
  for (const auto& r : *rounds) {
    EXPECT_TRUE(r.status == "ok" || r.status == "initial")
        << "round " << r.round << " " << r.status;
  }
  return rounds->back().test_accuracy.value_or(-1);
}

TEST(HostileClient, HugeSampleClaimsAndHugeValuesLeaveTheModelWithinAPoint) {
  const double baseline = finalAccuracy(testing::freshDir("hostile-base"), nullptr);
  const std::string dir = testing::freshDir("hostile-claims");
  const double attacked = finalAccuracy(dir, [](Rogue& rogue, const wire::Task& task, int round) {
    const size_t p = task.model_bytes.size() / 4;
    // Round 1: ones everywhere with 10^12 samples; round 2: 10^20 everywhere; round 3: both.
    const float value = round == 1 ? 1.0f : 1e20f;
    const uint64_t samples = round == 2 ? 100 : 1000000000000ull;
    rogue.upload(task, std::vector<float>(p, value), samples, 10);
  });
  ASSERT_GT(baseline, 0.5);
  EXPECT_NEAR(attacked, baseline, 0.01) << "baseline " << baseline << " attacked " << attacked;

  auto store = openHistory(dir);
  ASSERT_TRUE(store);
  auto runs = store->runs();
  ASSERT_TRUE(runs.isOk());
  auto updates = store->updates(runs->front().run_id, std::nullopt);
  ASSERT_TRUE(updates.isOk());
  int mallory = 0;
  for (const auto& u : *updates) {
    if (u.client_id != "mallory") continue;
    ++mallory;
    if (u.round != 2) {
      EXPECT_EQ(u.status, "rejected") << "round " << u.round;
    }
  }
  EXPECT_EQ(mallory, 3);
}

}  // namespace
}  // namespace fedfleet
