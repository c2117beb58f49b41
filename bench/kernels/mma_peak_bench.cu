// The tensor-core ceilings of the mma.sync tier on the GPU at hand: register-only loops (no
// memory traffic) of
//   (a) f16 m16n8k16 with f32 accumulators, the MMA the sm_90 build of the FP8 mma.sync GEMM
//       (src/backend/cuda/fp8_mma_gemm.cu) runs, since Hopper has no e4m3 mma.sync;
//   (b) the same MMAs with the e4m3 -> f16 widening that GEMM does per fragment, in its large
//       tile's proportions (a warp's 64 x 32 tile: 24 cvt.f16x2.e4m3x2 per 16 MMAs);
//   (c) e4m3 m16n8k32 with f32 accumulators, sm_89 / sm_120 / sm_121 only (native there: the
//       MMA the sm_120a and sm_121a builds run).
// The FP8 GEMM's profile for sm_120 on a Hopper GPU can never beat (b); fp8_gemm_bench's
// mma_TF column divided by (b) is its efficiency, and (b) over cuBLASLt's block-scaled rate on
// the Hopper path bounds the ratio the profile can reach there.
//   mma_peak_bench
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "bench_cuda.h"

namespace {

constexpr int kThreads = 256;
constexpr int MT = 4, NT = 4;  // a 64 x 32 warp tile: 16 independent accumulator chains

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <int kMode>  // 0: f16 MMAs, 1: f16 MMAs with e4m3 widening, 2: e4m3 m16n8k32
__global__ void __launch_bounds__(kThreads) mma_loop(int iters, float* out, uint32_t seed) {
  float c[MT][NT][4] = {};
  uint32_t a[MT][4], b[NT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) a[i][j] = (seed ^ (threadIdx.x * 2654435761u + i * 97 + j)) & 0x3b3b3b3bu;
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) b[i][j] = (seed ^ (threadIdx.x * 40503u + i * 31 + j)) & 0x3b3b3b3bu;
  for (int it = 0; it < iters; ++it) {
    if constexpr (kMode == 0) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_f16(c[mt][nt], a[mt], b[nt]);
    } else if constexpr (kMode == 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
      // One k32 step of the GEMM's Hopper path: widen the e4m3 fragments, then two k16 MMAs a
      // fragment pair. The inputs change every iteration so the widening is not hoisted.
      uint32_t ah[MT][4], bh[NT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t v = a[mt][j] + static_cast<uint32_t>(it);
          asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}\n" : "=r"(ah[mt][j]) : "r"(v));
        }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const uint32_t v = b[nt][j] + static_cast<uint32_t>(it);
          asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, h;\n}\n" : "=r"(bh[nt][j]) : "r"(v));
        }
        // 24 widenings (16 + 8) feed 16 MMAs here; the GEMM's 48 feed its 32 (the same 3 : 2).
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_f16(c[mt][nt], ah[mt], bh[nt]);
#endif
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && __CUDA_ARCH__ != 900
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          asm volatile(
              "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
              "{%0,%1,%2,%3};\n"
              : "+f"(c[mt][nt][0]), "+f"(c[mt][nt][1]), "+f"(c[mt][nt][2]), "+f"(c[mt][nt][3])
              : "r"(a[mt][0]), "r"(a[mt][1]), "r"(a[mt][2]), "r"(a[mt][3]), "r"(b[nt][0]), "r"(b[nt][1]));
#endif
    }
  }
  float s = 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) s += c[mt][nt][0] + c[mt][nt][1] + c[mt][nt][2] + c[mt][nt][3];
  if (s == 1.2345f) out[blockIdx.x] = s;  // keeps the loop alive
}

// TFLOP/s of kMode over `blocks` blocks, the median of 5 timed launches.
template <int kMode>
double tflops(int blocks, int iters, float* out, int k_per_mma) {
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  mma_loop<kMode><<<blocks, kThreads>>>(iters / 10, out, 1);  // warm-up
  BENCH_CUDA(cudaGetLastError());
  float ms[5];
  for (float& m : ms) {
    BENCH_CUDA(cudaEventRecord(e0));
    mma_loop<kMode><<<blocks, kThreads>>>(iters, out, 7);
    BENCH_CUDA(cudaEventRecord(e1));
    BENCH_CUDA(cudaEventSynchronize(e1));
    BENCH_CUDA(cudaEventElapsedTime(&m, e0, e1));
  }
  for (int i = 0; i < 5; ++i)
    for (int j = i + 1; j < 5; ++j)
      if (ms[j] < ms[i]) {
        const float t = ms[i];
        ms[i] = ms[j];
        ms[j] = t;
      }
  const double flops = 2.0 * 16 * 8 * k_per_mma * MT * NT * double(iters) * blocks * (kThreads / 32);
  BENCH_CUDA(cudaEventDestroy(e0));
  BENCH_CUDA(cudaEventDestroy(e1));
  return flops / (ms[2] * 1e-3) / 1e12;
}

}  // namespace

int main() {
  int dev = 0, sms = 0, major = 0, minor = 0;
  BENCH_CUDA(cudaGetDevice(&dev));
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  BENCH_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  BENCH_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s, compute capability %d.%d, %d SMs\n", prop.name, major, minor, sms);
  float* out = nullptr;
  BENCH_CUDA(cudaMalloc(&out, sizeof(float) * 65536));
  const int blocks = sms * 8, iters = 4096;
  const double f16 = tflops<0>(blocks, iters, out, 16);
  std::printf("mma.sync f16 m16n8k16, f32 accumulate:            %8.1f TFLOP/s\n", f16);
  if (major * 10 + minor >= 89) {
    const double wid = tflops<1>(blocks, iters, out, 16);
    std::printf("  with the e4m3 -> f16 widening (3 cvt : 2 MMA): %8.1f TFLOP/s (%.0f%% of f16 alone)\n", wid,
                100.0 * wid / f16);
  }
  if (major * 10 + minor >= 89 && major != 9) {
    const double e4 = tflops<2>(blocks, iters, out, 32);
    std::printf("mma.sync e4m3 m16n8k32, f32 accumulate:           %8.1f TFLOP/s (%.2fx f16)\n", e4, e4 / f16);
  } else {
    std::printf("mma.sync e4m3 m16n8k32: not native on compute capability %d.%d (not timed)\n", major, minor);
  }
  BENCH_CUDA(cudaFree(out));
  return 0;
}
