// Prefill attention over the paged cache, FlashAttention-2 style on tensor cores
// (mma.sync m16n8k16 bf16, f32 accumulation). A block owns 64 or 128 query rows
// of one sequence and one query head (4 warps); it walks 64-key tiles of the
// sequence's cached context (prefix + this step's keys) up to the causal limit,
// keeping the running max and sum of each row in registers. fp8 caches are
// widened to bf16 on the way into shared memory; k_scale folds into the score
// scale and v_scale into the output. A sliding window W: the key tiles start at the
// first key the block's earliest query attends (no block before it is read), and keys
// at or before a row's position - W are masked like the future.
#include <cstdlib>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/kernel_smem.h"
#include "backend/cuda/mma_utils.cuh"
#include "core/error.h"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 128;

// 2^x on the special-function unit; flushes denormals (p that small is 0 anyway).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Starts the copy of keys [n0, n0 + kBN) of one kv head into shared memory with
// cp.async (one commit group): bf16 straight into the padded tile, fp8 into a
// staging tile of D bytes a row that widen_tile() turns into bf16 afterwards.
// Rows past the context are zero-filled, so that P.V never meets garbage.
template <int D, typename CT, int kN>
__device__ __forceinline__ void issue_kv_tile(__nv_bfloat16* tile, uint8_t* stage, const CT* cache, const int32_t* bt,
                                              int n0, int ctx, int bs, int Hk, int kh) {
  constexpr int kLd = D + 8, kElems = 16 / sizeof(CT), kChunks = D / kElems;
  for (int c = threadIdx.x; c < kN * kChunks; c += kThreads) {
    const int key = c / kChunks, col = (c % kChunks) * kElems, j = n0 + key;
    void* dst =
        sizeof(CT) == 2 ? static_cast<void*>(tile + key * kLd + col) : static_cast<void*>(stage + key * D + col);
    if (j < ctx)
      cp_async16(dst, cache + ((static_cast<int64_t>(bt[j / bs]) * bs + j % bs) * Hk + kh) * D + col);
    else
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
  cp_async_commit();
}

// fp8 staging tile -> bf16 tile (exact: every e4m3 value is a bf16 value).
template <int D, int kN>
__device__ __forceinline__ void widen_tile(__nv_bfloat16* tile, const uint8_t* stage) {
  constexpr int kLd = D + 8, kChunks = D / 16;
  for (int c = threadIdx.x; c < kN * kChunks; c += kThreads) {
    const int key = c / kChunks, col = (c % kChunks) * 16;
    const uint4 raw = *reinterpret_cast<const uint4*>(stage + key * D + col);
    const __nv_fp8_e4m3* e = reinterpret_cast<const __nv_fp8_e4m3*>(&raw);
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = pack_bf16(static_cast<float>(e[2 * i]), static_cast<float>(e[2 * i + 1]));
    uint4* dst = reinterpret_cast<uint4*>(tile + key * kLd + col);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}

// A block owns kRF * 64 query rows: warp w computes rows {rf * 64 + w * 16 + [0, 16)}
// for rf < kRF, so every K/V fragment read from shared memory feeds kRF mmas and
// each warp has kRF independent dependency chains. Q stays in shared memory.
// kN: keys per tile (64, or 32 to save 32 registers of scores). kWindow: a.window > 0 (a sliding
// window); without it the window's code is compiled out, so models without windows run the same
// machine code as before windows existed.
template <int D, typename CT, int kRF, int kN, bool kWindow>
__global__ void __launch_bounds__(kThreads, 2) prefill_attention_kernel(PagedAttentionArgs a, int skip_upto) {
  constexpr int kLd = D + 8;  // padded rows: ldmatrix reads hit 8 different bank groups
  constexpr int kRows = kRF * 64;
  constexpr bool kFp8 = sizeof(CT) == 1;
  extern __shared__ __align__(16) uint8_t smem[];
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* k_s = q_s + kRows * kLd;
  __nv_bfloat16* v_s = k_s + kN * kLd;
  uint8_t* k_stage = reinterpret_cast<uint8_t*>(v_s + kN * kLd);  // fp8 caches only
  uint8_t* v_stage = k_stage + kN * D;

  // Causal: a query tile's work grows with its index. The grid is (head, tile), heads
  // fastest, tiles from the last, so the long blocks start first (the GPU issues blocks in
  // index order), the short ones fill the tail, and the heads of one kv group read the same
  // K/V tiles at about the same time (L2 hits). H200, 4,096 tokens: 0.1339 s in tile order,
  // 0.1307 / 0.1269 s this way.
  const int s = blockIdx.z, h = blockIdx.x, qtile = gridDim.y - 1 - blockIdx.y;
  const int q_begin = a.query_start_loc[s], qlen = a.query_start_loc[s + 1] - q_begin;
  if (qtile * kRows >= qlen || qlen <= skip_upto) return;
  const int ctx = a.seq_lens[s], first_pos = ctx - qlen, kh = h / (a.Hq / a.Hk);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(a.q);
  const int32_t* bt = a.block_tables + static_cast<int64_t>(s) * a.max_blocks_per_seq;
  const CT* kc = static_cast<const CT*>(a.k_cache);
  const CT* vc = static_cast<const CT*>(a.v_cache);

  // Q tile (zeros past the sequence) and the first K tile, in one commit group each.
  for (int c = tid; c < kRows * (D / 8); c += kThreads) {
    const int row = c / (D / 8), col = (c % (D / 8)) * 8, qi = qtile * kRows + row;
    __nv_bfloat16* dst = q_s + row * kLd + col;
    if (qi < qlen)
      cp_async16(dst, q + (static_cast<int64_t>(q_begin + qi) * a.Hq + h) * D + col);
    else
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
  cp_async_commit();

  float o[kRF][D / 8][4];
  float m[kRF][2], l[kRF][2];
#pragma unroll
  for (int rf = 0; rf < kRF; ++rf) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[rf][i][0] = o[rf][i][1] = o[rf][i][2] = o[rf][i][3] = 0.0f;
    m[rf][0] = m[rf][1] = -INFINITY;
    l[rf][0] = l[rf][1] = 0.0f;
  }
  const float sl2 = a.scale * a.k_scale * kLog2e;
  // Query index (within the sequence) of this thread's c0/c1 row in fragment rf; +8 for c2/c3.
  const int row_base = qtile * kRows + warp * 16 + (lane >> 2);
  const int last_q = min(qlen, (qtile + 1) * kRows) - 1;
  const int kv_end = first_pos + last_q + 1;
  const int window = kWindow ? a.window : 0;
  const int kv_begin = window > 0 ? max(0, first_pos + qtile * kRows - window + 1) : 0;

  // FlashAttention-2's schedule with one K and one V buffer: V(j) loads while S(j)
  // is computed, K(j+1) while the softmax and P.V(j) run.
  issue_kv_tile<D, CT, kN>(k_s, k_stage, kc, bt, kv_begin, ctx, a.block_size, a.Hk, kh);
  for (int n0 = kv_begin; n0 < kv_end; n0 += kN) {
    const bool has_next = n0 + kN < kv_end;
    issue_kv_tile<D, CT, kN>(v_s, v_stage, vc, bt, n0, ctx, a.block_size, a.Hk, kh);
    cp_async_wait<1>();  // Q and K(j) have landed; V(j) may still be in flight
    __syncthreads();
    if constexpr (kFp8) {
      widen_tile<D, kN>(k_s, k_stage);
      __syncthreads();
    }

    // S = Q K^T: kRF fragments of 16 rows x 64 keys per warp.
    float sacc[kRF][kN / 8][4];
#pragma unroll
    for (int rf = 0; rf < kRF; ++rf)
#pragma unroll
      for (int nb = 0; nb < kN / 8; ++nb) sacc[rf][nb][0] = sacc[rf][nb][1] = sacc[rf][nb][2] = sacc[rf][nb][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2) {
      uint32_t qa[kRF][2][4];
#pragma unroll
      for (int rf = 0; rf < kRF; ++rf)
#pragma unroll
        for (int k2 = 0; k2 < 2; ++k2)
          ldmatrix_x4(qa[rf][k2], q_s + (rf * 64 + warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kLd +
                                      (kk + k2) * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int nb = 0; nb < kN / 8; ++nb) {
        uint32_t b[4];
        ldmatrix_x4(b, k_s + (nb * 8 + (lane & 7)) * kLd + kk * 16 + (lane >> 3) * 8);
#pragma unroll
        for (int rf = 0; rf < kRF; ++rf) {
          mma_bf16(sacc[rf][nb], qa[rf][0], b[0], b[1]);
          mma_bf16(sacc[rf][nb], qa[rf][1], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with k_s
    if (has_next) issue_kv_tile<D, CT, kN>(k_s, k_stage, kc, bt, n0 + kN, ctx, a.block_size, a.Hk, kh);

#pragma unroll
    for (int rf = 0; rf < kRF; ++rf) {
      // Mask the future, keys past the context and keys before the window (only tiles that
      // reach them).
      const int frag_min_pos = first_pos + qtile * kRows + rf * 64 + warp * 16;
      if (n0 + kN - 1 > frag_min_pos || n0 + kN > ctx || (window > 0 && n0 <= frag_min_pos + 15 - window)) {
#pragma unroll
        for (int nb = 0; nb < kN / 8; ++nb) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n0 + nb * 8 + (lane & 3) * 2 + (e & 1);
            const int pos = first_pos + row_base + rf * 64 + (e >> 1) * 8;
            if (key > pos || key >= ctx || (window > 0 && key <= pos - window)) sacc[rf][nb][e] = -INFINITY;
          }
        }
      }
      // Online softmax on raw scores, two rows per thread (a quad shares a row):
      // p = 2^(s * scale' - max * scale') is one FFMA and one EX2.
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = -INFINITY;
#pragma unroll
        for (int nb = 0; nb < kN / 8; ++nb) mx = fmaxf(mx, fmaxf(sacc[rf][nb][2 * r], sacc[rf][nb][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mnew = fmaxf(m[rf][r], mx);
        const float mscaled = mnew == -INFINITY ? 0.0f : mnew * sl2;
        alpha[r] = fast_exp2(m[rf][r] * sl2 - mscaled);  // m = -inf: 0
        float sum = 0.0f;
#pragma unroll
        for (int nb = 0; nb < kN / 8; ++nb) {
          sacc[rf][nb][2 * r] = fast_exp2(fmaf(sacc[rf][nb][2 * r], sl2, -mscaled));
          sacc[rf][nb][2 * r + 1] = fast_exp2(fmaf(sacc[rf][nb][2 * r + 1], sl2, -mscaled));
          sum += sacc[rf][nb][2 * r] + sacc[rf][nb][2 * r + 1];
        }
        l[rf][r] = l[rf][r] * alpha[r] + sum;
        m[rf][r] = mnew;
      }
      // Rescale the output only when some row's max moved (rare after the first tiles).
      if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
          o[rf][i][0] *= alpha[0];
          o[rf][i][1] *= alpha[0];
          o[rf][i][2] *= alpha[1];
          o[rf][i][3] *= alpha[1];
        }
      }
    }

    if (has_next)
      cp_async_wait<1>();
    else
      cp_async_wait<0>();  // V(j) has landed
    __syncthreads();
    if constexpr (kFp8) {
      widen_tile<D, kN>(v_s, v_stage);
      __syncthreads();
    }

    // O += P V; P's accumulator layout is the A-fragment layout of the next mma.
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      uint32_t pa[kRF][4];
#pragma unroll
      for (int rf = 0; rf < kRF; ++rf) {
        pa[rf][0] = pack_bf16(sacc[rf][2 * kk][0], sacc[rf][2 * kk][1]);
        pa[rf][1] = pack_bf16(sacc[rf][2 * kk][2], sacc[rf][2 * kk][3]);
        pa[rf][2] = pack_bf16(sacc[rf][2 * kk + 1][0], sacc[rf][2 * kk + 1][1]);
        pa[rf][3] = pack_bf16(sacc[rf][2 * kk + 1][2], sacc[rf][2 * kk + 1][3]);
      }
#pragma unroll
      for (int db = 0; db < D / 16; ++db) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_s + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kLd + db * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int rf = 0; rf < kRF; ++rf) {
          mma_bf16(o[rf][2 * db], pa[rf], b[0], b[1]);
          mma_bf16(o[rf][2 * db + 1], pa[rf], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // before V(j+1) overwrites v_s
  }

  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(a.out);
#pragma unroll
  for (int rf = 0; rf < kRF; ++rf) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lsum = l[rf][r];
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
      const int qi = row_base + rf * 64 + r * 8;
      if (qi >= qlen) continue;
      const float inv = a.v_scale / lsum;
      __nv_bfloat16* orow = out + (static_cast<int64_t>(q_begin + qi) * a.Hq + h) * D + (lane & 3) * 2;
#pragma unroll
      for (int i = 0; i < D / 8; ++i)
        *reinterpret_cast<__nv_bfloat162*>(orow + i * 8) =
            __floats2bfloat162_rn(o[rf][i][2 * r] * inv, o[rf][i][2 * r + 1] * inv);
    }
  }
}

template <int D, typename CT, int kRF, int kN, bool kWindow>
void prefill_t(const PagedAttentionArgs& a, int max_query_len, int skip_upto, cudaStream_t s, size_t max_smem) {
  constexpr int smem = static_cast<int>(prefill_smem_bytes(D, sizeof(CT), kRF, kN));
  if (static_cast<size_t>(smem) > max_smem)
    fail(ErrorKind::kUnsupported,
         "prefill_attention_kernel (head dim {}, {} cache) needs {} bytes of shared memory a block; this device "
         "allows {}",
         D, sizeof(CT) == 1 ? "fp8" : "bf16", smem, max_smem);
  static const cudaError_t attr = cudaFuncSetAttribute(prefill_attention_kernel<D, CT, kRF, kN, kWindow>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  TCUDA_CHECK(attr);
  dim3 grid(a.Hq, (max_query_len + kRF * 64 - 1) / (kRF * 64), a.num_seqs);
  prefill_attention_kernel<D, CT, kRF, kN, kWindow><<<grid, kThreads, smem, s>>>(a, skip_upto);
  TCUDA_LAUNCH_CHECK();
}

// The tile of prefill_tile (kernel_smem.h), with or without a sliding window.
template <int D, typename CT, bool kWindow>
void prefill_t(const PagedAttentionArgs& a, int max_query_len, int skip_upto, cudaStream_t s, size_t max_smem) {
  constexpr PrefillTile lt = prefill_tile(D, true), st = prefill_tile(D, false);
  if (max_query_len > 64)
    prefill_t<D, CT, lt.row_frags, lt.keys, kWindow>(a, max_query_len, skip_upto, s, max_smem);
  else
    prefill_t<D, CT, st.row_frags, st.keys, kWindow>(a, max_query_len, skip_upto, s, max_smem);
}
template <int D, typename CT>
void prefill_t(const PagedAttentionArgs& a, int max_query_len, int skip_upto, cudaStream_t s, size_t max_smem) {
  if (a.window > 0)
    prefill_t<D, CT, true>(a, max_query_len, skip_upto, s, max_smem);
  else
    prefill_t<D, CT, false>(a, max_query_len, skip_upto, s, max_smem);
}

}  // namespace

bool prefill_attention_supported(int D, DType cache_dtype) {
  return (D == 64 || D == 128 || D == 256) && (cache_dtype == DType::kBF16 || cache_dtype == DType::kF8E4M3);
}

void launch_prefill_attention(const PagedAttentionArgs& a, int max_query_len, int skip_upto, cudaStream_t s,
                              size_t max_smem) {
  if (a.num_seqs == 0 || max_query_len == 0) return;
  const bool fp8 = a.cache_dtype == DType::kF8E4M3;
  if (a.D == 128) {
    fp8 ? prefill_t<128, __nv_fp8_e4m3>(a, max_query_len, skip_upto, s, max_smem)
        : prefill_t<128, __nv_bfloat16>(a, max_query_len, skip_upto, s, max_smem);
  } else if (a.D == 256) {
    fp8 ? prefill_t<256, __nv_fp8_e4m3>(a, max_query_len, skip_upto, s, max_smem)
        : prefill_t<256, __nv_bfloat16>(a, max_query_len, skip_upto, s, max_smem);
  } else {
    fp8 ? prefill_t<64, __nv_fp8_e4m3>(a, max_query_len, skip_upto, s, max_smem)
        : prefill_t<64, __nv_bfloat16>(a, max_query_len, skip_upto, s, max_smem);
  }
}

}  // namespace tessera::cuda
