// e4m3 unpacking shared by the FP8 kernels (fp8_gemm.cu, moe.cu, moe_gemm.cu).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

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

}  // namespace tessera::cuda
