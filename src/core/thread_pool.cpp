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

namespace {
// > 0 while this thread runs a chunk of some pool's job.
thread_local int t_chunk_depth = 0;
struct ChunkScope {
  ChunkScope() { ++t_chunk_depth; }
  ~ChunkScope() { --t_chunk_depth; }
};
}  // namespace

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t max_chunks = std::min<int64_t>(size() * 4, (n + grain - 1) / grain);
  if (max_chunks <= 1 || workers_.empty() || t_chunk_depth > 0) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> owner(submit_mu_, std::try_to_lock);
  if (!owner.owns_lock()) {  // another thread's loop has the workers
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> lk(mu_);
  job_ = &fn;
  n_ = n;
  chunk_ = (n + max_chunks - 1) / max_chunks;
  chunks_ = (n + chunk_ - 1) / chunk_;  // so that no chunk is empty
  next_chunk_ = 0;
  done_chunks_ = 0;
  error_ = nullptr;
  ++generation_;
  cv_start_.notify_all();
  while (next_chunk_ < chunks_) run_chunk(next_chunk_++, lk);
  cv_done_.wait(lk, [&] { return done_chunks_ == chunks_; });
  job_ = nullptr;
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    lk.unlock();
    std::rethrow_exception(e);
  }
}

// Called with lk held; runs chunk c unlocked, then counts it done.
void ThreadPool::run_chunk(int64_t c, std::unique_lock<std::mutex>& lk) {
  auto* fn = job_;
  int64_t begin = c * chunk_, end = std::min(n_, (c + 1) * chunk_);
  bool skip = error_ != nullptr;  // a chunk failed: finish quickly
  lk.unlock();
  std::exception_ptr err;
  if (!skip) {
    ChunkScope scope;
    try {
      (*fn)(begin, end);
    } catch (...) {
      err = std::current_exception();
    }
  }
  lk.lock();
  if (err && !error_) error_ = err;
  if (++done_chunks_ == chunks_) cv_done_.notify_all();
}

void ThreadPool::worker_loop(int) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_start_.wait(lk, [&] { return stop_ || (generation_ != seen && job_ && next_chunk_ < chunks_); });
    if (stop_) return;
    seen = generation_;
    while (job_ && next_chunk_ < chunks_) run_chunk(next_chunk_++, lk);
  }
}

}  // namespace tessera
