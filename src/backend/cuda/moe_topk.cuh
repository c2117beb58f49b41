// The router's softmax + top-k for one token by one warp, the row held in registers: shared by
// moe_topk_regs_kernel (moe.cu) and the fused decode kernel that folds the routing in
// (moe_fused.cu), so both give the same ids and weights bit for bit.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/device_utils.cuh"

namespace tessera::cuda {

// Softmax in f32 over row[0, E), then k rounds of a warp arg-max (ties to the lower id) over the
// experts not taken yet. Lane l holds experts l, l + 32, ... (kPer of them, E <= 32 * kPer),
// loads its logits once and computes their probabilities once. Lane j < k gets the j-th pick:
// *id and *weight (divided by the picks' sum when `renormalize`). Every lane of the warp calls it.
template <int kPer>
__device__ __forceinline__ void warp_topk(const float* __restrict__ row, int E, int k, bool renormalize, int* id,
                                          float* weight) {
  const int lane = threadIdx.x & 31;
  float p[kPer];
  float mx = -INFINITY;
#pragma unroll
  for (int b = 0; b < kPer; ++b) {
    const int i = lane + 32 * b;
    p[b] = i < E ? row[i] : -INFINITY;
    mx = fmaxf(mx, p[b]);
  }
  mx = warp_max(mx);
  float sum = 0.0f;
#pragma unroll
  for (int b = 0; b < kPer; ++b)
    if (lane + 32 * b < E) sum += expf(p[b] - mx);
  sum = warp_sum(sum);
#pragma unroll
  for (int b = 0; b < kPer; ++b) p[b] = lane + 32 * b < E ? expf(p[b] - mx) / sum : -2.0f;  // -2: never picked
  // A round: each lane's best (strict > over ascending ids keeps its lowest id on ties), then the
  // warp's largest probability by one reduction over keys that order like the probabilities (a
  // non-negative float's bits, plus one, so that 0 marks "nothing left"), and the lowest id among
  // the lanes that hold it by a second: the pick of a shuffle tree with ties to the lower id.
  float mine_p = 0.0f, picked = 0.0f;
  int mine_id = 0;
  for (int j = 0; j < k; ++j) {
    float best = -1.0f;
    int best_id = 0x7fffffff;
#pragma unroll
    for (int b = 0; b < kPer; ++b)
      if (p[b] > best) {  // ascending ids: strict > keeps the lower id on ties
        best = p[b];
        best_id = lane + 32 * b;
      }
    const unsigned key = best >= 0.0f ? __float_as_uint(best) + 1u : 0u;
    const unsigned top = __reduce_max_sync(0xffffffffu, key);
    best_id =
        static_cast<int>(__reduce_min_sync(0xffffffffu, key == top ? static_cast<unsigned>(best_id) : 0x7fffffffu));
    best = top > 0u ? __uint_as_float(top - 1u) : -1.0f;
#pragma unroll
    for (int b = 0; b < kPer; ++b)
      if (best_id == lane + 32 * b) p[b] = -2.0f;  // taken
    if (lane == j) {
      mine_p = best;
      mine_id = best_id;
    }
    picked += best;
  }
  *id = mine_id;
  *weight = renormalize ? mine_p / picked : mine_p;
}

}  // namespace tessera::cuda
