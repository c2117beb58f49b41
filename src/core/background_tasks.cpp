#include "core/background_tasks.h"

#include <algorithm>
#include <utility>

namespace tessera {

BackgroundTasks::BackgroundTasks(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) workers_.emplace_back([this] { worker_loop(); });
}

BackgroundTasks::~BackgroundTasks() {
  try {
    wait();
  } catch (...) {  // (the batch's owner is gone: nobody to report to)
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

int BackgroundTasks::default_threads() {
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(hw - 1, 1, 8);
}

void BackgroundTasks::start(int64_t n, std::function<void(int64_t)> fn) {
  if (running_) wait();
  if (n <= 0) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = std::move(fn);
    n_ = n;
    next_ = 0;
    done_ = 0;
    error_ = nullptr;
  }
  running_ = true;
  cv_start_.notify_all();
}

void BackgroundTasks::run_tasks(std::unique_lock<std::mutex>& lk) {
  while (next_ < n_) {
    const int64_t i = next_++;
    lk.unlock();
    std::exception_ptr err;
    try {
      fn_(i);
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    if (err && !error_) error_ = err;
    if (++done_ == n_) cv_done_.notify_all();
  }
}

void BackgroundTasks::wait() {
  if (!running_) return;
  running_ = false;
  std::unique_lock<std::mutex> lk(mu_);
  run_tasks(lk);
  cv_done_.wait(lk, [&] { return done_ == n_; });
  n_ = next_ = done_ = 0;
  fn_ = nullptr;
  if (std::exception_ptr e = std::exchange(error_, nullptr)) {
    lk.unlock();
    std::rethrow_exception(e);
  }
}

void BackgroundTasks::worker_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_start_.wait(lk, [&] { return stop_ || next_ < n_; });
    if (stop_) return;
    run_tasks(lk);
  }
}

}  // namespace tessera
