#include "coordinator/metrics_server.h"

#include <httplib.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

namespace fedfleet::coordinator {
namespace {

// Go's ParseFloat reads what Prometheus scrapes: shortest round-trip text, NaN, +Inf, -Inf.
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : "NaN";
}

// A label value with backslash, double quote and newline escaped, as the format requires.
std::string labelValue(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, const std::string& name, const std::string& value) {
  out += name;
  out += ' ';
  out += value;
  out += '\n';
}

void gauge(std::string& out, const char* name, const char* help, const std::string& value) {
  header(out, name, "gauge", help);
  sample(out, name, value);
}

void counter(std::string& out, const char* name, const char* help, uint64_t value) {
  header(out, name, "counter", help);
  sample(out, name, std::to_string(value));
}

void labelledCounter(std::string& out, const char* name, const char* help, const char* label,
                     const std::map<std::string, uint64_t>& values) {
  header(out, name, "counter", help);
  for (const auto& [key, value] : values) {
    sample(out, std::string(name) + "{" + label + "=\"" + labelValue(key) + "\"}",
           std::to_string(value));
  }
}

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
  std::string out;
  gauge(out, "fedfleet_run_id", "Id of the run in the history database.", std::to_string(s.run_id));
  gauge(out, "fedfleet_round", "The round in progress (the last one dispatched).",
        std::to_string(s.round));
  gauge(out, "fedfleet_rounds_target", "Rounds this run is configured to train (run.rounds).",
        std::to_string(s.rounds_target));
  gauge(out, "fedfleet_model_version", "Version of the global model (aggregations so far).",
        std::to_string(s.model_version));
  gauge(out, "fedfleet_connected_clients", "Clients connected and alive.",
        std::to_string(s.connected_clients));
  if (s.test_accuracy) {
    gauge(out, "fedfleet_test_accuracy", "Test accuracy (fraction) of the last evaluated round.",
          number(*s.test_accuracy));
  }
  if (s.test_loss) {
    gauge(out, "fedfleet_test_loss", "Test loss of the last evaluated round.",
          number(*s.test_loss));
  }
  counter(out, "fedfleet_rounds_committed_total",
          "Rounds written to the history by this process (round 0 included).", s.rounds_committed);
  counter(out, "fedfleet_bytes_up_total", "Bytes received from clients in committed rounds.",
          s.bytes_up);
  counter(out, "fedfleet_bytes_down_total", "Bytes sent to clients in committed rounds.",
          s.bytes_down);
  labelledCounter(out, "fedfleet_updates_total", "Client updates of committed rounds by outcome.",
                  "status", s.updates_by_status);
  labelledCounter(out, "fedfleet_events_total",
                  "Events recorded (rejections, refusals, drops, ...) by kind.", "kind",
                  s.events_by_kind);

  const char* h = "fedfleet_round_duration_seconds";
  header(out, h, "histogram", "Duration of committed training rounds, dispatch to end.");
  const auto& hist = s.round_duration;
  for (size_t i = 0; i < DurationHistogram::kBounds.size(); ++i) {
    sample(out, std::string(h) + "_bucket{le=\"" + number(DurationHistogram::kBounds[i]) + "\"}",
           std::to_string(hist.cumulativeCount(i)));
  }
  sample(out, std::string(h) + "_bucket{le=\"+Inf\"}", std::to_string(hist.count()));
  sample(out, std::string(h) + "_sum", number(hist.sum()));
  sample(out, std::string(h) + "_count", std::to_string(hist.count()));
  return out;
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
  // Scrapes are rare and cheap: two workers, not one per core.
  m->server_->new_task_queue = [] { return new httplib::ThreadPool(2); };
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
