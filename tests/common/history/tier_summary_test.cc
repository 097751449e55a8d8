#include "common/history/tier_summary.h"

#include <gtest/gtest.h>

namespace fedfleet::history {
namespace {

ClientRecord client(const std::string& id, const std::string& kind, const std::string& name) {
  ClientRecord c;
  c.client_id = id;
  c.device_kind = kind;
  c.device_name = name;
  return c;
}

UpdateRecord update(const std::string& id, const std::string& status, double start, double end) {
  UpdateRecord u;
  u.client_id = id;
  u.status = status;
  u.start_time = start;
  u.end_time = end;
  return u;
}

TEST(TierSummary, CountsEachStatusPerDeviceName) {
  const std::vector<ClientRecord> clients = {
      client("a", "cpu", "phone"),  client("b", "cpu", "phone"),
      client("c", "cuda", "board"), client("d", "cpu", ""),  // no name: its kind
      client("e", "cuda", "phone"),                          // same name, other kind
  };
  const std::vector<UpdateRecord> updates = {
      update("a", "completed", 0, 2), update("b", "completed", 0, 4),
      update("a", "late", 5, 9),      update("c", "dropped", 0, 1),
      update("c", "rejected", 2, 3),  update("d", "completed", 0, 1),
      update("zz", "late", 0, 30),  // no client row
      update("e", "late", 0, 7),
  };
  const auto tiers = summarizeTiers(updates, clients);
  ASSERT_EQ(tiers.size(), 4u);  // by name: "-", "board", "cpu", "phone"
  EXPECT_EQ(tiers[0].tier, "-");
  EXPECT_EQ(tiers[0].device_kind, "");
  EXPECT_EQ(tiers[0].late, 1u);
  EXPECT_EQ(tiers[1].tier, "board");
  EXPECT_EQ(tiers[1].device_kind, "cuda");
  EXPECT_EQ(tiers[1].clients, 1u);
  EXPECT_EQ(tiers[1].updates, 2u);
  EXPECT_EQ(tiers[1].dropped, 1u);
  EXPECT_EQ(tiers[1].rejected, 1u);
  EXPECT_EQ(tiers[1].completed, 0u);
  EXPECT_EQ(tiers[1].mean_completed_s, 0.0);
  EXPECT_EQ(tiers[2].tier, "cpu");
  EXPECT_EQ(tiers[2].completed, 1u);
  const TierSummary& phone = tiers[3];
  EXPECT_EQ(phone.tier, "phone");
  EXPECT_EQ(phone.device_kind, "mixed");
  EXPECT_EQ(phone.clients, 3u);
  EXPECT_EQ(phone.updates, 4u);
  EXPECT_EQ(phone.completed, 2u);
  EXPECT_EQ(phone.late, 2u);
  EXPECT_DOUBLE_EQ(phone.mean_completed_s, 3.0);  // (2 + 4) / 2; late updates not counted
}

TEST(TierSummary, NoUpdatesNoTiers) {
  EXPECT_TRUE(summarizeTiers({}, {client("a", "cpu", "phone")}).empty());
}

}  // namespace
}  // namespace fedfleet::history
