#include "sim/fleet.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

namespace fedfleet::sim {
namespace {

std::string writeFile(const std::string& name, const std::string& text) {
  const std::string path = std::string(FEDFLEET_TEST_TMP) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Fleet, ProfilesAreAPureFunctionOfSeedAndIndex) {
  auto a = Fleet::create("mobile-mix", 1000000, 7, {});
  auto b = Fleet::create("mobile-mix", 1000000, 7, {});
  auto c = Fleet::create("mobile-mix", 1000000, 8, {});
  ASSERT_TRUE(a.isOk() && b.isOk() && c.isOk());
  int differ = 0;
  for (uint64_t k : {0ull, 1ull, 999999ull, 123456ull, 42ull}) {
    const ClientProfile pa = a->profile(k), pb = b->profile(k), pc = c->profile(k);
    EXPECT_EQ(pa.speed, pb.speed);
    EXPECT_EQ(pa.up_bytes_per_s, pb.up_bytes_per_s);
    EXPECT_EQ(pa.phase_s, pb.phase_s);
    differ += pa.speed != pc.speed;
  }
  EXPECT_GE(differ, 4);  // another seed, another fleet
  // Asking in another order changes nothing.
  const ClientProfile late = a->profile(42);
  EXPECT_EQ(late.speed, b->profile(42).speed);
}

TEST(Fleet, MobileMixSpreadsComputeAndBandwidthOverTenfold) {
  auto fleet = Fleet::create("mobile-mix", 20000, 1, {});
  ASSERT_TRUE(fleet.isOk());
  std::vector<double> speed, up;
  std::vector<int> per_tier(fleet->tiers().size(), 0);
  for (uint64_t k = 0; k < 20000; ++k) {
    const ClientProfile p = fleet->profile(k);
    speed.push_back(p.speed);
    up.push_back(p.up_bytes_per_s);
    ++per_tier[p.tier];
  }
  auto ratio = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() * 95 / 100] / v[v.size() * 5 / 100];
  };
  EXPECT_GE(ratio(speed), 10.0);
  EXPECT_GE(ratio(up), 10.0);
  // Tier shares are honoured (15/35/35/15 %) within sampling noise.
  const double expect[] = {0.15, 0.35, 0.35, 0.15};
  for (size_t t = 0; t < per_tier.size(); ++t) {
    EXPECT_NEAR(per_tier[t] / 20000.0, expect[t], 0.015) << "tier " << t;
  }
}

TEST(Fleet, UniformFleetIsTheReferenceDevice) {
  auto fleet = Fleet::create("uniform", 10, 3, {});
  ASSERT_TRUE(fleet.isOk());
  const ClientProfile p = fleet->profile(9);
  EXPECT_EQ(p.speed, 1.0);
  EXPECT_EQ(p.up_bytes_per_s, 20e6 / 8);
  EXPECT_EQ(p.down_bytes_per_s, 50e6 / 8);
  EXPECT_EQ(p.latency_s, 0.02);
  EXPECT_TRUE(fleet->online(p, 12345.0));
  EXPECT_TRUE(std::isinf(fleet->onlineUntil(p, 0)));
}

TEST(Fleet, DiurnalAvailabilityKeepsEachClientOnlineItsHoursADay) {
  AvailabilityOptions avail;
  avail.mode = "diurnal";
  avail.online_hours = 6;
  auto fleet = Fleet::create("uniform", 5000, 11, avail);
  ASSERT_TRUE(fleet.isOk());
  // Per client: online for 6 of 24 hours, checked on a 1-minute grid over a day.
  const ClientProfile p = fleet->profile(17);
  int online_minutes = 0;
  for (int m = 0; m < 24 * 60; ++m) online_minutes += fleet->online(p, m * 60.0);
  EXPECT_NEAR(online_minutes, 6 * 60, 1);
  // Across the fleet at one instant: about a quarter online.
  int online = 0;
  for (uint64_t k = 0; k < 5000; ++k) online += fleet->online(fleet->profile(k), 3600.0);
  EXPECT_NEAR(online / 5000.0, 0.25, 0.03);
  // onlineUntil and nextOnline bound the window.
  double t = 0;
  while (!fleet->online(p, t)) t += 60;
  const double until = fleet->onlineUntil(p, t);
  EXPECT_GT(until, t);
  EXPECT_LE(until - t, 6 * 3600.0 + 1e-6);
  EXPECT_FALSE(fleet->online(p, until + 1));
  const double back = fleet->nextOnline(p, until + 1);
  EXPECT_TRUE(fleet->online(p, back + 1e-6));
  EXPECT_NEAR(back - (until - 6 * 3600.0), 86400.0, 120.0);  // one day after the window opened
}

TEST(Fleet, DropoutDrawsMatchTheProbability) {
  AvailabilityOptions avail;
  avail.dropout = 0.2;
  auto fleet = Fleet::create("uniform", 1000, 5, avail);
  ASSERT_TRUE(fleet.isOk());
  int drops = 0;
  for (uint64_t k = 0; k < 1000; ++k) {
    for (uint32_t r = 1; r <= 10; ++r) {
      double at = -1;
      if (fleet->dropsOut(fleet->profile(k), k, r, &at)) {
        ++drops;
        EXPECT_GE(at, 0.0);
        EXPECT_LT(at, 1.0);
      }
    }
  }
  EXPECT_NEAR(drops / 10000.0, 0.2, 0.02);
}

TEST(Fleet, CsvTiers) {
  const std::string path = writeFile("fleet_ok.csv",
                                     "name,share,device,speed,memory_mib,up_mbps,down_mbps,"
                                     "latency_ms,dropout\n"
                                     "fast,1,gpu,10,8192,100,100,5,0\n"
                                     "\"slow, old\",3,cpu,0.5,1024,1,4,200,0.1\n");
  auto fleet = Fleet::create(path, 4000, 2, {});
  ASSERT_TRUE(fleet.isOk()) << fleet.status().toString();
  ASSERT_EQ(fleet->tiers().size(), 2u);
  EXPECT_EQ(fleet->tiers()[1].name, "slow, old");
  int slow = 0;
  for (uint64_t k = 0; k < 4000; ++k) {
    const ClientProfile p = fleet->profile(k);
    if (p.tier == 1) {
      ++slow;
      EXPECT_EQ(p.speed, 0.5);  // no spread column: exact tier values
      EXPECT_EQ(p.up_bytes_per_s, 1e6 / 8);
      EXPECT_EQ(p.dropout, 0.1);
      EXPECT_FALSE(p.gpu);
    } else {
      EXPECT_TRUE(p.gpu);
      EXPECT_EQ(p.latency_s, 0.005);
    }
  }
  EXPECT_NEAR(slow / 4000.0, 0.75, 0.03);
}

TEST(Fleet, BadFleetsAreClearErrors) {
  auto unknown = Fleet::create("mobile", 10, 1, {});
  ASSERT_FALSE(unknown.isOk());
  EXPECT_NE(unknown.status().message().find("mobile-mix"), std::string::npos);

  auto missing = Fleet::create("/nonexistent/fleet.csv", 10, 1, {});
  ASSERT_FALSE(missing.isOk());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  struct Case {
    const char* text;
    const char* says;
  } cases[] = {
      {"name,share,device,speed,memory_mib,up_mbps,down_mbps,latency_ms,colour\n"
       "a,1,cpu,1,1,1,1,1,red\n",
       "unknown column 'colour'"},
      {"name,share,device,speed,memory_mib,up_mbps,down_mbps\na,1,cpu,1,1,1,1\n",
       "missing column 'latency_ms'"},
      {"name,share,device,speed,memory_mib,up_mbps,down_mbps,latency_ms\na,1,cpu,fast,1,1,1,1\n",
       "'speed' must be a number"},
      {"name,share,device,speed,memory_mib,up_mbps,down_mbps,latency_ms\na,1,tpu,1,1,1,1,1\n",
       "cpu or gpu"},
      {"name,share,device,speed,memory_mib,up_mbps,down_mbps,latency_ms\na,1,cpu,1,1,0,1,1\n",
       "up_mbps must be > 0"},
      {"name,share,device,speed,memory_mib,up_mbps,down_mbps,latency_ms\na,1,cpu,1,1,1\n",
       "6 fields"},
      {"name,share,device,speed,memory_mib,up_mbps,down_mbps,latency_ms\n", "no tiers"},
      {"name,share,device,speed,memory_mib,up_mbps,down_mbps,latency_ms\n\"a,1,cpu,1,1,1,1,1\n",
       "not valid CSV"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string path = writeFile("fleet_bad" + std::to_string(i++) + ".csv", c.text);
    auto fleet = Fleet::create(path, 10, 1, {});
    ASSERT_FALSE(fleet.isOk()) << c.text;
    EXPECT_EQ(fleet.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(fleet.status().message().find(c.says), std::string::npos)
        << fleet.status().message();
    EXPECT_NE(fleet.status().message().find(path), std::string::npos) << fleet.status().message();
  }
}

}  // namespace
}  // namespace fedfleet::sim
