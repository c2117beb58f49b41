#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace tessera {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (const char* e = std::getenv("TESSERA_NUM_THREADS")) return std::max(1, std::atoi(e));
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }());
  return pool;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t max_chunks = std::min<int64_t>(size() * 4, (n + grain - 1) / grain);
  if (max_chunks <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> lk(mu_);
  job_ = &fn;
  n_ = n;
  chunks_ = max_chunks;
  chunk_ = (n + chunks_ - 1) / chunks_;
  next_chunk_ = 0;
  done_chunks_ = 0;
  ++generation_;
  cv_start_.notify_all();
  while (next_chunk_ < chunks_) {
    int64_t c = next_chunk_++;
    lk.unlock();
    fn(c * chunk_, std::min(n, (c + 1) * chunk_));
    lk.lock();
    ++done_chunks_;
  }
  cv_done_.wait(lk, [&] { return done_chunks_ == chunks_; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_start_.wait(lk, [&] { return stop_ || (generation_ != seen && job_ && next_chunk_ < chunks_); });
    if (stop_) return;
    seen = generation_;
    while (job_ && next_chunk_ < chunks_) {
      int64_t c = next_chunk_++;
      auto* fn = job_;
      int64_t n = n_, chunk = chunk_;
      lk.unlock();
      (*fn)(c * chunk, std::min(n, (c + 1) * chunk));
      lk.lock();
      if (++done_chunks_ == chunks_) cv_done_.notify_all();
    }
  }
}

}  // namespace tessera
