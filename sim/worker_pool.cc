#include "sim/worker_pool.h"

#include <ATen/Parallel.h>

namespace fedfleet::sim {

WorkerPool::WorkerPool(size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::loop() {
  // One intra-op thread per worker. at::set_num_threads also sets this thread's OpenMP
  // max-threads, which OpenBLAS's OpenMP build follows.
  at::set_num_threads(1);
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

}  // namespace fedfleet::sim
