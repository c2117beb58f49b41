// The kernel benchmarks' CUDA call check (bench_util.h and the standalone .cu sweeps,
// which nvcc builds as C++17 and so cannot include the backend's C++20 headers).
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define BENCH_CUDA(call)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)
