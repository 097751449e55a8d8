// ProgressDisplay: what a person watching `fedfleet sim` sees while it runs.
//
// On a terminal: one line redrawn in place on stderr - a bar, the round, the latest test
// accuracy, the virtual time reached and an estimate of the wall time left. Not on a terminal
// (a log file, a pipe, CI): no bar and no carriage returns; the per-round log lines carry the
// same facts.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "common/config/config.h"

namespace fedfleet::sim {

class ProgressDisplay {
 public:
  // mode: auto (bar only when stderr is a terminal), on, off.
  ProgressDisplay(config::ProgressMode mode, uint32_t total_rounds, std::FILE* out = stderr);
  ~ProgressDisplay();

  bool active() const { return active_; }
  // A round was committed.
  void update(uint32_t round, std::optional<double> accuracy, double virtual_seconds);
  // Clears the bar's line (before the summary is printed).
  void finish();

  // "1h02m", "3m05s", "12.4s".
  static std::string duration(double seconds);

 private:
  bool active_ = false;
  uint32_t total_ = 0;
  std::FILE* out_;
  std::chrono::steady_clock::time_point started_;
  std::optional<double> last_accuracy_;
};

}  // namespace fedfleet::sim
