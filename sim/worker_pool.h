// WorkerPool: a fixed set of threads that run the simulator's training and evaluation jobs.
//
// Each worker sets its own LibTorch intra-op thread count (and, through OpenMP's per-thread
// setting, OpenBLAS's) to one when it starts, so N workers use N cores without oversubscribing
// them, and a job computes exactly the same bits on whichever worker runs it. Jobs run in
// submission order (FIFO); results come back through std::future. A job must not throw (the
// simulator's jobs return Result values). runPieces shares one piece of work between the caller
// and the workers that are free.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace fedfleet::sim {

class WorkerPool {
 public:
  // threads == 0: one per hardware thread.
  explicit WorkerPool(size_t threads);
  ~WorkerPool();  // finishes queued jobs, then joins
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  size_t size() const { return threads_.size(); }

  // Runs piece(0) .. piece(pieces - 1) and returns when every call has returned: the calling
  // thread takes pieces, and so do workers that pick up the helper jobs this queues ahead of the
  // others. A worker busy with a job joins only once that job is done, and finds nothing left
  // when the caller has taken every piece: a busy pool leaves the work to the caller.
  void runPieces(size_t pieces, const std::function<void(size_t)>& piece);

  template <typename F>
  auto submit(F job) -> std::future<decltype(job())> {
    using R = decltype(job());
    auto task = std::make_shared<std::packaged_task<R()>>(std::move(job));
    std::future<R> out = task->get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.emplace_back([task] { (*task)(); });
    }
    cv_.notify_one();
    return out;
  }

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // GUARDED_BY(mu_)
  bool stopping_ = false;                    // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

}  // namespace fedfleet::sim
