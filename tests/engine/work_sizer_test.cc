#include "engine/work_sizer.h"

#include <gtest/gtest.h>

#include "engine/engine_options.h"

namespace fedfleet::engine {
namespace {

EngineOptions adaptiveOptions(double max_factor) {
  EngineOptions o;
  o.adaptive_steps = true;
  o.adaptive_target = 0.8;
  o.adaptive_max_factor = max_factor;
  o.hparams.epochs = 2;
  o.hparams.batch_size = 10;
  o.hparams.max_steps = 0;
  return o;
}

TEST(WorkSizer, AdaptiveStepsFitTheTargetShareOfTheDeadline) {
  // 0.5 steps/s, 10 s overhead, deadline 100 s: (0.8 x 100 - 10) x 0.5 = 35 steps.
  const ClientSpeed speed{0.5, 10, 95};
  wire::HyperParams hp;
  WorkSizer(adaptiveOptions(2.0)).size(hp, speed, 100);
  EXPECT_EQ(hp.max_steps, 35u);  // under 2 x the configured 2 x ceil(95 / 10) = 20
  wire::HyperParams capped;
  WorkSizer(adaptiveOptions(1.0)).size(capped, speed, 100);
  EXPECT_EQ(capped.max_steps, 20u);  // never above 1 x the configured work
  wire::HyperParams slow;
  WorkSizer(adaptiveOptions(1.0)).size(slow, ClientSpeed{0.5, 200, 95}, 100);
  EXPECT_EQ(slow.max_steps, 1u);  // no time left: one step
}

TEST(WorkSizer, UnmeasuredClientsGetTheConfiguredWork) {
  wire::HyperParams hp;
  hp.max_steps = 7;
  WorkSizer(adaptiveOptions(1.0)).size(hp, ClientSpeed{0, -1, 95}, 100);
  EXPECT_EQ(hp.max_steps, 7u);
  EXPECT_EQ(hp.stop_after_s, 0);  // partial work is off
}

TEST(WorkSizer, PartialWorkStopsInTimeToUpload) {
  EngineOptions o;
  o.partial_work = true;
  WorkSizer w(o);
  wire::HyperParams hp;
  w.size(hp, ClientSpeed{1, 10, 0}, 100);
  EXPECT_DOUBLE_EQ(hp.stop_after_s, 87.5);  // 100 - 1.25 x 10
  w.size(hp, ClientSpeed{1, 90, 0}, 100);
  EXPECT_DOUBLE_EQ(hp.stop_after_s, 5);  // at least 5% of the deadline
  w.size(hp, ClientSpeed{}, 100);
  EXPECT_DOUBLE_EQ(hp.stop_after_s, 80);  // unmeasured: 80%
  EXPECT_EQ(hp.max_steps, 0u);            // adaptive steps are off
}

}  // namespace
}  // namespace fedfleet::engine
