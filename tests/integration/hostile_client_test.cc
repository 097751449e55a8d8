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
#include <map>
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
#include "common/wire/limits.h"
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
  // skipped, or kept for a later next() after keepSkipped()); a Task comes with its model bytes.
  std::optional<wire::Message> next(double seconds,
                                    const std::function<bool(const wire::Message&)>& want) {
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (!want(*it)) continue;
      wire::Message m = std::move(*it);
      kept_.erase(it);
      return m;
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
      auto got = transport_->receive(100);
      if (!got.isOk() || !got->has_value()) continue;
      auto m = wire::decodeFrames((*got)->payload, (*got)->attachment);
      if (!m.isOk()) continue;
      if (std::holds_alternative<wire::Task>(*m)) ++tasks_;
      if (want(*m)) return std::move(m).value();
      if (keep_skipped_) kept_.push_back(std::move(m).value());
    }
    return std::nullopt;
  }
  void keepSkipped() { keep_skipped_ = true; }
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
  bool keep_skipped_ = false;
  std::vector<wire::Message> kept_;  // skipped by next(), when keep_skipped_
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

// makeKeys, the job of `section` and its coordinator for `rounds` rounds (null when it did not
// start listening).
struct KeyedRun {
  std::string config;
  std::string endpoint;
  std::unique_ptr<Process> coord;
};
KeyedRun startKeyedRun(const std::string& dir, int clients, const std::string& section,
                       int rounds) {
  KeyedRun run;
  makeKeys(dir, clients);
  run.config = writeConfig(dir, section);
  run.coord =
      startCoordinator(dir, run.config, {"--rounds", std::to_string(rounds)}, &run.endpoint);
  if (run.endpoint.empty()) {
    ADD_FAILURE() << run.coord->log();
    run.coord.reset();
  }
  return run;
}

// The update rows of round `round` of the history's first run (nullopt when unreadable).
std::optional<std::vector<history::UpdateRecord>> roundUpdates(history::HistoryStore& store,
                                                               uint32_t round) {
  auto runs = store.runs();
  if (!runs.isOk() || runs->empty()) return std::nullopt;
  auto updates = store.updates(runs->front().run_id, round);
  if (!updates.isOk()) return std::nullopt;
  return std::move(updates).value();
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
  auto [config, endpoint, coord] = startKeyedRun(dir, 2, coordinatorSection(2, 2, 2, 60), 1000);
  ASSERT_TRUE(coord) << "the coordinator did not start: see " << dir;
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
  auto [config, endpoint, coord] = startKeyedRun(dir, 3, coordinatorSection(2, 2, 2, 60), 2);
  ASSERT_TRUE(coord) << "the coordinator did not start: see " << dir;

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
  auto [config, endpoint, coord] = startKeyedRun(dir, 1, coordinatorSection(1, 1, 1, 60), 1);
  ASSERT_TRUE(coord) << "the coordinator did not start: see " << dir;
  {
    Rogue rogue(dir, "mallory", endpoint);
    ASSERT_TRUE(rogue.ok());
    // A device name of 1 MiB: within the frame limit (2 MiB with these settings), refused by
    // the decoder's bound on the field. (One of 20 MiB is a frame over the limit, refused at its
    // header: the frame-limit test below.)
    ASSERT_TRUE(rogue.send(rogue.hello("mallory", std::string(1 << 20, 'x'))));
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
  auto [config, endpoint, coord] =
      startKeyedRun(dir, 2, coordinatorSection(2, 1, 1, 60, "liveness_s = 3"), 1000);
  ASSERT_TRUE(coord) << "the coordinator did not start: see " << dir;
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

// The attack the allow-list's path checks answer: with the key directory open to others, a
// running coordinator's allow-list is renamed away and a directory holding an outsider's key put
// in its place. The coordinator follows the directory by inode, checks the new one's path as
// StrictModes does, refuses to read it and says so in an event; the outsider is refused at the
// handshake and the honest client, admitted by the last list that passed, keeps training.
TEST(HostileClient, AnAllowListSwappedThroughAWritableParentAdmitsNoOne) {
  const std::string dir = testing::freshDir("hostile-swap");
  ASSERT_EQ(keygen(dir + "/keys", {"--coordinator", "--clients", "1"}), 0);
  ASSERT_EQ(keygen(dir + "/outsider", {"--name", "outsider"}), 0);
  fs::copy_file(dir + "/keys/coordinator.key", dir + "/outsider/coordinator.key");
  const std::string config = writeConfig(dir, coordinatorSection(1, 1, 1, 60));
  std::string endpoint;
  auto coord = startCoordinator(dir, config, {"--rounds", "1000"}, &endpoint);
  ASSERT_FALSE(endpoint.empty()) << coord->log();
  auto honest = startClient(dir, config, endpoint, "client-1");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (okRounds(dir) < 1 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(okRounds(dir), 1) << coord->log();

  // chmod 777 keys; mv keys/clients keys/clients.old; mkdir -m 700 keys/clients;
  // cp outsider.key keys/clients/
  const std::string keys = dir + "/keys";
  fs::permissions(keys, fs::perms::all, fs::perm_options::replace);
  fs::rename(keys + "/clients", keys + "/clients.old");
  fs::create_directory(keys + "/clients");
  fs::permissions(keys + "/clients", fs::perms::owner_all, fs::perm_options::replace);
  fs::copy_file(dir + "/outsider/outsider.key", keys + "/clients/outsider.key");
  const int rounds_at_attack = okRounds(dir);
  Process outsider({kBinary, "client", "--config", config, "--coordinator", endpoint, "--id",
                    "outsider", "--keys", dir + "/outsider", "--exit-idle", "60"},
                   dir + "/outsider.log");
  EXPECT_TRUE(coord->waitForLog("is another directory now", 10)) << coord->log();
  while (okRounds(dir) < rounds_at_attack + 3 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GE(okRounds(dir), rounds_at_attack + 3) << "the honest client must still be served";
  // The outsider must have tried before it is stopped: a slow start (under a sanitizer, loading
  // LibTorch takes seconds) could otherwise miss the three rounds.
  EXPECT_TRUE(outsider.waitForLog("refused this client's key", 60)) << outsider.log();
  outsider.kill(SIGINT);
  coord->kill(SIGINT);
  ASSERT_TRUE(coord->waitFor(30).has_value());

  auto store = openHistory(dir);
  ASSERT_TRUE(store);
  const auto refused = eventsOf(*store, "allow_list_refused");
  ASSERT_FALSE(refused.empty()) << coord->log();
  bool swap_recorded = false;
  for (const auto& e : refused) {
    EXPECT_NE(e.detail.find("chmod go-w " + keys + "`"), std::string::npos) << e.detail;
    swap_recorded |= e.detail.find("is another directory now") != std::string::npos;
  }
  EXPECT_TRUE(swap_recorded) << refused.front().detail;
  EXPECT_LE(refused.size(), 2u) << "recorded once per reason and directory";
  // The outsider never became a client: refused at the handshake, never given a task.
  auto clients = store->clients();
  ASSERT_TRUE(clients.isOk());
  for (const auto& c : *clients) EXPECT_NE(c.client_id, "outsider");
  EXPECT_TRUE(eventsOf(*store, "client_joined", "outsider").empty());
  EXPECT_EQ(updateClients(*store), (std::set<std::string>{"client-1"}));
  auto outsider_key = transport::readPublicKeyFile(dir + "/outsider/outsider.key");
  ASSERT_TRUE(outsider_key.isOk());
  bool outsider_refused = false;
  for (const auto& e : eventsOf(*store, "auth_rejected")) {
    outsider_refused |= e.detail.find(*outsider_key) != std::string::npos;
  }
  EXPECT_TRUE(outsider_refused) << "no auth_rejected row names the outsider's key";
  EXPECT_TRUE(eventsOf(*store, "key_revoked").empty()) << "the kept list revoked a key";
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
  const auto updates = roundUpdates(*store, 1);
  ASSERT_TRUE(updates.has_value());
  ASSERT_EQ(updates->size(), 2u);
  for (const auto& u : *updates) {
    EXPECT_EQ(u.status, u.client_id == "mallory" ? "rejected" : "completed") << u.client_id;
  }
  const auto stalled = eventsOf(*store, "update_rejected", "mallory");
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_NE(stalled.front().detail.find("upload_idle_s"), std::string::npos)
      << stalled.front().detail;
}

// An honest client whose connection is replaced (ZeroMQ reconnects with a new routing id, or a
// limit closed the old one) right after its task went out: the task may be lost with the old
// connection, so the coordinator sends it again on the new one, the same token, as long as
// nothing of its upload has come. Without that the round waits for its deadline (60 s here).
TEST(HostileClient, ATaskLostWithAReplacedConnectionIsSentAgainOnTheNewOne) {
  const std::string dir = testing::freshDir("hostile-resend");
  auto [config, endpoint, coord] = startKeyedRun(dir, 1, coordinatorSection(1, 1, 1, 60), 1);
  ASSERT_TRUE(coord) << "the coordinator did not start: see " << dir;
  Rogue first(dir, "mallory", endpoint);
  ASSERT_TRUE(first.ok());
  wire::Hello hello = first.hello("mallory");
  hello.session = 77;
  ASSERT_TRUE(first.send(hello));
  auto task = first.nextTask(60);
  ASSERT_TRUE(task.has_value()) << coord->log();
  const auto started = std::chrono::steady_clock::now();
  // A new connection of the same key: its first message (a heartbeat) replaces the first one,
  // which the coordinator closes.
  Rogue second(dir, "mallory", endpoint);
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(second.send(wire::Heartbeat{1}));
  auto again = second.nextTask(15);
  ASSERT_TRUE(again.has_value()) << "the task was not sent again\n" << coord->log();
  EXPECT_EQ(again->task_token, task->task_token);
  EXPECT_EQ(again->round, task->round);
  EXPECT_EQ(again->model_bytes, task->model_bytes);
  // A third connection that says Hello again (the same client process: same session) gets it
  // once more: its upload still has not started.
  Rogue third(dir, "mallory", endpoint);
  ASSERT_TRUE(third.ok());
  ASSERT_TRUE(third.send(hello));
  auto third_task = third.nextTask(15);
  ASSERT_TRUE(third_task.has_value()) << coord->log();
  EXPECT_EQ(third_task->task_token, task->task_token);
  ASSERT_TRUE(
      third.upload(*third_task, std::vector<float>(task->model_bytes.size() / 4, 0.0f), 10, 1));
  auto rc = coord->waitFor(40);
  ASSERT_TRUE(rc.has_value()) << coord->log();
  EXPECT_EQ(*rc, 0) << coord->log();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_LT(seconds, 45) << "the round waited for its deadline";

  auto store = openHistory(dir);
  ASSERT_TRUE(store);
  const auto updates = roundUpdates(*store, 1);
  ASSERT_TRUE(updates.has_value());
  ASSERT_EQ(updates->size(), 1u);
  EXPECT_EQ(updates->front().status, "completed");
  EXPECT_EQ(eventsOf(*store, "task_resent", "mallory").size(), 2u);
  EXPECT_EQ(eventsOf(*store, "connection_replaced", "mallory").size(), 2u);
}

// A Chunk for `task` of `values` (codec "none") at `offset`.
wire::Chunk chunkFor(const wire::Task& task, uint64_t offset, const std::vector<float>& values,
                     bool last, uint64_t n_samples = 10, uint64_t steps = 1) {
  auto codec = compress::makeCodec(*compress::parseCodecSpec("none"));
  wire::Chunk c;
  c.task_token = task.task_token;
  c.offset = offset;
  c.elements = values.size();
  c.last = last;
  c.n_samples = n_samples;
  c.steps = steps;
  if (codec.isOk()) (*codec)->encode(values.data(), values.size(), 0, &c.payload);
  return c;
}

// A Summary that completes an honest-looking update of `task` (10 samples, 1 step).
wire::Summary summaryFor(const wire::Task& task) {
  wire::Summary s;
  s.task_token = task.task_token;
  s.n_samples = 10;
  s.steps = 1;
  s.mean_loss = 0.5;
  s.sum_sq_loss = 2.5;
  s.compute_seconds = 0.1;
  return s;
}

// Every field of every message a client sends, each with a hostile value, from mallory (a valid
// key): each is refused (the frame as malformed, the Hello, or the update) or, where a field is
// bounded by clamping or is opaque by design, shown to be harmless. docs/ERRORS.md lists the
// checks ("Limits on what a client sends"); Chunk's tensor index is retired from the wire.
TEST(HostileClient, EveryFieldAClientSendsIsCheckedOrHarmless) {
  const std::string dir = testing::freshDir("hostile-fields");
  auto [config, endpoint, coord] =
      startKeyedRun(dir, 1, coordinatorSection(2, 2, 1, 60, "liveness_s = 30"), 1000);
  ASSERT_TRUE(coord) << "the coordinator did not start: see " << dir;
  auto honest = startClient(dir, config, endpoint, "client-1");

  // Hello, each on a connection of its own (a connection may say Hello 5 times at once).
  struct HelloCase {
    const char* what;
    std::function<void(wire::Hello&)> spoil;
    wire::ErrorCode code;
    const char* says;
  };
  const std::vector<HelloCase> hellos = {
      {"client id of another", [](wire::Hello& h) { h.client_id = "client-1"; },
       wire::ErrorCode::kRejected, "this connection's key is client 'mallory'"},
      {"client id not an id", [](wire::Hello& h) { h.client_id = "mal lory"; },
       wire::ErrorCode::kMalformed, "Hello.client_id"},
      {"public key of another",
       [](wire::Hello& h) { h.public_key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"; },
       wire::ErrorCode::kRejected, "public key other than"},
      {"device kind unknown", [](wire::Hello& h) { h.device_kind = wire::DeviceKind(7); },
       wire::ErrorCode::kMalformed, "unknown device kind"},
      {"device name with an escape", [](wire::Hello& h) { h.device_name = "x\x1b[2J"; },
       wire::ErrorCode::kMalformed, "Hello.device_name"},
      {"cores", [](wire::Hello& h) { h.cores = 1u << 20; }, wire::ErrorCode::kMalformed,
       "Hello.cores"},
      {"memory", [](wire::Hello& h) { h.memory_bytes = UINT64_MAX; }, wire::ErrorCode::kMalformed,
       "Hello.memory_bytes"},
      {"protocol version", [](wire::Hello& h) { h.protocol_version = 4; },
       wire::ErrorCode::kBadVersion, "protocol version 4"},
      {"negative partition", [](wire::Hello& h) { h.requested_partition = -7; },
       wire::ErrorCode::kMalformed, "Hello.requested_partition"},
      {"partition past the run's", [](wire::Hello& h) { h.requested_partition = 2; },
       wire::ErrorCode::kRejected, "asks for partition 2, and the run has 2"},
  };
  for (const auto& c : hellos) {
    Rogue rogue(dir, "mallory", endpoint);
    ASSERT_TRUE(rogue.ok());
    wire::Hello h = rogue.hello("mallory");
    c.spoil(h);
    ASSERT_TRUE(rogue.send(h)) << c.what;
    auto e = rogue.nextError(20);
    ASSERT_TRUE(e.has_value()) << c.what << "\n" << coord->log();
    EXPECT_EQ(e->code, c.code) << c.what << ": " << e->message;
    EXPECT_NE(e->message.find(c.says), std::string::npos) << c.what << ": " << e->message;
    EXPECT_EQ(rogue.tasksSeen(), 0) << c.what;
  }

  // The Hello that registers: a data size far beyond anything (bounded by the partition's size
  // it is recorded with), an opaque session id.
  Rogue mallory(dir, "mallory", endpoint);
  ASSERT_TRUE(mallory.ok());
  mallory.keepSkipped();
  wire::Hello h = mallory.hello("mallory");
  h.data_size = 1ull << 60;
  h.session = UINT64_MAX;
  h.memory_bytes = wire::kMaxMemoryBytes;
  ASSERT_TRUE(mallory.send(h));

  // Messages without a task: each refused as malformed, or (a heartbeat's sequence) echoed.
  ASSERT_TRUE(mallory.send(wire::Heartbeat{UINT64_MAX}));
  auto beat = mallory.next(20, [](const wire::Message& m) {
    const auto* b = std::get_if<wire::Heartbeat>(&m);
    return b != nullptr && b->seq == UINT64_MAX;
  });
  EXPECT_TRUE(beat.has_value()) << "a heartbeat's sequence is only echoed";
  struct FrameCase {
    const char* what;
    wire::Message message;
    const char* says;
  };
  wire::SecAgg survivors;
  survivors.step = wire::SecAggStep::kReveal;
  survivors.request.survivors = {0};
  wire::SecAgg mixed;
  mixed.step = wire::SecAggStep::kAdvert;
  mixed.revealed.push_back({0, true, std::string(44, 'r')});
  const std::vector<FrameCase> frames = {
      {"Bye with an escape", wire::Bye{"bye\x1b]0;owned\x07"}, "Bye.reason"},
      {"Error with the coordinator's code", wire::Error{wire::ErrorCode::kStaleTask, "x", 0},
       "Error.code"},
      {"Error with a control character", wire::Error{wire::ErrorCode::kInternal, "a\rb", 0},
       "Error.message"},
      {"SecAgg with survivors", survivors, "the coordinator's to send"},
      {"SecAgg with another step's list", mixed, "a list of another step"},
  };
  for (const auto& c : frames) {
    ASSERT_TRUE(mallory.send(c.message)) << c.what;
    auto e = mallory.nextError(20);
    ASSERT_TRUE(e.has_value()) << c.what;
    EXPECT_EQ(e->code, wire::ErrorCode::kMalformed) << c.what << ": " << e->message;
    EXPECT_NE(e->message.find(c.says), std::string::npos) << c.what << ": " << e->message;
  }

  // Per task: fields a chunk or summary carries, each refused with the update, except the
  // timings (clamped) of the round that completes.
  struct TaskCase {
    const char* what;
    std::function<void(Rogue&, const wire::Task&, size_t p)> send;
    const char* recorded;  // in the update_rejected row; nullptr: the update completes
  };
  const std::vector<TaskCase> cases = {
      {"a chunk past its offset",
       [](Rogue& r, const wire::Task& t, size_t p) {
         r.send(chunkFor(t, 1, std::vector<float>(p - 1, 0.f), true));
       },
       "chunk at offset 1, expected 0"},
      {"a chunk of no elements",
       [](Rogue& r, const wire::Task& t, size_t) { r.send(chunkFor(t, 0, {}, false)); },
       "chunk of 0 elements"},
      {"a payload that is not one",
       [](Rogue& r, const wire::Task& t, size_t p) {
         wire::Chunk c = chunkFor(t, 0, std::vector<float>(p, 0.f), true);
         c.payload = "garbage";
         r.send(c);
       },
       "chunk payload"},
      {"elements the payload does not hold",
       [](Rogue& r, const wire::Task& t, size_t p) {
         wire::Chunk c = chunkFor(t, 0, std::vector<float>(p, 0.f), true);
         c.elements = p / 2;
         c.last = false;
         r.send(c);
       },
       "chunk payload"},
      {"a payload of another codec than the task asked for",
       [](Rogue& r, const wire::Task& t, size_t p) {
         wire::Chunk c = chunkFor(t, 0, std::vector<float>(p, 0.f), true);
         auto lowrank = compress::makeCodec(*compress::parseCodecSpec("lowrank:2"));
         ASSERT_TRUE(lowrank.isOk());
         c.payload.clear();
         const std::vector<float> values(p, 0.25f);
         (*lowrank)->encode(values.data(), p, 0, &c.payload);  // well formed, but not "none"
         r.send(c);
       },
       "chunk payload made by codec lowrank, the task asked for none"},
      {"the last flag on a chunk that does not end the update",
       [](Rogue& r, const wire::Task& t, size_t p) {
         r.send(chunkFor(t, 0, std::vector<float>(p / 2, 0.f), true));
       },
       "last chunk ends at"},
      {"samples beyond the partition",
       [](Rogue& r, const wire::Task& t, size_t p) {
         r.send(chunkFor(t, 0, std::vector<float>(p, 0.f), true, 1000000000));
       },
       "samples, partition"},
      {"steps beyond the plan",
       [](Rogue& r, const wire::Task& t, size_t p) {
         r.send(chunkFor(t, 0, std::vector<float>(p, 0.f), true, 10, 1000000));
       },
       "local steps, its task planned at most"},
      {"a summary of other samples",
       [](Rogue& r, const wire::Task& t, size_t p) {
         r.send(chunkFor(t, 0, std::vector<float>(p, 0.f), true));
         wire::Summary s = summaryFor(t);
         s.n_samples = 11;
         r.send(s);
       },
       "summary reports 11 samples"},
      {"a mean loss that is not a number",
       [](Rogue& r, const wire::Task& t, size_t p) {
         r.send(chunkFor(t, 0, std::vector<float>(p, 0.f), true));
         wire::Summary s = summaryFor(t);
         s.mean_loss = std::nan("");
         r.send(s);
       },
       "mean loss"},
      {"squared losses beyond what the samples allow",
       [](Rogue& r, const wire::Task& t, size_t p) {
         r.send(chunkFor(t, 0, std::vector<float>(p, 0.f), true));
         wire::Summary s = summaryFor(t);
         s.sum_sq_loss = 1e300;
         r.send(s);
       },
       "sum of squared losses"},
      {"a served-model evaluation of too many samples",
       [](Rogue& r, const wire::Task& t, size_t p) {
         r.send(chunkFor(t, 0, std::vector<float>(p, 0.f), true));
         wire::Summary s = summaryFor(t);
         s.served_samples = 2000000;
         s.served_loss = 0.5;
         s.served_accuracy = 0.5;
         r.send(s);
       },
       "served-model evaluation claims 2000000"},
      {"a federated evaluation not asked for",
       [](Rogue& r, const wire::Task& t, size_t p) {
         r.send(chunkFor(t, 0, std::vector<float>(p, 0.f), true));
         wire::Summary s = summaryFor(t);
         s.eval_samples = 5;
         s.eval_loss = 0.5;
         s.eval_accuracy = 0.5;
         r.send(s);
       },
       "its task did not ask for"},
      {"an error for its own task",
       [](Rogue& r, const wire::Task& t, size_t) {
         r.send(wire::Error{wire::ErrorCode::kRejected, "will not train", t.task_token});
       },
       "client reported: will not train"},
      {"timings beyond the round, and an upload request",
       [](Rogue& r, const wire::Task& t, size_t p) {
         r.send(wire::UploadRequest{t.task_token});
         r.send(chunkFor(t, 0, std::vector<float>(p, 0.f), true));
         wire::Summary s = summaryFor(t);
         s.compute_seconds = 1e300;
         s.upload_seconds = std::nan("");
         s.encode_seconds = -5;
         r.send(s);
       },
       nullptr},
  };
  uint64_t beats = 0;
  auto awaitTask = [&]() -> std::optional<wire::Task> {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < until) {
      mallory.send(wire::Heartbeat{++beats});
      if (auto t = mallory.nextTask(1.0)) return t;
    }
    return std::nullopt;
  };
  std::map<uint32_t, const TaskCase*> case_of_round;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto task = awaitTask();
    ASSERT_TRUE(task.has_value()) << cases[i].what << "\n" << coord->log();
    const size_t p = task->model_bytes.size() / 4;
    if (i == 0) {
      // A token it was not given, in a chunk, an upload request and a summary: answered
      // (STALE_TASK), recorded, and never taken for its own task's.
      wire::Chunk stray = chunkFor(*task, 0, std::vector<float>(p, 0.f), true);
      stray.task_token ^= 0x5a5a5a5a5a5a5a5aULL;
      mallory.send(stray);
      mallory.send(wire::UploadRequest{stray.task_token});
      wire::Summary s = summaryFor(*task);
      s.task_token = stray.task_token;
      mallory.send(s);
    }
    case_of_round[task->round] = &cases[i];
    cases[i].send(mallory, *task, p);
  }
  // One more task: mallory's last case has completed.
  ASSERT_TRUE(awaitTask().has_value()) << coord->log();
  coord->kill(SIGINT);
  ASSERT_TRUE(coord->waitFor(30).has_value());

  auto store = openHistory(dir);
  ASSERT_TRUE(store);
  const auto rejected = eventsOf(*store, "update_rejected", "mallory");
  auto runs = store->runs();
  ASSERT_TRUE(runs.isOk());
  for (const auto& [round, c] : case_of_round) {
    auto updates = store->updates(runs->front().run_id, round);
    ASSERT_TRUE(updates.isOk());
    const history::UpdateRecord* mine = nullptr;
    for (const auto& u : *updates) {
      if (u.client_id == "mallory") mine = &u;
    }
    ASSERT_NE(mine, nullptr) << c->what << " (round " << round << ")";
    if (c->recorded == nullptr) {
      EXPECT_EQ(mine->status, "completed") << c->what;
      const double elapsed = mine->end_time - mine->start_time;
      EXPECT_LE(mine->compute_s, elapsed + 1e-6) << c->what;
      EXPECT_EQ(mine->upload_s, 0) << c->what;
      EXPECT_GE(mine->encode_s, 0) << c->what;
      continue;
    }
    EXPECT_EQ(mine->status, "rejected") << c->what;
    const std::string prefix = "round " + std::to_string(round) + ": ";
    bool found = false;
    for (const auto& e : rejected) {
      found |= e.detail.rfind(prefix, 0) == 0 && e.detail.find(c->recorded) != std::string::npos;
    }
    EXPECT_TRUE(found) << c->what << ": no update_rejected row of round " << round << " saying \""
                       << c->recorded << "\"";
  }
  // The tokens it was never given: answered, never taken for its task's.
  EXPECT_FALSE(eventsOf(*store, "unknown_token", "mallory").empty());
  // What it said it holds is recorded as what the coordinator knows it holds.
  auto clients = store->clients();
  ASSERT_TRUE(clients.isOk());
  for (const auto& c : *clients) {
    if (c.client_id == "mallory") EXPECT_LE(c.data_size, 6000u);
  }
  // The honest client completed every committed training round.
  auto rounds = store->rounds(runs->front().run_id);
  ASSERT_TRUE(rounds.isOk());
  for (const auto& r : *rounds) {
    if (r.round == 0 || r.status != "ok") continue;
    auto updates = store->updates(runs->front().run_id, r.round);
    ASSERT_TRUE(updates.isOk());
    for (const auto& u : *updates) {
      if (u.client_id == "client-1") EXPECT_EQ(u.status, "completed") << "round " << r.round;
    }
  }
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
      uint64_t beats = 0;
      while (!done.load()) {
        // Alive while it waits (the coordinator drops a client silent for liveness_s: on a
        // loaded machine the honest clients may take longer than that to join).
        rogue.send(wire::Heartbeat{++beats});
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
