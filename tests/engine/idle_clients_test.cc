#include "engine/idle_clients.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace fedfleet::engine {
namespace {

std::string name(int i) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "c%06d", i);
  return buf;
}

IdleClients fleet(int n) {
  IdleClients idle;
  for (int i = n - 1; i >= 0; --i) idle.set(name(i), true);  // arrival order is irrelevant
  return idle;
}

const auto kAll = [](const ClientId&) { return true; };

TEST(IdleClients, SetAndEraseKeepTheIdOrder) {
  IdleClients idle;
  idle.set("b", true);
  idle.set("a", true);
  idle.set("c", true);
  idle.set("b", false);  // got a task
  idle.erase("c");       // lost
  idle.set("a", true);   // again: still once
  EXPECT_EQ(std::vector<ClientId>(idle.begin(), idle.end()), std::vector<ClientId>{"a"});
  EXPECT_EQ(idle.size(), 1u);
}

// Both paths: few idle clients (listed) and many (ranks drawn).
class IdleClientsSample : public ::testing::TestWithParam<int> {};

TEST_P(IdleClientsSample, DrawsKDistinctEligibleClientsSortedAndSameForTheSameSeed) {
  const int n = GetParam();
  IdleClients idle = fleet(n);
  auto even = [](const ClientId& id) { return (id.back() - '0') % 2 == 0; };
  std::mt19937_64 rng(7);
  std::vector<ClientId> got = idle.sample(10, even, rng);
  ASSERT_EQ(got.size(), 10u);
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
  EXPECT_EQ(std::set<ClientId>(got.begin(), got.end()).size(), 10u);
  for (const auto& id : got) EXPECT_TRUE(even(id)) << id;
  std::mt19937_64 again(7);
  EXPECT_EQ(idle.sample(10, even, again), got);
}

TEST_P(IdleClientsSample, EveryEligibleClientIsDrawnAboutEquallyOften) {
  const int n = GetParam();
  IdleClients idle = fleet(n);
  std::mt19937_64 rng(11);
  std::map<ClientId, int> count;
  const int draws = 2000;
  for (int d = 0; d < draws; ++d) {
    for (const auto& id : idle.sample(5, kAll, rng)) ++count[id];
  }
  const double expected = draws * 5.0 / n;
  for (int i = 0; i < n; i += std::max(1, n / 20)) {
    EXPECT_NEAR(count[name(i)], expected, 0.5 * expected + 5) << name(i);
  }
}

INSTANTIATE_TEST_SUITE_P(FewAndMany, IdleClientsSample, ::testing::Values(30, 400));

TEST(IdleClients, FewerEligibleThanAskedGivesAllOfThem) {
  IdleClients idle = fleet(500);  // many idle: the rank draw keeps missing and falls back
  auto three = [](const ClientId& id) {
    return id == name(3) || id == name(250) || id == name(499);
  };
  std::mt19937_64 rng(1);
  EXPECT_EQ(idle.sample(10, three, rng), (std::vector<ClientId>{name(3), name(250), name(499)}));
  std::mt19937_64 rng2(1);
  EXPECT_TRUE(idle.sample(
                      4, [](const ClientId&) { return false; }, rng2)
                  .empty());
}

}  // namespace
}  // namespace fedfleet::engine
