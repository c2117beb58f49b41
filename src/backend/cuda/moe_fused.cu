// Mixture-of-experts decode in one persistent kernel (CudaMoeDecode::kFused*): (kTopk) the
// router's top-k, the gate_up grouped GEMV, the down grouped GEMV and (kCombine) the weighted
// combine, separated by one grid-wide barrier instead of kernel boundaries. The three-kernel path (moe.cu,
// launch_moe_decode) pays each kernel's ramp (launch, prologue, first load round trip) and drain
// (the last blocks streaming while the rest of the GPU idles) in turn; here the down weights of
// every warp's first unit are loaded before the barrier (they do not depend on the gate_up
// results), so DRAM stays busy while the last gate_up rows finish, and the combine is done by
// the last warp to finish each group of rows instead of a third kernel.
//
// Grid: at most one wave (every block resident at once, from the occupancy of this kernel), so
// the barrier cannot deadlock; a barrier that does not complete within a second raises
// kErrMoeGridBarrier (reported at the next synchronize) instead of hanging. The barrier and the
// per-row-group counters live in a small zeroed buffer owned by the caller; every use leaves them
// at zero again (the last arriver resets), so the kernel replays in CUDA graphs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemv_kernel.cuh"
#include "backend/cuda/moe_topk.cuh"

namespace tessera::cuda {

namespace {

constexpr int kFWarps = 8;
constexpr int kFThreads = kFWarps * 32;
static_assert(kFThreads == kMoeDecodeMaxPairs, "a thread per pair");
constexpr int kFM = 4;           // pairs per pass over an expert's rows
constexpr int kGuUnroll = 8;     // gate_up: 16-byte loads in flight per lane and row (gate, up)
constexpr int kDnRows = 4;       // down: rows of one expert per warp unit
constexpr int kDnUnroll = 4;     // down: 16-byte loads per lane and row (I <= 1024 in one round)
constexpr int kBarrierInts = 2;  // sync[0]: arrivals, sync[1]: generation; then a counter per row group

struct FusedLists {
  int rank_of[kMoeMaxExperts];        // local expert -> its first pair, then its rank
  int expert_of[kMoeDecodeMaxPairs];  // rank -> local expert
  int count[kMoeDecodeMaxPairs];      // rank -> pairs routed to it
  int offset[kMoeDecodeMaxPairs];     // rank -> its first entry in list
  int list[kMoeDecodeMaxPairs];       // pairs grouped by rank
  int warp_tot[kFWarps];
};

// Exclusive prefix sum of one value per thread over the block (kFThreads threads).
__device__ int fused_block_scan(int v, int* warp_tot) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += u;
  }
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  int before = 0;
#pragma unroll
  for (int w = 0; w < kFWarps; ++w) before += w < warp ? warp_tot[w] : 0;
  return before + incl - v;
}

// The step's distinct local experts ranked by their first pair and each one's pairs listed
// contiguously (the order within an expert varies; each pair's result is computed alone), from
// the routing in shared memory (s_ids). Every block computes the same lists. Returns the number
// of distinct local experts.
__device__ int fused_list_pairs(FusedLists& L, const int* s_ids, int P, int expert_begin, int E_local) {
  const int q = threadIdx.x, warp = q >> 5, lane = q & 31;
  for (int e = q; e < E_local; e += kFThreads) L.rank_of[e] = 0x7fffffff;
  L.count[q] = 0;
  const int e_q = q < P ? s_ids[q] - expert_begin : -1;
  const bool local_q = q < P && e_q >= 0 && e_q < E_local;
  __syncthreads();
  if (local_q) atomicMin(&L.rank_of[e_q], q);
  __syncthreads();
  const bool is_first = local_q && L.rank_of[e_q] == q;
  const unsigned ballot = __ballot_sync(0xffffffffu, is_first);
  if (lane == 0) L.warp_tot[warp] = __popc(ballot);
  __syncthreads();
  int rank = __popc(ballot & ((1u << lane) - 1u)), distinct = 0;
#pragma unroll
  for (int v = 0; v < kFWarps; ++v) {
    rank += v < warp ? L.warp_tot[v] : 0;
    distinct += L.warp_tot[v];
  }
  __syncthreads();  // warp_tot is reused by the scan below
  if (is_first) {   // every read of rank_of as "first pair" happened before the barriers above
    L.rank_of[e_q] = rank;
    L.expert_of[rank] = e_q;
  }
  __syncthreads();
  int r_q = 0, slot = 0;
  if (local_q) {
    r_q = L.rank_of[e_q];
    slot = atomicAdd(&L.count[r_q], 1);
  }
  __syncthreads();
  L.offset[q] = fused_block_scan(L.count[q], L.warp_tot);
  __syncthreads();
  if (local_q) L.list[L.offset[r_q] + slot] = q;
  __syncthreads();
  return distinct;
}

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every block of the grid arrives before any leaves; writes before it are visible to reads after
// it (the fences of cooperative groups' grid sync). Sense by generation: the last arriver resets
// the arrival count and bumps the generation, so the next launch finds the count at zero.
__device__ void fused_grid_barrier(unsigned* sync, int* err) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned gen = ld_acquire_gpu(sync + 1);
    __threadfence();
    if (atomicAdd(sync, 1u) == gridDim.x - 1) {
      atomicExch(sync, 0u);
      __threadfence();
      atomicAdd(sync + 1, 1u);
    } else {
      const uint64_t t0 = global_ns();
      while (ld_acquire_gpu(sync + 1) == gen) {
        __nanosleep(64);
        if (global_ns() - t0 > 1000000000ull) {  // 1 s: not every block became resident
          raise_error(err, kErrMoeGridBarrier);
          break;
        }
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// The router's top-k folded into the kernel (kTopk): every block computes the routing of every
// token itself (a warp per token, warp_topk: the same bits as moe_topk), block 0 also writes it
// to ids / weights. Otherwise ids / weights are inputs.
constexpr int kFTopkPer = 8;  // experts per lane: E <= 256
struct FusedTopk {
  const float* logits;  // f32 [T, E]
  int E;
  bool renormalize;
};

// The shared expert folded in (gate_up not null; kCombine only): one more rank in the lists,
// after the routed experts, with every token as a pair (virtual pairs P + t, their act and y rows
// after the routed pairs'), scaled in the combine by g_t = sigmoid(bf16(gate . x[t])) or 1.
struct FusedShared {
  const __nv_bfloat16* gate_up;  // [2I, H]
  const __nv_bfloat16* down;     // [H, I]
  const __nv_bfloat16* gate;     // [1, H] or null
};

template <bool kPrefetch, bool kCombine, bool kTopk>
__global__ void __launch_bounds__(kFThreads, 2)
    moe_fused_decode_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ gate_up,
                            const __nv_bfloat16* __restrict__ down, int32_t* ids, float* weights, FusedTopk topk,
                            FusedShared shared, int T, int k, int expert_begin, int E_local, int H, int I,
                            __nv_bfloat16* act, __nv_bfloat16* y, __nv_bfloat16* __restrict__ out, unsigned* sync,
                            int* err) {
  __shared__ FusedLists L;
  __shared__ int s_ids[kMoeDecodeMaxPairs];
  __shared__ float s_w[kMoeDecodeMaxPairs];
  __shared__ float s_gate[kMoeDecodeMaxPairs];  // g_t of the shared expert
  const int P = T * k;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  pdl_wait();  // the routing (or the logits) and x come from the kernels before
  if (kTopk) {
    for (int t = warp; t < T; t += kFWarps) {
      int id;
      float wt;
      warp_topk<kFTopkPer>(topk.logits + static_cast<int64_t>(t) * topk.E, topk.E, k, topk.renormalize, &id, &wt);
      if (lane < k) {
        s_ids[t * k + lane] = id;
        s_w[t * k + lane] = wt;
        if (blockIdx.x == 0) {
          ids[t * k + lane] = id;
          weights[t * k + lane] = wt;
        }
      }
    }
  } else if (threadIdx.x < P) {
    s_ids[threadIdx.x] = ids[threadIdx.x];
    s_w[threadIdx.x] = weights[threadIdx.x];
  }
  __syncthreads();
  const int routed = fused_list_pairs(L, s_ids, P, expert_begin, E_local);
  const bool has_shared = kCombine && shared.gate_up != nullptr;  // T * (k + 1) <= 256: checked by the host
  if (has_shared) {
    // The shared expert as rank `routed`: its pairs are the tokens, listed after the routed pairs.
    const int first = routed > 0 ? L.offset[routed - 1] + L.count[routed - 1] : 0;
    for (int t = threadIdx.x; t < T; t += kFThreads) L.list[first + t] = P + t;
    if (threadIdx.x == 0) {
      L.expert_of[routed] = -1;
      L.count[routed] = T;
      L.offset[routed] = first;
    }
    for (int t = warp; t < T; t += kFWarps) {
      float g = 1.0f;
      if (shared.gate) {
        const uint4* gr = reinterpret_cast<const uint4*>(shared.gate);
        const uint4* xr = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(t) * H);
        float d = 0.0f;
        for (int c = lane; c < H / 8; c += 32) d += dot8(__ldg(gr + c), __ldg(xr + c));
        d = __bfloat162float(__float2bfloat16_rn(warp_sum(d)));  // the gate linear's bf16 output
        g = 1.0f / (1.0f + __expf(-d));
      }
      if (lane == 0) s_gate[t] = g;
    }
    __syncthreads();
  }
  const int distinct = routed + (has_shared ? 1 : 0);  // ranks of the lists
  if (distinct == 0) {  // no pair on this rank's experts: zeros (every block takes this branch)
    if (kCombine)
      for (int64_t i = blockIdx.x * int64_t(kFThreads) + threadIdx.x; i < int64_t(T) * H; i += gridDim.x * kFThreads)
        out[i] = __float2bfloat16_rn(0.0f);
    return;
  }
  const int gwarp = blockIdx.x * kFWarps + warp, nwarps = gridDim.x * kFWarps;

  // ---- gate_up: unit (rank r, intermediate index i): rows i and I + i of gate_up[e] times x.
  {
    const int chunks = H / 8;
    const int units = distinct * I;
    for (int u = gwarp; u < units; u += nwarps) {
      const int r = u / I, i = u - r * I;
      const int e = L.expert_of[r], n = L.count[r], o = L.offset[r];
      const __nv_bfloat16* base = e >= 0 ? gate_up + static_cast<int64_t>(e) * 2 * I * H : shared.gate_up;
      const uint4* wg = reinterpret_cast<const uint4*>(base + static_cast<int64_t>(i) * H);
      const uint4* wu = reinterpret_cast<const uint4*>(base + static_cast<int64_t>(I + i) * H);
      for (int pass = 0; pass < n; pass += kFM) {
        const uint4* xr[kFM];
        bool use[kFM];
#pragma unroll
        for (int m = 0; m < kFM; ++m) {
          use[m] = pass + m < n;
          const int pq = L.list[o + (use[m] ? pass + m : pass)];
          xr[m] = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(pq < P ? pq / k : pq - P) * H);
        }
        float ag[kFM], au[kFM];
#pragma unroll
        for (int m = 0; m < kFM; ++m) ag[m] = au[m] = 0.0f;
        for (int base = lane; base < chunks; base += 32 * kGuUnroll) {
          uint4 g[kGuUnroll], up[kGuUnroll];
#pragma unroll
          for (int v = 0; v < kGuUnroll; ++v)
            if (base + 32 * v < chunks) {
              g[v] = load_stream(wg + base + 32 * v);
              up[v] = load_stream(wu + base + 32 * v);
            }
#pragma unroll
          for (int v = 0; v < kGuUnroll; ++v) {
            const int c = base + 32 * v;
            if (c < chunks) {
#pragma unroll
              for (int m = 0; m < kFM; ++m)
                if (use[m]) {
                  const uint4 xv = __ldg(xr[m] + c);
                  ag[m] += dot8(g[v], xv);
                  au[m] += dot8(up[v], xv);
                }
            }
          }
        }
#pragma unroll
        for (int m = 0; m < kFM; ++m) {
          if (!use[m]) continue;  // uniform over the warp
          const float sg = warp_sum(ag[m]), su = warp_sum(au[m]);
          if (lane == 0)
            act[static_cast<int64_t>(L.list[o + pass + m]) * I + i] =
                __float2bfloat16_rn(sg / (1.0f + __expf(-sg)) * su);
        }
      }
    }
  }

  // ---- down: unit (rank r, row group g): rows g * kDnRows .. + kDnRows - 1 of down[e] times act.
  const int groups = (H + kDnRows - 1) / kDnRows;
  const int units = distinct * groups;
  const int chunks = I / 8;
  uint4 wv[kDnRows][kDnUnroll];  // the first unit's first round, loaded before the barrier
  bool preloaded = false;
  auto unit_rows = [&](int u, const uint4*(&wr)[kDnRows], bool(&row_ok)[kDnRows], int& r, int& h0) {
    r = u / groups;
    h0 = (u - r * groups) * kDnRows;
    const int e = L.expert_of[r];
    const __nv_bfloat16* base = e >= 0 ? down + static_cast<int64_t>(e) * H * I : shared.down;
#pragma unroll
    for (int rr = 0; rr < kDnRows; ++rr) {
      row_ok[rr] = h0 + rr < H;
      wr[rr] = reinterpret_cast<const uint4*>(base + static_cast<int64_t>(row_ok[rr] ? h0 + rr : h0) * I);
    }
  };
  if (kPrefetch && gwarp < units) {
    const uint4* wr[kDnRows];
    bool row_ok[kDnRows];
    int r, h0;
    unit_rows(gwarp, wr, row_ok, r, h0);
#pragma unroll
    for (int v = 0; v < kDnUnroll; ++v)
#pragma unroll
      for (int rr = 0; rr < kDnRows; ++rr)
        if (lane + 32 * v < chunks) wv[rr][v] = load_stream(wr[rr] + lane + 32 * v);
    preloaded = true;
  }
  fused_grid_barrier(sync, err);  // act complete

  unsigned* group_done = sync + kBarrierInts;
  for (int u = gwarp; u < units; u += nwarps) {
    const uint4* wr[kDnRows];
    bool row_ok[kDnRows];
    int r, h0;
    unit_rows(u, wr, row_ok, r, h0);
    const int n = L.count[r], o = L.offset[r];
    for (int pass = 0; pass < n; pass += kFM) {
      const uint4* ar[kFM];
      bool use[kFM];
#pragma unroll
      for (int m = 0; m < kFM; ++m) {
        use[m] = pass + m < n;
        ar[m] = reinterpret_cast<const uint4*>(act + static_cast<int64_t>(L.list[o + (use[m] ? pass + m : pass)]) * I);
      }
      float acc[kDnRows][kFM];
#pragma unroll
      for (int rr = 0; rr < kDnRows; ++rr)
#pragma unroll
        for (int m = 0; m < kFM; ++m) acc[rr][m] = 0.0f;
      for (int base = lane; base < chunks; base += 32 * kDnUnroll) {
        if (!preloaded) {
#pragma unroll
          for (int v = 0; v < kDnUnroll; ++v)
#pragma unroll
            for (int rr = 0; rr < kDnRows; ++rr)
              if (base + 32 * v < chunks) wv[rr][v] = load_stream(wr[rr] + base + 32 * v);
        }
        preloaded = false;
#pragma unroll
        for (int v = 0; v < kDnUnroll; ++v) {
          const int c = base + 32 * v;
          if (c < chunks) {
#pragma unroll
            for (int m = 0; m < kFM; ++m)
              if (use[m]) {
                const uint4 av = __ldcg(ar[m] + c);  // written by this kernel: not through the read-only path
#pragma unroll
                for (int rr = 0; rr < kDnRows; ++rr) acc[rr][m] += dot8(wv[rr][v], av);
              }
          }
        }
      }
#pragma unroll
      for (int m = 0; m < kFM; ++m) {
        if (!use[m]) continue;  // uniform over the warp
        float s[kDnRows];
#pragma unroll
        for (int rr = 0; rr < kDnRows; ++rr) s[rr] = warp_sum(acc[rr][m]);
        if (lane != 0) continue;
        const int64_t pq = L.list[o + pass + m];
#pragma unroll
        for (int rr = 0; rr < kDnRows; ++rr)
          if (row_ok[rr]) y[pq * H + h0 + rr] = __float2bfloat16_rn(s[rr]);
      }
    }
    if (!kCombine) continue;
    // The last warp to finish this row group (over the distinct experts) combines it:
    // out[t, h] = sum_j w[t, j] * y[t * k + j, h] over the local pairs in slot order.
    const int g = h0 / kDnRows;
    int last = 0;
    if (lane == 0) {
      __threadfence();  // this warp's y rows before its arrival
      last = atomicAdd(group_done + g, 1u) == static_cast<unsigned>(distinct - 1);
      if (last) {
        atomicExch(group_done + g, 0u);  // ready for the next launch
        __threadfence();
      }
    }
    if (!__shfl_sync(0xffffffffu, last, 0)) continue;
    for (int idx = lane; idx < T * kDnRows; idx += 32) {
      const int t = idx / kDnRows, h = h0 + idx % kDnRows;
      if (h >= H) continue;
      float s = 0.0f;
      for (int j = 0; j < k; ++j) {
        const int pair = t * k + j, e = s_ids[pair] - expert_begin;
        if (e < 0 || e >= E_local) continue;
        s += s_w[pair] * __bfloat162float(__ldcg(y + static_cast<int64_t>(pair) * H + h));
      }
      if (has_shared) s += s_gate[t] * __bfloat162float(__ldcg(y + static_cast<int64_t>(P + t) * H + h));
      out[static_cast<int64_t>(t) * H + h] = __float2bfloat16_rn(s);
    }
  }
  pdl_launch_dependents();
}

template <bool kPrefetch, bool kCombine, bool kTopk>
void launch_fused(const MoeArgs& a, const MoeDecodeWorkspace& ws, const FusedTopk& topk, const FusedShared& shared,
                  int num_sms, cudaStream_t s) {
  auto kernel = moe_fused_decode_kernel<kPrefetch, kCombine, kTopk>;
  static const int resident = [&] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kFThreads, 0) != cudaSuccess || n < 1) {
      (void)cudaGetLastError();
      n = 1;
    }
    return n;
  }();
  const int64_t slots = std::min(a.T * a.k, a.E_local) + (shared.gate_up ? 1 : 0);  // ranks at most
  const int64_t warps_wanted = std::max(slots * a.I, slots * ceil_div(a.H, kDnRows));
  const auto grid = static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>(int64_t{resident} * std::max(num_sms, 1), ceil_div(warps_wanted, kFWarps))));
  launch_pdl(kernel, grid, kFThreads, 0, s, static_cast<const __nv_bfloat16*>(a.x),
             static_cast<const __nv_bfloat16*>(a.gate_up), static_cast<const __nv_bfloat16*>(a.down),
             const_cast<int32_t*>(a.ids), const_cast<float*>(a.weights), topk, shared, a.T, a.k, a.expert_begin,
             a.E_local, a.H, a.I, static_cast<__nv_bfloat16*>(ws.act), static_cast<__nv_bfloat16*>(ws.y),
             static_cast<__nv_bfloat16*>(a.out), ws.sync, ws.err);
  TCUDA_LAUNCH_CHECK();
  if (!kCombine) launch_moe_combine(a, ws.y, nullptr, s);
}

}  // namespace

int64_t moe_decode_sync_ints(int64_t H) { return kBarrierInts + (H + kDnRows - 1) / kDnRows; }

bool moe_decode_fused_topk_supported(int E, int k) { return E >= k && E <= 32 * kFTopkPer && k >= 1 && k <= 32; }

bool moe_decode_fused_shared_supported(CudaMoeDecode kind, int T, int k) {
  return kind != CudaMoeDecode::kSplit && kind != CudaMoeDecode::kFusedSeparateCombine &&
         static_cast<int64_t>(T) * (k + 1) <= kMoeDecodeMaxPairs;
}

void launch_moe_decode_fused(const MoeArgs& a, const MoeDecodeWorkspace& ws, CudaMoeDecode kind, int num_sms,
                             cudaStream_t s, const MoeFusedTopk* fold, const MoeFusedShared* shared) {
  const FusedTopk topk{fold ? fold->logits : nullptr, fold ? fold->E : 0, fold && fold->renormalize};
  const FusedShared sh{shared ? static_cast<const __nv_bfloat16*>(shared->gate_up) : nullptr,
                       shared ? static_cast<const __nv_bfloat16*>(shared->down) : nullptr,
                       shared ? static_cast<const __nv_bfloat16*>(shared->gate) : nullptr};
  if (fold && kind != CudaMoeDecode::kFusedTopkKernel) {
    switch (kind) {
      case CudaMoeDecode::kFusedNoPrefetch:
        launch_fused<false, true, true>(a, ws, topk, sh, num_sms, s);
        return;
      case CudaMoeDecode::kFusedSeparateCombine:
        launch_fused<true, false, true>(a, ws, topk, sh, num_sms, s);
        return;
      default:
        launch_fused<true, true, true>(a, ws, topk, sh, num_sms, s);
        return;
    }
  }
  if (fold)  // kFusedTopkKernel: the top-k kernel, then the fused kernel on its routing
    launch_moe_topk(fold->logits, a.T, fold->E, a.k, fold->renormalize, const_cast<int32_t*>(a.ids),
                    const_cast<float*>(a.weights), s);
  switch (kind) {
    case CudaMoeDecode::kFusedNoPrefetch:
      launch_fused<false, true, false>(a, ws, topk, sh, num_sms, s);
      return;
    case CudaMoeDecode::kFusedSeparateCombine:
      launch_fused<true, false, false>(a, ws, topk, sh, num_sms, s);
      return;
    default:
      launch_fused<true, true, false>(a, ws, topk, sh, num_sms, s);
      return;
  }
}

}  // namespace tessera::cuda
