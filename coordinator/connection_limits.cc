#include "coordinator/connection_limits.h"

#include <fmt/format.h>

#include <algorithm>

namespace fedfleet::coordinator {

bool RateLimit::take(double now) {
  if (at_ >= 0 && now > at_) level_ = std::min(burst_, level_ + (now - at_) * rate_);
  at_ = std::max(at_, now);
  if (level_ < 1) return false;
  level_ -= 1;
  return true;
}

ConnectionLimits::ConnectionLimits(const ConnectionLimitOptions& o)
    : options_(o), limits_{RateLimit(o.bad_frames), RateLimit(o.hellos), RateLimit(o.heartbeats)} {}

bool ConnectionLimits::admit(Kind kind, double now) {
  if (!over_ && limits_[kind].take(now)) return true;
  over_ = true;
  ++refused_[kind];
  return false;
}

std::string ConnectionLimits::refusedSummary() const {
  const auto& o = options_;
  auto rate = [](const char* what, Rate r) {
    return fmt::format("{} {:g}/s burst {:g}", what, r.per_second, r.burst);
  };
  return fmt::format(
      "{} bad frames, {} Hellos, {} heartbeats refused (limits a connection: {}, {}, {})",
      refused_[kBadFrame], refused_[kHello], refused_[kHeartbeat], rate("bad frames", o.bad_frames),
      rate("Hellos", o.hellos), rate("heartbeats", o.heartbeats));
}

bool EventBudget::take(double now) {
  if (limit_.take(now)) return true;
  ++left_out_;
  return false;
}

}  // namespace fedfleet::coordinator
