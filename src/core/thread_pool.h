// A fixed pool of worker threads for data-parallel loops in CPU kernels.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Runs fn(begin, end) over [0, n) split into non-empty chunks of about `grain` or more;
  // the calling thread takes part. Returns when every chunk is done. If fn throws, the
  // chunks not yet started are skipped and the first exception is rethrown here.
  // A call from inside fn (nested), or while another thread's call holds the pool,
  // runs fn(0, n) on the calling thread instead of waiting: never a deadlock.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
  // The process-wide pool used by CPU kernels (threads = TESSERA_NUM_THREADS or hardware).
  static ThreadPool& global();

 private:
  void worker_loop(int index);
  void run_chunk(int64_t c, std::unique_lock<std::mutex>& lk);
  std::vector<std::thread> workers_;
  std::mutex submit_mu_;  // held by the one parallel_for that owns the workers
  std::mutex mu_;
  std::exception_ptr error_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t n_ = 0, chunk_ = 0, chunks_ = 0;
  int64_t next_chunk_ = 0, done_chunks_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace tessera
