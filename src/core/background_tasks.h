// A small fixed set of threads that runs one batch of indexed tasks in the background while the thread
// that started it goes on (LLMEngine fills a step's token masks while the forward runs). Unlike
// ThreadPool::parallel_for, start() returns at once; wait() then runs the tasks no thread has taken yet
// on the calling thread and returns when every task is done.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera {

class BackgroundTasks {
 public:
  // `threads` background threads (at least 1), started here and kept until destruction.
  explicit BackgroundTasks(int threads);
  // Waits for a batch still running (its exception, if any, is dropped).
  ~BackgroundTasks();
  BackgroundTasks(const BackgroundTasks&) = delete;
  BackgroundTasks& operator=(const BackgroundTasks&) = delete;

  // min(8, hardware threads - 1), at least 1: the caller's thread keeps a core of its own.
  static int default_threads();
  int threads() const { return static_cast<int>(workers_.size()); }

  // Runs fn(0) .. fn(n - 1), each once, in any order, on the background threads; returns at once. The
  // previous batch must have been waited for. fn must stay valid until wait() returns.
  void start(int64_t n, std::function<void(int64_t)> fn);
  // Runs the tasks not taken yet on this thread, then waits for the others. Rethrows the first exception
  // a task threw (the other tasks still ran). No batch running: returns at once.
  void wait();
  // A batch was started and not waited for.
  bool running() const { return running_; }

 private:
  void worker_loop();
  // Takes and runs tasks while some are left; called and returns with lk held.
  void run_tasks(std::unique_lock<std::mutex>& lk);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  std::function<void(int64_t)> fn_;
  int64_t n_ = 0, next_ = 0, done_ = 0;
  std::exception_ptr error_;
  bool running_ = false;  // (touched by the owning thread only)
  bool stop_ = false;
};

}  // namespace tessera
