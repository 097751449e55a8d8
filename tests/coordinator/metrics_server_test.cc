// The metrics endpoint: Prometheus text and status JSON rendered from a snapshot, served over
// HTTP, and a clear error when the port is taken.
#include "coordinator/metrics_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/process.h"

namespace fedfleet::coordinator {
namespace {

// Samples of a Prometheus text: "name{labels}" -> value. Fails the test on a malformed line.
std::map<std::string, std::string> samples(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    EXPECT_NE(space, std::string::npos) << line;
    if (space == std::string::npos) continue;
    out[line.substr(0, space)] = line.substr(space + 1);
  }
  return out;
}

MetricsSnapshot exampleSnapshot() {
  MetricsSnapshot s;
  s.run_id = 7;
  s.run_name = "m\"x";
  s.state = "running";
  s.rounds_target = 10;
  s.round = 4;
  s.rounds_committed = 4;  // rounds 0..3
  s.last_committed_round = 3;
  s.model_version = 3;
  s.connected_clients = 5;
  s.bytes_up = 123456789;
  s.bytes_down = 42;
  s.test_accuracy = 0.625;
  s.test_loss = 1.5;
  s.updates_by_status = {{"completed", 9}, {"late", 2}, {"rejected", 1}};
  s.events_by_kind = {{"auth_rejected", 3}, {"update_rejected", 1}};
  for (double d : {0.2, 1.5, 7.0}) s.round_duration.observe(d);
  return s;
}

TEST(DurationHistogram, BucketsAreCumulativeAndCountEveryObservation) {
  DurationHistogram h;
  for (double d : {0.1, 0.5, 0.7, 3.0, 3.0, 1e6, -1.0}) h.observe(d);
  EXPECT_EQ(h.count(), 7u);
  EXPECT_DOUBLE_EQ(h.sum(), 0.1 + 0.5 + 0.7 + 3.0 + 3.0 + 1e6);  // the negative one adds 0
  // le=0.5 holds 0.1, 0.5 and the negative value; le=1 adds 0.7; le=5 adds the two 3s.
  EXPECT_EQ(h.cumulativeCount(0), 3u);
  EXPECT_EQ(h.cumulativeCount(1), 4u);
  EXPECT_EQ(h.cumulativeCount(2), 4u);
  EXPECT_EQ(h.cumulativeCount(3), 6u);
  // 1e6 s is beyond the last bound: only in +Inf (the count).
  EXPECT_EQ(h.cumulativeCount(DurationHistogram::kBounds.size() - 1), 6u);
}

TEST(MetricsFormat, PrometheusTextCarriesTheSnapshot) {
  const std::string text = formatPrometheus(exampleSnapshot());
  auto m = samples(text);
  EXPECT_EQ(m["fedfleet_run_id"], "7");
  EXPECT_EQ(m["fedfleet_round"], "4");
  EXPECT_EQ(m["fedfleet_rounds_target"], "10");
  EXPECT_EQ(m["fedfleet_model_version"], "3");
  EXPECT_EQ(m["fedfleet_connected_clients"], "5");
  EXPECT_EQ(m["fedfleet_test_accuracy"], "0.625");
  EXPECT_EQ(m["fedfleet_test_loss"], "1.5");
  EXPECT_EQ(m["fedfleet_rounds_committed_total"], "4");
  EXPECT_EQ(m["fedfleet_bytes_up_total"], "123456789");
  EXPECT_EQ(m["fedfleet_bytes_down_total"], "42");
  EXPECT_EQ(m["fedfleet_updates_total{status=\"late\"}"], "2");
  EXPECT_EQ(m["fedfleet_events_total{kind=\"auth_rejected\"}"], "3");
  EXPECT_EQ(m["fedfleet_round_duration_seconds_bucket{le=\"0.5\"}"], "1");
  EXPECT_EQ(m["fedfleet_round_duration_seconds_bucket{le=\"2\"}"], "2");
  EXPECT_EQ(m["fedfleet_round_duration_seconds_bucket{le=\"10\"}"], "3");
  EXPECT_EQ(m["fedfleet_round_duration_seconds_bucket{le=\"+Inf\"}"], "3");
  EXPECT_EQ(m["fedfleet_round_duration_seconds_count"], "3");
  EXPECT_DOUBLE_EQ(std::stod(m["fedfleet_round_duration_seconds_sum"]), 0.2 + 1.5 + 7.0);
  EXPECT_NE(text.find("# TYPE fedfleet_round_duration_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE fedfleet_bytes_up_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE fedfleet_round gauge\n"), std::string::npos);
}

TEST(MetricsFormat, AccuracyIsLeftOutUntilARoundWasEvaluated) {
  MetricsSnapshot s;
  const std::string text = formatPrometheus(s);
  EXPECT_EQ(text.find("fedfleet_test_accuracy"), std::string::npos) << text;
  EXPECT_EQ(samples(text)["fedfleet_round_duration_seconds_count"], "0");
  auto j = nlohmann::json::parse(formatStatusJson(s));
  EXPECT_TRUE(j["test_accuracy"].is_null());
  EXPECT_TRUE(j["last_committed_round"].is_null());
}

TEST(MetricsFormat, StatusJsonCarriesTheSnapshot) {
  auto j = nlohmann::json::parse(formatStatusJson(exampleSnapshot()));
  EXPECT_EQ(j["run_id"], 7);
  EXPECT_EQ(j["run_name"], "m\"x");
  EXPECT_EQ(j["state"], "running");
  EXPECT_EQ(j["round"], 4);
  EXPECT_EQ(j["last_committed_round"], 3);
  EXPECT_EQ(j["bytes_up"], 123456789);
  EXPECT_DOUBLE_EQ(j["test_accuracy"].get<double>(), 0.625);
  EXPECT_EQ(j["updates"]["completed"], 9);
  EXPECT_EQ(j["events"]["update_rejected"], 1);
}

TEST(MetricsServer, ServesTheLastPublishedSnapshot) {
  const int port = testing::freeLoopbackPort();
  auto server = MetricsServer::start("127.0.0.1", static_cast<uint16_t>(port));
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  EXPECT_EQ((*server)->url(), "http://127.0.0.1:" + std::to_string(port));
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);

  MetricsSnapshot s = exampleSnapshot();
  (*server)->publish(s);
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  EXPECT_EQ(samples(res->body)["fedfleet_round"], "4");

  s.round = 5;
  (*server)->publish(s);
  res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(samples(res->body)["fedfleet_round"], "5");

  res = client.Get("/status");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(nlohmann::json::parse(res->body)["round"], 5);

  res = client.Get("/nothing");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
}

TEST(MetricsServer, APortInUseIsAClearError) {
  const int port = testing::freeLoopbackPort();
  auto first = MetricsServer::start("127.0.0.1", static_cast<uint16_t>(port));
  ASSERT_TRUE(first.isOk()) << first.status().toString();
  auto second = MetricsServer::start("127.0.0.1", static_cast<uint16_t>(port));
  ASSERT_FALSE(second.isOk());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << second.status().message();
  EXPECT_NE(second.status().message().find("metrics.port"), std::string::npos);
}

TEST(MetricsServer, StopsPromptlyRightAfterStarting) {
  for (int i = 0; i < 3; ++i) {
    auto server =
        MetricsServer::start("127.0.0.1", static_cast<uint16_t>(testing::freeLoopbackPort()));
    ASSERT_TRUE(server.isOk()) << server.status().toString();
  }  // each destructor must return (a hang fails the test by its timeout)
}

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A connection to 127.0.0.1:`port` that sends `first` (half a request, or nothing) and stalls.
int stalledConnection(int port, const std::string& first) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  if (!first.empty()) EXPECT_EQ(::send(fd, first.data(), first.size(), 0), ssize_t(first.size()));
  return fd;
}

// Seconds until the server closes `fd` (reads return 0 or fail), or -1 after `limit_s`.
double secondsUntilClosed(int fd, Clock::time_point since, double limit_s) {
  while (secondsSince(since) < limit_s) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) > 0) {
      char buf[4096];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return secondsSince(since);
    }
  }
  return -1;
}

// The half-requests of a slow or hostile scraper: a request line cut short, headers without
// their end, and a connection that says nothing.
std::string halfRequest(size_t i) {
  switch (i % 3) {
    case 0:
      return "GET /metr";
    case 1:
      return "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    default:
      return "";
  }
}

// Seconds one scrape of /metrics by a fresh client takes; -1 when it fails.
double timedScrape(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(10);
  client.set_read_timeout(10);
  const auto t0 = Clock::now();
  auto res = client.Get("/metrics");
  const double s = secondsSince(t0);
  if (!res || res->status != 200 || res->body.find("fedfleet_round 4") == std::string::npos) {
    return -1;
  }
  return s;
}

// Connections that send half a request and stall cannot hold a scrape: with one fewer than the
// pool's workers stalled, scrapes are answered at once, and the server closes each stalled
// connection after about its timeout.
TEST(MetricsServer, StalledScrapersDoNotHoldAScrape) {
  const int port = testing::freeLoopbackPort();
  auto server = MetricsServer::start("127.0.0.1", static_cast<uint16_t>(port));
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  (*server)->publish(exampleSnapshot());
  const auto t0 = Clock::now();
  std::vector<int> stalled;
  for (size_t i = 0; i + 1 < kMetricsWorkers; ++i) {
    stalled.push_back(stalledConnection(port, halfRequest(i)));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // each taken by a worker
  double slowest = 0;
  for (int i = 0; i < 3; ++i) {
    const double s = timedScrape(port);
    ASSERT_GE(s, 0) << "scrape " << i << " failed";
    slowest = std::max(slowest, s);
  }
  std::printf("metrics: slowest of 3 scrapes beside %zu stalled connections: %.3f s\n",
              stalled.size(), slowest);
  EXPECT_LT(slowest, 1.0);
  for (size_t i = 0; i < stalled.size(); ++i) {
    const double closed = secondsUntilClosed(stalled[i], t0, 10);
    EXPECT_GE(closed, 0.5 * kMetricsTimeoutSeconds) << "connection " << i;
    EXPECT_LT(closed, 3.0 * kMetricsTimeoutSeconds + 1) << "connection " << i << " not closed";
    ::close(stalled[i]);
  }
}

// More stalled connections than workers: a scrape waits for the first of them to time out,
// once per pool's worth of them, not for ever.
TEST(MetricsServer, MoreStalledScrapersThanWorkersDelayAScrapeByTheirTimeoutOnly) {
  const int port = testing::freeLoopbackPort();
  auto server = MetricsServer::start("127.0.0.1", static_cast<uint16_t>(port));
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  (*server)->publish(exampleSnapshot());
  std::vector<int> stalled;
  for (size_t i = 0; i < 2 * kMetricsWorkers; ++i) {
    stalled.push_back(stalledConnection(port, halfRequest(i)));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double s = timedScrape(port);
  std::printf("metrics: a scrape behind %zu stalled connections (%zu workers): %.3f s\n",
              stalled.size(), kMetricsWorkers, s);
  ASSERT_GE(s, 0);
  // Two waves of stalled connections ahead of it, each closed after the timeout.
  EXPECT_LT(s, 2.0 * kMetricsTimeoutSeconds + 1.5);
  for (int fd : stalled) ::close(fd);
}

}  // namespace
}  // namespace fedfleet::coordinator
