// Fallback paged attention for shapes the fast kernels do not cover (head_dim other
// than 64/128, f32/f16/e5m2 caches): one block per (token, query head), keys in
// chunks of the block size with an online softmax. Correctness first: it serves
// the tiny test models and unusual configs; real models take the fast kernels. A sliding
// window starts the key loop at the query's first key in the window.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_ops.h"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxHeadDim = 512;

__device__ __forceinline__ float load_cache_elem(const void* base, DType t, size_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::kF16:
      return __half2float(static_cast<const __half*>(base)[i]);
    case DType::kF8E4M3:
      return static_cast<float>(static_cast<const __nv_fp8_e4m3*>(base)[i]);
    case DType::kF8E5M2:
      return static_cast<float>(static_cast<const __nv_fp8_e5m2*>(base)[i]);
    default:
      return 0.f;
  }
}

__device__ float block_reduce(float v, float* smem, bool is_max) {
  const int tid = threadIdx.x;
  smem[tid] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (tid < stride) smem[tid] = is_max ? fmaxf(smem[tid], smem[tid + stride]) : smem[tid] + smem[tid + stride];
    __syncthreads();
  }
  float r = smem[0];
  __syncthreads();
  return r;
}

__global__ void generic_attention_kernel(PagedAttentionArgs a) {
  const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int group = a.Hq / a.Hk, kh = h / group;
  // The sequence owning token t: query_start_loc is sorted.
  int lo = 0, hi = a.num_seqs - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (a.query_start_loc[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int s = lo;
  const int qlen = a.query_start_loc[s + 1] - a.query_start_loc[s];
  const int pos = a.seq_lens[s] - qlen + (t - a.query_start_loc[s]);
  const int first = a.window > 0 ? max(0, pos - a.window + 1) : 0;  // the first key this query attends
  const int32_t* bt = a.block_tables + static_cast<int64_t>(s) * a.max_blocks_per_seq;

  __shared__ float q[kMaxHeadDim];
  __shared__ float p[kThreads];
  __shared__ float red[kThreads];
  const __nv_bfloat16* qp = static_cast<const __nv_bfloat16*>(a.q) + (static_cast<int64_t>(t) * a.Hq + h) * a.D;
  for (int d = tid; d < a.D; d += kThreads) q[d] = __bfloat162float(qp[d]);
  __syncthreads();

  constexpr int kDimsPerThread = kMaxHeadDim / kThreads;
  float acc[kDimsPerThread];
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) acc[i] = 0.f;
  float m = -INFINITY, l = 0.f;
  const size_t es = a.cache_dtype == DType::kF32                                      ? 4
                    : (a.cache_dtype == DType::kBF16 || a.cache_dtype == DType::kF16) ? 2
                                                                                      : 1;
  for (int j0 = first; j0 <= pos; j0 += kThreads) {
    const int j = j0 + tid;
    float score = -INFINITY;
    if (j <= pos) {
      const int64_t slot = static_cast<int64_t>(bt[j / a.block_size]) * a.block_size + j % a.block_size;
      const char* kb = static_cast<const char*>(a.k_cache) + ((slot * a.Hk + kh) * a.D) * es;
      float dot = 0.f;
      for (int d = 0; d < a.D; ++d) dot += q[d] * load_cache_elem(kb, a.cache_dtype, d);
      score = dot * a.k_scale * a.scale;
    }
    const float m_chunk = block_reduce(score, red, true);
    const float new_m = fmaxf(m, m_chunk);
    const float pj = j <= pos ? __expf(score - new_m) : 0.f;
    p[tid] = pj;
    const float l_chunk = block_reduce(pj, red, false);  // its barriers also publish p[]
    const float alpha = __expf(m - new_m);
    l = l * alpha + l_chunk;
    const int n = min(kThreads, pos - j0 + 1);
#pragma unroll
    for (int i = 0; i < kDimsPerThread; ++i) {
      const int d = tid + i * kThreads;
      if (d >= a.D) break;
      float sum = 0.f;
      for (int jj = 0; jj < n; ++jj) {
        const int key = j0 + jj;
        const int64_t slot = static_cast<int64_t>(bt[key / a.block_size]) * a.block_size + key % a.block_size;
        const char* vb = static_cast<const char*>(a.v_cache) + ((slot * a.Hk + kh) * a.D) * es;
        sum += p[jj] * load_cache_elem(vb, a.cache_dtype, d);
      }
      acc[i] = acc[i] * alpha + sum * a.v_scale;
    }
    m = new_m;
    __syncthreads();  // p[] is rewritten by the next chunk
  }
  __nv_bfloat16* op = static_cast<__nv_bfloat16*>(a.out) + (static_cast<int64_t>(t) * a.Hq + h) * a.D;
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) {
    const int d = tid + i * kThreads;
    if (d < a.D) op[d] = __float2bfloat16(acc[i] / l);
  }
}

}  // namespace

bool generic_attention_supported(int D) { return D > 0 && D <= kMaxHeadDim; }

void launch_generic_attention(const PagedAttentionArgs& a, cudaStream_t s) {
  dim3 grid(a.num_tokens, a.Hq);
  generic_attention_kernel<<<grid, kThreads, 0, s>>>(a);
}

}  // namespace tessera::cuda
