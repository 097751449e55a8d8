// ConnectionAdmission: the limits on connections before they authenticate (MaxStartups'
// start:rate:full, per address, the descriptor reserve), decided from counts and a seeded
// generator.
#include "common/transport/connection_admission.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace fedfleet::transport {
namespace {

AdmissionOptions options(uint32_t full, uint32_t start, double rate, uint32_t per_host) {
  AdmissionOptions o;
  o.max_unauthenticated = full;
  o.early_drop_start = start;
  o.early_drop_rate = rate;
  o.max_unauthenticated_per_host = per_host;
  return o;
}

TEST(ConnectionAdmission, DropProbabilityRisesFromRateAtStartToOneAtFull) {
  ConnectionAdmission a(options(100, 40, 0.3, 0), 1);
  EXPECT_EQ(a.dropProbability(0), 0);
  EXPECT_EQ(a.dropProbability(39), 0);
  EXPECT_DOUBLE_EQ(a.dropProbability(40), 0.3);
  EXPECT_DOUBLE_EQ(a.dropProbability(70), 0.3 + 0.7 * 0.5);
  EXPECT_EQ(a.dropProbability(100), 1);
  EXPECT_EQ(a.dropProbability(5000), 1);
  // No start given: half of full.
  EXPECT_EQ(ConnectionAdmission(options(256, 0, 0.3, 0), 1).earlyDropStart(), 128u);
  // No limit at all.
  ConnectionAdmission unlimited(options(0, 0, 0.3, 0), 1);
  EXPECT_EQ(unlimited.dropProbability(1000000), 0);
  EXPECT_FALSE(unlimited.admit(1000000, 1000000 - 1, 0, 0).has_value());
}

TEST(ConnectionAdmission, BelowStartEveryConnectionStaysAndAtFullNoneDoes) {
  ConnectionAdmission a(options(100, 40, 0.3, 0), 7);
  for (uint64_t n = 0; n < 40; ++n) EXPECT_FALSE(a.admit(n, 0, 0, 0).has_value()) << n;
  for (uint64_t n : {100u, 101u, 150u}) {
    auto cause = a.admit(n, 0, 0, 0);
    ASSERT_TRUE(cause.has_value()) << n;
    EXPECT_EQ(*cause, RefusalCause::kUnauthenticatedLimit);
  }
}

TEST(ConnectionAdmission, EarlyDropRefusesAboutItsProbabilityAndASeedRepeatsIt) {
  auto draw = [](uint64_t seed) {
    ConnectionAdmission a(options(100, 40, 0.3, 0), seed);
    std::vector<bool> refused;
    for (int i = 0; i < 20000; ++i) refused.push_back(a.admit(70, 0, 0, 0).has_value());
    return refused;
  };
  const std::vector<bool> first = draw(42);
  int n = 0;
  for (bool r : first) n += r;
  EXPECT_NEAR(n / 20000.0, 0.65, 0.02);  // 0.3 + 0.7 * (70 - 40) / (100 - 40)
  EXPECT_EQ(draw(42), first);
  EXPECT_NE(draw(43), first);
  ConnectionAdmission a(options(100, 40, 0.3, 0), 1);
  for (int i = 0; i < 100; ++i) {
    auto cause = a.admit(99, 0, 0, 0);
    if (cause) {
      EXPECT_EQ(*cause, RefusalCause::kEarlyDrop);
    }
  }
}

TEST(ConnectionAdmission, OneAddressGetsItsShareOnly) {
  ConnectionAdmission a(options(100, 100, 0.3, 8), 1);
  EXPECT_FALSE(a.admit(10, 7, 0, 0).has_value());
  auto cause = a.admit(10, 8, 0, 0);
  ASSERT_TRUE(cause.has_value());
  EXPECT_EQ(*cause, RefusalCause::kPerHostLimit);
}

TEST(ConnectionAdmission, TheDescriptorReserveIsKeptForAuthenticatedConnections) {
  ConnectionAdmission a(options(1000, 1000, 0.3, 0), 1);
  // An eighth of the limit, at least 32, at most 4096.
  EXPECT_EQ(a.reserveFor(1024), 128u);
  EXPECT_EQ(a.reserveFor(100), 32u);
  EXPECT_EQ(a.reserveFor(1u << 20), 4096u);
  EXPECT_FALSE(a.overReserve(895, 1024));
  EXPECT_TRUE(a.overReserve(896, 1024));
  EXPECT_FALSE(a.overReserve(1u << 30, 0));  // no known limit: no check
  EXPECT_FALSE(a.admit(0, 0, 895, 1024).has_value());
  auto cause = a.admit(0, 0, 896, 1024);
  ASSERT_TRUE(cause.has_value());
  EXPECT_EQ(*cause, RefusalCause::kDescriptorReserve);
  AdmissionOptions fixed = options(1000, 1000, 0.3, 0);
  fixed.descriptor_reserve = 10;
  EXPECT_EQ(ConnectionAdmission(fixed, 1).reserveFor(1024), 10u);
  EXPECT_TRUE(ConnectionAdmission(fixed, 1).overReserve(1014, 1024));
}

TEST(ConnectionAdmission, EveryCauseHasItsOwnName) {
  std::set<std::string> names;
  for (RefusalCause c : {RefusalCause::kUnauthenticatedLimit, RefusalCause::kEarlyDrop,
                         RefusalCause::kPerHostLimit, RefusalCause::kDescriptorReserve,
                         RefusalCause::kHandshakeTimeout, RefusalCause::kSilentAfterHandshake,
                         RefusalCause::kPerKeyLimit, RefusalCause::kSilentWithoutHello}) {
    names.insert(refusalCauseName(c));
  }
  EXPECT_EQ(names.size(), 8u);
  EXPECT_EQ(names.count("unknown"), 0u);
}

}  // namespace
}  // namespace fedfleet::transport
