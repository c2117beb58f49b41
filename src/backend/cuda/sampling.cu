// Backend::sample on the GPU: backend/sampling.h's rule, one 1024-thread block per row.
// Thresholds are found by bitwise search over order-preserving float keys (radix
// select): 32 passes over the row for the k-th largest value (top-k), 32 for the top-p
// cut; each pass is a strided read of the row (L2-resident) and a block reduction. The
// draw is Gumbel-max with the counter-based uniforms of backend/sampling_hash.h. A row with
// a NaN or +inf logit gets -1 (kNoToken of backend/sampling.h), found by the max reduction.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "backend/cuda/cuda_ops.h"
#include "backend/sampling_hash.h"
#include "backend/sampling_row.h"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

struct Best {
  float v;
  int32_t i;
};

// Larger v wins; equal v: smaller index. NaN never wins.
__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
  return a;
}

__device__ Best block_best(Best b, Best* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
    b = better(b, other);
  }
  __syncthreads();
  if (lane == 0) smem[warp] = b;
  __syncthreads();
  if (warp == 0) {
    b = lane < kWarps ? smem[lane] : Best{-INFINITY, INT32_MAX};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      Best other{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
      b = better(b, other);
    }
    if (lane == 0) smem[0] = b;
  }
  __syncthreads();
  return smem[0];
}

template <typename T>
__device__ T block_sum(T v, T* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? smem[lane] : T(0);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) smem[0] = v;
  }
  __syncthreads();
  return smem[0];
}

// NaN or +inf (on the bits: no fast-math flag folds it away); -inf is a masked token.
__device__ __forceinline__ bool is_broken(float v) {
  const uint32_t u = __float_as_uint(v);
  return (u & 0x7fffffffu) >= 0x7f800000u && u != 0xff800000u;
}

__device__ __forceinline__ uint32_t key_of(float f) { return sampling_float_key(__float_as_uint(f)); }
__device__ __forceinline__ float value_of(uint32_t k) { return __uint_as_float(sampling_key_bits(k)); }

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* __restrict__ logits, int64_t V, const SamplingRow* __restrict__ rows,
                  int32_t* __restrict__ out) {
  __shared__ Best best_s[kWarps];
  __shared__ float sum_s[kWarps];
  __shared__ int count_s[kWarps];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * V;
  const SamplingRow r = rows[row];

  // A broken logit enters the max as {+inf, -1}, which beats every other entry: the row's
  // maximum says whether it has one, at no extra pass.
  Best b{-INFINITY, INT32_MAX};
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float v = x[i];
    b = better(b, is_broken(v) ? Best{INFINITY, -1} : Best{v, static_cast<int32_t>(i)});
  }
  b = block_best(b, best_s);
  if (b.i < 0) {
    if (threadIdx.x == 0) out[row] = -1;
    return;
  }
  if (r.temperature < 1e-5f || V == 1 || b.i == INT32_MAX) {
    if (threadIdx.x == 0) out[row] = b.i == INT32_MAX ? 0 : b.i;
    return;
  }
  const float m = b.v, inv_t = 1.0f / r.temperature;
  auto s_of = [&](int64_t i) { return (x[i] - m) * inv_t; };
  float tau = -INFINITY;

  if (r.top_k > 0 && r.top_k < V) {  // the k-th largest s: largest key with count(key >= it) >= k
    uint32_t prefix = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = prefix | (1u << bit);
      int c = 0;
      for (int64_t i = threadIdx.x; i < V; i += kThreads) c += key_of(s_of(i)) >= cand;
      if (block_sum(c, count_s) >= r.top_k) prefix = cand;
    }
    tau = value_of(prefix);
  }
  if (r.top_p < 1.0f) {  // largest t with mass(s >= t) >= top_p * mass(s >= tau)
    float z = 0.0f;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float s = s_of(i);
      if (s >= tau) z += expf(s);
    }
    const float target = r.top_p * block_sum(z, sum_s);
    const uint32_t floor_key = key_of(tau);
    uint32_t prefix = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = prefix | (1u << bit);
      const uint32_t cut = cand > floor_key ? cand : floor_key;
      float mass = 0.0f;
      for (int64_t i = threadIdx.x; i < V; i += kThreads) {
        const float s = s_of(i);
        if (key_of(s) >= cut) mass += expf(s);
      }
      if (block_sum(mass, sum_s) >= target) prefix = cand;
    }
    tau = fmaxf(tau, value_of(prefix));
  }
  if (r.min_p > 0.0f) tau = fmaxf(tau, logf(r.min_p));

  const uint64_t key = sampling_row_key(r.seed, r.position);
  Best g{-INFINITY, INT32_MAX};
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float s = s_of(i);
    if (!(s >= tau)) continue;
    const float u = sampling_uniform(key, static_cast<uint32_t>(i));
    g = better(g, Best{s - logf(-logf(u)), static_cast<int32_t>(i)});
  }
  g = block_best(g, best_s);
  if (threadIdx.x == 0) out[row] = g.i == INT32_MAX ? b.i : g.i;
}

constexpr int32_t kNanBits = 0x7fc00000;  // the host's quiet NaN

// Backend::shard_argmax: one block a row of the shard, the same max reduction as sample_kernel's
// (a broken logit enters as {+inf, -1}); the columns past `width` (padding) are never read.
__global__ void __launch_bounds__(kThreads)
    shard_argmax_kernel(const float* __restrict__ logits, int64_t Vs, int64_t width, int64_t first,
                        int32_t* __restrict__ out) {
  __shared__ Best best_s[kWarps];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * Vs;
  Best b{-INFINITY, INT32_MAX};
  for (int64_t i = threadIdx.x; i < width; i += kThreads) {
    const float v = x[i];
    b = better(b, is_broken(v) ? Best{INFINITY, -1} : Best{v, static_cast<int32_t>(i)});
  }
  b = block_best(b, best_s);
  if (threadIdx.x != 0) return;
  int32_t* o = out + 2 * row;
  if (b.i < 0) {
    o[0] = kNanBits;
    o[1] = -1;
  } else if (b.i == INT32_MAX) {  // width 0
    o[0] = __float_as_int(-INFINITY);
    o[1] = INT32_MAX;
  } else {
    o[0] = __float_as_int(b.v);
    o[1] = static_cast<int32_t>(first + b.i);
  }
}

// Backend::merge_shard_argmax: one block a merged row; every thread merges the S pairs (a few),
// then the block writes the stand-in row.
__global__ void merge_shard_argmax_kernel(const int32_t* __restrict__ pairs, int S, int64_t m,
                                          const int32_t* __restrict__ rows, float* __restrict__ logits, int64_t V) {
  const int64_t k = blockIdx.x;
  const int64_t r = rows ? rows[k] : k;
  float best = -INFINITY;
  int32_t id = INT32_MAX;
  bool broken = false;
  for (int s = 0; s < S; ++s) {
    const int32_t* p = pairs + (static_cast<int64_t>(s) * m + k) * 2;
    const float v = __int_as_float(p[0]);
    if (p[1] == -1) {
      broken = true;
      break;
    }
    if (v > best || (v == best && p[1] < id)) {
      best = v;
      id = p[1];
    }
  }
  float* x = logits + r * V;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
    x[i] = broken ? (i == 0 ? __int_as_float(kNanBits) : -INFINITY) : (i == id ? best : -INFINITY);
}

}  // namespace

void launch_shard_argmax(const float* logits, int64_t n, int64_t Vs, int64_t width, int64_t first, int32_t* out,
                         cudaStream_t s) {
  if (n == 0) return;
  shard_argmax_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(logits, Vs, width, first, out);
  TCUDA_LAUNCH_CHECK();
}

void launch_merge_shard_argmax(const int32_t* pairs, int S, int64_t m, const int32_t* rows, float* logits, int64_t V,
                               cudaStream_t s) {
  if (m == 0 || V == 0) return;
  merge_shard_argmax_kernel<<<static_cast<unsigned>(m), 256, 0, s>>>(pairs, S, m, rows, logits, V);
  TCUDA_LAUNCH_CHECK();
}

void launch_sample(const float* logits, int64_t n, int64_t V, const void* rows, int32_t* out, cudaStream_t s) {
  if (n == 0) return;
  sample_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(logits, V, static_cast<const SamplingRow*>(rows), out);
  TCUDA_LAUNCH_CHECK();
}

// Speculative decoding's acceptance and the MTP drafting inputs after it (Backend::accept_drafts,
// Backend::draft_positions): a thread a sequence.
__global__ void accept_drafts_kernel(const int32_t* __restrict__ sampled, const int32_t* __restrict__ tokens, int S,
                                     int q, int32_t* __restrict__ rows) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= S) return;
  const int64_t r0 = static_cast<int64_t>(s) * q;
  int a = 0;
  while (a < q - 1 && sampled[r0 + a] == tokens[r0 + a + 1]) ++a;
  rows[s] = static_cast<int32_t>(r0 + a);
}

__global__ void draft_positions_kernel(const int32_t* __restrict__ rows, const int32_t* __restrict__ positions,
                                       const int32_t* __restrict__ slot_mapping, const int32_t* __restrict__ tables,
                                       int S, int q, int W, int block_size, int ahead, int32_t* __restrict__ out_pos,
                                       int32_t* __restrict__ out_slot, int32_t* __restrict__ out_len) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= S) return;
  const int64_t r0 = static_cast<int64_t>(s) * q;
  const int32_t row = rows[s];
  if (slot_mapping[r0] < 0 || row < r0 || row >= r0 + q) {  // a padding sequence (or no accepted row)
    out_pos[s] = 0;
    out_slot[s] = -1;
    out_len[s] = 1;
    return;
  }
  const int32_t at = positions[row] + ahead;
  const int32_t block = at / block_size;
  out_pos[s] = at;
  out_slot[s] = block < W ? tables[static_cast<int64_t>(s) * W + block] * block_size + at % block_size : -1;
  out_len[s] = at + 1;
}

// Backend::apply_token_mask: one thread per token (grid y: the masked rows).
__global__ void apply_token_mask_kernel(float* logits, int64_t V, const uint32_t* mask, int64_t W,
                                        const int32_t* rows) {
  const int64_t k = blockIdx.y;
  const int64_t t = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  if (t >= V) return;
  const uint32_t word = t < 32 * W ? mask[k * W + (t >> 5)] : 0u;
  if (!(word >> (t & 31) & 1u)) logits[static_cast<int64_t>(rows[k]) * V + t] = -INFINITY;
}

void launch_apply_token_mask(float* logits, int64_t V, const uint32_t* mask, int64_t m, int64_t W, const int32_t* rows,
                             cudaStream_t s) {
  if (m == 0 || V == 0) return;
  const dim3 grid(static_cast<unsigned>((V + 255) / 256), static_cast<unsigned>(m));
  apply_token_mask_kernel<<<grid, 256, 0, s>>>(logits, V, mask, W, rows);
  TCUDA_LAUNCH_CHECK();
}

void launch_accept_drafts(const int32_t* sampled, const int32_t* tokens, int S, int q, int32_t* rows, cudaStream_t s) {
  if (S == 0) return;
  accept_drafts_kernel<<<(S + 127) / 128, 128, 0, s>>>(sampled, tokens, S, q, rows);
  TCUDA_LAUNCH_CHECK();
}

void launch_draft_positions(const int32_t* rows, const int32_t* positions, const int32_t* slot_mapping,
                            const int32_t* tables, int S, int q, int W, int block_size, int ahead, int32_t* out_pos,
                            int32_t* out_slot, int32_t* out_len, cudaStream_t s) {
  if (S == 0) return;
  draft_positions_kernel<<<(S + 127) / 128, 128, 0, s>>>(rows, positions, slot_mapping, tables, S, q, W, block_size,
                                                         ahead, out_pos, out_slot, out_len);
  TCUDA_LAUNCH_CHECK();
}

}  // namespace tessera::cuda
