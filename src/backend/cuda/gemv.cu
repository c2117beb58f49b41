// Skinny GEMM for decode: out[M, N] = x[M, K] @ w[N, K]^T with M <= 4 (bf16 in, f32
// accumulate, bf16 or f32 out). Decode reads every weight once per step, so this is a
// stream over w at memory bandwidth: each row of w is read by `wpr` warps (split over K
// when N is small, so the grid still fills the GPU), 16-byte non-allocating loads, four in
// flight per lane before any math; x (M rows, a few KiB) stays in L1/L2. Partial sums of a
// row's warps meet in shared memory. cuBLASLt serves larger M and unaligned shapes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_utils.cuh"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 8;

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

template <int M, typename OutT>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w, OutT* __restrict__ out, int N,
                int K, int wpr) {
  constexpr int kUnroll = M == 1 ? 8 : 4;  // 16-byte loads in flight per lane
  __shared__ float part[kWarps][M];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows_per_block = kWarps / wpr;
  const int row = blockIdx.x * rows_per_block + warp / wpr;
  const int slice = warp % wpr;
  const int chunks = K / 8;                  // 16-byte chunks per row
  const int per = (chunks + wpr - 1) / wpr;  // this warp's chunk range
  const int c0 = slice * per, c1 = min(chunks, c0 + per);
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  // Launched with PDL (device_utils.cuh): x comes from the kernel before. (Issuing the first
  // weight loads before this wait cost registers, 38 -> 59, and so occupancy: not worth it.)
  pdl_launch_dependents();
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

template <int M>
void launch_m(const void* x, const void* w, void* out, DType out_t, int N, int K, int wpr, cudaStream_t s) {
  const int rows_per_block = kWarps / wpr;
  const unsigned grid = static_cast<unsigned>((N + rows_per_block - 1) / rows_per_block);
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const auto* wb = static_cast<const __nv_bfloat16*>(w);
  if (out_t == DType::kF32)
    launch_pdl(gemv_kernel<M, float>, grid, kWarps * 32, 0, s, xb, wb, static_cast<float*>(out), N, K, wpr);
  else
    launch_pdl(gemv_kernel<M, __nv_bfloat16>, grid, kWarps * 32, 0, s, xb, wb, static_cast<__nv_bfloat16*>(out), N, K,
               wpr);
}

}  // namespace

bool launch_gemv(const void* x, const void* w, void* out, DType out_t, int64_t M, int64_t N, int64_t K, int num_sms,
                 cudaStream_t s) {
  if (M < 1 || M > kMaxGemvRows || K % 8 != 0 || N > (int64_t{1} << 30) || K > (int64_t{1} << 28)) return false;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16 != 0) return false;
  if (out_t != DType::kF32 && out_t != DType::kBF16) return false;
  // Warps per row: split K only when whole rows give fewer than ~2 blocks per SM (and keep
  // at least 4 chunks per lane). bench/kernels/gemv_sweep_bench on H200 (M = 1, 8 warps,
  // 8 loads in flight): o_proj 4096 x 4096 12.4 us at 1 warp per row vs 13.1 at 2, down_proj
  // 4096 x 12288 28.6 vs 30.8 (2 warps per row gives 1,024 blocks, 1.3 waves at 6 per SM).
  int wpr = 1;
  while (wpr < kWarps && (N * wpr) / kWarps < 2 * num_sms && K / 8 / (wpr * 2) >= 32 * 4) wpr *= 2;
  const int n = static_cast<int>(N), k = static_cast<int>(K);
  switch (M) {
    case 1:
      launch_m<1>(x, w, out, out_t, n, k, wpr, s);
      break;
    case 2:
      launch_m<2>(x, w, out, out_t, n, k, wpr, s);
      break;
    case 3:
      launch_m<3>(x, w, out, out_t, n, k, wpr, s);
      break;
    case 4:
      launch_m<4>(x, w, out, out_t, n, k, wpr, s);
      break;
    default:
      return false;
  }
  TCUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace tessera::cuda
