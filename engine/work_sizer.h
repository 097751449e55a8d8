// WorkSizer: how much work a task asks of its client (EngineOptions "straggler policies"),
// decided per task from what the engine measured of that client:
//   adaptive steps  max_steps sized from the client's steps per compute second and its
//                   non-compute overhead so that it finishes at adaptive_target x the deadline,
//                   never above adaptive_max_factor x the configured work (epochs x
//                   ceil(data size / batch), or max_steps); unmeasured clients get the
//                   configured work;
//   partial work    stop_after_s: the deadline less 1.25 x the client's measured overhead
//                   (download and upload), at least 5% of it; unmeasured: 80% of the deadline,
//                   so that a slow client uploads what it did by then with its true steps.
// Both may be on (adaptive first). Pure: no state beyond the options.
#pragma once

#include <cstdint>

#include "common/wire/messages.h"

namespace fedfleet::engine {

struct EngineOptions;

// What the engine measured of a client, from its last completed task.
struct ClientSpeed {
  double steps_per_s = 0;  // local steps per compute second (0: unknown)
  double overhead_s = -1;  // task duration less compute (-1: unknown)
  uint64_t data_size = 0;  // the samples it says it holds (0: unknown)
};

class WorkSizer {
 public:
  explicit WorkSizer(const EngineOptions& options);

  // Sets max_steps (adaptive steps) and stop_after_s (partial work) in `task` for a client of
  // `speed` and a task deadline of `deadline_s`; leaves them as configured otherwise.
  void size(wire::HyperParams& task, const ClientSpeed& speed, double deadline_s) const;

 private:
  const wire::HyperParams configured_;
  const bool adaptive_;
  const double adaptive_target_;
  const double adaptive_max_factor_;
  const bool partial_work_;
};

}  // namespace fedfleet::engine
