// Decode GEMV design sweep (M = 1, bf16): for the Qwen3-8B projection shapes, times
// (a) a pure streaming read of the same bytes (the ceiling for one kernel of that size),
// (b) the skinny-GEMV design of src/backend/cuda/gemv.cu over warps per block, loads in
//     flight per lane and warps per row,
// each as 36 back-to-back launches over 8 rotating weight copies (as in a decode step,
// where every projection follows other kernels), in microseconds per launch and as
// weight bytes per second. Every variant's output is checked against a CPU reference
// on sampled rows. Standalone: picks the parameters gemv.cu uses.
//   gemv_sweep_bench
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CK(call)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)

namespace {

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ float lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b) {
  float s = lo(a.x) * lo(b.x);
  s = fmaf(hi(a.x), hi(b.x), s);
  s = fmaf(lo(a.y), lo(b.y), s);
  s = fmaf(hi(a.y), hi(b.y), s);
  s = fmaf(lo(a.z), lo(b.z), s);
  s = fmaf(hi(a.z), hi(b.z), s);
  s = fmaf(lo(a.w), lo(b.w), s);
  s = fmaf(hi(a.w), hi(b.w), s);
  return s;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Pure read: grid-stride over n16 16-byte chunks, U loads in flight per thread.
template <int U>
__global__ void read_kernel(const uint4* __restrict__ p, int64_t n16, unsigned* out) {
  unsigned acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + (U - 1) * stride < n16; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = load_stream(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    uint4 v = load_stream(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}

// The gemv.cu design: W warps per block, `wpr` warps per row (split over K), U 16-byte
// loads in flight per lane.
template <int W, int U>
__global__ void __launch_bounds__(W * 32)
    gemv_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                __nv_bfloat16* __restrict__ out, int N, int K, int wpr) {
  __shared__ float part[W];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows_per_block = W / wpr;
  const int row = blockIdx.x * rows_per_block + warp / wpr;
  const int slice = warp % wpr;
  const int chunks = K / 8;
  const int per = (chunks + wpr - 1) / wpr;
  const int c0 = slice * per, c1 = row < N ? min(chunks, c0 + per) : c0;
  const uint4* wr = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(min(row, N - 1)) * K);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  float acc = 0.0f;
  int c = c0 + lane;
  for (; c + 32 * (U - 1) < c1; c += 32 * U) {
    uint4 wv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) wv[u] = load_stream(wr + c + 32 * u);
#pragma unroll
    for (int u = 0; u < U; ++u) acc += dot8(wv[u], __ldg(xr + c + 32 * u));
  }
  for (; c < c1; c += 32) acc += dot8(load_stream(wr + c), __ldg(xr + c));
  acc = warp_sum(acc);
  if (wpr == 1) {
    if (row < N && lane == 0) out[row] = __float2bfloat16_rn(acc);
    return;
  }
  if (lane == 0) part[warp] = acc;
  __syncthreads();
  if (slice == 0 && row < N && lane == 0) {
    float s = 0.0f;
    for (int j = 0; j < wpr; ++j) s += part[warp + j];
    out[row] = __float2bfloat16_rn(s);
  }
}

struct Shape {
  const char* name;
  int N, K;
};

float bf(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  unsigned* sink;
  CK(cudaMalloc(&sink, 64));

  const Shape shapes[] = {{"qkv_proj", 6144, 4096},
                          {"o_proj", 4096, 4096},
                          {"gate_up", 24576, 4096},
                          {"down_proj", 4096, 12288},
                          {"lm_head", 151936, 4096}};
  constexpr int kCopies = 8, kLaunches = 36;
  for (const Shape& sh : shapes) {
    const int64_t n = int64_t(sh.N) * sh.K, bytes = n * 2;
    const int copies = bytes * kCopies > (int64_t(4) << 30) ? 2 : kCopies;
    std::vector<uint16_t> hw(n), hx(sh.K);
    std::mt19937 rng(7);
    for (auto& v : hw) v = uint16_t((rng() & 0x7fff) ^ 0x3c00) & 0xbfff;  // |w| < ~2
    for (auto& v : hx) v = uint16_t(0x3c00 | (rng() & 0x00ff)) | (rng() & 1 ? 0x8000 : 0);
    for (auto& v : hw) v = uint16_t(0x3800 | (v & 0x80ff));  // small, mixed signs
    std::vector<__nv_bfloat16*> ws(copies);
    for (auto& p : ws) {
      CK(cudaMalloc(&p, bytes));
      CK(cudaMemcpy(p, hw.data(), bytes, cudaMemcpyHostToDevice));
    }
    __nv_bfloat16 *x, *out;
    CK(cudaMalloc(&x, sh.K * 2));
    CK(cudaMalloc(&out, sh.N * 2));
    CK(cudaMemcpy(x, hx.data(), sh.K * 2, cudaMemcpyHostToDevice));
    // CPU reference on sampled rows.
    std::vector<int> rows;
    for (int i = 0; i < 64; ++i) rows.push_back(int(rng() % sh.N));
    std::vector<double> ref;
    for (int r : rows) {
      double a = 0;
      for (int k = 0; k < sh.K; ++k) a += double(bf(hw[int64_t(r) * sh.K + k])) * bf(hx[k]);
      ref.push_back(a);
    }
    auto check = [&]() {
      std::vector<uint16_t> got(sh.N);
      CK(cudaMemcpy(got.data(), out, sh.N * 2, cudaMemcpyDeviceToHost));
      double worst = 0;
      for (size_t i = 0; i < rows.size(); ++i)
        worst = std::max(worst, std::fabs(bf(got[rows[i]]) - ref[i]) / (std::fabs(ref[i]) + 1.0));
      return worst;
    };
    auto timeit = [&](auto&& launch) {
      for (int i = 0; i < 8; ++i) launch(i);
      CK(cudaStreamSynchronize(s));
      std::vector<float> t;
      for (int rep = 0; rep < 7; ++rep) {
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < kLaunches; ++i) launch(i);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms * 1000 / kLaunches);
      }
      CK(cudaGetLastError());
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    std::printf("\n%s N=%d K=%d (%.1f MB)\n", sh.name, sh.N, sh.K, bytes / 1e6);
    for (int per_sm : {2, 4, 8}) {
      double us = timeit([&](int i) {
        read_kernel<8><<<sms * per_sm, 256, 0, s>>>(reinterpret_cast<const uint4*>(ws[i % copies]), bytes / 16, sink);
      });
      std::printf("  read  blocks/SM %d          %8.2f us %6.0f GB/s\n", per_sm, us, bytes / us / 1e3);
    }
    auto sweep = [&](auto kern, int W, int U) {
      for (int wpr : {1, 2, 4, 8}) {
        if (wpr > W || sh.K / 8 / wpr < 32) continue;
        const int rpb = W / wpr;
        const unsigned grid = (sh.N + rpb - 1) / rpb;
        CK(cudaMemset(out, 0, sh.N * 2));
        kern<<<grid, W * 32, 0, s>>>(x, ws[0], out, sh.N, sh.K, wpr);
        CK(cudaStreamSynchronize(s));
        double err = check();
        double us = timeit([&](int i) { kern<<<grid, W * 32, 0, s>>>(x, ws[i % copies], out, sh.N, sh.K, wpr); });
        std::printf("  gemv  warps %d unroll %2d wpr %d grid %6u %8.2f us %6.0f GB/s err %.1e%s\n", W, U, wpr, grid, us,
                    bytes / us / 1e3, err, err < 1e-2 ? "" : " FAIL");
      }
    };
    sweep(gemv_kernel<8, 8>, 8, 8);
    sweep(gemv_kernel<8, 4>, 8, 4);
    sweep(gemv_kernel<8, 16>, 8, 16);
    sweep(gemv_kernel<4, 8>, 4, 8);
    sweep(gemv_kernel<4, 16>, 4, 16);
    sweep(gemv_kernel<16, 8>, 16, 8);
    for (auto p : ws) CK(cudaFree(p));
    CK(cudaFree(x));
    CK(cudaFree(out));
  }
  return 0;
}
