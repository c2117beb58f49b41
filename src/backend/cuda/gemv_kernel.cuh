// The decode GEMV kernel (gemv.cu's design, see there), in a header so that
// bench/kernels/gemv_sweep_bench.cu times this very kernel over its parameters.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/device_utils.cuh"

namespace tessera::cuda {

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

__device__ __forceinline__ float dot8(const uint4& a, const uint4& b) {
  float s = lo(a.x) * lo(b.x);
  s = fmaf(hi(a.x), hi(b.x), s);
  s = fmaf(lo(a.y), lo(b.y), s);
  s = fmaf(hi(a.y), hi(b.y), s);
  s = fmaf(lo(a.z), lo(b.z), s);
  s = fmaf(hi(a.z), hi(b.z), s);
  s = fmaf(lo(a.w), lo(b.w), s);
  s = fmaf(hi(a.w), hi(b.w), s);
  return s;
}

// M rows of x; W warps per block, `wpr` of them per row of w (W / wpr rows per block);
// kUnroll 16-byte loads in flight per lane.
template <int M, typename OutT, int W, int kUnroll>
__global__ void __launch_bounds__(W * 32)
    gemv_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w, OutT* __restrict__ out, int N,
                int K, int wpr) {
  __shared__ float part[W][M];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows_per_block = W / wpr;
  const int row = blockIdx.x * rows_per_block + warp / wpr;
  const int slice = warp % wpr;
  const int chunks = K / 8;                  // 16-byte chunks per row
  const int per = (chunks + wpr - 1) / wpr;  // this warp's chunk range
  const int c0 = slice * per, c1 = min(chunks, c0 + per);
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  // Launched with PDL (device_utils.cuh): x comes from the kernel before. Issuing the first
  // weight loads before this wait measured slower (223.4 / 225.6 vs 226.5 / 226.9 tok/s,
  // H200, batch 1); prefetching them into L2 from here cost 8% of decode.
  pdl_wait();
  if (row < N) {
    const uint4* wr = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(row) * K);
    const uint4* xr = reinterpret_cast<const uint4*>(x);
    int c = c0 + lane;
    for (; c + 32 * (kUnroll - 1) < c1; c += 32 * kUnroll) {
      uint4 wv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) wv[u] = load_stream(wr + c + 32 * u);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[m] += dot8(wv[u], __ldg(xr + static_cast<int64_t>(m) * chunks + c + 32 * u));
    }
    for (; c < c1; c += 32) {
      const uint4 wv = load_stream(wr + c);
#pragma unroll
      for (int m = 0; m < M; ++m) acc[m] += dot8(wv, __ldg(xr + static_cast<int64_t>(m) * chunks + c));
    }
  }
  // The next kernel may launch once every block got here: triggered at the start instead, its
  // blocks (and the next GEMV's, launched early by the small kernel in between) sat on SM
  // slots while this one streamed; decode batch 1 on H200 205.7 -> 208.0 tok/s with this.
  pdl_launch_dependents();
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = warp_sum(acc[m]);
  if (wpr == 1) {
    if (row < N && lane < M) {
#pragma unroll
      for (int m = 0; m < M; ++m)
        if (lane == m) out[static_cast<int64_t>(m) * N + row] = from_float<OutT>(acc[m]);
    }
    return;
  }
  if (lane == 0) {
#pragma unroll
    for (int m = 0; m < M; ++m) part[warp][m] = acc[m];
  }
  __syncthreads();
  if (slice == 0 && row < N && lane < M) {
    float s = 0.0f;
    for (int j = 0; j < wpr; ++j) s += part[warp + j][lane];
    out[static_cast<int64_t>(lane) * N + row] = from_float<OutT>(s);
  }
}

}  // namespace tessera::cuda
