// Pieces the decode-path MoE kernels share (moe.cu: bf16 and FP8 grouped GEMVs and the one-token
// kernels; moe_fp8_decode.cu: the FP8 grouped GEMV on tensor cores): the routing preamble of a
// decode block, the one-token pair lookup, FP8 widening, and the FP8 tensor-core launcher.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/fp8_utils.cuh"
#include "backend/cuda/gemv_kernel.cuh"

namespace tessera::cuda {

// FP8 experts on tensor cores (CudaMoeDecode's kMma; moe_fp8_decode.cu): the one-token form at
// T = 1 (CudaMoeFp8OneToken), else grouped. shared: folded in as pair k on the one-token form
// (returns true), else left to the caller.
bool launch_moe_decode_fp8(const MoeArgs& a, __nv_bfloat16* act, __nv_bfloat16* y, cudaStream_t s,
                           CudaMoeFp8OneToken one_token, const MoeFusedShared* shared);

namespace {

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

}  // namespace

}  // namespace tessera::cuda
