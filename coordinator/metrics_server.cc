#include "coordinator/metrics_server.h"

#include <httplib.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

namespace fedfleet::coordinator {
namespace {

// httplib serves each connection on one worker, reading its request with a wait of up to the
// read timeout for every piece: a client that sends half a request and stalls holds a worker
// that long. A fixed pool of workers, connections taken in arrival order, and at most
// kMetricsQueuedConnections waiting: beyond that enqueue(), called by httplib's listener
// thread, waits for room, so that further connections wait in the kernel's listen backlog
// instead of as descriptors of the coordinator (whose ZeroMQ sockets and history need them).
class BoundedPool final : public httplib::TaskQueue {
 public:
  BoundedPool(size_t workers, size_t max_queued) : max_queued_(max_queued) {
    for (size_t i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
  }
  ~BoundedPool() override = default;

  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    has_room_.wait(lock, [&] { return jobs_.size() < max_queued_ || stopping_; });
    jobs_.push_back(std::move(fn));
    has_job_.notify_one();
  }

  // Runs what is queued (each job closes its connection), then joins the workers.
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    has_job_.notify_all();
    has_room_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void work() {
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        has_job_.wait(lock, [&] { return !jobs_.empty() || stopping_; });
        if (jobs_.empty()) return;  // stopping, nothing left
        fn = std::move(jobs_.front());
        jobs_.pop_front();
        has_room_.notify_one();
      }
      fn();
    }
  }

  const size_t max_queued_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable has_job_, has_room_;
  std::deque<std::function<void()>> jobs_;  // guarded by mu_
  bool stopping_ = false;                   // guarded by mu_
};

}  // namespace

void DurationHistogram::observe(double seconds) {
  size_t i = 0;
  if (seconds > 0) {
    while (i < kBounds.size() && seconds > kBounds[i]) ++i;
  }
  if (i < kBounds.size()) ++in_bucket_[i];  // beyond the last bound: only in +Inf
  ++count_;
  if (std::isfinite(seconds) && seconds > 0) sum_ += seconds;
}

uint64_t DurationHistogram::cumulativeCount(size_t i) const {
  uint64_t total = 0;
  for (size_t j = 0; j <= i && j < in_bucket_.size(); ++j) total += in_bucket_[j];
  return total;
}

std::string formatPrometheus(const MetricsSnapshot& s) {
  // A registry of its own for each rendering: the snapshot is the state (the loop's, copied),
  // prometheus-cpp's families and TextSerializer are the format.
  prometheus::Registry registry;
  auto gauge = [&registry](const std::string& name, const std::string& help, double value) {
    prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({}).Set(value);
  };
  auto counter = [&registry](const std::string& name, const std::string& help, uint64_t value) {
    prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({}).Increment(
        static_cast<double>(value));
  };
  auto labelledCounter = [&registry](const std::string& name, const std::string& help,
                                     const std::string& label,
                                     const std::map<std::string, uint64_t>& values) {
    auto& family = prometheus::BuildCounter().Name(name).Help(help).Register(registry);
    for (const auto& [key, value] : values) {
      family.Add({{label, key}}).Increment(static_cast<double>(value));
    }
  };

  gauge("fedfleet_run_id", "Id of the run in the history database.", static_cast<double>(s.run_id));
  gauge("fedfleet_round", "The round in progress (the last one dispatched).", s.round);
  gauge("fedfleet_rounds_target", "Rounds this run is configured to train (run.rounds).",
        s.rounds_target);
  gauge("fedfleet_model_version", "Version of the global model (aggregations so far).",
        static_cast<double>(s.model_version));
  gauge("fedfleet_connected_clients", "Clients connected and alive.",
        static_cast<double>(s.connected_clients));
  if (s.test_accuracy) {
    gauge("fedfleet_test_accuracy", "Test accuracy (fraction) of the last evaluated round.",
          *s.test_accuracy);
  }
  if (s.test_loss) {
    gauge("fedfleet_test_loss", "Test loss of the last evaluated round.", *s.test_loss);
  }
  counter("fedfleet_rounds_committed_total",
          "Rounds written to the history by this process (round 0 included).", s.rounds_committed);
  counter("fedfleet_bytes_up_total", "Bytes received from clients in committed rounds.",
          s.bytes_up);
  counter("fedfleet_bytes_down_total", "Bytes sent to clients in committed rounds.", s.bytes_down);
  labelledCounter("fedfleet_updates_total", "Client updates of committed rounds by outcome.",
                  "status", s.updates_by_status);
  labelledCounter("fedfleet_events_total",
                  "Events recorded (rejections, refusals, drops, ...) by kind.", "kind",
                  s.events_by_kind);
  labelledCounter("fedfleet_refused_connections_total",
                  "Connections refused or closed before they became a client, by cause (the "
                  "limits of connections before authentication, failed handshakes, keys not in "
                  "the allow-list).",
                  "cause", s.refused_connections_by_cause);

  // The snapshot's counts per bucket, the last one +Inf's (beyond every bound).
  const auto& hist = s.round_duration;
  constexpr size_t kBuckets = DurationHistogram::kBounds.size();
  std::vector<double> in_bucket(kBuckets + 1);
  for (size_t i = 0; i < kBuckets; ++i) {
    in_bucket[i] =
        static_cast<double>(hist.cumulativeCount(i) - (i > 0 ? hist.cumulativeCount(i - 1) : 0));
  }
  in_bucket[kBuckets] = static_cast<double>(hist.count() - hist.cumulativeCount(kBuckets - 1));
  prometheus::BuildHistogram()
      .Name("fedfleet_round_duration_seconds")
      .Help("Duration of committed training rounds, dispatch to end.")
      .Register(registry)
      .Add({}, prometheus::Histogram::BucketBoundaries(DurationHistogram::kBounds.begin(),
                                                       DurationHistogram::kBounds.end()))
      .ObserveMultiple(in_bucket, hist.sum());
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

std::string formatStatusJson(const MetricsSnapshot& s) {
  nlohmann::ordered_json j;
  j["run_id"] = s.run_id;
  j["run_name"] = s.run_name;
  j["state"] = s.state;
  j["round"] = s.round;
  j["rounds_target"] = s.rounds_target;
  j["rounds_committed"] = s.rounds_committed;
  j["last_committed_round"] =
      s.last_committed_round ? nlohmann::ordered_json(*s.last_committed_round) : nullptr;
  j["model_version"] = s.model_version;
  j["connected_clients"] = s.connected_clients;
  j["bytes_up"] = s.bytes_up;
  j["bytes_down"] = s.bytes_down;
  auto optional = [](const std::optional<double>& v) {
    return v && std::isfinite(*v) ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
  };
  j["test_accuracy"] = optional(s.test_accuracy);
  j["test_loss"] = optional(s.test_loss);
  j["updates"] = s.updates_by_status;
  j["events"] = s.events_by_kind;
  j["refused_connections"] = s.refused_connections_by_cause;
  j["round_duration_count"] = s.round_duration.count();
  j["round_duration_sum_s"] = s.round_duration.sum();
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& bind_address,
                                                            uint16_t port) {
  const std::string where = bind_address + ":" + std::to_string(port);
  if (port == 0) return invalidArgument("metrics endpoint " + where + ": port 0 means off");
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->server_ = std::make_unique<httplib::Server>();
  // No scraper holds the others (docs/ARCHITECTURE.md, "Watching a run"): a bounded pool, each
  // connection one request, and every wait bounded: for the request to begin (keep-alive
  // timeout), for each piece of it (read timeout), for the client to take the answer (write).
  m->server_->new_task_queue = [] {
    return new BoundedPool(kMetricsWorkers, kMetricsQueuedConnections);
  };
  m->server_->set_keep_alive_max_count(1);
  m->server_->set_keep_alive_timeout(kMetricsTimeoutSeconds);
  m->server_->set_read_timeout(kMetricsTimeoutSeconds, 0);
  m->server_->set_write_timeout(kMetricsTimeoutSeconds, 0);
  m->server_->set_payload_max_length(kMetricsMaxRequestBody);
  // httplib's default sets SO_REUSEPORT, which lets a second coordinator bind the same port
  // and take half the scrapes. SO_REUSEADDR alone allows a quick restart (TIME_WAIT) but makes
  // a port another process listens on an error.
  m->server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  MetricsServer* self = m.get();
  m->server_->Get("/metrics", [self](const httplib::Request&, httplib::Response& res) {
    res.set_content(formatPrometheus(self->copySnapshot()), "text/plain; version=0.0.4");
  });
  m->server_->Get("/status", [self](const httplib::Request&, httplib::Response& res) {
    res.set_content(formatStatusJson(self->copySnapshot()), "application/json");
  });
  if (!m->server_->bind_to_port(bind_address, port)) {
    return unavailable("metrics endpoint: cannot listen on " + where +
                       " (port in use, or an address this host does not have); set "
                       "metrics.port to a free port, or 0 to turn the endpoint off, and "
                       "metrics.bind to a local address");
  }
  m->url_ = "http://" + where;
  m->thread_ = std::thread([self] { self->server_->listen_after_bind(); });
  // stop() only acts on a running server: wait until the thread is listening, so that a
  // MetricsServer destroyed at once still stops (bounded; the thread sets the flag first thing).
  for (int i = 0; i < 5000 && !m->server_->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return m;
}

MetricsServer::~MetricsServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void MetricsServer::publish(const MetricsSnapshot& snapshot) {
  std::lock_guard<std::mutex> lock(mu_);
  snapshot_ = snapshot;
}

MetricsSnapshot MetricsServer::copySnapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

}  // namespace fedfleet::coordinator
