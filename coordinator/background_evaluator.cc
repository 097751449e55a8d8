#include "coordinator/background_evaluator.h"

#include <spdlog/spdlog.h>

#include "common/model/evaluate.h"

namespace fedfleet::coordinator {

BackgroundEvaluator::BackgroundEvaluator(std::unique_ptr<model::Model> model,
                                         data::Dataset test_set)
    : model_(std::move(model)), test_set_(std::move(test_set)) {
  thread_ = std::thread([this] { work(); });
}

BackgroundEvaluator::~BackgroundEvaluator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    jobs_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void BackgroundEvaluator::submit(uint32_t round, std::shared_ptr<const std::vector<float>> params) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(Job{round, std::move(params)});
  }
  cv_.notify_one();
}

std::vector<BackgroundEvaluator::Result> BackgroundEvaluator::takeResults() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Result> out;
  out.swap(done_);
  return out;
}

bool BackgroundEvaluator::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !jobs_.empty() || running_ > 0 || !done_.empty();
}

void BackgroundEvaluator::work() {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      ++running_;
    }
    Result result{job.round, evaluate(*job.params)};
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
    done_.push_back(result);
  }
}

std::optional<engine::EvalOutcome> BackgroundEvaluator::evaluate(const std::vector<float>& params) {
  Status st = model_->setFlatParameters(params.data(), params.size());
  if (!st.isOk()) {
    spdlog::error("evaluation: {}", st.toString());
    return std::nullopt;
  }
  // Batches of 250 keep the CNN's activations near 40 MB (1000 would need about 150 MB).
  auto r = model::evaluate(*model_, test_set_, /*limit=*/0, /*batch_size=*/250);
  if (!r.isOk()) {
    spdlog::error("evaluation: {}", r.status().toString());
    return std::nullopt;
  }
  return engine::EvalOutcome{r->loss, r->accuracy, model::namedMetrics(*r)};
}

}  // namespace fedfleet::coordinator
