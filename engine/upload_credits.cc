#include "engine/upload_credits.h"

#include <algorithm>

namespace fedfleet::engine {

std::vector<uint64_t> UploadCredits::settle(const Pending& pending) {
  std::erase_if(granted_, [&](uint64_t token) { return !pending(token); });
  std::erase_if(queue_, [&](uint64_t token) { return !pending(token); });
  std::vector<uint64_t> out;
  while (!queue_.empty() && (!bounded() || granted_.size() < max_concurrent_)) {
    const uint64_t token = queue_.front();
    queue_.pop_front();
    granted_.insert(token);
    peak_ = std::max(peak_, granted_.size());
    out.push_back(token);
  }
  return out;
}

std::vector<uint64_t> UploadCredits::idleUploads(double now, const LastActivity& last) const {
  std::vector<uint64_t> out;
  if (!checksIdle()) return out;
  for (uint64_t token : granted_) {
    const std::optional<double> at = last(token);
    if (at && now >= *at + idle_s_) out.push_back(token);  // the form nextIdleCheck names
  }
  return out;
}

std::optional<double> UploadCredits::nextIdleCheck(const LastActivity& last) const {
  std::optional<double> t;
  if (!checksIdle()) return t;
  for (uint64_t token : granted_) {
    if (const std::optional<double> at = last(token)) {
      const double v = *at + idle_s_;
      t = t ? std::min(*t, v) : v;
    }
  }
  return t;
}

}  // namespace fedfleet::engine
