// A head of the fused QKV projection, normed and rotated: the attention prologue's math.
#pragma once
#include <cuda_bf16.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_utils.cuh"

namespace tessera::cuda {

// One head of a fused QKV row into b[D] (shared memory): loaded, RMS-normed when nw is
// given; then rope_at(i) is element i rotated at `pos`. One warp. The attention prologue
// (qkv_prologue.cu) and the fused decode attention (attention_decode.cu, every head-chunk
// instantiation) both use it, so they compute the same bits: every multiply-add is an explicit
// fmaf or __fmul_rn, since how nvcc contracts `a * b - c * d` may differ between the kernels
// it is inlined into (seen on the H200: one bf16 ulp of q apart between two instantiations).
struct QkvHead {
  const QkvPrologueArgs& p;
  float* b;
  int pos;
  __device__ void load(int64_t t, int h, const void* nw_raw, int lane) {
    const int H = p.Hq + 2 * p.Hk, D = p.D;
    const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(p.qkv) + (t * H + h) * D;
    float ss = 0.0f;
    for (int i = lane; i < D; i += 32) {
      const float x = __bfloat162float(src[i]);
      b[i] = x;
      ss = fmaf(x, x, ss);
    }
    if (const auto* nw = static_cast<const __nv_bfloat16*>(nw_raw)) {
      const float r = rsqrtf(warp_sum(ss) / static_cast<float>(D) + p.eps);
      for (int i = lane; i < D; i += 32) b[i] = b[i] * r * __bfloat162float(nw[i]);
    }
    __syncwarp();
  }
  __device__ float rope_at(int i) const {
    float o = b[i];
    const int rd = p.rotary_dim, half = rd / 2;
    if (i < rd) {
      const float* c = p.cos_sin + static_cast<int64_t>(pos) * rd;
      const float* s = c + half;
      if (p.neox) {
        const int j = i < half ? i : i - half;
        const float x1 = b[j], x2 = b[j + half];
        o = i < half ? fmaf(x1, c[j], -__fmul_rn(x2, s[j])) : fmaf(x2, c[j], __fmul_rn(x1, s[j]));
      } else {
        const int j = i / 2;
        const float x1 = b[2 * j], x2 = b[2 * j + 1];
        o = (i & 1) == 0 ? fmaf(x1, c[j], -__fmul_rn(x2, s[j])) : fmaf(x2, c[j], __fmul_rn(x1, s[j]));
      }
    }
    return o;
  }
};

}  // namespace tessera::cuda
