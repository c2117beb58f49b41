// The attention prologue on a fused QKV projection (Backend::qkv_prologue): one warp per
// head of one token reads the head from qkv, RMS-norms it (q/k heads, when the model has
// q_norm/k_norm), applies RoPE from the cos/sin table, and writes q to q_out or k/v into the
// paged cache, in one launch instead of split + 2 norms + rope + KV write. The head lives in
// shared memory between the norm and the rotation (a rotation pairs elements of other lanes).
#include <cuda_bf16.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernel_smem.h"
#include "backend/cuda/qkv_head.cuh"

namespace tessera::cuda {

namespace {

constexpr int kHeadsPerBlock = kQkvPrologueHeads;

template <typename CT>
__global__ void __launch_bounds__(kHeadsPerBlock * 32) qkv_prologue_kernel(QkvPrologueArgs a) {
  extern __shared__ float buf[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int H = a.Hq + 2 * a.Hk, D = a.D;
  const int h = blockIdx.y * kHeadsPerBlock + warp;
  const int64_t t = blockIdx.x;
  pdl_wait();  // launched with PDL (device_utils.cuh); the attention after it launches when it ends
  if (h >= H) return;
  const bool is_q = h < a.Hq, is_k = !is_q && h < a.Hq + a.Hk;
  QkvHead hd{a, buf + warp * D, 0};
  hd.load(t, h, is_q ? a.q_norm : is_k ? a.k_norm : nullptr, lane);
  const int32_t slot = a.slots[t];
  if (!is_q) {
    if (slot < 0) return;  // padding: no KV write
    if (slot >= a.num_slots) {
      if (lane == 0) raise_error(a.err, kErrKvSlot);
      return;
    }
  }
  if (!is_q && !is_k) {  // v: straight into the cache
    CT* dst = static_cast<CT*>(a.v_cache) + (static_cast<int64_t>(slot) * a.Hk + (h - a.Hq - a.Hk)) * D;
    for (int i = lane; i < D; i += 32) dst[i] = from_float<CT>(hd.b[i] * a.inv_v_scale);
    return;
  }
  hd.pos = a.positions[t];
  if (hd.pos < 0 || hd.pos >= a.max_pos) {
    if (lane == 0) raise_error(a.err, kErrRopePosition);
    return;
  }
  for (int i = lane; i < D; i += 32) {
    const float o = hd.rope_at(i);
    if (is_q) {
      static_cast<__nv_bfloat16*>(a.q_out)[(t * a.Hq + h) * D + i] = __float2bfloat16_rn(o);
    } else {
      static_cast<CT*>(a.k_cache)[(static_cast<int64_t>(slot) * a.Hk + (h - a.Hq)) * D + i] =
          from_float<CT>(o * a.inv_k_scale);
    }
  }
}

}  // namespace

void launch_qkv_prologue(const QkvPrologueArgs& a, int64_t T, DType cache_t, cudaStream_t s) {
  if (T == 0) return;
  const int H = a.Hq + 2 * a.Hk;
  dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>((H + kHeadsPerBlock - 1) / kHeadsPerBlock));
  const size_t smem = qkv_prologue_smem_bytes(a.D);
  switch (cache_t) {
    case DType::kBF16:
      launch_pdl(qkv_prologue_kernel<__nv_bfloat16>, grid, kHeadsPerBlock * 32, smem, s, a);
      break;
    case DType::kF16:
      qkv_prologue_kernel<__half><<<grid, kHeadsPerBlock * 32, smem, s>>>(a);
      break;
    case DType::kF32:
      qkv_prologue_kernel<float><<<grid, kHeadsPerBlock * 32, smem, s>>>(a);
      break;
    case DType::kF8E4M3:
      launch_pdl(qkv_prologue_kernel<__nv_fp8_e4m3>, grid, kHeadsPerBlock * 32, smem, s, a);
      break;
    case DType::kF8E5M2:
      qkv_prologue_kernel<__nv_fp8_e5m2><<<grid, kHeadsPerBlock * 32, smem, s>>>(a);
      break;
    default:
      break;
  }
  TCUDA_LAUNCH_CHECK();
}

}  // namespace tessera::cuda
