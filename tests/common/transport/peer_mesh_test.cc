// Tests of PeerMesh (common/transport/peer_mesh.h): meshes of peers over CURVE on 127.0.0.1
// exchanging messages with authenticated sender ids, a key outside the allow-list refused, a
// closed peer reported down by heartbeats exactly once, oversized messages refused on both
// sides. Heartbeats are short (50 ms, timeout 600 ms: a loaded machine may stall a poll loop
// for a few hundred ms) so that every test takes a second or two.

#include "common/transport/peer_mesh.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/transport/transport.h"

namespace fedfleet::transport {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Keys of `ids` under a fresh directory: `<dir>/<id>.key{,_secret}`; the public halves also
// form the allow-list directory `<dir>/allow`.
struct PeerKeys {
  std::string allow_dir;
  std::map<std::string, KeyPair> keys;
};

PeerKeys makeKeys(const std::vector<std::string>& ids, const std::vector<std::string>& outsiders) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::path(FEDFLEET_TEST_TMP) /
                       ("peer_mesh_" + std::to_string(::getpid()) + "_" + info->name());
  fs::remove_all(dir);
  PeerKeys out;
  out.allow_dir = (dir / "allow").string();
  for (const std::string& id : ids) {
    Result<KeyPair> keys = generateKeyPair();
    EXPECT_TRUE(keys.isOk());
    EXPECT_TRUE(writeKeyPair((dir / "secret").string(), id, *keys).isOk());
    EXPECT_TRUE(
        writeKeyPair(out.allow_dir, id, KeyPair{keys->public_key, keys->secret_key}).isOk());
    fs::remove(fs::path(out.allow_dir) / (id + ".key_secret"));
    out.keys[id] = *keys;
  }
  for (const std::string& id : outsiders) {
    Result<KeyPair> keys = generateKeyPair();
    EXPECT_TRUE(keys.isOk());
    out.keys[id] = *keys;
  }
  return out;
}

PeerMeshOptions optionsFor(const PeerKeys& keys, const std::string& id) {
  PeerMeshOptions options;
  options.self_id = id;
  options.keys = keys.keys.at(id);
  options.allow_dir = keys.allow_dir;
  options.heartbeat_interval_ms = 50;
  options.heartbeat_timeout_ms = 600;
  options.max_message_bytes = 4096;
  return options;
}

std::unique_ptr<PeerMesh> makeMesh(const PeerMeshOptions& options) {
  Result<std::unique_ptr<PeerMesh>> mesh = PeerMesh::create(options);
  EXPECT_TRUE(mesh.isOk()) << mesh.status().toString();
  return mesh.isOk() ? std::move(*mesh) : nullptr;
}

// The table of `meshes`, each under its own id and public key.
std::vector<PeerAddress> tableOf(const std::map<std::string, std::unique_ptr<PeerMesh>>& meshes,
                                 const PeerKeys& keys) {
  std::vector<PeerAddress> table;
  for (const auto& [id, mesh] : meshes) {
    table.push_back({id, mesh->boundEndpoint(), keys.keys.at(id).public_key});
  }
  return table;
}

// Polls every mesh for `ms`, collecting what each reports.
std::map<std::string, std::vector<PeerEvent>> pollAll(
    std::map<std::string, std::unique_ptr<PeerMesh>>& meshes, int ms) {
  std::map<std::string, std::vector<PeerEvent>> seen;
  const auto until = Clock::now() + std::chrono::milliseconds(ms);
  while (Clock::now() < until) {
    for (auto& [id, mesh] : meshes) {
      Result<std::vector<PeerEvent>> events = mesh->poll(5);
      EXPECT_TRUE(events.isOk()) << events.status().toString();
      if (!events.isOk()) continue;
      for (PeerEvent& e : *events) seen[id].push_back(std::move(e));
    }
  }
  return seen;
}

// pollAll for `ms`, then on in 100 ms steps until `done(seen)` holds or 10 s have passed: a
// loaded machine may take longer than `ms` for a connection's handshake or a refusal.
std::map<std::string, std::vector<PeerEvent>> pollAllUntil(
    std::map<std::string, std::unique_ptr<PeerMesh>>& meshes, int ms,
    const std::function<bool(const std::map<std::string, std::vector<PeerEvent>>&)>& done) {
  std::map<std::string, std::vector<PeerEvent>> seen = pollAll(meshes, ms);
  const auto cap = Clock::now() + std::chrono::seconds(10);
  while (!done(seen) && Clock::now() < cap) {
    for (auto& [id, events] : pollAll(meshes, 100)) {
      for (PeerEvent& e : events) seen[id].push_back(std::move(e));
    }
  }
  return seen;
}

std::vector<PeerEvent> ofKind(const std::vector<PeerEvent>& events, PeerEvent::Kind kind) {
  std::vector<PeerEvent> out;
  for (const PeerEvent& e : events) {
    if (e.kind == kind) out.push_back(e);
  }
  return out;
}

TEST(PeerMeshTest, FourPeersExchangeMessagesUnderTheirAuthenticatedIds) {
  const std::vector<std::string> ids = {"peer-0", "peer-1", "peer-2", "peer-3"};
  PeerKeys keys = makeKeys(ids, {});
  std::map<std::string, std::unique_ptr<PeerMesh>> meshes;
  for (const auto& id : ids) meshes[id] = makeMesh(optionsFor(keys, id));
  const std::vector<PeerAddress> table = tableOf(meshes, keys);
  for (auto& [id, mesh] : meshes) ASSERT_TRUE(mesh->setPeers(table).isOk());

  // Everyone sends two ordered messages to everyone else.
  for (auto& [from, mesh] : meshes) {
    for (const auto& to : ids) {
      if (to == from) continue;
      ASSERT_TRUE(mesh->send(to, from + "->" + to + " #1").isOk());
      ASSERT_TRUE(mesh->send(to, from + "->" + to + " #2").isOk());
    }
  }
  EXPECT_EQ(meshes["peer-0"]->send("peer-0", "self").code(), StatusCode::kNotFound);
  EXPECT_EQ(meshes["peer-0"]->send("peer-9", "x").code(), StatusCode::kNotFound);

  auto seen = pollAll(meshes, 800);
  for (const auto& to : ids) {
    std::vector<PeerEvent> messages = ofKind(seen[to], PeerEvent::kMessage);
    ASSERT_EQ(messages.size(), 2 * (ids.size() - 1)) << to;
    std::map<std::string, std::vector<std::string>> by_sender;
    for (const PeerEvent& m : messages) by_sender[m.peer].push_back(m.payload);
    for (const auto& from : ids) {
      if (from == to) continue;
      EXPECT_EQ(by_sender[from],
                (std::vector<std::string>{from + "->" + to + " #1", from + "->" + to + " #2"}))
          << from << " to " << to;
    }
    EXPECT_TRUE(ofKind(seen[to], PeerEvent::kPeerDown).empty()) << to;
    EXPECT_EQ(meshes[to]->livePeers().size(), ids.size() - 1);
  }
}

TEST(PeerMeshTest, KeyOutsideTheAllowListIsRefused) {
  PeerKeys keys = makeKeys({"peer-0", "peer-1"}, {"mallory"});
  std::map<std::string, std::unique_ptr<PeerMesh>> meshes;
  meshes["peer-0"] = makeMesh(optionsFor(keys, "peer-0"));
  // Mallory holds a fresh key pair and claims to be peer-1 in her own options and table.
  PeerMeshOptions mallory_options = optionsFor(keys, "mallory");
  mallory_options.self_id = "peer-1";
  std::unique_ptr<PeerMesh> mallory = makeMesh(mallory_options);
  const std::vector<PeerAddress> table = {
      {"peer-0", meshes["peer-0"]->boundEndpoint(), keys.keys["peer-0"].public_key},
      {"peer-1", mallory->boundEndpoint(), keys.keys["mallory"].public_key}};
  ASSERT_TRUE(meshes["peer-0"]->setPeers(table).isOk());
  ASSERT_TRUE(mallory->setPeers(table).isOk());
  Status first = mallory->send("peer-0", "let me in");
  EXPECT_TRUE(first.isOk()) << first.toString();  // queued before the handshake

  std::vector<PeerEvent> seen;
  Status later;
  const auto until = Clock::now() + std::chrono::milliseconds(700);
  while (Clock::now() < until) {
    for (auto* mesh : {meshes["peer-0"].get(), mallory.get()}) {
      Result<std::vector<PeerEvent>> events = mesh->poll(5);
      ASSERT_TRUE(events.isOk());
      if (mesh == meshes["peer-0"].get()) seen.insert(seen.end(), events->begin(), events->end());
    }
    later = mallory->send("peer-0", "again");
  }
  EXPECT_TRUE(ofKind(seen, PeerEvent::kMessage).empty());
  EXPECT_EQ(later.code(), StatusCode::kPermissionDenied) << later.toString();
  std::vector<AuthEvent> refused = meshes["peer-0"]->takeAuthEvents();
  ASSERT_FALSE(refused.empty());
  EXPECT_EQ(refused[0].public_key, keys.keys["mallory"].public_key);
  EXPECT_EQ(refused[0].kind, AuthEvent::kRefused);
}

TEST(PeerMeshTest, AllowedKeyCannotSpeakForAnotherPeer) {
  // peer-2's key is in the allow-list; it presents itself as peer-1 (whose table entry points
  // at it). peer-0 still sees its messages as peer-2's, and peer-2 is not in peer-0's table.
  PeerKeys keys = makeKeys({"peer-0", "peer-1", "peer-2"}, {});
  std::unique_ptr<PeerMesh> victim = makeMesh(optionsFor(keys, "peer-0"));
  PeerMeshOptions liar_options = optionsFor(keys, "peer-2");
  liar_options.self_id = "peer-1";
  std::unique_ptr<PeerMesh> liar = makeMesh(liar_options);
  ASSERT_TRUE(victim
                  ->setPeers({{"peer-0", victim->boundEndpoint(), keys.keys["peer-0"].public_key},
                              {"peer-1", liar->boundEndpoint(), keys.keys["peer-1"].public_key}})
                  .isOk());
  ASSERT_TRUE(
      liar->setPeers({{"peer-0", victim->boundEndpoint(), keys.keys["peer-0"].public_key}}).isOk());
  ASSERT_TRUE(liar->send("peer-0", "I am peer-1").isOk());
  std::vector<PeerEvent> seen;
  const auto until = Clock::now() + std::chrono::milliseconds(300);
  while (Clock::now() < until) {
    Result<std::vector<PeerEvent>> events = victim->poll(5);
    ASSERT_TRUE(events.isOk());
    seen.insert(seen.end(), events->begin(), events->end());
    ASSERT_TRUE(liar->poll(5).isOk());
  }
  EXPECT_TRUE(ofKind(seen, PeerEvent::kMessage).empty());
  EXPECT_GE(victim->framesDropped(), 1u);
}

TEST(PeerMeshTest, ClosedPeerIsReportedDownExactlyOnce) {
  const std::vector<std::string> ids = {"peer-0", "peer-1", "peer-2"};
  PeerKeys keys = makeKeys(ids, {});
  std::map<std::string, std::unique_ptr<PeerMesh>> meshes;
  for (const auto& id : ids) meshes[id] = makeMesh(optionsFor(keys, id));
  const std::vector<PeerAddress> table = tableOf(meshes, keys);
  for (auto& [id, mesh] : meshes) ASSERT_TRUE(mesh->setPeers(table).isOk());

  // Longer than the timeout: heartbeats keep everyone up.
  auto before = pollAll(meshes, 900);
  for (const auto& id : ids) EXPECT_TRUE(ofKind(before[id], PeerEvent::kPeerDown).empty()) << id;

  meshes.erase("peer-2");
  const auto closed_at = Clock::now();
  std::map<std::string, std::vector<PeerEvent>> after;
  std::map<std::string, Clock::duration> reported_after;  // from the close to the report
  while (Clock::now() - closed_at < std::chrono::milliseconds(1800)) {  // three timeouts
    for (auto& [id, mesh] : meshes) {
      Result<std::vector<PeerEvent>> events = mesh->poll(5);
      ASSERT_TRUE(events.isOk());
      for (PeerEvent& e : *events) {
        if (e.kind == PeerEvent::kPeerDown && reported_after.count(id) == 0) {
          reported_after[id] = Clock::now() - closed_at;
        }
        after[id].push_back(std::move(e));
      }
    }
  }
  for (const std::string id : {"peer-0", "peer-1"}) {
    // Not before the timeout could have run out (its last heartbeat came before the close).
    EXPECT_GE(reported_after[id], std::chrono::milliseconds(600 - 60)) << id;
    std::vector<PeerEvent> down = ofKind(after[id], PeerEvent::kPeerDown);
    ASSERT_EQ(down.size(), 1u) << id;
    EXPECT_EQ(down[0].peer, "peer-2");
    EXPECT_NE(down[0].reason.find("peer-2"), std::string::npos);
    EXPECT_TRUE(meshes[id]->isDown("peer-2"));
    EXPECT_EQ(meshes[id]->livePeers(),
              (std::vector<std::string>{id == "peer-0" ? "peer-1" : "peer-0"}));
    EXPECT_EQ(meshes[id]->send("peer-2", "hello?").code(), StatusCode::kUnavailable);
  }
  // The survivors still talk.
  ASSERT_TRUE(meshes["peer-0"]->send("peer-1", "still here").isOk());
  auto last = pollAll(meshes, 200);
  std::vector<PeerEvent> messages = ofKind(last["peer-1"], PeerEvent::kMessage);
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].payload, "still here");
  EXPECT_TRUE(ofKind(last["peer-0"], PeerEvent::kPeerDown).empty());
}

TEST(PeerMeshTest, OversizedMessagesAreRefused) {
  PeerKeys keys = makeKeys({"peer-0", "peer-1"}, {});
  PeerMeshOptions small = optionsFor(keys, "peer-0");
  small.max_message_bytes = 1000;
  PeerMeshOptions large = optionsFor(keys, "peer-1");
  large.max_message_bytes = 100000;
  std::map<std::string, std::unique_ptr<PeerMesh>> meshes;
  meshes["peer-0"] = makeMesh(small);
  meshes["peer-1"] = makeMesh(large);
  const std::vector<PeerAddress> table = tableOf(meshes, keys);
  for (auto& [id, mesh] : meshes) ASSERT_TRUE(mesh->setPeers(table).isOk());

  // The sender's own limit.
  Status too_big = meshes["peer-0"]->send("peer-1", std::string(1001, 'x'));
  EXPECT_EQ(too_big.code(), StatusCode::kResourceExhausted) << too_big.toString();
  EXPECT_TRUE(meshes["peer-0"]->send("peer-1", std::string(1000, 'y')).isOk());

  // A sender with a larger limit: the receiver drops what is over its own.
  ASSERT_TRUE(meshes["peer-1"]->send("peer-0", std::string(50000, 'z')).isOk());
  auto seen = pollAllUntil(meshes, 500, [&](const auto& events) {
    return meshes["peer-0"]->framesDropped() >= 1 && events.count("peer-1") > 0;
  });
  std::vector<PeerEvent> at1 = ofKind(seen["peer-1"], PeerEvent::kMessage);
  ASSERT_EQ(at1.size(), 1u);
  EXPECT_EQ(at1[0].payload, std::string(1000, 'y'));
  EXPECT_TRUE(ofKind(seen["peer-0"], PeerEvent::kMessage).empty());
  EXPECT_GE(meshes["peer-0"]->framesDropped(), 1u);

  // After the refusal the link reconnects and small messages flow again.
  ASSERT_TRUE(meshes["peer-1"]->send("peer-0", "small").isOk());
  seen = pollAllUntil(meshes, 500, [](const auto& events) {
    auto it = events.find("peer-0");
    return it != events.end() && !ofKind(it->second, PeerEvent::kMessage).empty();
  });
  std::vector<PeerEvent> at0 = ofKind(seen["peer-0"], PeerEvent::kMessage);
  ASSERT_EQ(at0.size(), 1u);
  EXPECT_EQ(at0[0].payload, "small");
}

TEST(PeerMeshTest, OptionsAndTablesAreChecked) {
  PeerKeys keys = makeKeys({"peer-0", "peer-1"}, {});
  PeerMeshOptions bad = optionsFor(keys, "peer-0");
  bad.heartbeat_timeout_ms = bad.heartbeat_interval_ms;
  EXPECT_EQ(PeerMesh::create(bad).status().code(), StatusCode::kInvalidArgument);
  bad = optionsFor(keys, "peer-0");
  bad.self_id = "../etc";
  EXPECT_EQ(PeerMesh::create(bad).status().code(), StatusCode::kInvalidArgument);

  std::unique_ptr<PeerMesh> mesh = makeMesh(optionsFor(keys, "peer-0"));
  EXPECT_EQ(mesh->setPeers({{"peer-1", "tcp://127.0.0.1:1", "not a key"}}).code(),
            StatusCode::kInvalidArgument);
  const PeerAddress one{"peer-1", "tcp://127.0.0.1:1", keys.keys["peer-1"].public_key};
  EXPECT_EQ(mesh->setPeers({one, one}).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(mesh->setPeers({one}).isOk());
  EXPECT_EQ(mesh->setPeers({one}).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace fedfleet::transport
