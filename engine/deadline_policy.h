// DeadlinePolicy: how long a synchronous round gives its participants (protocol step 7 in
// round_engine.h), chosen once from EngineOptions::deadline_mode:
//   fixed       every round gets deadline_s;
//   percentile  the deadline_percentile quantile (linear interpolation between order
//               statistics, NumPy's default) of the task durations (task sent -> summary) of the
//               last deadline_window rounds, times deadline_slack, never more than deadline_s;
//               deadline_s until one round's worth (clients_per_round) of durations is known.
//               A task cancelled at the deadline counts with the time it had (censored): it took
//               at least that long, and without it the quantile could only shrink.
// Asynchronous rounds have no round deadline (each task gets deadline_s): their policy is fixed.
// One owner: not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace fedfleet::engine {

struct EngineOptions;

enum class DeadlineMode { kFixed, kPercentile };
// "fixed" / "percentile" (the config's policy.deadline); anything else is kInvalidArgument.
Result<DeadlineMode> parseDeadlineMode(std::string_view name);
const char* deadlineModeName(DeadlineMode mode);

// kInvalidArgument for a percentile outside (0, 1], a window of 0 or a slack that is not > 0
// (percentile mode only).
Status validateDeadlineOptions(const EngineOptions& options);

class DeadlinePolicy {
 public:
  // The policy of `options` (fixed for asynchronous rounds).
  static std::unique_ptr<DeadlinePolicy> create(const EngineOptions& options);
  virtual ~DeadlinePolicy() = default;

  // A round starts: returns its deadline in seconds from now, from what was observed before.
  virtual double startRound() = 0;
  // A task of the current round took `duration_s` (completed), or at least that (cancelled at
  // the deadline).
  virtual void observe(double duration_s) = 0;
};

class FixedDeadline : public DeadlinePolicy {
 public:
  explicit FixedDeadline(double deadline_s) : deadline_s_(deadline_s) {}
  double startRound() override { return deadline_s_; }
  void observe(double) override {}

 private:
  const double deadline_s_;
};

class PercentileDeadline : public DeadlinePolicy {
 public:
  // `min_durations`: how many durations must be known before the quantile is used.
  PercentileDeadline(double max_deadline_s, double percentile, uint32_t window, double slack,
                     size_t min_durations)
      : max_deadline_s_(max_deadline_s),
        percentile_(percentile),
        window_(window),
        slack_(slack),
        min_durations_(min_durations) {}
  double startRound() override;
  void observe(double duration_s) override;

 private:
  double deadline() const;

  const double max_deadline_s_;
  const double percentile_;
  const uint32_t window_;
  const double slack_;
  const size_t min_durations_;
  std::deque<std::vector<double>> recent_;  // durations per round, the current one last
};

}  // namespace fedfleet::engine
