// Helpers for the kernel benchmarks: CUDA-event timing on the backend's stream
// (median of many runs after warm-up), host/device transfers, relative error.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "bench_cuda.h"
#include "core/dtype.h"

namespace tessera::bench {

// A benchmark's main(): runs `run`, turning an exception into "error: ..." on stderr and exit 1.
inline int run_main(int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

// Median milliseconds of `iters` runs of f(i), each bracketed by CUDA events.
template <typename F>
double time_ms(Backend& be, F&& f, int warmup = 5, int iters = 50) {
  auto stream = static_cast<cudaStream_t>(cuda_backend_stream(be));
  for (int i = 0; i < warmup; ++i) f(i);
  be.synchronize();
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) BENCH_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventRecord(ev[2 * i], stream));
    f(warmup + i);
    BENCH_CUDA(cudaEventRecord(ev[2 * i + 1], stream));
  }
  be.synchronize();
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) BENCH_CUDA(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

inline std::vector<float> random_bf16_values(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(d(rng)));
  return v;
}

inline Tensor upload(Backend& be, const std::vector<float>& v, Shape shape, DType dt) {
  Tensor t = be.alloc(shape, dt);
  std::vector<uint8_t> bytes(t.nbytes());
  convert_host(v.data(), DType::kF32, bytes.data(), dt, v.size());
  be.copy_from_host(t, bytes.data());
  return t;
}

inline std::vector<float> download(Backend& be, const Tensor& t) {
  std::vector<uint8_t> bytes(t.nbytes());
  be.copy_to_host(bytes.data(), t);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  convert_host(bytes.data(), t.dtype(), v.data(), DType::kF32, v.size());
  return v;
}

inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Device-to-device copy bandwidth (bytes read + written per second), the ceiling
// for memory-bound kernels measured in the same run.
inline double copy_bandwidth_gbs(Backend& be, int64_t bytes = int64_t{2} << 30) {
  Tensor a = be.alloc({bytes / 4}, DType::kF32), b = be.alloc({bytes / 4}, DType::kF32);
  be.fill_random(a, 1, -1.0f, 1.0f);
  double ms = time_ms(
      be, [&](int) { be.copy(b, a); }, 3, 20);
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

}  // namespace tessera::bench
