#include "engine/work_sizer.h"

#include <algorithm>
#include <cmath>

#include "engine/engine_options.h"

namespace fedfleet::engine {

WorkSizer::WorkSizer(const EngineOptions& o)
    : configured_(o.hparams),
      adaptive_(o.adaptive_steps),
      adaptive_target_(o.adaptive_target),
      adaptive_max_factor_(o.adaptive_max_factor),
      partial_work_(o.partial_work) {}

void WorkSizer::size(wire::HyperParams& task, const ClientSpeed& c, double deadline_s) const {
  if (adaptive_ && c.steps_per_s > 0 && c.overhead_s >= 0) {
    // Work sized to finish at adaptive_target of the deadline, never above the configured
    // work times adaptive_max_factor (unknown data size: no cap from it).
    const auto& hp = configured_;
    double configured = hp.max_steps;
    if (configured == 0 && c.data_size > 0) {
      configured = static_cast<double>(hp.epochs) *
                   std::ceil(static_cast<double>(c.data_size) / hp.batch_size);
    }
    const double budget = adaptive_target_ * deadline_s - c.overhead_s;
    double steps = std::floor(c.steps_per_s * budget);
    if (configured > 0) steps = std::min(steps, std::floor(configured * adaptive_max_factor_));
    task.max_steps = static_cast<uint32_t>(std::clamp(steps, 1.0, 1e9));
  }
  if (partial_work_) {
    // Stop training early enough to upload by the deadline: the non-compute time measured
    // last time (download and upload), with a quarter more for safety; unknown: 80%.
    task.stop_after_s = c.overhead_s >= 0
                            ? std::max(0.05 * deadline_s, deadline_s - 1.25 * c.overhead_s)
                            : 0.8 * deadline_s;
  }
}

}  // namespace fedfleet::engine
