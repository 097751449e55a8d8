// ConnectionLimits: how much a single connection may send of the messages that cost the
// coordinator work without moving a round on (frames that do not decode or break a limit,
// Hellos, heartbeats), and EventBudget: how many event rows one client may cause.
//
// Each kind has a RateLimit: a bucket of `burst` that refills at `per_second`. A message that
// finds its bucket empty is refused; the driver answers the first refusal, closes the
// connection and records one event row with the counts (refusedSummary()). Honest clients stay
// far below the defaults: one Hello per connection, a heartbeat every client.heartbeat_s.
//
// Time is passed in (seconds); nothing here reads a clock. Plain value types.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace fedfleet::coordinator {

// A RateLimit's two numbers.
struct Rate {
  double per_second = 0;
  double burst = 0;
};

class RateLimit {
 public:
  RateLimit(double per_second, double burst) : rate_(per_second), burst_(burst), level_(burst) {}
  explicit RateLimit(Rate r) : RateLimit(r.per_second, r.burst) {}
  // Takes one token at `now` (times must not decrease); false when the bucket is empty.
  bool take(double now);

 private:
  double rate_;
  double burst_;
  double level_;
  double at_ = -1;  // time of the last refill (-1: not yet)
};

struct ConnectionLimitOptions {
  Rate bad_frames{5, 20};
  Rate hellos{0.2, 5};
  Rate heartbeats{10, 50};
};

class ConnectionLimits {
 public:
  enum Kind { kBadFrame, kHello, kHeartbeat };

  explicit ConnectionLimits(const ConnectionLimitOptions& options = {});

  // Counts one message of `kind` at `now`; false when it is over its rate (then it and every
  // later message of the connection are refused: over() stays true).
  bool admit(Kind kind, double now);
  bool over() const { return over_; }
  // "12 bad frames, 0 Hellos, 3 heartbeats refused (limits: ...)" for the event row.
  std::string refusedSummary() const;
  uint64_t refused() const { return refused_[0] + refused_[1] + refused_[2]; }

 private:
  ConnectionLimitOptions options_;
  RateLimit limits_[3];
  uint64_t refused_[3] = {0, 0, 0};
  bool over_ = false;
};

// Event rows the coordinator's driver writes about one client (refusals, replaced connections,
// rate limits): `burst` at once, then one a `refill_s`. What is over budget is counted, and
// takeLeftOut() hands the count to the driver, which records it in one row.
class EventBudget {
 public:
  explicit EventBudget(double burst = 30, double refill_s = 10)
      : limit_(refill_s > 0 ? 1 / refill_s : 0, burst) {}
  // Whether a row may be written at `now`; if not, it is counted as left out.
  bool take(double now);
  // Whether a row may be written at `now`, without counting it as left out if not.
  bool takeQuietly(double now) { return limit_.take(now); }
  uint64_t takeLeftOut() { return std::exchange(left_out_, 0); }
  uint64_t leftOut() const { return left_out_; }

 private:
  RateLimit limit_;
  uint64_t left_out_ = 0;
};

}  // namespace fedfleet::coordinator
