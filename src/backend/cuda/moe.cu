// Mixture-of-experts kernels except the grouped GEMM (moe_gemm.cu): the router's top-k, the
// decode path's two grouped GEMVs, the prefill path's routing (tokens permuted by expert on the
// device) and the weighted combine both paths end with. Nothing here reads routing results on
// the host, so every launch is capturable in a CUDA graph (see CudaBackend::moe_experts).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/fp8_utils.cuh"
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
static_assert(kGemvWarps * 32 == kMoeDecodeMaxPairs, "a thread per pair");

// Shared memory of a decode block's routing (moe_decode_route).
struct DecodeRouteSmem {
  int first[kMoeMaxExperts];  // lowest pair routed to each local expert
  int list[kMoeDecodeMaxPairs];
  int warp_firsts[kGemvWarps];
  int list_n, block_id;
};

// The routing preamble of a decode block: which local expert block y serves (the one of rank
// blockIdx.y among the step's distinct local experts, ranked by their first pair), and the
// pairs routed to it (r.list[0 .. *n), in any order: each pair's result is computed alone).
// Returns false (the block has nothing to do) when there are fewer distinct experts than
// blocks. Thread q reads pair q's expert: the only global load before the weights stream.
__device__ __forceinline__ bool moe_decode_route(DecodeRouteSmem& r, const int32_t* __restrict__ ids, int P,
                                                 int expert_begin, int E_local, int* e_out, int* n_out) {
  for (int x = threadIdx.x; x < E_local; x += blockDim.x) r.first[x] = 0x7fffffff;
  if (threadIdx.x == 0) r.list_n = 0;
  const int q = threadIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  pdl_wait();  // ids and the kernel's input come from the kernels before
  const int id_q = q < P ? ids[q] : -1;
  const bool local_q = q < P && id_q - expert_begin >= 0 && id_q - expert_begin < E_local;
  __syncthreads();
  if (local_q) atomicMin(&r.first[id_q - expert_begin], q);
  __syncthreads();
  const bool is_first = local_q && r.first[id_q - expert_begin] == q;
  const unsigned ballot = __ballot_sync(0xffffffffu, is_first);
  if (lane == 0) r.warp_firsts[warp] = __popc(ballot);
  __syncthreads();
  int rank = __popc(ballot & ((1u << lane) - 1u)), distinct = 0;
#pragma unroll
  for (int v = 0; v < kGemvWarps; ++v) {
    rank += v < warp ? r.warp_firsts[v] : 0;
    distinct += r.warp_firsts[v];
  }
  if (static_cast<int>(blockIdx.y) >= distinct) return false;  // uniform over the block
  if (is_first && rank == static_cast<int>(blockIdx.y)) r.block_id = id_q;
  __syncthreads();
  const int id = r.block_id;
  if (id_q == id) r.list[atomicAdd(&r.list_n, 1)] = q;
  __syncthreads();
  *e_out = id - expert_begin;
  *n_out = r.list_n;
  return true;
}

// 16 e4m3 weights (one uint4) to floats.
__device__ __forceinline__ void fp8x16_to_float(const uint4& v, float (&f)[16]) {
  const uint32_t ws[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float g[4];
    fp8x4_to_float(ws[q], g);
#pragma unroll
    for (int i = 0; i < 4; ++i) f[4 * q + i] = g[i];
  }
}

// sum_i f[i] * x[i] over 16 floats and 16 bf16 activations (two uint4).
__device__ __forceinline__ float dot16f(const float (&f)[16], const uint4& x0, const uint4& x1) {
  const uint32_t xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  float s = 0.0f;
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    s = fmaf(f[2 * q], lo(xs[q]), s);
    s = fmaf(f[2 * q + 1], hi(xs[q]), s);
  }
  return s;
}

// kFp8: the weights are e4m3 with f32 scales per 128 x 128 block of each expert's matrix
// (scale [E_local, ceil(rows / 128), ceil(K / 128)]); a 16-byte load is 16 weights, widened
// to f32 once per load and multiplied with every pair's x; each load's partial dot gets its
// block's scale with one FMA (16 columns never straddle a 128-column block). Half the bytes
// of bf16, so half the unroll keeps the same weights in flight (bf16's unroll, measured on the
// H200 in session 17, needs 160-169 registers and runs at 0.6x).
template <bool kGateUp, bool kFp8>
__global__ void __launch_bounds__(kGemvWarps * 32)
    moe_gemv_kernel(const __nv_bfloat16* __restrict__ in, const void* __restrict__ w_raw,
                    const float* __restrict__ scale, const int32_t* __restrict__ ids, int P, int k, int expert_begin,
                    int E_local, int H, int I, __nv_bfloat16* __restrict__ out) {
  constexpr int kRows = kGateUp ? 2 : 4;
  constexpr int kUnroll = (kGateUp ? 8 : 4) / (kFp8 ? 2 : 1);
  constexpr int kPerChunk = kFp8 ? 16 : 8;  // weights per 16-byte load
  constexpr int kWeightBytes = kFp8 ? 1 : 2;
  __shared__ DecodeRouteSmem route;
  int e = 0, n = 0;
  if (!moe_decode_route(route, ids, P, expert_begin, E_local, &e, &n)) return;
  const int* list = route.list;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // This warp's rows and the length K of each row (and of each input vector).
  const int K = kGateUp ? H : I;
  const int N_out = kGateUp ? I : H;
  const int r0 = (blockIdx.x * kGemvWarps + warp) * (kGateUp ? 1 : kRows);
  if (r0 >= N_out) return;
  const int64_t expert_rows = kGateUp ? 2 * static_cast<int64_t>(I) : H;
  const int kb = (K + 127) / 128;                        // scale blocks per row
  const int64_t scale_rows = (expert_rows + 127) / 128;  // scale block rows per expert
  const auto* w = static_cast<const char*>(w_raw);
  const uint4* wr[kRows];
  const float* sr[kRows];
  bool row_ok[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = kGateUp ? (r == 0 ? r0 : I + r0) : r0 + r;
    row_ok[r] = kGateUp || r0 + r < N_out;
    const int64_t rr = row_ok[r] ? row : r0;
    wr[r] = reinterpret_cast<const uint4*>(w + (e * expert_rows + rr) * K * kWeightBytes);
    sr[r] = kFp8 ? scale + (e * scale_rows + rr / 128) * kb : nullptr;
  }
  const int chunks = K / kPerChunk;
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
        if (c >= chunks) continue;
        if constexpr (kFp8) {
          uint4 x0[kGemvM], x1[kGemvM];
#pragma unroll
          for (int m = 0; m < kGemvM; ++m)
            if (use[m]) {
              x0[m] = __ldg(xr[m] + 2 * c);
              x1[m] = __ldg(xr[m] + 2 * c + 1);
            }
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const float sc = __ldg(sr[r] + c / 8);  // columns 16c .. 16c + 15: block 16c / 128
            float f[16];
            fp8x16_to_float(wv[r][u], f);
#pragma unroll
            for (int m = 0; m < kGemvM; ++m)
              if (use[m]) acc[r][m] = fmaf(sc, dot16f(f, x0[m], x1[m]), acc[r][m]);
          }
        } else {
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

constexpr int kOneTokenMaxPairs = 32;  // k up to a warp's lanes

// A shared expert folded into the one-token down GEMV: its down [H, I] (null: none), its gate
// [1, H] (null: weight 1) and x [H] (the MoE input, for the gate's dot product).
struct OneTokenShared {
  const __nv_bfloat16 *down, *gate, *x;
};

// Lane l < P of the calling warp gets pair l's expert id in *id; returns the mask of the pairs
// whose expert is local. ids is read through L2 (ld.global.cg): moe_down_one_token_kernel reads
// it before pdl_wait.
__device__ __forceinline__ unsigned one_token_local_pairs(const int32_t* __restrict__ ids, int P, int expert_begin,
                                                          int E_local, int* id) {
  const int lane = threadIdx.x & 31;
  *id = lane < P ? __ldcg(ids + lane) : -1;
  const bool local = lane < P && *id - expert_begin >= 0 && *id - expert_begin < E_local;
  return __ballot_sync(0xffffffffu, local);
}

// The expert (local index) and pair of the y-th local pair, or false when fewer pairs are local.
// Every lane of the warp calls it.
__device__ __forceinline__ bool one_token_pair(const int32_t* __restrict__ ids, int P, int expert_begin, int E_local,
                                               int y, int* e, int* pair) {
  int id;
  unsigned mask = one_token_local_pairs(ids, P, expert_begin, E_local, &id);
  if (y >= __popc(mask)) return false;
  for (int i = 0; i < y; ++i) mask &= mask - 1u;  // drop the y lowest local pairs
  const int pos = __ffs(static_cast<int>(mask)) - 1;
  *e = __shfl_sync(0xffffffffu, id, pos) - expert_begin;
  *pair = pos;
  return true;
}

// ---------------------------------------------------------------- decode: FP8 grouped GEMV on tensor cores
// FP8 experts at decode (CudaMoeFp8Decode::kMma). The routing preamble and grid (row tiles,
// expert ranks) of moe_gemv_kernel with the maths of fp8_gemv_mma_kernel (fp8_gemm.cu): a warp
// takes a 16-row tile of the expert's matrix over a slice of K in 64-column groups; per group a
// lane (g = lane / 4, t = lane % 4) loads 16 e4m3 weights of the tile's rows g and g + 8 (one
// 16-byte load each), widens them once to bf16 (exact) into the A operand of 4 bf16 m16n8k16
// MMAs per 8 pairs, x of pair 8 j + g at the same 16 columns being B (a permutation of the
// group's k order, the same for A and B), and adds the group's sums times their 128 x 128 block
// scales (row g's and row g + 8's: one FMA an accumulator). moe_gemv_kernel's FP8 path spends a
// widening to f32 and an FMA per weight and pair, plus the unpacking of x per pair.
//   gate_up: a tile is 8 intermediate indices i0 .. i0 + 7, rows g the gate rows i0 + g and rows
//     g + 8 the up rows I + i0 + g, so a lane holds gate and up of the same (pair, i) and writes
//     silu(gate) * up.
//   down: a tile is 16 rows h0 .. h0 + 15 of H.
// A block holds kTiles tiles (gate_up 2, down 4), the 8 / kTiles warps of a tile splitting K.
// The slices of a tile add their sums in warp order through shared memory (deterministic).
// Pairs go in passes of 8 * kFp8MmaNT; an expert with more pairs streams its rows once a pass.
constexpr int kFp8MmaNT = 2;      // 8-pair MMA columns a pass
constexpr int kFp8MmaUnroll = 4;  // 64-column groups whose weight loads a warp issues before their maths

// kOneToken (T = 1, CudaMoeFp8OneToken): block y serves the y-th local pair, found by a warp
// ballot (one_token_pair) instead of the routing preamble; with one pair only MMA column 0 is
// used (kNT = 1), so fewer registers hold accumulators and x, and a lane can keep more weight
// loads in flight (kUnroll). The sums are the same in every instantiation: a slice's groups
// in ascending order whatever kUnroll, pair 0 in column 0 whatever kNT.
// kWarps: warps a block (kTiles of them per tile's K split); the sums depend on kWarps / kTiles only.
template <bool kGateUp, int kTiles, int kNT = kFp8MmaNT, int kUnroll = kFp8MmaUnroll, bool kOneToken = false,
          int kMinBlocks = 1, int kWarps = kGemvWarps>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    moe_gemv_fp8_mma_kernel(const __nv_bfloat16* __restrict__ in, const uint8_t* __restrict__ w,
                            const float* __restrict__ scale, const int32_t* __restrict__ ids, int P, int k,
                            int expert_begin, int E_local, int H, int I, __nv_bfloat16* __restrict__ out,
                            const uint8_t* __restrict__ shared_w = nullptr,
                            const float* __restrict__ shared_scale = nullptr) {
  constexpr int kSlices = kWarps / kTiles;  // warps splitting K over one tile
  __shared__ DecodeRouteSmem route;
  __shared__ float4 part[kWarps][kNT][32];
  int e = 0, n = 0, one_pair = 0;
  // kOneToken with shared_w: the grid's last row of blocks computes the shared expert (its matrix and
  // scales as one expert's) as pair P, on token 0's x.
  bool on_shared = false;
  if constexpr (kOneToken) {
    pdl_wait();  // ids and the kernel's input come from the kernels before
    // The down GEMV lets the combine kernel launch now: its two blocks then wait resident (and
    // compute the shared expert's gate) instead of launching when the last down block ends. This
    // kernel has waited, so the combine may read what came before it (device_utils.cuh).
    if constexpr (!kGateUp) pdl_launch_dependents();
    on_shared = shared_w != nullptr && blockIdx.y + 1 == gridDim.y;
    if (on_shared)
      one_pair = P;
    else if (!one_token_pair(ids, P, expert_begin, E_local, static_cast<int>(blockIdx.y), &e, &one_pair))
      return;
    n = 1;
  } else {
    if (!moe_decode_route(route, ids, P, expert_begin, E_local, &e, &n)) return;
  }
  auto list_at = [&](int p) { return kOneToken ? one_pair : route.list[p]; };
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x * kTiles + warp / kSlices, slice = warp % kSlices;
  const int K = kGateUp ? H : I;
  const int64_t expert_rows = kGateUp ? 2 * static_cast<int64_t>(I) : H;
  // This lane's weight rows: ra (fragment row g) and rb (g + 8), and whether they exist.
  int64_t ra, rb;
  bool va, vb;
  if (kGateUp) {
    const int i = tile * 8 + g;
    va = vb = i < I;
    ra = i;
    rb = static_cast<int64_t>(I) + i;
  } else {
    ra = static_cast<int64_t>(tile) * 16 + g;
    rb = ra + 8;
    va = ra < H;
    vb = rb < H;
  }
  const int kb = (K + 127) / 128;
  const int64_t scale_rows = (expert_rows + 127) / 128;
  const uint8_t* we = on_shared ? shared_w : w + static_cast<int64_t>(e) * expert_rows * K;
  const float* se = on_shared ? shared_scale : scale + static_cast<int64_t>(e) * scale_rows * kb;
  const uint8_t* wa = we + (va ? ra : 0) * K;
  const uint8_t* wb = we + (vb ? rb : 0) * K;
  const float* sa = se + ((va ? ra : 0) / 128) * kb;
  const float* sb = se + ((vb ? rb : 0) / 128) * kb;
  const int groups = (K + 63) / 64;
  for (int pass = 0; pass < n; pass += 8 * kNT) {
    const __nv_bfloat16* xr[kNT];  // x rows of pairs pass + 8 j + g (null past the expert's pairs)
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      const int p = pass + 8 * j + g;
      xr[j] = p < n ? in + static_cast<int64_t>(kGateUp ? (on_shared ? 0 : list_at(p) / k) : list_at(p)) * K : nullptr;
    }
    float acc[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
    for (int gi = slice; gi < groups; gi += kSlices * kUnroll) {
      uint4 wva[kUnroll], wvb[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int gu = gi + u * kSlices, k0 = gu * 64 + 16 * t;
        const bool kv = gu < groups && k0 < K;
        wva[u] = kv && va ? load_stream(reinterpret_cast<const uint4*>(wa + k0)) : make_uint4(0, 0, 0, 0);
        wvb[u] = kv && vb ? load_stream(reinterpret_cast<const uint4*>(wb + k0)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int gu = gi + u * kSlices, k0 = gu * 64 + 16 * t;
        if (gu >= groups) break;                                         // the same for the whole warp
        const float s_a = __ldg(sa + gu / 2), s_b = __ldg(sb + gu / 2);  // group gu lies in 128-column block gu / 2
        uint32_t a[4][4];
        widen_group(wva[u], wvb[u], a);
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          if (pass + 8 * j >= n) break;  // no pair in this MMA column: the same for the whole warp
          uint4 x0 = make_uint4(0, 0, 0, 0), x1 = x0;
          if (xr[j] && k0 < K) {
            const uint4* xm = reinterpret_cast<const uint4*>(xr[j] + k0);
            x0 = __ldg(xm);
            x1 = __ldg(xm + 1);
          }
          mma_group(a, x0, x1, s_a, s_b, acc[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kNT; ++j) part[warp][j][lane] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
    __syncthreads();
    if (slice == 0) {
      // Accumulator i of lane (g, t): weight row g + 8 (i / 2), pair 8 j + 2 t + i % 2.
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        float4 v = part[warp][j][lane];
#pragma unroll
        for (int q = 1; q < kSlices; ++q) {
          const float4 o = part[warp + q][j][lane];
          v.x += o.x;
          v.y += o.y;
          v.z += o.z;
          v.w += o.w;
        }
        const int p0 = pass + 8 * j + 2 * t;
        const float r[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          if (p0 + c >= n) continue;
          const int64_t pq = list_at(p0 + c);
          if (kGateUp) {
            if (va) out[pq * I + ra] = __float2bfloat16_rn(r[c] / (1.0f + __expf(-r[c])) * r[2 + c]);
          } else {
            if (va) out[pq * H + ra] = __float2bfloat16_rn(r[c]);
            if (vb) out[pq * H + rb] = __float2bfloat16_rn(r[2 + c]);
          }
        }
      }
    }
    __syncthreads();  // part is rewritten by the next pass
  }
  pdl_launch_dependents();
}

// ---------------------------------------------------------------- decode: one token
// bf16 experts at T = 1 (CudaMoeOneToken): k pairs, each to its own expert (top-k picks distinct
// experts), so block y of the gate_up GEMV serves the y-th local pair, found by one warp ballot
// over the k ids (the grouped kernels' routing preamble, shared-memory ranks and three barriers,
// is for experts shared by several pairs). The down GEMV takes all k pairs of a row group in one
// block, warp w the pairs w, w + 8, ..., and writes out[h] = sum_j weight_j * y_j itself in slot
// order j, y_j rounded to bf16 first, as the combine kernel does; every sum runs in the grouped
// kernels' order (a lane's chunks ascending, then warp_sum), so the result is theirs bit for bit.
// gate_up at one token: grid (ceil(I / 8), local pairs <= k); warp w of block (r, y) computes
// act[pair, i] = silu(gate_i . x) * (up_i . x) for i = r * 8 + w, kUnroll loads of each row in
// flight per lane. kEarlyTrigger: the next kernel (the down GEMV) may launch once this block's
// last loads are issued. shared_w (a shared expert's gate_up [2I, H] with the routed experts' I, or
// null): the grid's last row of blocks computes it as pair P (act row P).
template <int kUnroll, int kMinBlocks, bool kEarlyTrigger>
__global__ void __launch_bounds__(kGemvWarps * 32, kMinBlocks)
    moe_gate_up_one_token_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                 const int32_t* __restrict__ ids, int P, int expert_begin, int E_local, int H, int I,
                                 __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ shared_w) {
  pdl_wait();  // ids (the top-k kernel's) and x
  int e = 0, pair = P;
  const __nv_bfloat16* wb = shared_w;
  if (shared_w == nullptr || blockIdx.y + 1 < gridDim.y) {
    if (!one_token_pair(ids, P, expert_begin, E_local, static_cast<int>(blockIdx.y), &e, &pair)) return;
    wb = w + static_cast<int64_t>(e) * 2 * I * H;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i = static_cast<int>(blockIdx.x) * kGemvWarps + warp;
  if (i >= I) return;
  const uint4* wg = reinterpret_cast<const uint4*>(wb + static_cast<int64_t>(i) * H);
  const uint4* wu = reinterpret_cast<const uint4*>(wb + static_cast<int64_t>(i + I) * H);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  const int chunks = H / 8;
  float sg = 0.0f, su = 0.0f;
  for (int base = lane; base < chunks; base += 32 * kUnroll) {
    uint4 g[kUnroll], u[kUnroll];
#pragma unroll
    for (int v = 0; v < kUnroll; ++v)
      if (base + 32 * v < chunks) {
        g[v] = load_stream(wg + base + 32 * v);
        u[v] = load_stream(wu + base + 32 * v);
      }
    if (kEarlyTrigger && base + 32 * kUnroll >= chunks) pdl_launch_dependents();
#pragma unroll
    for (int v = 0; v < kUnroll; ++v) {
      const int c = base + 32 * v;
      if (c >= chunks) continue;
      const uint4 xv = __ldg(xr + c);
      sg += dot8(g[v], xv);
      su += dot8(u[v], xv);
    }
  }
  sg = warp_sum(sg);
  su = warp_sum(su);
  if (lane == 0) act[static_cast<int64_t>(pair) * I + i] = __float2bfloat16_rn(sg / (1.0f + __expf(-sg)) * su);
  if (!kEarlyTrigger) pdl_launch_dependents();
}

// down + combine at one token: grid ceil(H / kRows); block r computes out[h] for its kRows rows
// h of every local pair's expert, warp w the pairs w, w + 8, ... (k <= kOneTokenMaxPairs), then
// the weighted sum over the pairs in slot order. kPrefetch: each warp's first pair's weight loads
// are issued before pdl_wait. They depend on ids only, written by the top-k kernel before gate_up;
// gate_up's blocks wait for that kernel before they let this one launch, so it has finished, and
// ids is read through L2. shared (its down [H, I] not null): the shared expert is pair P (act row
// P), added as g * y_P with g = sigmoid(bf16(gate . x)) (1 without a gate), as the fused decode
// kernel's combine does.
template <int kRows, int kMinBlocks, bool kPrefetch>
__global__ void __launch_bounds__(kGemvWarps * 32, kMinBlocks)
    moe_down_one_token_kernel(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                              const int32_t* __restrict__ ids, const float* __restrict__ weights, int P,
                              int expert_begin, int E_local, int H, int I, __nv_bfloat16* __restrict__ out,
                              OneTokenShared shared) {
  constexpr int kUnroll = 4;  // chunks of a row per lane in flight: I up to 1,024 in one pass
  __shared__ float ys[kOneTokenMaxPairs + 1][kRows];
  __shared__ float shared_scale;
  const bool sh = shared.down != nullptr;
  const int pairs = P + (sh ? 1 : 0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h0 = static_cast<int>(blockIdx.x) * kRows;
  const int chunks = I / 8;
  uint4 wv[kRows][kUnroll];
  bool have = false;                     // wv holds the warp's first pair's loads (kPrefetch)
  if constexpr (!kPrefetch) pdl_wait();  // act (gate_up's), weights and (read first) ids
  // Every warp: the local pairs, and pair j's expert from lane j.
  int id;
  const unsigned local = one_token_local_pairs(ids, P, expert_begin, E_local, &id);
  // Pair j's down matrix (a warp-wide call: the expert id comes from lane j).
  auto matrix_of = [&](int j) {
    const int ej = __shfl_sync(0xffffffffu, id, j & 31) - expert_begin;
    return j == P ? shared.down : w + static_cast<int64_t>(ej) * H * I;
  };
  auto issue = [&](const __nv_bfloat16* wm, int base) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int h = min(h0 + r, H - 1);
      const uint4* wr = reinterpret_cast<const uint4*>(wm + static_cast<int64_t>(h) * I);
#pragma unroll
      for (int v = 0; v < kUnroll; ++v)
        if (base + 32 * v < chunks) wv[r][v] = load_stream(wr + base + 32 * v);
    }
  };
  if (kPrefetch && (local >> warp & 1u)) {
    issue(matrix_of(warp), lane);
    have = true;
  }
  if constexpr (kPrefetch) pdl_wait();  // act (gate_up's) and weights
  // Waited either way: the next kernel (the residual add + norm) may launch and wait resident.
  pdl_launch_dependents();
  if (sh && warp == kGemvWarps - 1) {  // the shared expert's gate, from x (the MoE input)
    float g = 1.0f;
    if (shared.gate != nullptr) {
      const uint4* gr = reinterpret_cast<const uint4*>(shared.gate);
      const uint4* xr = reinterpret_cast<const uint4*>(shared.x);
      float d = 0.0f;
      for (int c = lane; c < H / 8; c += 32) d += dot8(__ldg(gr + c), __ldg(xr + c));
      d = __bfloat162float(__float2bfloat16_rn(warp_sum(d)));  // the gate linear's bf16 output
      g = 1.0f / (1.0f + __expf(-d));
    }
    if (lane == 0) shared_scale = g;
  }
  for (int j = warp; j < pairs; j += kGemvWarps) {
    if (j < P && !(local >> j & 1u)) continue;  // the same for the whole warp
    const __nv_bfloat16* wm = matrix_of(j);
    const uint4* xr = reinterpret_cast<const uint4*>(act + static_cast<int64_t>(j) * I);
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    for (int base = lane; base < chunks; base += 32 * kUnroll) {
      if (!(have && base == lane)) issue(wm, base);
#pragma unroll
      for (int v = 0; v < kUnroll; ++v) {
        const int c = base + 32 * v;
        if (c >= chunks) continue;
        const uint4 xv = __ldg(xr + c);
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] += dot8(wv[r][v], xv);
      }
    }
    have = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float s = warp_sum(acc[r]);
      if (lane == 0) ys[j][r] = __bfloat162float(__float2bfloat16_rn(s));
    }
  }
  __syncthreads();
  if (threadIdx.x < kRows && h0 + static_cast<int>(threadIdx.x) < H) {
    float acc = 0.0f;
    for (int j = 0; j < P; ++j)
      if (local >> j & 1u) acc += __ldg(weights + j) * ys[j][threadIdx.x];
    if (sh) acc += shared_scale * ys[P][threadIdx.x];
    out[h0 + threadIdx.x] = __float2bfloat16_rn(acc);
  }
}

template <int kGuUnroll, int kGuBlocks, int kDnRows, int kDnBlocks, bool kOverlap>
void launch_moe_one_token(const MoeArgs& a, __nv_bfloat16* act, const MoeFusedShared* shared, cudaStream_t s) {
  const int P = a.k;
  const OneTokenShared sh{shared ? static_cast<const __nv_bfloat16*>(shared->down) : nullptr,
                          shared ? static_cast<const __nv_bfloat16*>(shared->gate) : nullptr,
                          static_cast<const __nv_bfloat16*>(a.x)};
  launch_pdl(moe_gate_up_one_token_kernel<kGuUnroll, kGuBlocks, kOverlap>,
             dim3(ceil_div(a.I, kGemvWarps), std::min(P, a.E_local) + (shared ? 1 : 0)), kGemvWarps * 32, 0, s,
             static_cast<const __nv_bfloat16*>(a.x), static_cast<const __nv_bfloat16*>(a.gate_up), a.ids, P,
             a.expert_begin, a.E_local, a.H, a.I, act,
             shared ? static_cast<const __nv_bfloat16*>(shared->gate_up) : nullptr);
  TCUDA_LAUNCH_CHECK();
  launch_pdl(moe_down_one_token_kernel<kDnRows, kDnBlocks, kOverlap>, dim3(ceil_div(a.H, kDnRows)), kGemvWarps * 32, 0,
             s, static_cast<const __nv_bfloat16*>(act), static_cast<const __nv_bfloat16*>(a.down), a.ids, a.weights, P,
             a.expert_begin, a.E_local, a.H, a.I, static_cast<__nv_bfloat16*>(a.out), sh);
  TCUDA_LAUNCH_CHECK();
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
                                   int H, int expert_begin, int E_local, __nv_bfloat16* __restrict__ out,
                                   OneTokenShared shared) {
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

template <bool kFp8>
void launch_moe_decode_gemvs(const MoeArgs& a, __nv_bfloat16* act, __nv_bfloat16* y, cudaStream_t s) {
  const int P = a.T * a.k;
  const auto* x = static_cast<const __nv_bfloat16*>(a.x);
  const int slots = std::min(P, a.E_local);  // at most this many distinct local experts
  launch_pdl(moe_gemv_kernel<true, kFp8>, dim3(ceil_div(a.I, kGemvWarps), slots), kGemvWarps * 32, 0, s, x, a.gate_up,
             a.gate_up_scale, a.ids, P, a.k, a.expert_begin, a.E_local, a.H, a.I, act);
  TCUDA_LAUNCH_CHECK();
  launch_pdl(moe_gemv_kernel<false, kFp8>, dim3(ceil_div(a.H, kGemvWarps * 4), slots), kGemvWarps * 32, 0, s,
             static_cast<const __nv_bfloat16*>(act), a.down, a.down_scale, a.ids, P, a.k, a.expert_begin, a.E_local,
             a.H, a.I, y);
  TCUDA_LAUNCH_CHECK();
}

// Tiles a block: gate_up 2 (16 intermediate indices, 4 warps splitting K over each), down 4 (64
// rows, 2 warps each). Blocks of half those rows (twice the warps on K) took 1.16-1.22x the time
// at 8-32 tokens on the H200 (session 17): each block pays the routing preamble for fewer bytes.
// kNT, kUnroll, kOneToken, kMinBlocks: moe_gemv_fp8_mma_kernel's (the grouped form by default).
// kWarps: a block's warps; the K split of a tile stays (gate_up 4 warps, down 2), so the sums
// are the same for every kWarps, and fewer warps make more, smaller blocks.
template <int kNT = kFp8MmaNT, int kUnroll = kFp8MmaUnroll, bool kOneToken = false, int kMinBlocks = 1,
          int kWarps = kGemvWarps>
void launch_moe_decode_fp8_mma(const MoeArgs& a, __nv_bfloat16* act, __nv_bfloat16* y, cudaStream_t s,
                               const MoeFusedShared* shared = nullptr) {
  const int P = a.T * a.k;
  const int slots = std::min(P, a.E_local) + (shared ? 1 : 0);  // (shared: kOneToken only)
  static_assert(kWarps % 4 == 0 && kWarps <= kGemvWarps, "a block holds whole tiles of both kernels");
  constexpr int kGuTiles = kWarps / 4, kDnTiles = kWarps / 2;
  launch_pdl(moe_gemv_fp8_mma_kernel<true, kGuTiles, kNT, kUnroll, kOneToken, kMinBlocks, kWarps>,
             dim3(ceil_div(a.I, 8 * kGuTiles), slots), kWarps * 32, 0, s, static_cast<const __nv_bfloat16*>(a.x),
             static_cast<const uint8_t*>(a.gate_up), a.gate_up_scale, a.ids, P, a.k, a.expert_begin, a.E_local, a.H,
             a.I, act, shared ? static_cast<const uint8_t*>(shared->gate_up) : nullptr,
             shared ? shared->gate_up_scale : nullptr);
  TCUDA_LAUNCH_CHECK();
  launch_pdl(moe_gemv_fp8_mma_kernel<false, kDnTiles, kNT, kUnroll, kOneToken, kMinBlocks, kWarps>,
             dim3(ceil_div(a.H, 16 * kDnTiles), slots), kWarps * 32, 0, s, static_cast<const __nv_bfloat16*>(act),
             static_cast<const uint8_t*>(a.down), a.down_scale, a.ids, P, a.k, a.expert_begin, a.E_local, a.H, a.I, y,
             shared ? static_cast<const uint8_t*>(shared->down) : nullptr, shared ? shared->down_scale : nullptr);
  TCUDA_LAUNCH_CHECK();
}

// FP8 experts on tensor cores: the one-token form at T = 1 (CudaMoeFp8OneToken), else grouped.
// shared: folded in as pair k on the one-token form (returns true), else left to the caller.
bool launch_moe_decode_fp8_one_token_or_grouped(const MoeArgs& a, __nv_bfloat16* act, __nv_bfloat16* y, cudaStream_t s,
                                                CudaMoeFp8OneToken one_token, const MoeFusedShared* shared) {
  if (a.T == 1 && a.k <= kOneTokenMaxPairs) {
    switch (one_token) {
      case CudaMoeFp8OneToken::kGrouped:
        break;
      case CudaMoeFp8OneToken::kShallow:
        launch_moe_decode_fp8_mma<1, 4, true, 3>(a, act, y, s, shared);
        return shared != nullptr;
      case CudaMoeFp8OneToken::kDeep:
        launch_moe_decode_fp8_mma<1, 8, true, 2>(a, act, y, s, shared);
        return shared != nullptr;
      case CudaMoeFp8OneToken::kFine:
        launch_moe_decode_fp8_mma<1, 4, true, 6, 4>(a, act, y, s, shared);
        return shared != nullptr;
      case CudaMoeFp8OneToken::kFineWide:
        launch_moe_decode_fp8_mma<1, 2, true, 8, 4>(a, act, y, s, shared);
        return shared != nullptr;
      case CudaMoeFp8OneToken::kFine10:
        launch_moe_decode_fp8_mma<1, 2, true, 10, 4>(a, act, y, s, shared);
        return shared != nullptr;
    }
  }
  launch_moe_decode_fp8_mma(a, act, y, s);
  return false;
}

}  // namespace

bool launch_moe_decode(const MoeArgs& a, void* act, void* y, cudaStream_t s, CudaMoeFp8Decode fp8_kernel,
                       CudaMoeOneToken one_token, CudaMoeFp8OneToken fp8_one_token, const MoeFusedShared* shared) {
  auto* actb = static_cast<__nv_bfloat16*>(act);
  auto* yb = static_cast<__nv_bfloat16*>(y);
  if (!a.gate_up_scale && a.T == 1 && a.k <= kOneTokenMaxPairs) {
    // Template arguments: gate_up loads per row in flight and blocks per SM, down rows per warp
    // and blocks per SM, overlap.
    switch (one_token) {
      case CudaMoeOneToken::kGrouped:
        break;
      case CudaMoeOneToken::kDeep:
        launch_moe_one_token<8, 2, 4, 2, false>(a, actb, shared, s);
        return shared != nullptr;
      case CudaMoeOneToken::kDeepOverlap:
        launch_moe_one_token<8, 2, 4, 2, true>(a, actb, shared, s);
        return shared != nullptr;
      case CudaMoeOneToken::kNarrow:
        launch_moe_one_token<4, 4, 2, 4, false>(a, actb, shared, s);
        return shared != nullptr;
      case CudaMoeOneToken::kNarrowOverlap:
        launch_moe_one_token<4, 4, 2, 4, true>(a, actb, shared, s);
        return shared != nullptr;
      case CudaMoeOneToken::kMixedOverlap:
        launch_moe_one_token<4, 4, 4, 2, true>(a, actb, shared, s);
        return shared != nullptr;
      case CudaMoeOneToken::kWideOverlap:
        launch_moe_one_token<2, 6, 4, 2, true>(a, actb, shared, s);
        return shared != nullptr;
    }
  }
  bool folded = false;  // the shared expert (FP8) as pair k of the one-token kernels, added by the combine
  if (!a.gate_up_scale)
    launch_moe_decode_gemvs<false>(a, actb, yb, s);
  else if (fp8_kernel == CudaMoeFp8Decode::kMma)
    folded = launch_moe_decode_fp8_one_token_or_grouped(a, actb, yb, s, fp8_one_token,
                                                        shared && shared->gate_up_scale ? shared : nullptr);
  else
    launch_moe_decode_gemvs<true>(a, actb, yb, s);
  launch_moe_combine(a, yb, nullptr, s, folded ? shared : nullptr);
  return folded;
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

void launch_moe_combine(const MoeArgs& a, const void* y, const int32_t* pair_pos, cudaStream_t s,
                        const MoeFusedShared* shared) {
  const int64_t n = static_cast<int64_t>(a.T) * (a.H / 8);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(n, 256), 65535LL * 16));
  const OneTokenShared sh{shared ? static_cast<const __nv_bfloat16*>(shared->down) : nullptr,
                          shared ? static_cast<const __nv_bfloat16*>(shared->gate) : nullptr,
                          static_cast<const __nv_bfloat16*>(a.x)};
  launch_pdl(moe_combine_kernel, grid, 256, 0, s, static_cast<const __nv_bfloat16*>(y), pair_pos, a.ids, a.weights, a.T,
             a.k, a.H, a.expert_begin, a.E_local, static_cast<__nv_bfloat16*>(a.out), sh);
  TCUDA_LAUNCH_CHECK();
}

}  // namespace tessera::cuda
