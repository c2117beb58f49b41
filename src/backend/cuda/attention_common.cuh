// Pieces shared by the two paged-attention kernels: cache element loads (bf16 or
// fp8-e4m3, converted to f32) and the token -> sequence lookup.
#pragma once
#include "backend/cuda/device_utils.cuh"

namespace tessera::cuda {

constexpr float kLog2e = 1.4426950408889634f;

// Loads N consecutive cache elements (N*sizeof(CT) bytes, naturally aligned) as f32.
template <typename CT, int N>
__device__ __forceinline__ void load_cache(const CT* p, float (&out)[N]) {
  if constexpr (sizeof(CT) == 2) {
    static_assert(N % 2 == 0);
    if constexpr (N == 8) {
      uint4 u = *reinterpret_cast<const uint4*>(p);
      const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float2 f = __bfloat1622float2(b[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
      }
    } else if constexpr (N == 4) {
      uint2 u = *reinterpret_cast<const uint2*>(p);
      const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float2 f = __bfloat1622float2(b[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
      }
    } else {
      static_assert(N == 2);
      float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
      out[0] = f.x;
      out[1] = f.y;
    }
  } else {
    static_assert(sizeof(CT) == 1);
    if constexpr (N == 8) {
      uint2 u = *reinterpret_cast<const uint2*>(p);
      const __nv_fp8_e4m3* e = reinterpret_cast<const __nv_fp8_e4m3*>(&u);
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = static_cast<float>(e[i]);
    } else if constexpr (N == 4) {
      uint32_t u = *reinterpret_cast<const uint32_t*>(p);
      const __nv_fp8_e4m3* e = reinterpret_cast<const __nv_fp8_e4m3*>(&u);
#pragma unroll
      for (int i = 0; i < 4; ++i) out[i] = static_cast<float>(e[i]);
    } else {
      static_assert(N == 2);
      uint16_t u = *reinterpret_cast<const uint16_t*>(p);
      const __nv_fp8_e4m3* e = reinterpret_cast<const __nv_fp8_e4m3*>(&u);
      out[0] = static_cast<float>(e[0]);
      out[1] = static_cast<float>(e[1]);
    }
  }
}

// A register holding N cache elements (N * sizeof(CT) bytes).
template <typename CT, int N>
struct RawVec;
template <>
struct RawVec<__nv_bfloat16, 8> {
  using type = uint4;
};
template <>
struct RawVec<__nv_bfloat16, 4> {
  using type = uint2;
};
template <>
struct RawVec<__nv_bfloat16, 2> {
  using type = uint32_t;
};
template <>
struct RawVec<__nv_fp8_e4m3, 8> {
  using type = uint2;
};
template <>
struct RawVec<__nv_fp8_e4m3, 4> {
  using type = uint32_t;
};
template <>
struct RawVec<__nv_fp8_e4m3, 2> {
  using type = uint16_t;
};

// The sequence that owns query token t: the last s with query_start_loc[s] <= t.
__device__ __forceinline__ int seq_of_token(const int32_t* qsl, int num_seqs, int t) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (qsl[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace tessera::cuda
