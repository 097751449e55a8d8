#include "client/token_bucket.h"

#include <algorithm>

namespace fedfleet::client {

TokenBucket::TokenBucket(double rate_bytes_per_s, double burst_bytes, double now)
    : rate_(rate_bytes_per_s), burst_(std::max(1.0, burst_bytes)), level_(burst_), at_(now) {}

double TokenBucket::level(double now) const {
  if (unlimited()) return burst_;
  if (now <= at_) return now == at_ ? level_ : 0;
  return std::min(burst_, level_ + (now - at_) * rate_);
}

double TokenBucket::reserve(size_t bytes, double now) {
  if (unlimited()) return now;
  const double t = std::max(now, at_);
  const double have = level(t);
  const double need = static_cast<double>(bytes);
  if (have >= need) {
    level_ = have - need;
    at_ = t;
    return t;
  }
  at_ = t + (need - have) / rate_;
  level_ = 0;
  return at_;
}

}  // namespace fedfleet::client
