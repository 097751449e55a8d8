// TokenBucket: the bandwidth throttle a client process puts in front of its uploads, to
// emulate a slow uplink on a fast network (a test bench on one host, a LAN).
//
// The bucket fills at `rate` bytes a second up to `burst` bytes. A send of b bytes reserves b
// tokens: when the bucket holds them it passes at once; otherwise it takes what the bucket
// holds and passes once the rest has accrued, (b - level) / rate later, leaving the bucket
// empty. Reservations queue one behind the other, so a sender that reserves faster than the
// rate is held to it: from a full bucket, sends totalling B bytes pass by (B - burst) / rate.
// A send larger than the burst is therefore allowed (it waits for its own bytes), and the time
// a send passes is the time its last byte would have left a link of that rate.
//
// Time is passed in (seconds on any monotonic clock), so the bucket itself never reads a clock
// or sleeps: the caller waits, in slices, until the time reserve() returns, and unit tests
// drive it with made-up times. Not thread-safe: one owner (the client's loop thread).
#pragma once

#include <cstddef>

namespace fedfleet::client {

class TokenBucket {
 public:
  // rate_bytes_per_s <= 0: unlimited (every reservation passes at once). burst_bytes is
  // clamped to at least 1. The bucket starts full at time `now`.
  TokenBucket(double rate_bytes_per_s, double burst_bytes, double now);

  // A rate given in Mbit/s (10^6 bits a second), as configs write it, in bytes a second.
  static double bytesPerSecond(double mbit_per_s) { return mbit_per_s * 1e6 / 8; }

  // Reserves `bytes` tokens for a send wanted at `now` and returns the time (>= now) at which
  // the send may pass. Times passed in must not decrease from one call to the next.
  double reserve(size_t bytes, double now);

  // Tokens the bucket would hold at `now` (0 while a reservation is still waiting); for tests
  // and logs.
  double level(double now) const;

  bool unlimited() const { return rate_ <= 0; }
  double rate() const { return rate_; }
  double burst() const { return burst_; }

 private:
  double rate_;
  double burst_;
  double level_;  // tokens at time at_
  double at_;     // may lie in the future: the time the last reservation passes
};

}  // namespace fedfleet::client
