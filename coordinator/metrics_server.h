// Live metrics of a coordinator over HTTP: GET /metrics in the Prometheus text exposition format
// (version 0.0.4) and GET /status as one JSON object.
//
// The coordinator's event loop owns a MetricsSnapshot, updates it as rounds go by and hands a
// copy to MetricsServer::publish(); the server's own threads (cpp-httplib's listener and a
// bounded worker pool) only read the last published copy, under the server's mutex. The loop
// therefore never waits on a scrape beyond that copy, and a slow scraper never sees a half-updated
// round. The text is prometheus-cpp's (a Registry of Gauge, Counter and Histogram families rendered
// by its TextSerializer); only coordinator/metrics_server.cc includes httplib.h and prometheus/.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/status.h"

namespace httplib {
class Server;
}

namespace fedfleet::coordinator {

// A Prometheus histogram with fixed buckets. The bounds are upper limits in seconds; counts are
// per bucket here and made cumulative when rendered (`_bucket{le="..."}`), with `+Inf` = count.
class DurationHistogram {
 public:
  static constexpr std::array<double, 12> kBounds = {0.5, 1,  2,   5,   10,  20,
                                                     30,  60, 120, 300, 600, 1800};

  // Adds one observation; NaN and negative values are counted in the lowest bucket (a clock
  // step backwards must not make the histogram inconsistent).
  void observe(double seconds);

  // Observations <= kBounds[i] (cumulative), i in [0, kBounds.size()).
  uint64_t cumulativeCount(size_t i) const;
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::array<uint64_t, kBounds.size()> in_bucket_{};  // observations in (kBounds[i-1], kBounds[i]]
  uint64_t count_ = 0;
  double sum_ = 0;
};

// What the coordinator reports; the loop thread fills it, MetricsServer reads copies.
struct MetricsSnapshot {
  int64_t run_id = 0;
  std::string run_name;
  std::string state = "starting";  // "starting", "running", "finished", "failed", "interrupted"
  uint32_t rounds_target = 0;      // run.rounds
  uint32_t round = 0;              // the round in progress (the last one dispatched)
  uint32_t rounds_committed = 0;   // rounds written to the history in this process (round 0 too)
  std::optional<uint32_t> last_committed_round;
  uint64_t model_version = 0;
  uint64_t connected_clients = 0;
  uint64_t bytes_up = 0;  // sum over the committed rounds of this process
  uint64_t bytes_down = 0;
  std::optional<double> test_accuracy;  // of the last evaluated round
  std::optional<double> test_loss;
  std::map<std::string, uint64_t> updates_by_status;  // "completed", "late", "dropped", "rejected"
  std::map<std::string, uint64_t> events_by_kind;     // every recorded event ("auth_rejected",
                                                      // "malformed_frame", "update_rejected", ...)
  // Connections refused or closed before they became a client, by cause: the transport's
  // limits (transport::refusalCauseName: "per_host_limit", "handshake_timeout", ...),
  // "handshake_failed" and "key_refused".
  std::map<std::string, uint64_t> refused_connections_by_cause;
  DurationHistogram round_duration;  // end - start of committed training rounds (not round 0)
};

// The Prometheus text of `snapshot`, rendered by prometheus-cpp's TextSerializer: per metric
// family its HELP and TYPE lines, then its samples. Metric names:
//   fedfleet_run_id, fedfleet_round, fedfleet_rounds_target, fedfleet_model_version,
//   fedfleet_connected_clients, fedfleet_test_accuracy, fedfleet_test_loss (gauges; the last two
//   only once a round was evaluated), fedfleet_rounds_committed_total, fedfleet_bytes_up_total,
//   fedfleet_bytes_down_total, fedfleet_updates_total{status}, fedfleet_events_total{kind},
//   fedfleet_refused_connections_total{cause} (counters), fedfleet_round_duration_seconds
//   (histogram).
std::string formatPrometheus(const MetricsSnapshot& snapshot);

// The JSON object of GET /status (run, state, rounds, model version, clients, bytes, last
// accuracy and loss or null, updates and events by kind, refused connections by cause), with a
// trailing newline.
std::string formatStatusJson(const MetricsSnapshot& snapshot);

// How the endpoint bounds its clients, so that no scraper can hold the others: a pool of
// kMetricsWorkers threads serves one connection each, one request per connection; a connection
// must begin its request within kMetricsTimeoutSeconds, send each further piece of it within as
// long, and take each piece of the answer within as long, or it is closed. Connections beyond
// the workers wait, at most kMetricsQueuedConnections of them; further ones wait in the kernel's
// listen backlog. So up to kMetricsWorkers - 1 stalled connections cost a scrape nothing, and
// more delay it by about kMetricsTimeoutSeconds for each kMetricsWorkers of them.
constexpr size_t kMetricsWorkers = 8;
constexpr size_t kMetricsQueuedConnections = 64;
constexpr int kMetricsTimeoutSeconds = 1;
constexpr size_t kMetricsMaxRequestBody = 4096;  // GET requests carry none

// Serves the last published snapshot on its own threads.
class MetricsServer {
 public:
  // Binds `bind_address`:`port` and starts serving. A port already in use or an address this
  // host does not have is kUnavailable naming the address and the config keys; nothing keeps
  // running then. `port` must be in 1..65535 (the caller turns the endpoint off with 0).
  static Result<std::unique_ptr<MetricsServer>> start(const std::string& bind_address,
                                                      uint16_t port);

  // Stops listening and joins the server thread.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Replaces the snapshot that requests see. Safe from any thread.
  void publish(const MetricsSnapshot& snapshot);

  // "http://ADDRESS:PORT".
  std::string url() const { return url_; }

 private:
  MetricsServer() = default;
  MetricsSnapshot copySnapshot() const;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string url_;
  mutable std::mutex mu_;
  MetricsSnapshot snapshot_;  // GUARDED_BY(mu_)
};

}  // namespace fedfleet::coordinator
