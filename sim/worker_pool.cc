#include "sim/worker_pool.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <memory>

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

void WorkerPool::runPieces(size_t pieces, const std::function<void(size_t)>& piece) {
  if (pieces == 0) return;
  struct Shared {
    const std::function<void(size_t)>* piece;  // valid until every taken piece is done
    size_t pieces;
    std::atomic<size_t> next{0};
    std::mutex mu;
    std::condition_variable cv;
    size_t done = 0;  // GUARDED_BY(mu)
  };
  auto shared = std::make_shared<Shared>();
  shared->piece = &piece;
  shared->pieces = pieces;
  // Helpers that start after the last piece is taken return at once; they hold `shared`, never
  // `piece`, past that point.
  const auto work = [shared] {
    size_t finished = 0;
    for (size_t i; (i = shared->next.fetch_add(1)) < shared->pieces; ++finished) {
      (*shared->piece)(i);
    }
    if (finished == 0) return;
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->done += finished;
    if (shared->done == shared->pieces) shared->cv.notify_all();
  };
  const size_t helpers = std::min(threads_.size(), pieces - 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t h = 0; h < helpers; ++h) queue_.emplace_front(work);
  }
  if (helpers == 1) cv_.notify_one();
  if (helpers > 1) cv_.notify_all();
  work();
  std::unique_lock<std::mutex> lock(shared->mu);
  shared->cv.wait(lock, [&] { return shared->done == shared->pieces; });
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
