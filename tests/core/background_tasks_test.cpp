// BackgroundTasks: every task of a batch runs once, start() returns while tasks are still to run (they
// run on the background threads), wait() finishes the batch on the caller's thread too, exceptions reach
// wait(), batches follow one another, and a batch left running is waited for at destruction.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/background_tasks.h"

namespace tessera {
namespace {

TEST(BackgroundTasks, EveryTaskRunsOnceOverManyBatches) {
  for (int threads : {1, 3}) {
    BackgroundTasks pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t n : {0, 1, 2, 7, 64, 500}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.start(n, [&](int64_t i) { hits[static_cast<size_t>(i)]++; });
      pool.wait();
      EXPECT_FALSE(pool.running());
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n " << n << " i " << i;
    }
  }
  EXPECT_GE(BackgroundTasks::default_threads(), 1);
  EXPECT_LE(BackgroundTasks::default_threads(), 8);
}

TEST(BackgroundTasks, StartReturnsWhileABackgroundThreadRunsTheTask) {
  // The task waits for the caller to go on past start(): only a background thread can run it then.
  BackgroundTasks pool(1);
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  std::atomic<bool> timed_out{false};
  bool started = false;
  std::thread::id ran_on;
  pool.start(1, [&](int64_t) {
    std::unique_lock<std::mutex> lk(mu);
    ran_on = std::this_thread::get_id();
    started = true;
    cv.notify_all();
    // (guards against a hang, not timing checks)
    if (!cv.wait_for(lk, std::chrono::seconds(60), [&] { return released; })) timed_out = true;
  });
  {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait_for(lk, std::chrono::seconds(60), [&] { return started; });  // (before wait() could take it)
    released = true;
  }
  cv.notify_all();
  pool.wait();
  EXPECT_FALSE(timed_out.load()) << "start() did not return before its task finished";
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(BackgroundTasks, WaitRunsTheTasksNotTakenYet) {
  // The one background thread is held by task 0 until task 1 has run: the caller's wait() runs it.
  BackgroundTasks pool(1);
  std::atomic<bool> second_done{false}, first_started{false};
  std::thread::id second_on;
  pool.start(2, [&](int64_t i) {
    if (i == 0) {
      first_started = true;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!second_done && std::chrono::steady_clock::now() < until) std::this_thread::yield();
      return;
    }
    second_on = std::this_thread::get_id();
    second_done = true;
  });
  while (!first_started) std::this_thread::yield();
  pool.wait();
  EXPECT_TRUE(second_done.load());
  EXPECT_EQ(second_on, std::this_thread::get_id());
}

TEST(BackgroundTasks, AnExceptionReachesWaitAndTheOtherTasksStillRun) {
  BackgroundTasks pool(2);
  std::atomic<int> ran{0};
  pool.start(20, [&](int64_t i) {
    ++ran;
    if (i == 5) throw std::runtime_error("task 5 failed");
  });
  EXPECT_THROW(
      {
        try {
          pool.wait();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "task 5 failed");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_EQ(ran.load(), 20);
  pool.start(3, [&](int64_t) { ++ran; });  // usable again, the error gone
  EXPECT_NO_THROW(pool.wait());
  EXPECT_EQ(ran.load(), 23);
}

TEST(BackgroundTasks, DestructionWaitsForARunningBatch) {
  std::atomic<int> ran{0};
  {
    BackgroundTasks pool(2);
    pool.start(50, [&](int64_t) {
      std::this_thread::yield();
      ++ran;
    });
  }
  EXPECT_EQ(ran.load(), 50);
}

}  // namespace
}  // namespace tessera
