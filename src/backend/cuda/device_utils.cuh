// Device-side helpers: dtype conversions and warp reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_ops.h"

namespace tessera::cuda {

// ---- scalar conversions ----
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_fp8_e4m3 v) { return static_cast<float>(v); }
__device__ __forceinline__ float to_float(__nv_fp8_e5m2 v) { return static_cast<float>(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float v) {
  return __nv_fp8_e4m3(v);
}  // satfinite
template <>
__device__ __forceinline__ __nv_fp8_e5m2 from_float<__nv_fp8_e5m2>(float v) {
  return __nv_fp8_e5m2(v);
}

// Runtime-dtype element access for ops that are not hot (cast, fill, write_kv).
__device__ __forceinline__ float load_as_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return to_float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16:
      return to_float(static_cast<const __half*>(p)[i]);
    case DType::kF8E4M3:
      return to_float(static_cast<const __nv_fp8_e4m3*>(p)[i]);
    case DType::kF8E5M2:
      return to_float(static_cast<const __nv_fp8_e5m2*>(p)[i]);
    default:
      return 0.0f;
  }
}
__device__ __forceinline__ void store_from_float(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = from_float<__nv_bfloat16>(v);
      break;
    case DType::kF16:
      static_cast<__half*>(p)[i] = from_float<__half>(v);
      break;
    case DType::kF8E4M3:
      static_cast<__nv_fp8_e4m3*>(p)[i] = from_float<__nv_fp8_e4m3>(v);
      break;
    case DType::kF8E5M2:
      static_cast<__nv_fp8_e5m2*>(p)[i] = from_float<__nv_fp8_e5m2>(v);
      break;
    default:
      break;
  }
}

// Raises a device error flag (the first one wins; synchronize() reports it).
__device__ __forceinline__ void raise_error(int* err, int code) {
  if (err) atomicCAS(err, 0, code);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float t = lane < nw ? part[lane] : 0.0f;
  return warp_sum(t);
}

// ---- programmatic dependent launch (sm_90+) ----
// A kernel started with launch_pdl() may begin while the kernel before it on the stream
// is still running (its launch, block scheduling and prologue overlap the other's tail).
// Rules for such a kernel:
//   - before pdl_wait() it reads only what no kernel before it in this step writes: weights,
//     the step inputs the host uploaded before the step (positions, slots, block tables,
//     sequence lengths), and KV-cache rows that only this kernel writes (the fused decode
//     attention's preload: every key but the newest), or what a kernel two or more launches back
//     wrote when every block of the kernel right before calls pdl_wait() before it triggers
//     (that kernel's trigger then implies those kernels finished; read through L2, ld.global.cg:
//     the MoE one-token down GEMV's routing ids); it writes nothing;
//   - every thread that goes on to read or write anything else calls pdl_wait() first, and
//     every block calls it before it exits (so that "this kernel finished" still implies
//     "every kernel before it finished" for the kernels after it); a block that reads and writes
//     nothing else may leave without it where another block of the kernel always waits (the
//     decode attention's slices past the context).
// pdl_launch_dependents() lets the next PDL kernel start launching now; it changes only
// scheduling, never what is safe. Both are no-ops for a kernel launched normally.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches `kernel` on `s`, with programmatic stream serialization when pdl_enabled()
// (the kernel must follow the rules above). Works under CUDA graph capture: the edge to
// the previous kernel becomes a programmatic one.
template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(std::forward<Args>(args))...);
}

}  // namespace tessera::cuda
