// UploadCredits: how many tasks may upload at once (protocol step 4 in round_engine.h).
//
// A task whose update is ready asks for a credit; at most `max_concurrent` tasks hold one at
// once (0: unbounded, every request is granted at the next settle()), the others wait in the
// order they asked. The engine calls settle() after every event, with what it knows of which
// tasks are still pending: credits and requests of tasks that are not are dropped there, so no
// path can keep a credit, and the next in line are granted. With credits bounded, a granted
// upload that sends nothing for `idle_s` (since its grant or its last chunk) is reported by
// idleUploads(), for the engine to reject it. Tasks are named by their token; the engine keeps
// everything else about them. One owner: not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <vector>

namespace fedfleet::engine {

class UploadCredits {
 public:
  // `max_concurrent`: credits at once (0: unbounded). `idle_s`: with credits bounded, how long
  // a granted upload may send nothing before idleUploads() names it (0: never).
  UploadCredits(uint32_t max_concurrent, double idle_s)
      : max_concurrent_(max_concurrent), idle_s_(idle_s) {}

  // Whether credits are bounded (only then must a task hold one to send chunks).
  bool bounded() const { return max_concurrent_ > 0; }
  // Whether `token` holds a credit.
  bool holds(uint64_t token) const { return granted_.count(token) > 0; }
  // Queues the request of `token` (which neither holds a credit nor waits for one).
  void request(uint64_t token) { queue_.push_back(token); }

  // Whether a task is still pending (only those may hold or wait for a credit).
  using Pending = std::function<bool(uint64_t token)>;
  // Drops the credits and requests of tasks no longer pending, then grants waiting requests in
  // the order they were made while credits are free. Returns the tokens granted, in order.
  std::vector<uint64_t> settle(const Pending& pending);

  // The last sign of an upload in progress of a granted task (its grant or its last chunk), or
  // nothing when the task is no longer pending.
  using LastActivity = std::function<std::optional<double>(uint64_t token)>;
  // With credits bounded and idle_s > 0: the granted tasks that sent nothing for idle_s by
  // `now`, in token order; else none.
  std::vector<uint64_t> idleUploads(double now, const LastActivity& last) const;
  // When idleUploads() will next name a task (nothing: no such time).
  std::optional<double> nextIdleCheck(const LastActivity& last) const;

  double idleSeconds() const { return idle_s_; }
  size_t inFlight() const { return granted_.size(); }
  size_t waiting() const { return queue_.size(); }
  // The most credits held at once so far.
  size_t peakInFlight() const { return peak_; }

 private:
  bool checksIdle() const { return bounded() && idle_s_ > 0; }

  const uint32_t max_concurrent_;
  const double idle_s_;
  std::set<uint64_t> granted_;  // tasks holding a credit
  std::deque<uint64_t> queue_;  // tasks waiting for one, in the order they asked
  size_t peak_ = 0;
};

}  // namespace fedfleet::engine
