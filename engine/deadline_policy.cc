#include "engine/deadline_policy.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/engine_options.h"

namespace fedfleet::engine {

Result<DeadlineMode> parseDeadlineMode(std::string_view name) {
  for (DeadlineMode m : {DeadlineMode::kFixed, DeadlineMode::kPercentile}) {
    if (name == deadlineModeName(m)) return m;
  }
  return invalidArgument("deadline mode '" + std::string(name) +
                         "': expected \"fixed\" or \"percentile\"");
}

const char* deadlineModeName(DeadlineMode mode) {
  return mode == DeadlineMode::kPercentile ? "percentile" : "fixed";
}

Status validateDeadlineOptions(const EngineOptions& o) {
  if (o.deadline_mode != DeadlineMode::kPercentile) return Status::ok();
  if (!(o.deadline_percentile > 0 && o.deadline_percentile <= 1)) {
    return invalidArgument("deadline_percentile must be in (0, 1], got " +
                           std::to_string(o.deadline_percentile));
  }
  if (o.deadline_window == 0) return invalidArgument("deadline_window must be at least 1");
  if (!(o.deadline_slack > 0)) {
    return invalidArgument("deadline_slack must be > 0, got " + std::to_string(o.deadline_slack));
  }
  return Status::ok();
}

std::unique_ptr<DeadlinePolicy> DeadlinePolicy::create(const EngineOptions& o) {
  if (o.async || o.deadline_mode == DeadlineMode::kFixed) {
    return std::make_unique<FixedDeadline>(o.deadline_s);
  }
  return std::make_unique<PercentileDeadline>(o.deadline_s, o.deadline_percentile,
                                              o.deadline_window, o.deadline_slack,
                                              o.clients_per_round);
}

double PercentileDeadline::startRound() {
  const double d = deadline();
  recent_.emplace_back();
  while (recent_.size() > window_ + 1) recent_.pop_front();
  return d;
}

void PercentileDeadline::observe(double duration_s) {
  if (recent_.empty()) recent_.emplace_back();
  recent_.back().push_back(duration_s);
}

double PercentileDeadline::deadline() const {
  std::vector<double> d;
  for (const auto& round : recent_) d.insert(d.end(), round.begin(), round.end());
  if (d.size() < min_durations_ || d.empty()) return max_deadline_s_;
  // The q-quantile by linear interpolation between order statistics (NumPy's default).
  std::sort(d.begin(), d.end());
  const double pos = percentile_ * static_cast<double>(d.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, d.size() - 1);
  const double q = d[lo] + (pos - static_cast<double>(lo)) * (d[hi] - d[lo]);
  return std::min(max_deadline_s_, q * slack_);
}

}  // namespace fedfleet::engine
