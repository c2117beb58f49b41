// ThreadPool::parallel_for: every index exactly once, chunks non-empty and in range,
// exceptions reach the caller, nested and concurrent calls neither deadlock nor mix jobs.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace tessera {
namespace {

// Runs one parallel_for and checks coverage; returns the number of chunks.
int check_cover(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<int> chunks{0}, bad{0};
  pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
    if (!(0 <= b && b < e && e <= n)) ++bad;
    ++chunks;
    for (int64_t i = b; i < e && i < n && i >= 0; ++i) hits[static_cast<size_t>(i)]++;
  });
  EXPECT_EQ(bad.load(), 0) << "empty, inverted or out-of-range chunk for n=" << n << " grain=" << grain;
  for (int64_t i = 0; i < n; ++i)
    if (hits[static_cast<size_t>(i)] != 1) {
      ADD_FAILURE() << "index " << i << " ran " << hits[static_cast<size_t>(i)] << " times, n=" << n
                    << " grain=" << grain << " threads=" << pool.size();
      break;
    }
  return chunks.load();
}

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 4, 7}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 3, 5, 9, 10, 17, 64, 100, 1000, 4097})
      for (int64_t grain : {-1, 0, 1, 2, 3, 4, 7, 16, 1000, 5000}) {
        int chunks = check_cover(pool, n, grain);
        if (n == 0) EXPECT_EQ(chunks, 0);
        // Never more chunks than the grain allows.
        if (n > 0 && grain > 0) EXPECT_LE(chunks, (n + grain - 1) / grain) << n << " " << grain;
      }
  }
}

TEST(ThreadPool, ManyJobsInARow) {
  ThreadPool pool(4);
  std::atomic<int64_t> sum{0};
  for (int rep = 0; rep < 2000; ++rep)
    pool.parallel_for(37, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i;
    });
  EXPECT_EQ(sum.load(), 2000 * (36 * 37 / 2));
}

TEST(ThreadPool, UsesMoreThanOneThread) {
  ThreadPool pool(4);
  std::atomic<int> inside{0}, max_inside{0};
  pool.parallel_for(16, 1, [&](int64_t, int64_t) {
    int now = ++inside;
    int m = max_inside.load();
    while (now > m && !max_inside.compare_exchange_weak(m, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    --inside;
  });
  EXPECT_GT(max_inside.load(), 1);
}

TEST(ThreadPool, ExceptionReachesTheCallerAndPoolStaysUsable) {
  ThreadPool pool(4);
  for (int rep = 0; rep < 50; ++rep) {
    EXPECT_THROW(pool.parallel_for(64, 1,
                                   [&](int64_t b, int64_t) {
                                     if (b == 40) throw std::runtime_error("chunk failed");
                                   }),
                 std::runtime_error);
    check_cover(pool, 1000, 3);
  }
}

TEST(ThreadPool, NestedCallsRunInlineAndCoverEverything) {
  ThreadPool pool(4);
  const int64_t outer = 16, inner = 50;
  std::vector<std::atomic<int>> hits(static_cast<size_t>(outer * inner));
  pool.parallel_for(outer, 1, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o)
      pool.parallel_for(inner, 1, [&](int64_t ib, int64_t ie) {
        for (int64_t i = ib; i < ie; ++i) hits[static_cast<size_t>(o * inner + i)]++;
      });
  });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(ThreadPool, ConcurrentCallersFromSeveralThreads) {
  ThreadPool pool(4);
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 200; ++rep) {
        const int64_t n = 100 + c * 37 + rep % 13;
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, 2, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        });
        for (auto& h : hits)
          if (h.load() != 1) ++failures;
      }
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(ThreadPool, GlobalPoolExists) {
  ThreadPool& g = ThreadPool::global();
  EXPECT_GE(g.size(), 1);
  EXPECT_EQ(&g, &ThreadPool::global());
  check_cover(g, 333, 5);
}

}  // namespace
}  // namespace tessera
