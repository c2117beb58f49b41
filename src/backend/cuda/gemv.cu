// Skinny GEMM for decode: out[M, N] = x[M, K] @ w[N, K]^T with M <= 4 (bf16 in, f32
// accumulate, bf16 or f32 out). Decode reads every weight once per step, so this is a
// stream over w at memory bandwidth: each row of w is read by `wpr` warps (split over K
// when N is small, so the grid still fills the GPU), 16-byte non-allocating loads, 8 (M = 1)
// or 4 in flight per lane before any math; x (M rows, a few KiB) stays in L1/L2. Partial sums of a
// row's warps meet in shared memory. cuBLASLt serves larger M and unaligned shapes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemv_kernel.cuh"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 8;
template <int M>
constexpr int kUnroll = M == 1 ? 8 : 4;  // 16-byte loads in flight per lane

template <int M>
void launch_m(const void* x, const void* w, void* out, DType out_t, int N, int K, int wpr, cudaStream_t s) {
  const int rows_per_block = kWarps / wpr;
  const unsigned grid = static_cast<unsigned>((N + rows_per_block - 1) / rows_per_block);
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const auto* wb = static_cast<const __nv_bfloat16*>(w);
  if (out_t == DType::kF32)
    launch_pdl(gemv_kernel<M, float, kWarps, kUnroll<M>>, grid, kWarps * 32, 0, s, xb, wb, static_cast<float*>(out), N,
               K, wpr);
  else
    launch_pdl(gemv_kernel<M, __nv_bfloat16, kWarps, kUnroll<M>>, grid, kWarps * 32, 0, s, xb, wb,
               static_cast<__nv_bfloat16*>(out), N, K, wpr);
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
