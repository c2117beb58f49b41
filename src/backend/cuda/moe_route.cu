// Mixture-of-experts kernels that both paths share: the router's top-k, the prefill path's
// routing (tokens permuted by expert on the device) and the weighted combine both paths end with.
// Nothing here reads routing results on the host, so every launch is capturable in a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemv_kernel.cuh"
#include "backend/cuda/moe_topk.cuh"

namespace tessera::cuda {

namespace {

// The shared expert the combine adds (T = 1, after the one-token down GEMV wrote its row k of y):
// its down (null: none), its gate [1, H] (null: weight 1) and x [H] for the gate's dot product.
struct CombineShared {
  const __nv_bfloat16 *down, *gate, *x;
};

// ---------------------------------------------------------------- prefill: routing
// One block of 1024 threads: experts counted (shared-memory atomics), exclusive scans of the
// counts (row offsets) and of their kMoeTileM tiles (tile offsets), then each pair's place in
// its expert's rows. The order of pairs within an expert varies from run to run; each row of
// the grouped GEMM depends only on its own pair, so the results do not.
constexpr int kRouteThreads = 1024;
static_assert(kRouteThreads >= kMoeMaxExperts, "a thread per local expert");

// Exclusive prefix sum over the block (one value per thread); *total gets the sum.
__device__ int block_exclusive_scan(int v, int* total) {
  __shared__ int warp_tot[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += u;
  }
  __syncthreads();
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = lane < (blockDim.x >> 5) ? warp_tot[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += u;
    }
    warp_tot[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const int before = warp > 0 ? warp_tot[warp - 1] : 0;
  *total = warp_tot[(blockDim.x >> 5) - 1];
  return before + incl - v;
}

__global__ void __launch_bounds__(kRouteThreads)
    moe_route_kernel(const int32_t* __restrict__ ids, int P, int expert_begin, int E_local, int tile_m,
                     int32_t* __restrict__ expert_offsets, int32_t* __restrict__ tile_offsets,
                     int32_t* __restrict__ sorted_pair, int32_t* __restrict__ pair_pos) {
  __shared__ int count[kMoeMaxExperts];
  for (int e = threadIdx.x; e < E_local; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < P; i += blockDim.x) {
    const int e = ids[i] - expert_begin;
    if (e >= 0 && e < E_local) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  const int e = threadIdx.x;  // E_local <= kMoeMaxExperts == blockDim.x
  const int c = e < E_local ? count[e] : 0;
  int rows_total = 0, tiles_total = 0;
  const int row_off = block_exclusive_scan(c, &rows_total);
  const int tile_off = block_exclusive_scan((c + tile_m - 1) / tile_m, &tiles_total);
  __syncthreads();
  if (e < E_local) {
    expert_offsets[e] = row_off;
    tile_offsets[e] = tile_off;
    count[e] = row_off;  // now the next free row of expert e
  }
  if (e == 0) {
    expert_offsets[E_local] = rows_total;
    tile_offsets[E_local] = tiles_total;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < P; i += blockDim.x) {
    const int x = ids[i] - expert_begin;
    int pos = -1;
    if (x >= 0 && x < E_local) {
      pos = atomicAdd(&count[x], 1);
      sorted_pair[pos] = i;
    }
    pair_pos[i] = pos;
  }
}

// ---------------------------------------------------------------- combine
// out[t, :] = sum_j weights[t, j] * y[row(t, j), :] in slot order j (deterministic), over the
// pairs with a local expert: row = pair_pos[pair] (prefill; -1: not local), or the pair itself
// when pair_pos is null (decode: y is indexed by pair; ids say which are local). 8 columns a
// thread, 16-byte loads and stores.
__global__ void moe_combine_kernel(const __nv_bfloat16* __restrict__ y, const int32_t* __restrict__ pair_pos,
                                   const int32_t* __restrict__ ids, const float* __restrict__ weights, int T, int k,
                                   int H, int expert_begin, int E_local, __nv_bfloat16* __restrict__ out,
                                   CombineShared shared) {
  // shared (T = 1; its down not null): y row k is the shared expert's, added as g * y_k after the
  // routed pairs with g = sigmoid(bf16(gate . x)) (1 without a gate). x and the gate are read before
  // pdl_wait: x comes from five launches back, and the one-token down kernel before this one waits
  // before it triggers (device_utils.cuh).
  __shared__ float shared_g;
  if (shared.down != nullptr && threadIdx.x < 32) {
    float g = 1.0f;
    if (shared.gate != nullptr) {
      const uint4* gr = reinterpret_cast<const uint4*>(shared.gate);
      const uint4* xr = reinterpret_cast<const uint4*>(shared.x);
      float d = 0.0f;
      for (int c = threadIdx.x; c < H / 8; c += 32) d += dot8(__ldg(gr + c), __ldg(xr + c));
      d = __bfloat162float(__float2bfloat16_rn(warp_sum(d)));  // the gate linear's bf16 output
      g = 1.0f / (1.0f + __expf(-d));
    }
    if (threadIdx.x == 0) shared_g = g;
  }
  __syncthreads();
  pdl_wait();
  // The next kernel (the residual add + norm, one block) may launch now and wait resident: this
  // kernel has waited, so it may read what came before (device_utils.cuh).
  pdl_launch_dependents();
  const int per_row = H / 8;
  const int64_t total = static_cast<int64_t>(T) * per_row;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(idx / per_row), c = static_cast<int>(idx % per_row);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    // Eight pairs at a time: their rows and weights first, then all their loads in flight at once
    // (a loop that loaded ids[pair] then y one pair after the other took k dependent round trips:
    // 3.3 us at decode batch 1). Summed in slot order j, as before.
    for (int j0 = 0; j0 < k; j0 += 8) {
      int row[8];
      float wt[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int pair = t * k + j0 + u;
        row[u] = -1;
        wt[u] = 0.0f;
        if (j0 + u < k) {
          if (pair_pos) {
            row[u] = pair_pos[pair];
          } else {
            const int e = ids[pair] - expert_begin;
            row[u] = e >= 0 && e < E_local ? pair : -1;
          }
          wt[u] = weights[pair];
        }
      }
      uint4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u)
        if (row[u] >= 0) v[u] = reinterpret_cast<const uint4*>(y + static_cast<int64_t>(row[u]) * H)[c];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (row[u] < 0) continue;
        acc[0] += wt[u] * lo(v[u].x);
        acc[1] += wt[u] * hi(v[u].x);
        acc[2] += wt[u] * lo(v[u].y);
        acc[3] += wt[u] * hi(v[u].y);
        acc[4] += wt[u] * lo(v[u].z);
        acc[5] += wt[u] * hi(v[u].z);
        acc[6] += wt[u] * lo(v[u].w);
        acc[7] += wt[u] * hi(v[u].w);
      }
    }
    if (shared.down != nullptr) {
      const uint4 v = reinterpret_cast<const uint4*>(y + static_cast<int64_t>(k) * H)[c];
      acc[0] += shared_g * lo(v.x);
      acc[1] += shared_g * hi(v.x);
      acc[2] += shared_g * lo(v.y);
      acc[3] += shared_g * hi(v.y);
      acc[4] += shared_g * lo(v.z);
      acc[5] += shared_g * hi(v.z);
      acc[6] += shared_g * lo(v.w);
      acc[7] += shared_g * hi(v.w);
    }
    uint4 o;
    uint32_t* ow = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const __nv_bfloat162 b = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
      ow[q] = *reinterpret_cast<const uint32_t*>(&b);
    }
    reinterpret_cast<uint4*>(out + static_cast<int64_t>(t) * H)[c] = o;
  }
}

// ---------------------------------------------------------------- top-k
// One warp (one block of 32 threads) per token, the row held in registers: softmax in f32, then
// k rounds of a warp arg-max (ties to the lower id) over the experts not taken yet. Lane l holds
// experts l, l + 32, ... (kPer of them), loads its logits once and computes their probabilities
// once, and marks taken experts in registers. (A kernel that re-read the row and recomputed expf
// in each of the k rounds took 5.3 us against 3.3 at Qwen3-30B-A3B decode batch 1 on the H200.)
template <int kPer>
__global__ void __launch_bounds__(32)
    moe_topk_regs_kernel(const float* __restrict__ logits, int E, int k, bool renormalize, int32_t* __restrict__ ids,
                         float* __restrict__ weights) {
  pdl_wait();
  const int lane = threadIdx.x, t = blockIdx.x;
  int id;
  float weight;
  warp_topk<kPer>(logits + static_cast<int64_t>(t) * E, E, k, renormalize, &id, &weight);
  pdl_launch_dependents();
  if (lane < k) {
    ids[static_cast<int64_t>(t) * k + lane] = id;
    weights[static_cast<int64_t>(t) * k + lane] = weight;
  }
}

}  // namespace

void launch_moe_topk(const float* logits, int64_t T, int E, int k, bool renormalize, int32_t* ids, float* weights,
                     cudaStream_t s) {
  if (T == 0) return;
  const unsigned grid = static_cast<unsigned>(T);  // T < 2^31 (grid.x's limit): checked by the backend
  if (E <= 32)
    launch_pdl(moe_topk_regs_kernel<1>, grid, 32, 0, s, logits, E, k, renormalize, ids, weights);
  else if (E <= 64)
    launch_pdl(moe_topk_regs_kernel<2>, grid, 32, 0, s, logits, E, k, renormalize, ids, weights);
  else if (E <= 128)
    launch_pdl(moe_topk_regs_kernel<4>, grid, 32, 0, s, logits, E, k, renormalize, ids, weights);
  else if (E <= 256)
    launch_pdl(moe_topk_regs_kernel<8>, grid, 32, 0, s, logits, E, k, renormalize, ids, weights);
  else if (E <= 512)
    launch_pdl(moe_topk_regs_kernel<16>, grid, 32, 0, s, logits, E, k, renormalize, ids, weights);
  else
    launch_pdl(moe_topk_regs_kernel<32>, grid, 32, 0, s, logits, E, k, renormalize, ids, weights);
  TCUDA_LAUNCH_CHECK();
}

void launch_moe_route(const MoeArgs& a, int32_t* expert_offsets, int32_t* tile_offsets, int32_t* sorted_pair,
                      int32_t* pair_pos, cudaStream_t s) {
  moe_route_kernel<<<1, kRouteThreads, 0, s>>>(a.ids, a.T * a.k, a.expert_begin, a.E_local, kMoeTileM, expert_offsets,
                                               tile_offsets, sorted_pair, pair_pos);
  TCUDA_LAUNCH_CHECK();
}

void launch_moe_combine(const MoeArgs& a, const void* y, const int32_t* pair_pos, cudaStream_t s,
                        const MoeFusedShared* shared) {
  const int64_t n = static_cast<int64_t>(a.T) * (a.H / 8);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(n, 256), 65535LL * 16));
  const CombineShared sh{shared ? static_cast<const __nv_bfloat16*>(shared->down) : nullptr,
                         shared ? static_cast<const __nv_bfloat16*>(shared->gate) : nullptr,
                         static_cast<const __nv_bfloat16*>(a.x)};
  launch_pdl(moe_combine_kernel, grid, 256, 0, s, static_cast<const __nv_bfloat16*>(y), pair_pos, a.ids, a.weights, a.T,
             a.k, a.H, a.expert_begin, a.E_local, static_cast<__nv_bfloat16*>(a.out), sh);
  TCUDA_LAUNCH_CHECK();
}

}  // namespace tessera::cuda
