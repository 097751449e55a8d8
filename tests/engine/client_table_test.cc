#include "engine/client_table.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

namespace fedfleet::engine {
namespace {

std::string name(int i) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "c%06d", i);
  return buf;
}

ClientState withPartition(int32_t partition) {
  ClientState s;
  s.partition = partition;
  return s;
}

// n clients, all idle, added in decreasing id order (arrival order is irrelevant).
ClientTable fleet(int n) {
  ClientTable table;
  for (int i = n - 1; i >= 0; --i) {
    table.add(name(i), withPartition(i), wire::Hello{});
    table.setIdle(name(i), true);
  }
  return table;
}

const auto kAll = [](const ClientId&) { return true; };

std::vector<ClientId> idleIds(const ClientTable& table) {
  std::vector<ClientId> out;
  table.forEachIdle([&out](const ClientId& id) { out.push_back(id); });
  return out;
}

TEST(ClientTable, FindsEveryClientAndVisitsThemInIdOrder) {
  ClientTable table;
  std::vector<int> ids(300);
  for (int i = 0; i < 300; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(3));
  for (int i : ids) table.add(name(i), withPartition(i), wire::Hello{});
  EXPECT_EQ(table.size(), 300u);
  for (int i = 0; i < 300; ++i) {
    ASSERT_NE(table.find(name(i)), nullptr) << name(i);
    EXPECT_EQ(table.at(name(i)).partition, i);  // each id keeps its own row
  }
  EXPECT_EQ(table.find("c999999"), nullptr);
  EXPECT_EQ(table.find(""), nullptr);
  EXPECT_FALSE(table.contains("b"));
  std::vector<ClientId> visited;
  table.forEach([&](const ClientId& id, const ClientState& c) {
    EXPECT_EQ(name(c.partition), id);
    visited.push_back(id);
  });
  ASSERT_EQ(visited.size(), 300u);
  EXPECT_TRUE(std::is_sorted(visited.begin(), visited.end()));
}

TEST(ClientTable, RowsStayWhereTheyAreWhenOthersArrive) {
  ClientTable table;
  ClientState& first = table.add("m", withPartition(7), wire::Hello{});
  for (int i = 0; i < 2000; ++i)
    table.add(name(i), withPartition(i), wire::Hello{});  // before "m" in id order
  first.task_token = 42;
  EXPECT_EQ(table.at("m").task_token, 42u);
  EXPECT_EQ(table.at("m").partition, 7);
}

TEST(ClientTable, SetIdleKeepsTheIdOrderAndCountsOnce) {
  ClientTable table;
  for (const char* id : {"b", "a", "c"}) table.add(id, ClientState{}, wire::Hello{});
  EXPECT_EQ(table.idleCount(), 0u);  // added: not idle until said so
  table.setIdle("b", true);
  table.setIdle("a", true);
  table.setIdle("c", true);
  table.setIdle("b", false);  // got a task
  table.setIdle("c", false);  // lost
  table.setIdle("a", true);   // again: still once
  EXPECT_EQ(idleIds(table), std::vector<ClientId>{"a"});
  EXPECT_EQ(table.idleCount(), 1u);
}

TEST(ClientTable, KeepsTheHelloAndSharesItsStrings) {
  ClientTable table;
  wire::Hello h;
  h.client_id = "ignored";
  h.public_key = "key-of-a";
  h.device_kind = wire::DeviceKind::kCuda;
  h.device_name = "phone-high";
  h.cores = 8;
  h.memory_bytes = 6ull << 30;
  h.data_size = 1234;
  h.requested_partition = 17;
  h.session = 99;
  h.last_coordinator_session = 5;
  const ClientState& a = table.add("a", ClientState{}, h);
  const wire::Hello back = table.hello("a", a.hello);
  EXPECT_EQ(back.client_id, "a");
  EXPECT_EQ(back.public_key, "key-of-a");
  EXPECT_EQ(back.device_kind, wire::DeviceKind::kCuda);
  EXPECT_EQ(back.device_name, "phone-high");
  EXPECT_EQ(back.cores, 8u);
  EXPECT_EQ(back.memory_bytes, 6ull << 30);
  EXPECT_EQ(back.data_size, 1234u);
  EXPECT_EQ(back.requested_partition, 17);
  EXPECT_EQ(back.session, 99u);
  EXPECT_EQ(back.last_coordinator_session, 5u);
  wire::Hello other = h;
  other.public_key = "key-of-b";
  const ClientState& b = table.add("b", ClientState{}, other);
  EXPECT_EQ(b.hello.device_name, a.hello.device_name);  // one copy of "phone-high"
  EXPECT_NE(b.hello.public_key, a.hello.public_key);
  EXPECT_EQ(table.hello("b", b.hello).public_key, "key-of-b");
  EXPECT_EQ(table.internedStrings(), 3u);
  EXPECT_EQ(table.hello("c", table.add("c", ClientState{}, wire::Hello{}).hello).device_name, "");
  EXPECT_EQ(table.internedStrings(), 3u);
}

TEST(ClientTable, AClientGreetingWithNewStringsLeavesNothingBehind) {
  // A client with a valid key may say Hello again and again, naming a new device each time:
  // the strings it no longer names are let go, and those another client names stay.
  ClientTable table;
  wire::Hello h;
  h.public_key = "key-of-a";
  h.device_name = "shared-name";
  ClientState& a = table.add("a", ClientState{}, h);
  const ClientState& b = table.add("b", ClientState{}, h);
  ASSERT_EQ(table.internedStrings(), 2u);
  for (int i = 0; i < 10000; ++i) {
    h.device_name = "device-" + std::to_string(i);
    table.setHello(a, h);
    ASSERT_EQ(table.hello("a", a.hello).device_name, h.device_name);
  }
  EXPECT_EQ(table.internedStrings(), 3u);  // the key, the name "b" still has, a's last name
  EXPECT_EQ(table.hello("b", b.hello).device_name, "shared-name");
  EXPECT_EQ(table.hello("b", b.hello).public_key, "key-of-a");
  h.device_name = "shared-name";
  table.setHello(a, h);  // the same strings again: nothing new
  table.setHello(a, h);
  EXPECT_EQ(table.internedStrings(), 2u);
  EXPECT_EQ(table.hello("a", a.hello).device_name, "shared-name");
  h.public_key.clear();
  h.device_name.clear();
  table.setHello(a, h);
  EXPECT_EQ(table.internedStrings(), 2u);  // "b" still names both
  EXPECT_EQ(table.hello("a", a.hello).public_key, "");
}

// The draw as it was specified, over a plain sorted list of the idle ids: the table's rank
// lookup must give the same clients for the same generator state.
std::vector<ClientId> referenceSample(const std::vector<ClientId>& idle, size_t k,
                                      const std::function<bool(const ClientId&)>& eligible,
                                      std::mt19937_64& rng) {
  const size_t n = idle.size();
  std::vector<ClientId> out;
  if (n > 4 * k + 64) {
    std::uniform_int_distribution<size_t> rank(0, n - 1);
    std::unordered_set<size_t> seen;
    size_t budget = 50 * k + 1000;
    while (out.size() < k && budget-- > 0) {
      const size_t r = rank(rng);
      if (!seen.insert(r).second) continue;
      if (eligible(idle[r])) out.push_back(idle[r]);
    }
    if (out.size() == k) {
      std::sort(out.begin(), out.end());
      return out;
    }
    out.clear();
  }
  for (const auto& id : idle) {
    if (eligible(id)) out.push_back(id);
  }
  const size_t take = std::min(k, out.size());
  for (size_t i = 0; i < take; ++i) {
    std::uniform_int_distribution<size_t> pick(i, out.size() - 1);
    std::swap(out[i], out[pick(rng)]);
  }
  out.resize(take);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ClientTable, DrawMatchesTheRankDrawOverASortedListThroughArrivalsAndTasks) {
  // Clients arrive in random order between draws, take tasks and come back: the counting tree
  // is updated in place, and rebuilt after arrivals.
  ClientTable table;
  std::set<ClientId> idle;
  std::mt19937_64 ops(5);
  std::mt19937_64 rng(9);
  std::mt19937_64 ref(9);
  int next = 0;
  std::vector<ClientId> known;
  for (int step = 0; step < 60; ++step) {
    const int arrivals = step % 7 == 0 ? 400 : static_cast<int>(ops() % 5);
    for (int a = 0; a < arrivals; ++a) {
      const ClientId id = name(static_cast<int>((next++ * 7919) % 1000003));
      table.add(id, ClientState{}, wire::Hello{});
      table.setIdle(id, true);
      idle.insert(id);
      known.push_back(id);
    }
    for (int t = 0; t < 30; ++t) {  // tasks handed out and finished
      const ClientId& id = known[ops() % known.size()];
      const bool now_idle = ops() % 2 == 0;
      table.setIdle(id, now_idle);
      if (now_idle) {
        idle.insert(id);
      } else {
        idle.erase(id);
      }
    }
    ASSERT_EQ(table.idleCount(), idle.size());
    const std::vector<ClientId> sorted(idle.begin(), idle.end());
    auto odd = [](const ClientId& id) { return (id.back() - '0') % 2 == 1; };
    const auto got = table.sample(10, odd, rng);
    EXPECT_EQ(got, referenceSample(sorted, 10, odd, ref)) << "step " << step;
    ASSERT_EQ(idleIds(table), sorted);
  }
}

// What a registered client costs is what a simulated fleet of ten million costs: its id (a
// short string, 32 bytes), its state, its slot in the id order, its idle mark, and the
// containers' slack. About 410 bytes each in the map-and-tree table this replaced.
TEST(ClientTable, ARegisteredClientCostsUnder180BytesOfHeap) {
  constexpr int kClients = 200000;
  wire::Hello h;
  h.device_name = "phone-mid";
  std::vector<ClientId> ids;
  ids.reserve(kClients);
  for (int i = 0; i < kClients; ++i)
    ids.push_back("v" + name(i));  // 8 characters, as the simulator's
  const size_t before = mallinfo2().uordblks;
  {
    ClientTable table;
    for (const ClientId& id : ids) {
      ClientState s;
      s.connected = true;
      table.add(id, s, h);
      table.setIdle(id, true);
    }
    std::mt19937_64 rng(1);
    EXPECT_EQ(table.sample(1000, kAll, rng).size(), 1000u);  // builds the counting tree
    const double per_client =
        static_cast<double>(mallinfo2().uordblks - before) / static_cast<double>(kClients);
    EXPECT_LT(per_client, 180.0);
    EXPECT_GT(per_client, 32.0 + sizeof(ClientState));  // the measure sees the rows
  }
}

// Both paths: few idle clients (listed) and many (ranks drawn).
class ClientTableSample : public ::testing::TestWithParam<int> {};

TEST_P(ClientTableSample, DrawsKDistinctEligibleClientsSortedAndSameForTheSameSeed) {
  const int n = GetParam();
  ClientTable table = fleet(n);
  auto even = [](const ClientId& id) { return (id.back() - '0') % 2 == 0; };
  std::mt19937_64 rng(7);
  std::vector<ClientId> got = table.sample(10, even, rng);
  ASSERT_EQ(got.size(), 10u);
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
  EXPECT_EQ(std::set<ClientId>(got.begin(), got.end()).size(), 10u);
  for (const auto& id : got) EXPECT_TRUE(even(id)) << id;
  std::mt19937_64 again(7);
  EXPECT_EQ(table.sample(10, even, again), got);
}

TEST_P(ClientTableSample, EveryEligibleClientIsDrawnAboutEquallyOften) {
  const int n = GetParam();
  ClientTable table = fleet(n);
  std::mt19937_64 rng(11);
  std::map<ClientId, int> count;
  const int draws = 2000;
  for (int d = 0; d < draws; ++d) {
    for (const auto& id : table.sample(5, kAll, rng)) ++count[id];
  }
  const double expected = draws * 5.0 / n;
  for (int i = 0; i < n; i += std::max(1, n / 20)) {
    EXPECT_NEAR(count[name(i)], expected, 0.5 * expected + 5) << name(i);
  }
}

INSTANTIATE_TEST_SUITE_P(FewAndMany, ClientTableSample, ::testing::Values(30, 400));

TEST(ClientTable, FewerEligibleThanAskedGivesAllOfThem) {
  ClientTable table = fleet(500);  // many idle: the rank draw keeps missing and falls back
  auto three = [](const ClientId& id) {
    return id == name(3) || id == name(250) || id == name(499);
  };
  std::mt19937_64 rng(1);
  EXPECT_EQ(table.sample(10, three, rng), (std::vector<ClientId>{name(3), name(250), name(499)}));
  std::mt19937_64 rng2(1);
  EXPECT_TRUE(table
                  .sample(
                      4, [](const ClientId&) { return false; }, rng2)
                  .empty());
}

}  // namespace
}  // namespace fedfleet::engine
