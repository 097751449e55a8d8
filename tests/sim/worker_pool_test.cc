// WorkerPool::runPieces: every piece runs once and the call returns only when all are done; idle
// workers take pieces beside the caller; a pool whose workers are all busy leaves every piece to
// the caller, which does not wait for them.
#include "sim/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace fedfleet::sim {
namespace {

using std::chrono::milliseconds;

TEST(WorkerPoolPieces, EveryPieceRunsOnceAndTheCallReturnsWhenAllAreDone) {
  WorkerPool pool(2);
  for (size_t pieces : {1, 2, 3, 100}) {
    std::vector<std::atomic<int>> runs(pieces);
    std::atomic<size_t> finished{0};
    pool.runPieces(pieces, [&](size_t i) {
      std::this_thread::sleep_for(milliseconds(i % 3));
      runs[i].fetch_add(1);
      finished.fetch_add(1);
    });
    EXPECT_EQ(finished.load(), pieces);
    for (size_t i = 0; i < pieces; ++i) EXPECT_EQ(runs[i].load(), 1) << pieces << " " << i;
  }
  pool.runPieces(0, [](size_t) { FAIL() << "no piece to run"; });
}

TEST(WorkerPoolPieces, IdleWorkersTakePiecesBesideTheCaller) {
  WorkerPool pool(2);
  // Each piece waits (10 s at most) until the other has started: one thread cannot run both.
  std::atomic<int> started{0};
  std::mutex mu;
  std::set<std::thread::id> threads;
  pool.runPieces(2, [&](size_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      threads.insert(std::this_thread::get_id());
    }
    started.fetch_add(1);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 2 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(1));
    }
  });
  EXPECT_EQ(started.load(), 2);
  EXPECT_EQ(threads.size(), 2u);
}

TEST(WorkerPoolPieces, ABusyPoolLeavesThePiecesToTheCaller) {
  WorkerPool pool(1);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> running;
  auto busy = pool.submit([released, &running] {
    running.set_value();
    released.wait();
    return 7;
  });
  running.get_future().wait();
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::thread::id> ran(5);
  pool.runPieces(5, [&](size_t i) { ran[i] = std::this_thread::get_id(); });
  for (size_t i = 0; i < ran.size(); ++i) EXPECT_EQ(ran[i], caller) << i;
  // The helper job queued for the busy worker runs later and finds nothing left.
  release.set_value();
  EXPECT_EQ(busy.get(), 7);
  std::atomic<int> after{0};
  pool.runPieces(3, [&](size_t) { after.fetch_add(1); });
  EXPECT_EQ(after.load(), 3);
}

}  // namespace
}  // namespace fedfleet::sim
