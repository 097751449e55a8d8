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
    : options_(o),
      limits_{RateLimit(o.bad_frames_per_s, o.bad_frames_burst),
              RateLimit(o.hellos_per_s, o.hellos_burst),
              RateLimit(o.heartbeats_per_s, o.heartbeats_burst)} {}

bool ConnectionLimits::admit(Kind kind, double now) {
  if (!over_ && limits_[kind].take(now)) return true;
  over_ = true;
  ++refused_[kind];
  return false;
}

std::string ConnectionLimits::refusedSummary() const {
  const auto& o = options_;
  auto formatNumber = [](double x) { return fmt::format("{:g}", x); };
  return std::to_string(refused_[kBadFrame]) + " bad frames, " + std::to_string(refused_[kHello]) +
         " Hellos, " + std::to_string(refused_[kHeartbeat]) +
         " heartbeats refused (limits a connection: bad frames " +
         formatNumber(o.bad_frames_per_s) + "/s burst " + formatNumber(o.bad_frames_burst) +
         ", Hellos " + formatNumber(o.hellos_per_s) + "/s burst " + formatNumber(o.hellos_burst) +
         ", heartbeats " + formatNumber(o.heartbeats_per_s) + "/s burst " +
         formatNumber(o.heartbeats_burst) + ")";
}

bool EventBudget::take(double now) {
  if (limit_.take(now)) return true;
  ++left_out_;
  return false;
}

}  // namespace fedfleet::coordinator
