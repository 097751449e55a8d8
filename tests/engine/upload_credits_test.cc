#include "engine/upload_credits.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace fedfleet::engine {
namespace {

using Tokens = std::vector<uint64_t>;

TEST(UploadCredits, UnboundedGrantsEveryRequestAtTheNextSettle) {
  UploadCredits c(0, 30);
  EXPECT_FALSE(c.bounded());
  for (uint64_t t : {5, 3, 9}) c.request(t);
  EXPECT_EQ(c.waiting(), 3u);
  EXPECT_EQ(c.settle([](uint64_t) { return true; }), (Tokens{5, 3, 9}));  // in asking order
  EXPECT_EQ(c.inFlight(), 3u);
  EXPECT_EQ(c.waiting(), 0u);
  // Unbounded credits never name an idle upload.
  EXPECT_TRUE(c.idleUploads(1e9, [](uint64_t) { return 0.0; }).empty());
  EXPECT_FALSE(c.nextIdleCheck([](uint64_t) { return 0.0; }));
}

TEST(UploadCredits, BoundedGrantsInOrderAndFreesCreditsOfTasksThatEnded) {
  UploadCredits c(2, 0);
  std::set<uint64_t> pending = {1, 2, 3, 4};
  auto isPending = [&](uint64_t t) { return pending.count(t) > 0; };
  for (uint64_t t : {4, 1, 3, 2}) c.request(t);
  EXPECT_EQ(c.settle(isPending), (Tokens{4, 1}));
  EXPECT_TRUE(c.holds(4));
  EXPECT_FALSE(c.holds(3));
  EXPECT_EQ(c.settle(isPending), Tokens{});  // no credit free
  pending.erase(1);                          // completed, rejected, late, lost: all alike
  pending.erase(3);                          // a waiting request of a task that ended goes too
  EXPECT_EQ(c.settle(isPending), (Tokens{2}));
  EXPECT_FALSE(c.holds(1));
  EXPECT_EQ(c.inFlight(), 2u);
  EXPECT_EQ(c.waiting(), 0u);
  EXPECT_EQ(c.peakInFlight(), 2u);
}

TEST(UploadCredits, IdleUploadsAreThoseSilentForIdleSeconds) {
  UploadCredits c(3, 10);
  for (uint64_t t : {1, 2, 3}) c.request(t);
  c.settle([](uint64_t) { return true; });
  std::map<uint64_t, double> last = {{1, 100}, {2, 95}};  // 3: no longer pending
  auto activity = [&](uint64_t t) -> std::optional<double> {
    auto it = last.find(t);
    if (it == last.end()) return std::nullopt;
    return it->second;
  };
  EXPECT_EQ(c.idleUploads(104.9, activity), Tokens{});
  EXPECT_EQ(c.idleUploads(105, activity), (Tokens{2}));  // 105 - 95 >= 10
  EXPECT_EQ(c.idleUploads(110, activity), (Tokens{1, 2}));
  EXPECT_EQ(*c.nextIdleCheck(activity), 105);
  // idle_s = 0: never.
  UploadCredits never(3, 0);
  never.request(1);
  never.settle([](uint64_t) { return true; });
  EXPECT_TRUE(never.idleUploads(1e9, activity).empty());
}

}  // namespace
}  // namespace fedfleet::engine
