// Mixture-of-experts kernels except the grouped GEMM (moe_gemm.cu): the router's top-k, the
// decode path's two grouped GEMVs, the prefill path's routing (tokens permuted by expert on the
// device) and the weighted combine both paths end with. Nothing here reads routing results on
// the host, so every launch is capturable in a CUDA graph (see CudaBackend::moe_experts).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemv_kernel.cuh"
#include "backend/cuda/moe_topk.cuh"

namespace tessera::cuda {

namespace {

// ---------------------------------------------------------------- decode: grouped GEMV
// Grid (row tiles, min(T * k, E_local)): the distinct local experts of the step are ranked by
// their first pair on the device, and block (r, y) serves the one of rank y (exiting when there
// are fewer). It lists the pairs routed to that expert and streams its rows of the weights once per
// kM of them (one pass for almost every expert at decode batch sizes), 16-byte non-allocating
// loads, kRows x kUnroll of them in flight per lane, as the dense decode GEMV (gemv_kernel.cuh).
//   gate_up (kGateUp): warp w of block r owns intermediate index i = r * 8 + w: rows i (gate)
//     and I + i (up) of gate_up[e], times x[token]; act[pair, i] = silu(gate) * up.
//   down: warp w owns rows h = (r * 8 + w) * 4 .. + 3 of down[e], times act[pair];
//     y[pair, h] (the routing weight is applied by the combine).
constexpr int kGemvWarps = 8;
constexpr int kGemvM = 4;  // pairs per pass over the weights

template <bool kGateUp>
__global__ void __launch_bounds__(kGemvWarps * 32)
    moe_gemv_kernel(const __nv_bfloat16* __restrict__ in, const __nv_bfloat16* __restrict__ w,
                    const int32_t* __restrict__ ids, int P, int k, int expert_begin, int E_local, int H, int I,
                    __nv_bfloat16* __restrict__ out) {
  constexpr int kRows = kGateUp ? 2 : 4;
  constexpr int kUnroll = kGateUp ? 8 : 4;
  static_assert(kGemvWarps * 32 == kMoeDecodeMaxPairs, "a thread per pair");
  __shared__ int first[kMoeMaxExperts];  // lowest pair routed to each local expert
  __shared__ int list[kMoeDecodeMaxPairs];
  __shared__ int warp_firsts[kGemvWarps];
  __shared__ int list_n, block_id;
  for (int x = threadIdx.x; x < E_local; x += blockDim.x) first[x] = 0x7fffffff;
  if (threadIdx.x == 0) list_n = 0;
  const int q = threadIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  pdl_wait();  // ids and `in` come from the kernels before
  // Thread q reads pair q's expert: the only global load before the weights stream.
  const int id_q = q < P ? ids[q] : -1;
  const bool local_q = q < P && id_q - expert_begin >= 0 && id_q - expert_begin < E_local;
  __syncthreads();
  if (local_q) atomicMin(&first[id_q - expert_begin], q);
  __syncthreads();
  // Rank the distinct local experts by their first pair; block y serves the one of rank y.
  const bool is_first = local_q && first[id_q - expert_begin] == q;
  const unsigned ballot = __ballot_sync(0xffffffffu, is_first);
  if (lane == 0) warp_firsts[warp] = __popc(ballot);
  __syncthreads();
  int rank = __popc(ballot & ((1u << lane) - 1u)), distinct = 0;
#pragma unroll
  for (int v = 0; v < kGemvWarps; ++v) {
    rank += v < warp ? warp_firsts[v] : 0;
    distinct += warp_firsts[v];
  }
  if (static_cast<int>(blockIdx.y) >= distinct) return;  // fewer distinct experts than blocks
  if (is_first && rank == static_cast<int>(blockIdx.y)) block_id = id_q;
  __syncthreads();
  const int id = block_id, e = id - expert_begin;
  // The pairs routed to this expert, in any order (each pair's result is computed alone).
  if (id_q == id) list[atomicAdd(&list_n, 1)] = q;
  __syncthreads();
  const int n = list_n;
  // This warp's rows and the length K of each row (and of each input vector).
  const int K = kGateUp ? H : I;
  const int N_out = kGateUp ? I : H;
  const int r0 = (blockIdx.x * kGemvWarps + warp) * (kGateUp ? 1 : kRows);
  if (r0 >= N_out) return;
  const int64_t expert_rows = kGateUp ? 2 * static_cast<int64_t>(I) : H;
  const uint4* wr[kRows];
  bool row_ok[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = kGateUp ? (r == 0 ? r0 : I + r0) : r0 + r;
    row_ok[r] = kGateUp || r0 + r < N_out;
    wr[r] = reinterpret_cast<const uint4*>(w + (e * expert_rows + (row_ok[r] ? row : r0)) * K);
  }
  const int chunks = K / 8;
  for (int pass = 0; pass < n; pass += kGemvM) {
    const uint4* xr[kGemvM];
    bool use[kGemvM];
#pragma unroll
    for (int m = 0; m < kGemvM; ++m) {
      use[m] = pass + m < n;
      const int pq = use[m] ? list[pass + m] : list[pass];
      xr[m] = reinterpret_cast<const uint4*>(in + static_cast<int64_t>(kGateUp ? pq / k : pq) * K);
    }
    float acc[kRows][kGemvM];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int m = 0; m < kGemvM; ++m) acc[r][m] = 0.0f;
    for (int base = lane; base < chunks; base += 32 * kUnroll) {
      uint4 wv[kRows][kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          if (base + 32 * u < chunks) wv[r][u] = load_stream(wr[r] + base + 32 * u);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = base + 32 * u;
        if (c < chunks) {
#pragma unroll
          for (int m = 0; m < kGemvM; ++m)
            if (use[m]) {
              const uint4 xv = __ldg(xr[m] + c);
#pragma unroll
              for (int r = 0; r < kRows; ++r) acc[r][m] += dot8(wv[r][u], xv);
            }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kGemvM; ++m) {
      if (!use[m]) continue;  // uniform over the warp
      const int pq = list[pass + m];
      float s[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) s[r] = warp_sum(acc[r][m]);
      if (lane != 0) continue;
      if (kGateUp) {
        out[static_cast<int64_t>(pq) * I + r0] = __float2bfloat16_rn(s[0] / (1.0f + __expf(-s[0])) * s[1]);
      } else {
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          if (row_ok[r]) out[static_cast<int64_t>(pq) * H + r0 + r] = __float2bfloat16_rn(s[r]);
      }
    }
  }
  pdl_launch_dependents();
}

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
                                   int H, int expert_begin, int E_local, __nv_bfloat16* __restrict__ out) {
  pdl_wait();
  const int per_row = H / 8;
  const int64_t total = static_cast<int64_t>(T) * per_row;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(idx / per_row), c = static_cast<int>(idx % per_row);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < k; ++j) {
      const int pair = t * k + j;
      int row;
      if (pair_pos) {
        row = pair_pos[pair];
      } else {
        const int e = ids[pair] - expert_begin;
        row = e >= 0 && e < E_local ? pair : -1;
      }
      if (row < 0) continue;
      const float wt = weights[pair];
      const uint4 v = reinterpret_cast<const uint4*>(y + static_cast<int64_t>(row) * H)[c];
      acc[0] += wt * lo(v.x);
      acc[1] += wt * hi(v.x);
      acc[2] += wt * lo(v.y);
      acc[3] += wt * hi(v.y);
      acc[4] += wt * lo(v.z);
      acc[5] += wt * hi(v.z);
      acc[6] += wt * lo(v.w);
      acc[7] += wt * hi(v.w);
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
  pdl_launch_dependents();
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

void launch_moe_decode(const MoeArgs& a, void* act, void* y, cudaStream_t s) {
  const int P = a.T * a.k;
  const auto* x = static_cast<const __nv_bfloat16*>(a.x);
  auto* actb = static_cast<__nv_bfloat16*>(act);
  auto* yb = static_cast<__nv_bfloat16*>(y);
  const int slots = std::min(P, a.E_local);  // at most this many distinct local experts
  launch_pdl(moe_gemv_kernel<true>, dim3(ceil_div(a.I, kGemvWarps), slots), kGemvWarps * 32, 0, s, x,
             static_cast<const __nv_bfloat16*>(a.gate_up), a.ids, P, a.k, a.expert_begin, a.E_local, a.H, a.I, actb);
  TCUDA_LAUNCH_CHECK();
  launch_pdl(moe_gemv_kernel<false>, dim3(ceil_div(a.H, kGemvWarps * 4), slots), kGemvWarps * 32, 0, s,
             static_cast<const __nv_bfloat16*>(actb), static_cast<const __nv_bfloat16*>(a.down), a.ids, P, a.k,
             a.expert_begin, a.E_local, a.H, a.I, yb);
  TCUDA_LAUNCH_CHECK();
  launch_moe_combine(a, yb, nullptr, s);
}

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

void launch_moe_combine(const MoeArgs& a, const void* y, const int32_t* pair_pos, cudaStream_t s) {
  const int64_t n = static_cast<int64_t>(a.T) * (a.H / 8);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(n, 256), 65535LL * 16));
  launch_pdl(moe_combine_kernel, grid, 256, 0, s, static_cast<const __nv_bfloat16*>(y), pair_pos, a.ids, a.weights, a.T,
             a.k, a.H, a.expert_begin, a.E_local, static_cast<__nv_bfloat16*>(a.out));
  TCUDA_LAUNCH_CHECK();
}

}  // namespace tessera::cuda
