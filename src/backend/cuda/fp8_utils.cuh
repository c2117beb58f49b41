// e4m3 unpacking shared by the FP8 kernels (fp8_gemm.cu, moe.cu, moe_gemm.cu), and the 64-column
// group of the tensor-core FP8 GEMVs (fp8_gemm.cu's fp8_gemv_mma_kernel, moe.cu's FP8 decode GEMVs).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/mma_utils.cuh"

namespace tessera::cuda {

// 4 e4m3 values (one 32-bit word, the lowest byte first) to floats.
__device__ __forceinline__ void fp8x4_to_float(uint32_t v, float (&f)[4]) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v >> 16), __NV_E4M3);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
}

// 2 e4m3 values (the low 16 bits) to a bf16x2 word, the lower k in the low half. Exact:
// e4m3 has 3 mantissa bits and exponents 2^-9 .. 2^8, all representable in bf16.
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint32_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 b = __float22bfloat162_rn(f);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// The A fragments of a 64-column group's 4 MMA steps from a lane's 16 weights of rows g (wa)
// and g + 8 (wb): step st takes columns 4 st .. 4 st + 3 (see fp8_gemv_mma_kernel).
__device__ __forceinline__ void widen_group(const uint4& wa, const uint4& wb, uint32_t (&a)[4][4]) {
  const uint32_t wa4[4] = {wa.x, wa.y, wa.z, wa.w};
  const uint32_t wb4[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
  for (int st = 0; st < 4; ++st) {
    a[st][0] = fp8x2_to_bf16x2(wa4[st]);
    a[st][1] = fp8x2_to_bf16x2(wb4[st]);
    a[st][2] = fp8x2_to_bf16x2(wa4[st] >> 16);
    a[st][3] = fp8x2_to_bf16x2(wb4[st] >> 16);
  }
}

// acc += s * (the group's MMA sum against x's 16 columns x0, x1 of this lane's row), with s = s_g
// for the accumulators of weight row g (0, 1) and s_g8 for those of row g + 8 (2, 3): the two
// rows may lie in different 128-row scale blocks (a MoE gate_up tile pairs gate and up rows).
__device__ __forceinline__ void mma_group(const uint32_t (&a)[4][4], const uint4& x0, const uint4& x1, float s_g,
                                          float s_g8, float (&acc)[4]) {
  const uint32_t xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int st = 0; st < 4; ++st) mma_bf16(c, a[st], xs[2 * st], xs[2 * st + 1]);
  acc[0] = fmaf(s_g, c[0], acc[0]);
  acc[1] = fmaf(s_g, c[1], acc[1]);
  acc[2] = fmaf(s_g8, c[2], acc[2]);
  acc[3] = fmaf(s_g8, c[3], acc[3]);
}

}  // namespace tessera::cuda
