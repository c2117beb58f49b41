// Decode GEMV design sweep (M = 1, bf16): for the Qwen3-8B projection shapes, times
// (a) a pure streaming read of the same bytes (the ceiling for one kernel of that size),
// (b) the decode GEMV kernel itself (src/backend/cuda/gemv_kernel.cuh) over warps per
//     block, loads in flight per lane and warps per row,
// each as 36 back-to-back launches over 8 rotating weight copies (as in a decode step,
// where every projection follows other kernels), in microseconds per launch and as
// weight bytes per second. Every variant's output is checked against a CPU reference
// on sampled rows. Picks the parameters gemv.cu uses.
//   gemv_sweep_bench
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/gemv_kernel.cuh"
#include "bench_cuda.h"
#include "core/dtype.h"

namespace {

using tessera::cuda::gemv_kernel;
using tessera::cuda::load_stream;

// Pure read: grid-stride over n16 16-byte chunks, U loads in flight per thread.
template <int U>
__global__ void read_kernel(const uint4* __restrict__ p, int64_t n16, unsigned* out) {
  unsigned acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + (U - 1) * stride < n16; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = load_stream(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    uint4 v = load_stream(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}

struct Shape {
  const char* name;
  int N, K;
};

}  // namespace

int main() {
  int sms = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
  cudaStream_t s;
  BENCH_CUDA(cudaStreamCreate(&s));
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  unsigned* sink;
  BENCH_CUDA(cudaMalloc(&sink, 64));

  const Shape shapes[] = {{"qkv_proj", 6144, 4096},
                          {"o_proj", 4096, 4096},
                          {"gate_up", 24576, 4096},
                          {"down_proj", 4096, 12288},
                          {"lm_head", 151936, 4096}};
  constexpr int kCopies = 8, kLaunches = 36;
  for (const Shape& sh : shapes) {
    const int64_t n = int64_t(sh.N) * sh.K, bytes = n * 2;
    const int copies = bytes * kCopies > (int64_t(4) << 30) ? 2 : kCopies;
    std::vector<uint16_t> hw(n), hx(sh.K);
    std::mt19937 rng(7);
    for (auto& v : hw) v = uint16_t((rng() & 0x7fff) ^ 0x3c00) & 0xbfff;  // |w| < ~2
    for (auto& v : hx) v = uint16_t(0x3c00 | (rng() & 0x00ff)) | (rng() & 1 ? 0x8000 : 0);
    for (auto& v : hw) v = uint16_t(0x3800 | (v & 0x80ff));  // small, mixed signs
    std::vector<__nv_bfloat16*> ws(copies);
    for (auto& p : ws) {
      BENCH_CUDA(cudaMalloc(&p, bytes));
      BENCH_CUDA(cudaMemcpy(p, hw.data(), bytes, cudaMemcpyHostToDevice));
    }
    __nv_bfloat16 *x, *out;
    BENCH_CUDA(cudaMalloc(&x, sh.K * 2));
    BENCH_CUDA(cudaMalloc(&out, sh.N * 2));
    BENCH_CUDA(cudaMemcpy(x, hx.data(), sh.K * 2, cudaMemcpyHostToDevice));
    // CPU reference on sampled rows.
    std::vector<int> rows;
    for (int i = 0; i < 64; ++i) rows.push_back(int(rng() % sh.N));
    std::vector<double> ref;
    for (int r : rows) {
      double a = 0;
      for (int k = 0; k < sh.K; ++k)
        a += double(tessera::bf16_to_f32(hw[int64_t(r) * sh.K + k])) * tessera::bf16_to_f32(hx[k]);
      ref.push_back(a);
    }
    auto check = [&]() {
      std::vector<uint16_t> got(sh.N);
      BENCH_CUDA(cudaMemcpy(got.data(), out, sh.N * 2, cudaMemcpyDeviceToHost));
      double worst = 0;
      for (size_t i = 0; i < rows.size(); ++i)
        worst = std::max(worst, std::fabs(tessera::bf16_to_f32(got[rows[i]]) - ref[i]) / (std::fabs(ref[i]) + 1.0));
      return worst;
    };
    auto timeit = [&](auto&& launch) {
      for (int i = 0; i < 8; ++i) launch(i);
      BENCH_CUDA(cudaStreamSynchronize(s));
      std::vector<float> t;
      for (int rep = 0; rep < 7; ++rep) {
        BENCH_CUDA(cudaEventRecord(e0, s));
        for (int i = 0; i < kLaunches; ++i) launch(i);
        BENCH_CUDA(cudaEventRecord(e1, s));
        BENCH_CUDA(cudaEventSynchronize(e1));
        float ms;
        BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms * 1000 / kLaunches);
      }
      BENCH_CUDA(cudaGetLastError());
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    std::printf("\n%s N=%d K=%d (%.1f MB)\n", sh.name, sh.N, sh.K, bytes / 1e6);
    for (int per_sm : {2, 4, 8}) {
      double us = timeit([&](int i) {
        read_kernel<8><<<sms * per_sm, 256, 0, s>>>(reinterpret_cast<const uint4*>(ws[i % copies]), bytes / 16, sink);
      });
      std::printf("  read  blocks/SM %d          %8.2f us %6.0f GB/s\n", per_sm, us, bytes / us / 1e3);
    }
    auto sweep = [&](auto kern, int W, int U) {
      for (int wpr : {1, 2, 4, 8}) {
        if (wpr > W || sh.K / 8 / wpr < 32) continue;
        const int rpb = W / wpr;
        const unsigned grid = (sh.N + rpb - 1) / rpb;
        BENCH_CUDA(cudaMemset(out, 0, sh.N * 2));
        kern<<<grid, W * 32, 0, s>>>(x, ws[0], out, sh.N, sh.K, wpr);
        BENCH_CUDA(cudaStreamSynchronize(s));
        double err = check();
        double us = timeit([&](int i) { kern<<<grid, W * 32, 0, s>>>(x, ws[i % copies], out, sh.N, sh.K, wpr); });
        std::printf("  gemv  warps %d unroll %2d wpr %d grid %6u %8.2f us %6.0f GB/s err %.1e%s\n", W, U, wpr, grid, us,
                    bytes / us / 1e3, err, err < 1e-2 ? "" : " FAIL");
      }
    };
    using bf16 = __nv_bfloat16;
    sweep(gemv_kernel<1, bf16, 8, 8>, 8, 8);
    sweep(gemv_kernel<1, bf16, 8, 4>, 8, 4);
    sweep(gemv_kernel<1, bf16, 8, 16>, 8, 16);
    sweep(gemv_kernel<1, bf16, 4, 8>, 4, 8);
    sweep(gemv_kernel<1, bf16, 4, 16>, 4, 16);
    sweep(gemv_kernel<1, bf16, 16, 8>, 16, 8);
    for (auto p : ws) BENCH_CUDA(cudaFree(p));
    BENCH_CUDA(cudaFree(x));
    BENCH_CUDA(cudaFree(out));
  }
  return 0;
}
