// BackgroundEvaluator: server-side evaluation on a thread of its own, so the coordinator's
// event loop keeps answering heartbeats and receiving uploads while a model is evaluated (a
// FedAvg CNN takes seconds on the 10k test set).
//
// Threads: submit() and takeResults() are called by the owner (the event loop); the worker
// thread alone touches the model and the test set after construction.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/data/dataset.h"
#include "common/model/model.h"
#include "engine/round_engine.h"

namespace fedfleet::coordinator {

class BackgroundEvaluator {
 public:
  struct Result {
    uint32_t round = 0;
    std::optional<engine::EvalOutcome> outcome;  // std::nullopt: the evaluation failed (logged)
  };

  // Takes ownership of the model and test set and starts the worker thread.
  BackgroundEvaluator(std::unique_ptr<model::Model> model, data::Dataset test_set);
  // Finishes the evaluation in progress, drops queued ones, joins the thread.
  ~BackgroundEvaluator();

  // Queues the evaluation of `params` as the model after `round`. Evaluations run in order.
  void submit(uint32_t round, std::shared_ptr<const std::vector<float>> params);
  // Returns and clears the finished evaluations, in submission order.
  std::vector<Result> takeResults();
  // True while an evaluation is queued or running.
  bool busy() const;

 private:
  struct Job {
    uint32_t round;
    std::shared_ptr<const std::vector<float>> params;
  };
  void work();
  std::optional<engine::EvalOutcome> evaluate(const std::vector<float>& params);

  std::unique_ptr<model::Model> model_;  // worker thread only
  data::Dataset test_set_;               // worker thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;      // GUARDED_BY(mu_)
  std::vector<Result> done_;  // GUARDED_BY(mu_)
  size_t running_ = 0;        // GUARDED_BY(mu_)
  bool stop_ = false;         // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace fedfleet::coordinator
