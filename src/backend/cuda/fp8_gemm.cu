// FP8 block-scaled linear kernels (weights e4m3 [N, K] with f32 scales [ceil(N/128), ceil(K/128)],
// w[n, k] = fp8[n, k] * scale[n / 128, k / 128]; see Tensor::block_scale):
//  - the decode GEMV, a stream over the FP8 weights (half the bytes of bf16) that reads each
//    weight byte once for all M <= 16 rows of x:
//      M = 1: one warp per output row, 16 weights per 16-byte load, CUDA-core FMAs;
//      M = 2..16: tensor cores. A block of 4 warps owns 16 output rows; its warps take turns
//      over K in 64-column groups. Per group a lane loads 16 weights of two rows (16-byte
//      loads), widens them once to bf16 (exact: every e4m3 value is a bf16 value) and feeds
//      them as the A operand of 4 bf16 m16n8k16 MMAs (f32 accumulate) against x as B, one
//      MMA per 8 rows of x. The old one-warp-per-row form re-converted every weight and
//      re-read x from L1 once per row of x: instruction bound, time linear in M (lm_head
//      248320 x 3072 on H200: 203 us at M = 1, 2129 us at M = 16). The 64 columns of a
//      group lie in one 128-column scale block, so its MMA sum gets its block scale with one
//      FMA per accumulator, the same maths as scaling every product;
//  - per-token activation quantisation for the prefill GEMM (one e4m3 value per element and one
//    f32 scale per 128 columns, amax / 448, stored [K/128][M] as cuBLASLt's VEC128_32F wants);
//  - a dequantising copy to bf16 (the prefill fallback where cuBLASLt has no block-scaled
//    algorithm for the shape).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/fp8_utils.cuh"
#include "backend/cuda/gemv_kernel.cuh"
#include "backend/cuda/mma_utils.cuh"

namespace tessera::cuda {

namespace {

constexpr int kBlock = 128;
constexpr int kWarps = 8;

// sum_i w[i] * x[i] over 16 weights (one uint4 of e4m3) and 16 bf16 activations (two uint4).
__device__ __forceinline__ float dot16(const uint4& w, const uint4& x0, const uint4& x1) {
  float f[4], s = 0.0f;
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  const uint32_t xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    fp8x4_to_float(ws[q], f);
    s = fmaf(f[0], lo(xs[2 * q]), s);
    s = fmaf(f[1], hi(xs[2 * q]), s);
    s = fmaf(f[2], lo(xs[2 * q + 1]), s);
    s = fmaf(f[3], hi(xs[2 * q + 1]), s);
  }
  return s;
}

// M = 1: one warp per output row. The row's K/16 chunks go to the lanes in order, so a lane's chunk
// c lies in scale block c / 8; each 16-byte chunk's partial dot is scaled on the spot (one
// FMA per 16 weights), which is exact w.r.t. the blocks and needs no per-block bookkeeping.
template <int M, typename OutT>
__global__ void __launch_bounds__(kWarps * 32)
    fp8_gemv_kernel(const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ w, const float* __restrict__ scale,
                    OutT* __restrict__ out, int rows_m, int N, int K) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarps + warp;
  const int chunks = K / 16;
  const int kb = (K + kBlock - 1) / kBlock;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  pdl_wait();
  if (row < N) {
    const uint4* wr = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(row) * K);
    const float* sr = scale + static_cast<int64_t>(row / kBlock) * kb;
    const uint4* xr = reinterpret_cast<const uint4*>(x);
    constexpr int kUnroll = 4;
    int c = lane;
    for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
      uint4 wv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) wv[u] = load_stream(wr + c + 32 * u);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int cc = c + 32 * u;
        const float s = __ldg(sr + cc / 8);
#pragma unroll
        for (int m = 0; m < M; ++m)
          if (m < rows_m) {
            const uint4* xm = xr + static_cast<int64_t>(m) * (K / 8) + 2 * cc;
            acc[m] = fmaf(s, dot16(wv[u], __ldg(xm), __ldg(xm + 1)), acc[m]);
          }
      }
    }
    for (; c < chunks; c += 32) {
      const uint4 wv = load_stream(wr + c);
      const float s = __ldg(sr + c / 8);
#pragma unroll
      for (int m = 0; m < M; ++m)
        if (m < rows_m) {
          const uint4* xm = xr + static_cast<int64_t>(m) * (K / 8) + 2 * c;
          acc[m] = fmaf(s, dot16(wv, __ldg(xm), __ldg(xm + 1)), acc[m]);
        }
    }
  }
  pdl_launch_dependents();
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = warp_sum(acc[m]);
  if (row < N && lane == 0) {
#pragma unroll
    for (int m = 0; m < M; ++m)
      if (m < rows_m) out[static_cast<int64_t>(m) * N + row] = from_float<OutT>(acc[m]);
  }
}

constexpr int kMmaWarps = 4;   // warps per 16-row tile, splitting K
constexpr int kMmaGroup = 64;  // K columns per warp step (4 lanes x 16)
constexpr int kMmaUnroll = 2;  // groups whose loads a warp issues before their math

// Tensor-core GEMV for 2 <= M <= 8 * NT (see the top of the file). Lane (g = lane / 4,
// t = lane % 4) of a warp, in group kg, loads w rows row0 + g and row0 + g + 8 at columns
// kg * 64 + 16 t .. + 15 and, per 8-row tile j of x, x row 8 j + g at the same columns. MMA
// step s (0..3) takes columns 4 s .. 4 s + 3 of every lane's 16: the A fragment's
// (k 2t, 2t+1) pair is columns 4s, 4s+1 and its (k 2t+8, 2t+9) pair columns 4s+2, 4s+3, and
// B's b0 / b1 the same columns, so the MMA's k order is a permutation of the group's 64
// columns, the same for A and B. Rows past N, x rows past M and columns past K load zeros.
template <int NT, typename OutT>
__global__ void __launch_bounds__(kMmaWarps * 32)
    fp8_gemv_mma_kernel(const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ w,
                        const float* __restrict__ scale, OutT* __restrict__ out, int rows_m, int N, int K) {
  __shared__ float4 part[kMmaWarps][NT][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * 16;
  const int ra = row0 + g, rb = row0 + g + 8;
  const bool va = ra < N, vb = rb < N;
  const uint8_t* wa = w + static_cast<int64_t>(va ? ra : row0) * K;
  const uint8_t* wb = w + static_cast<int64_t>(vb ? rb : row0) * K;
  const int groups = (K + kMmaGroup - 1) / kMmaGroup;
  const float* sr = scale + static_cast<int64_t>(row0 / kBlock) * ((K + kBlock - 1) / kBlock);
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
  pdl_wait();
  for (int gi = warp; gi < groups; gi += kMmaWarps * kMmaUnroll) {
    uint4 wva[kMmaUnroll], wvb[kMmaUnroll];
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int k0 = (gi + u * kMmaWarps) * kMmaGroup + 16 * t;
      const bool kv = gi + u * kMmaWarps < groups && k0 < K;
      wva[u] = kv && va ? load_stream(reinterpret_cast<const uint4*>(wa + k0)) : make_uint4(0, 0, 0, 0);
      wvb[u] = kv && vb ? load_stream(reinterpret_cast<const uint4*>(wb + k0)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int gu = gi + u * kMmaWarps;
      if (gu >= groups) break;  // the same for the whole warp
      const int k0 = gu * kMmaGroup + 16 * t;
      const bool kv = k0 < K;
      const float s = __ldg(sr + gu * kMmaGroup / kBlock);
      uint32_t a[4][4];
      widen_group(wva[u], wvb[u], a);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int m = 8 * j + g;
        uint4 x0 = make_uint4(0, 0, 0, 0), x1 = x0;
        if (kv && m < rows_m) {
          const uint4* xm = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(m) * K + k0);
          x0 = __ldg(xm);
          x1 = __ldg(xm + 1);
        }
        mma_group(a, x0, x1, s, s, acc[j]);
      }
    }
  }
  pdl_launch_dependents();
#pragma unroll
  for (int j = 0; j < NT; ++j) part[warp][j][lane] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
  __syncthreads();
  if (warp != 0) return;
    // Accumulator i of lane (g, t): w row g + 8 (i / 2), x row 8 j + 2 t + i % 2.
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    float4 v = part[0][j][lane];
#pragma unroll
    for (int q = 1; q < kMmaWarps; ++q) {
      const float4 p = part[q][j][lane];
      v.x += p.x;
      v.y += p.y;
      v.z += p.z;
      v.w += p.w;
    }
    const float r[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = 8 * j + 2 * t + (i & 1), row = (i < 2 ? ra : rb);
      if (m < rows_m && row < N) out[static_cast<int64_t>(m) * N + row] = from_float<OutT>(r[i]);
    }
  }
}

// W8A16 for 17 <= M <= 8 * NT rows (kMaxFp8SmallRows): the MMA GEMV's maths (per 64-column
// group, the group's 16 x 64 weights widened to bf16 are the A operand of 4 bf16 m16n8k16 MMAs
// per 8 rows of x, the group sum scaled with one FMA) with x staged in shared memory: a block of
// 4 warps owns 64 output rows (16 a warp) and walks its K slice group by group together, each
// group's x tile [8 * NT rows][64 columns] copied once (cp.async, two groups ahead in a ring of
// three buffers, one barrier a group) and read by all 4 warps, where the GEMV's warps each re-read
// x from L1 per 16 rows; each lane's weights are loaded two groups ahead too. Few row blocks
// (N / 64) split K over grid.y, the slices' f32 partials added in order by the reduce kernel.
// x tile rows are padded to 72 bf16 (144 bytes) so the lanes' 16-byte reads (row g, columns
// 16 t) fall on distinct banks.
constexpr int kSmallWarps = 4, kSmallRows = 16 * kSmallWarps, kXPad = 72, kSmallStages = 3;

template <int NT>
__global__ void __launch_bounds__(kSmallWarps * 32)
    fp8_w16_small_kernel(const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ w,
                         const float* __restrict__ scale, float* __restrict__ part, int rows_m, int N, int K,
                         int groups_per_slice) {
  __shared__ __align__(16) __nv_bfloat16 xs[kSmallStages][8 * NT][kXPad];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * kSmallRows + warp * 16;
  const int ra = row0 + g, rb = row0 + g + 8;
  const bool va = ra < N, vb = rb < N;
  const uint8_t* wa = w + static_cast<int64_t>(va ? ra : 0) * K;
  const uint8_t* wb = w + static_cast<int64_t>(vb ? rb : 0) * K;
  const int groups = (K + kMmaGroup - 1) / kMmaGroup;
  const int g_begin = blockIdx.y * groups_per_slice, g_end = min(groups, g_begin + groups_per_slice);
  const float* sr = scale + static_cast<int64_t>((row0 < N ? row0 : 0) / kBlock) * ((K + kBlock - 1) / kBlock);
  // x tile copy: 8 NT rows x 8 chunks of 16 bytes, NT / 2 chunks a thread.
  auto load_x = [&](int gi, int buf) {
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) {
      const int c = tid + i * kSmallWarps * 32, r = c >> 3, ch = c & 7;
      const int k = gi * kMmaGroup + ch * 8;
      const bool ok = r < rows_m && k < K;
      cp_async16_zfill(&xs[buf][r][ch * 8], ok ? static_cast<const void*>(x + static_cast<int64_t>(r) * K + k) : x,
                       ok ? 16 : 0);
    }
  };
  float acc[NT][4] = {};
  pdl_wait();
  auto load_w = [&](int gi, uint4& da, uint4& db) {
    const int k0 = gi * kMmaGroup + 16 * t;
    const bool kv = gi < g_end && k0 < K;
    da = kv && va ? load_stream(reinterpret_cast<const uint4*>(wa + k0)) : make_uint4(0, 0, 0, 0);
    db = kv && vb ? load_stream(reinterpret_cast<const uint4*>(wb + k0)) : make_uint4(0, 0, 0, 0);
  };
  // Two groups ahead: x tiles in a ring of kSmallStages buffers (one cp.async group a tile, empty
  // past the slice), the weights in registers.
  uint4 wq[2][2];
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    if (g_begin + p < g_end) load_x(g_begin + p, p);
    cp_async_commit();
    load_w(g_begin + p, wq[p][0], wq[p][1]);
  }
  for (int gi = g_begin, buf = 0; gi < g_end; ++gi, buf = buf + 1 == kSmallStages ? 0 : buf + 1) {
    cp_async_wait<1>();  // tile gi (this thread's copies)
    __syncthreads();     // every thread's copies of tile gi; every warp done with tile gi - 1
    const int nbuf = buf + 2 >= kSmallStages ? buf + 2 - kSmallStages : buf + 2;  // tile gi - 1's
    if (gi + 2 < g_end) load_x(gi + 2, nbuf);
    cp_async_commit();
    const uint4 cwa = wq[0][0], cwb = wq[0][1];
    wq[0][0] = wq[1][0];
    wq[0][1] = wq[1][1];
    load_w(gi + 2, wq[1][0], wq[1][1]);
    const float s = __ldg(sr + gi * kMmaGroup / kBlock);
    uint32_t a[4][4];
    widen_group(cwa, cwb, a);
#pragma unroll
    for (int j = 0; j < NT; ++j)
      mma_group(a, *reinterpret_cast<const uint4*>(&xs[buf][8 * j + g][16 * t]),
                *reinterpret_cast<const uint4*>(&xs[buf][8 * j + g][16 * t + 8]), s, s, acc[j]);
  }
  cp_async_wait<0>();
  pdl_launch_dependents();
  // Accumulator i of lane (g, t): w row g + 8 (i / 2), x row 8 j + 2 t + i % 2.
  float* out = part + static_cast<int64_t>(blockIdx.y) * rows_m * N;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = 8 * j + 2 * t + (i & 1), row = (i < 2 ? ra : rb);
      if (m < rows_m && row < N) out[static_cast<int64_t>(m) * N + row] = acc[j][i];
    }
}

// out = the sum of `splits` f32 partials [splits][n] in order, as bf16 or f32.
template <typename OutT>
__global__ void f32_partials_sum_kernel(const float* __restrict__ part, OutT* __restrict__ out, int64_t n, int splits) {
  pdl_wait();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = part[i];
    for (int z = 1; z < splits; ++z) v += part[z * n + i];
    out[i] = from_float<OutT>(v);
  }
}

template <int NT>
void launch_gemv_mma(const void* x, const void* w, const float* scale, void* out, DType out_t, int rows_m, int N, int K,
                     cudaStream_t s) {
  const unsigned grid = static_cast<unsigned>((N + 15) / 16);
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const auto* wb = static_cast<const uint8_t*>(w);
  if (out_t == DType::kF32)
    launch_pdl(fp8_gemv_mma_kernel<NT, float>, grid, kMmaWarps * 32, 0, s, xb, wb, scale, static_cast<float*>(out),
               rows_m, N, K);
  else
    launch_pdl(fp8_gemv_mma_kernel<NT, __nv_bfloat16>, grid, kMmaWarps * 32, 0, s, xb, wb, scale,
               static_cast<__nv_bfloat16*>(out), rows_m, N, K);
}

template <int M>
void launch_gemv_m(const void* x, const void* w, const float* scale, void* out, DType out_t, int rows_m, int N, int K,
                   cudaStream_t s) {
  const unsigned grid = static_cast<unsigned>((N + kWarps - 1) / kWarps);
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const auto* wb = static_cast<const uint8_t*>(w);
  if (out_t == DType::kF32)
    launch_pdl(fp8_gemv_kernel<M, float>, grid, kWarps * 32, 0, s, xb, wb, scale, static_cast<float*>(out), rows_m, N,
               K);
  else
    launch_pdl(fp8_gemv_kernel<M, __nv_bfloat16>, grid, kWarps * 32, 0, s, xb, wb, scale,
               static_cast<__nv_bfloat16*>(out), rows_m, N, K);
}

// One warp per (token, 128-column block): 4 values per lane, amax over the warp.
__global__ void quantize_act_kernel(const __nv_bfloat16* __restrict__ x, __nv_fp8_e4m3* __restrict__ q,
                                    float* __restrict__ scale, int M, int K) {
  const int kb = K / kBlock;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (item >= static_cast<int64_t>(M) * kb) return;
  const int m = static_cast<int>(item / kb), b = static_cast<int>(item % kb);
  const int64_t base = static_cast<int64_t>(m) * K + b * kBlock + lane * 4;
  float v[4], amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = __bfloat162float(x[base + i]);
    amax = fmaxf(amax, fabsf(v[i]));
  }
  amax = warp_max(amax);
  const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
  const float inv = 1.0f / s;
#pragma unroll
  for (int i = 0; i < 4; ++i) q[base + i] = __nv_fp8_e4m3(v[i] * inv);
  if (lane == 0) scale[static_cast<int64_t>(b) * M + m] = s;  // [K/128][M]: M-major (VEC128_32F)
}

__global__ void dequant_kernel(const uint8_t* __restrict__ w, const float* __restrict__ scale,
                               __nv_bfloat16* __restrict__ out, int64_t N, int K) {
  const int kb = (K + kBlock - 1) / kBlock;
  const int64_t n = static_cast<int64_t>(N) * K;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / K;
    const int c = static_cast<int>(i % K);
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(w[i]), __NV_E4M3);
    out[i] =
        __float2bfloat16(__half2float(*reinterpret_cast<const __half*>(&h)) * scale[(r / kBlock) * kb + c / kBlock]);
  }
}

}  // namespace

bool launch_fp8_gemv(const void* x, const void* w, const float* scale, void* out, DType out_t, int64_t M, int64_t N,
                     int64_t K, cudaStream_t s) {
  if (M < 1 || M > kMaxFp8GemvRows || K % 16 != 0 || N > (int64_t{1} << 30) || K > (int64_t{1} << 28)) return false;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16 != 0) return false;
  if (out_t != DType::kF32 && out_t != DType::kBF16) return false;
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
  if (m == 1)
    launch_gemv_m<1>(x, w, scale, out, out_t, m, n, k, s);
  else if (m <= 8)
    launch_gemv_mma<1>(x, w, scale, out, out_t, m, n, k, s);
  else
    launch_gemv_mma<2>(x, w, scale, out, out_t, m, n, k, s);
  TCUDA_LAUNCH_CHECK();
  return true;
}

int fp8_w16_small_splits(int64_t N, int64_t K) {
  const int64_t row_blocks = (N + kSmallRows - 1) / kSmallRows, groups = (K + kMmaGroup - 1) / kMmaGroup;
  // About 4 blocks an SM of the 132 (several blocks an SM keep enough weight loads in flight),
  // at least 4 groups a slice.
  const int64_t want = (4 * 132 + row_blocks - 1) / row_blocks;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, groups / 4, kMaxFp8W16Splits})));
}

bool launch_fp8_w16_small(const void* x, const void* w, const float* scale, void* out, DType out_t, int64_t M,
                          int64_t N, int64_t K, int splits, float* partials, cudaStream_t s) {
  if (M <= kMaxFp8GemvRows || M > kMaxFp8SmallRows || K % 16 != 0 || N > (int64_t{1} << 30) || K > (int64_t{1} << 28) ||
      splits < 1 || !partials)
    return false;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16 != 0) return false;
  if (out_t != DType::kF32 && out_t != DType::kBF16) return false;
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
  const int groups = (k + kMmaGroup - 1) / kMmaGroup, per = (groups + splits - 1) / splits;
  const int z = (groups + per - 1) / per;
  const dim3 grid(static_cast<unsigned>((N + kSmallRows - 1) / kSmallRows), static_cast<unsigned>(z));
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const auto* wb = static_cast<const uint8_t*>(w);
  if (m <= 32)
    launch_pdl(fp8_w16_small_kernel<4>, grid, kSmallWarps * 32, 0, s, xb, wb, scale, partials, m, n, k, per);
  else
    launch_pdl(fp8_w16_small_kernel<8>, grid, kSmallWarps * 32, 0, s, xb, wb, scale, partials, m, n, k, per);
  TCUDA_LAUNCH_CHECK();
  launch_f32_partials_sum(partials, out, out_t, M * N, z, s);
  return true;
}

void launch_f32_partials_sum(const float* partials, void* out, DType out_t, int64_t n, int splits, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096));
  if (out_t == DType::kF32)
    launch_pdl(f32_partials_sum_kernel<float>, blocks, 256, 0, s, partials, static_cast<float*>(out), n, splits);
  else
    launch_pdl(f32_partials_sum_kernel<__nv_bfloat16>, blocks, 256, 0, s, partials, static_cast<__nv_bfloat16*>(out), n,
               splits);
  TCUDA_LAUNCH_CHECK();
}

void launch_quantize_act_fp8(const void* x, void* q, float* scale, int64_t M, int64_t K, cudaStream_t s) {
  const int64_t items = M * (K / kBlock);
  if (items == 0) return;
  constexpr int kThreads = 256;
  const unsigned grid = static_cast<unsigned>((items + kThreads / 32 - 1) / (kThreads / 32));
  quantize_act_kernel<<<grid, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(x), static_cast<__nv_fp8_e4m3*>(q),
                                                scale, static_cast<int>(M), static_cast<int>(K));
  TCUDA_LAUNCH_CHECK();
}

void launch_dequant_fp8(const void* w, const float* scale, void* out, int64_t N, int64_t K, cudaStream_t s) {
  if (N * K == 0) return;
  const int64_t blocks = std::min<int64_t>((N * K + 255) / 256, 65535);
  dequant_kernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(
      static_cast<const uint8_t*>(w), scale, static_cast<__nv_bfloat16*>(out), N, static_cast<int>(K));
  TCUDA_LAUNCH_CHECK();
}

}  // namespace tessera::cuda
