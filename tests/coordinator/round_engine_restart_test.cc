// RoundEngine across restarts and in the client rows it writes: partition assignments kept in
// the engine state, waiting status, and what the history learns of each client.
#include <gtest/gtest.h>

#include "common/history/history.h"
#include "tests/engine/round_engine_fixture.h"

namespace fedfleet::coordinator {
namespace {

using engine::engine_test::actionsOf;
using engine::engine_test::baseOptions;
using engine::engine_test::Fixture;
using engine::engine_test::hello;
using engine::engine_test::tokensOf;

// The partition each client-joined event names ("cpu , partition 2" -> 2).
std::map<std::string, int> joinedPartitions(const std::vector<engine::Action>& actions) {
  std::map<std::string, int> out;
  for (const auto& e : actionsOf<engine::RecordEvent>(actions)) {
    if (e.event.kind != "client_joined") continue;
    const auto at = e.event.detail.rfind("partition ");
    if (at != std::string::npos) out[e.event.client_id] = std::stoi(e.event.detail.substr(at + 10));
  }
  return out;
}

TEST(RoundEngineRestart, AssignedPartitionsSurviveARestartWhateverOrderClientsComeBackIn) {
  engine::EngineOptions o = baseOptions(2, 3, 1);
  Fixture first(o);
  first.engine->start(0);
  for (const std::string id : {"a", "b", "c"}) first.engine->onHello(id, hello(id), 0);
  first.take();
  EXPECT_EQ(first.engine->partitionOf("a"), 0);
  EXPECT_EQ(first.engine->partitionOf("b"), 1);
  EXPECT_EQ(first.engine->partitionOf("c"), 2);
  const std::string state = first.engine->saveState();

  // The restarted engine: c comes back first, then a newcomer d, then a; b has not returned.
  engine::EngineOptions resumed = o;
  resumed.first_round = 2;
  resumed.evaluate_initial = false;
  Fixture second(resumed);
  ASSERT_TRUE(second.engine->loadState(state).isOk());
  second.engine->start(10);
  second.engine->onHello("c", hello("c"), 10);
  second.engine->onHello("d", hello("d"), 10);
  second.engine->onHello("a", hello("a"), 10);
  auto actions = second.take();
  EXPECT_EQ(second.engine->partitionOf("c"), 2);
  EXPECT_EQ(second.engine->partitionOf("a"), 0);
  // Partitions 0-2 are held (b's too, though b is away): the newcomer gets the free one.
  EXPECT_EQ(second.engine->partitionOf("d"), 3);
  EXPECT_EQ(joinedPartitions(actions), (std::map<std::string, int>{{"a", 0}, {"c", 2}, {"d", 3}}));
  second.engine->onHello("b", hello("b"), 11);
  EXPECT_EQ(second.engine->partitionOf("b"), 1);

  // The restored assignments are saved again with the next state, b's included.
  Fixture third(resumed);
  ASSERT_TRUE(third.engine->loadState(second.engine->saveState()).isOk());
  third.engine->start(20);
  for (const std::string id : {"d", "b", "a", "c"}) third.engine->onHello(id, hello(id), 20);
  EXPECT_EQ(third.engine->partitionOf("a"), 0);
  EXPECT_EQ(third.engine->partitionOf("b"), 1);
  EXPECT_EQ(third.engine->partitionOf("c"), 2);
  EXPECT_EQ(third.engine->partitionOf("d"), 3);
}

// Only assignments are kept: a client that names its partition asks for it again after a
// restart. a was given partition 0, then came back (a new process) naming 0 itself; b named 1
// from the start; c was given 2. After the restart only c's is reserved, so a newcomer z takes
// the lowest free partition, 0.
TEST(RoundEngineRestart, AClientThatNamesItsPartitionIsNotKeptAsAssigned) {
  engine::EngineOptions o = baseOptions(2, 3, 1);
  Fixture first(o);
  first.engine->start(0);
  first.engine->onHello("a", hello("a"), 0);
  first.engine->onHello("b", hello("b", 1), 0);
  first.engine->onHello("c", hello("c"), 0);
  wire::Hello again = hello("a", 0);
  again.session = 7;
  first.engine->onHello("a", again, 1);
  first.take();
  EXPECT_EQ(first.engine->partitionOf("a"), 0);
  EXPECT_EQ(first.engine->partitionOf("b"), 1);
  EXPECT_EQ(first.engine->partitionOf("c"), 2);

  engine::EngineOptions resumed = o;
  resumed.first_round = 2;
  resumed.evaluate_initial = false;
  Fixture second(resumed);
  ASSERT_TRUE(second.engine->loadState(first.engine->saveState()).isOk());
  second.engine->start(10);
  second.engine->onHello("z", hello("z"), 10);
  second.engine->onHello("c", hello("c"), 10);
  EXPECT_EQ(second.engine->partitionOf("z"), 0);
  EXPECT_EQ(second.engine->partitionOf("c"), 2);
}

TEST(RoundEngineRestart, AStateWhosePartitionsDoNotFitTheRunIsRefused) {
  engine::EngineOptions o = baseOptions(1, 1, 1);
  Fixture first(o);
  first.engine->start(0);
  for (const std::string id : {"a", "b", "c", "d"}) first.engine->onHello(id, hello(id), 0);
  first.take();
  const std::string state = first.engine->saveState();
  engine::EngineOptions fewer = o;
  fewer.num_partitions = 2;  // d held partition 3
  Fixture second(fewer);
  Status st = second.engine->loadState(state);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("client c holds partition 2 of a run with 2"), std::string::npos)
      << st.message();
  // Nothing was restored: a newcomer named d takes the first free partition.
  second.engine->start(0);
  second.engine->onHello("d", hello("d"), 0);
  EXPECT_EQ(second.engine->partitionOf("d"), 0);
}

TEST(RoundEngineRestart, RequestedPartitionsAreNotKeptInTheState) {
  engine::EngineOptions o = baseOptions(1, 1, 1);
  Fixture first(o);
  first.engine->start(0);
  first.engine->onHello("a", hello("a", 0), 0);  // asks for its own partition
  first.take();
  EXPECT_EQ(first.engine->partitionOf("a"), 0);
  // After a restart a asks again; nothing holds partition 0 for it meanwhile.
  Fixture second(o);
  ASSERT_TRUE(second.engine->loadState(first.engine->saveState()).isOk());
  second.engine->start(1);
  second.engine->onHello("b", hello("b"), 1);
  EXPECT_EQ(second.engine->partitionOf("b"), 0);
}

TEST(RoundEngineClients, ClientRowsCarryThePartitionSizeAndTheLastTimeEachWasSeen) {
  engine::EngineOptions o = baseOptions(2, 2, 1);
  o.partition_sizes = {100, 200, 300, 400};
  Fixture f(o);
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 1);
  f.engine->onHello("b", hello("b"), 2);
  auto actions = f.take();
  auto rows = actionsOf<engine::UpsertClient>(actions);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].client.client_id, "a");
  EXPECT_EQ(rows[0].client.data_size, 100u);  // partition 0
  EXPECT_EQ(rows[1].client.data_size, 200u);  // partition 1
  EXPECT_EQ(rows[0].client.first_seen, 1);
  EXPECT_EQ(rows[0].client.last_seen, 1);
  auto token = tokensOf(actionsOf<engine::SendTask>(actions));
  ASSERT_EQ(token.size(), 2u);
  f.engine->onHeartbeat("b", 4.5);
  f.upload("a", token.at("a"), {1, 1, 1}, 10, 6.0);
  f.engine->onTick(12.5);  // past the 10 s deadline: b is late
  actions = f.take();
  ASSERT_EQ(actionsOf<engine::CommitRound>(actions).size(), 1u);
  std::map<std::string, history::ClientRecord> seen;
  for (const auto& u : actionsOf<engine::UpsertClient>(actions))
    seen[u.client.client_id] = u.client;
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen["a"].last_seen, 6.0);  // its summary
  EXPECT_EQ(seen["b"].last_seen, 4.5);  // its heartbeat: being late is not being heard from
  EXPECT_EQ(seen["a"].data_size, 100u);
  // The memory store keeps first_seen and takes the rest.
  auto store = history::createMemoryHistory();
  for (const auto& r : rows) ASSERT_TRUE(store->upsertClient(r.client).isOk());
  ASSERT_TRUE(store->upsertClient(seen["a"]).isOk());
  auto clients = store->clients();
  ASSERT_TRUE(clients.isOk());
  EXPECT_EQ((*clients)[0].first_seen, 1);
  EXPECT_EQ((*clients)[0].last_seen, 6.0);
}

TEST(RoundEngineClients, WaitingStatusSaysWhoIsConnectedOfHowManyNeeded) {
  engine::EngineOptions o = baseOptions(3, 3, 1);
  Fixture f(o);
  EXPECT_FALSE(f.engine->waitingStatus().waiting);
  f.engine->start(5);
  f.take();
  f.engine->onHello("b", hello("b"), 6);
  f.engine->onHello("a", hello("a"), 7);
  auto w = f.engine->waitingStatus();
  EXPECT_TRUE(w.waiting);
  EXPECT_EQ(w.idle, 2u);
  EXPECT_EQ(w.needed, 3u);
  EXPECT_EQ(w.since, 5);
  EXPECT_EQ(w.connected, (std::vector<engine::ClientId>{"a", "b"}));
  f.engine->onHello("c", hello("c"), 8);
  EXPECT_FALSE(f.engine->waitingStatus().waiting);  // the round started
}

TEST(RoundEngineClients, WaitingTooLongNamesTheDurationAndWhatToDo) {
  engine::EngineOptions o = baseOptions(2, 2, 1);
  o.wait_clients_s = 300;
  o.liveness_s = 0;  // a stays connected however long it is silent
  Fixture f(o);
  f.engine->start(0);
  f.engine->onHello("a", hello("a"), 1);
  f.take();
  f.engine->onTick(301);
  auto done = actionsOf<engine::RunFinished>(f.take());
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok);
  EXPECT_EQ(
      done[0].message,
      "only 1 of 2 clients available after 5 min 0 s (coordinator.wait_clients_s); start more "
      "clients, or lower coordinator.min_clients");
}

}  // namespace
}  // namespace fedfleet::coordinator
