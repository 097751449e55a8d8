// RefusalLog: refusals before a connection became a client, one report at once and one per
// group and interval after, however long a flood goes on.
#include "coordinator/refusal_log.h"

#include <gtest/gtest.h>

#include <string>

namespace fedfleet::coordinator {
namespace {

TEST(RefusalLog, TheFirstIsReportedAtOnceAndTheRestOncePerInterval) {
  RefusalLog log(60);
  auto first = log.note("handshake_refused", "10.0.0.7:5000", "wrong key", 0);
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(first->first);
  EXPECT_EQ(first->text(), "wrong key (from 10.0.0.7)");
  // A new port, the same host: counted.
  EXPECT_FALSE(log.note("handshake_refused", "10.0.0.7:5001", "wrong key", 1).has_value());
  EXPECT_FALSE(log.note("handshake_refused", "10.0.0.7:5002", "wrong key", 2, 10).has_value());
  EXPECT_TRUE(log.flush(59).empty());
  auto reports = log.flush(60);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].count, 11u);
  EXPECT_EQ(reports[0].text(), "11 more from 10.0.0.7: wrong key");
  // Still refused: counted into the next interval's report, not reported at once again.
  EXPECT_FALSE(log.note("handshake_refused", "10.0.0.7:5003", "wrong key", 70).has_value());
  EXPECT_TRUE(log.flush(100).empty());
  reports = log.flush(120);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].count, 1u);
  // Quiet for a whole interval: forgotten, so the next one is reported at once.
  EXPECT_TRUE(log.flush(180).empty());
  EXPECT_TRUE(log.note("handshake_refused", "10.0.0.7:5004", "wrong key", 181).has_value());
  EXPECT_EQ(log.totals().at("handshake_refused"), 14u);
}

TEST(RefusalLog, AKindGroupedAcrossHostsIsOneReportWithItsDetailsAndBusiestHosts) {
  RefusalLog log(60);
  log.groupAcrossHosts("connection_refused");
  auto first = log.note("connection_refused", "127.0.0.2", "closed by a limit", 0, 40, "per host");
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->text(), "closed by a limit: per host (from 127.0.0.2)");
  for (int h = 3; h <= 9; ++h) {
    const std::string host = "127.0.0." + std::to_string(h);
    EXPECT_FALSE(log.note("connection_refused", host, "closed by a limit", 1, h, "per host"));
    EXPECT_FALSE(log.note("connection_refused", host, "closed by a limit", 2, 1, "timeout"));
  }
  // Another kind still goes by host.
  EXPECT_TRUE(log.note("handshake_refused", "127.0.0.2", "plain text", 3).has_value());
  auto reports = log.flush(60);
  ASSERT_EQ(reports.size(), 1u);
  const RefusalLog::Report& r = reports[0];
  EXPECT_EQ(r.count, 39u + 42u + 7u);
  ASSERT_EQ(r.details.size(), 2u);
  EXPECT_EQ(r.details[0], (std::pair<std::string, uint64_t>{"per host", 81}));
  EXPECT_EQ(r.details[1], (std::pair<std::string, uint64_t>{"timeout", 7}));
  ASSERT_EQ(r.hosts.size(), RefusalLog::kListed + 1);
  EXPECT_EQ(r.hosts[0], (std::pair<std::string, uint64_t>{"127.0.0.2", 39}));
  EXPECT_EQ(r.hosts[1], (std::pair<std::string, uint64_t>{"127.0.0.9", 10}));
  EXPECT_EQ(r.hosts.back().first, "other hosts");
  EXPECT_EQ(r.text().rfind("88 more: closed by a limit (81 per host; 7 timeout), from 127.0.0.2 "
                           "(39), 127.0.0.9 (10), ",
                           0),
            0u)
      << r.text();
}

TEST(RefusalLog, FlushAllReportsWhatIsCountedWhateverTheInterval) {
  RefusalLog log(60);
  log.note("auth_rejected", "10.0.0.1:1", "key K", 0);
  log.note("auth_rejected", "10.0.0.1:2", "key K", 1, 5);
  log.note("auth_rejected", "10.0.0.2:1", "key K", 2);  // a first: nothing counted
  auto reports = log.flushAll();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].count, 5u);
  EXPECT_TRUE(log.flushAll().empty());
}

TEST(RefusalLog, HostsAreAddressesWithoutPorts) {
  EXPECT_EQ(RefusalLog::hostOf("10.0.0.7:53122"), "10.0.0.7");
  EXPECT_EQ(RefusalLog::hostOf("[::1]:4000"), "[::1]");
  EXPECT_EQ(RefusalLog::hostOf("127.0.0.2"), "127.0.0.2");
  EXPECT_EQ(RefusalLog::hostOf("an address not known"), "an address not known");
}

}  // namespace
}  // namespace fedfleet::coordinator
