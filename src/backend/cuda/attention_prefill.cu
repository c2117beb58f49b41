// Prefill attention over the paged cache, FlashAttention-2 style on tensor cores
// (mma.sync m16n8k16 bf16, f32 accumulation). A block owns 64 query rows of one
// sequence and one query head (4 warps x 16 rows); it walks 64-key tiles of the
// sequence's cached context (prefix + this step's keys) up to the causal limit,
// keeping the running max and sum of each row in registers. fp8 caches are
// widened to bf16 on the way into shared memory; k_scale folds into the score
// scale and v_scale into the output.
#include "backend/cuda/attention_common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kBM = 64, kBN = 64, kThreads = 128;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Copies keys [n0, n0 + kBN) of one kv head into smem rows (zeros past the context).
template <int D, typename CT>
__device__ __forceinline__ void load_kv_tile(__nv_bfloat16* smem, const CT* cache, const int32_t* bt, int n0, int ctx,
                                             int bs, int Hk, int kh) {
  constexpr int kLd = D + 8, kChunks = D / 8;
  for (int c = threadIdx.x; c < kBN * kChunks; c += kThreads) {
    const int key = c / kChunks, col = (c % kChunks) * 8, j = n0 + key;
    __nv_bfloat16* dst = smem + key * kLd + col;
    if (j < ctx) {
      const CT* src = cache + ((static_cast<int64_t>(bt[j / bs]) * bs + j % bs) * Hk + kh) * D + col;
      if constexpr (sizeof(CT) == 2) {
        cp_async16(dst, src);
      } else {
        float f[8];
        load_cache<CT, 8>(src, f);
        uint4 u;
        u.x = pack_bf16(f[0], f[1]);
        u.y = pack_bf16(f[2], f[3]);
        u.z = pack_bf16(f[4], f[5]);
        u.w = pack_bf16(f[6], f[7]);
        *reinterpret_cast<uint4*>(dst) = u;
      }
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }
}

template <int D, typename CT>
__global__ void __launch_bounds__(kThreads) prefill_attention_kernel(PagedAttentionArgs a, bool skip_single) {
  constexpr int kLd = D + 8;  // padded rows: ldmatrix reads hit 8 different bank groups
  __shared__ __align__(16) __nv_bfloat16 k_s[kBN * kLd];
  __shared__ __align__(16) __nv_bfloat16 v_s[kBN * kLd];

  const int s = blockIdx.z, h = blockIdx.y, qtile = blockIdx.x;
  const int q_begin = a.query_start_loc[s], qlen = a.query_start_loc[s + 1] - q_begin;
  if (qtile * kBM >= qlen || (skip_single && qlen == 1)) return;
  const int ctx = a.seq_lens[s], first_pos = ctx - qlen, kh = h / (a.Hq / a.Hk);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(a.q);

  // Q tile -> smem (k_s as staging) -> A fragments in registers.
  for (int c = tid; c < kBM * (D / 8); c += kThreads) {
    const int row = c / (D / 8), col = (c % (D / 8)) * 8, qi = qtile * kBM + row;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (qi < qlen) v = *reinterpret_cast<const uint4*>(q + (static_cast<int64_t>(q_begin + qi) * a.Hq + h) * D + col);
    *reinterpret_cast<uint4*>(k_s + row * kLd + col) = v;
  }
  __syncthreads();
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldmatrix_x4(qf[kk], k_s + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kLd + kk * 16 + (lane >> 4) * 8);
  __syncthreads();

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float sl2 = a.scale * a.k_scale * kLog2e;
  const int row0 = qtile * kBM + warp * 16 + (lane >> 2);  // query index of c0,c1; row0 + 8 for c2,c3
  const int last_q = min(qlen, (qtile + 1) * kBM) - 1;
  const int kv_end = first_pos + last_q + 1;
  const int warp_min_pos = first_pos + qtile * kBM + warp * 16;
  const int32_t* bt = a.block_tables + static_cast<int64_t>(s) * a.max_blocks_per_seq;
  const CT* kc = static_cast<const CT*>(a.k_cache);
  const CT* vc = static_cast<const CT*>(a.v_cache);

  for (int n0 = 0; n0 < kv_end; n0 += kBN) {
    load_kv_tile<D, CT>(k_s, kc, bt, n0, ctx, a.block_size, a.Hk, kh);
    load_kv_tile<D, CT>(v_s, vc, bt, n0, ctx, a.block_size, a.Hk, kh);
    cp_async_wait_all();
    __syncthreads();

    // S = Q K^T for this warp's 16 rows x 64 keys.
    float sacc[kBN / 8][4];
#pragma unroll
    for (int nb = 0; nb < kBN / 8; ++nb) sacc[nb][0] = sacc[nb][1] = sacc[nb][2] = sacc[nb][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2) {
#pragma unroll
      for (int nb = 0; nb < kBN / 8; ++nb) {
        uint32_t b[4];
        ldmatrix_x4(b, k_s + (nb * 8 + (lane & 7)) * kLd + kk * 16 + (lane >> 3) * 8);
        mma_bf16(sacc[nb], qf[kk], b[0], b[1]);
        mma_bf16(sacc[nb], qf[kk + 1], b[2], b[3]);
      }
    }

    // Scale into the log2 domain; mask the future and keys past the context.
    const bool need_mask = n0 + kBN - 1 > warp_min_pos || n0 + kBN > ctx;
#pragma unroll
    for (int nb = 0; nb < kBN / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = sacc[nb][e] * sl2;
        if (need_mask) {
          const int key = n0 + nb * 8 + (lane & 3) * 2 + (e & 1);
          const int pos = first_pos + row0 + (e >> 1) * 8;
          if (key > pos || key >= ctx) v = -INFINITY;
        }
        sacc[nb][e] = v;
      }
    }

    // Online softmax, two rows per thread (a quad shares a row).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nb = 0; nb < kBN / 8; ++nb) mx = fmaxf(mx, fmaxf(sacc[nb][2 * r], sacc[nb][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mnew = fmaxf(m[r], mx);
      const float msafe = mnew == -INFINITY ? 0.0f : mnew;
      const float alpha = exp2f(m[r] - msafe);
      float sum = 0.0f;
#pragma unroll
      for (int nb = 0; nb < kBN / 8; ++nb) {
        sacc[nb][2 * r] = exp2f(sacc[nb][2 * r] - msafe);
        sacc[nb][2 * r + 1] = exp2f(sacc[nb][2 * r + 1] - msafe);
        sum += sacc[nb][2 * r] + sacc[nb][2 * r + 1];
      }
      l[r] = l[r] * alpha + sum;
      m[r] = mnew;
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        o[i][2 * r] *= alpha;
        o[i][2 * r + 1] *= alpha;
      }
    }

    // O += P V; P's accumulator layout is the A-fragment layout of the next mma.
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t pa[4];
      pa[0] = pack_bf16(sacc[2 * kk][0], sacc[2 * kk][1]);
      pa[1] = pack_bf16(sacc[2 * kk][2], sacc[2 * kk][3]);
      pa[2] = pack_bf16(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]);
      pa[3] = pack_bf16(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3]);
#pragma unroll
      for (int db = 0; db < D / 16; ++db) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_s + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kLd + db * 16 + (lane >> 4) * 8);
        mma_bf16(o[2 * db], pa, b[0], b[1]);
        mma_bf16(o[2 * db + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // before the next tile overwrites k_s / v_s
  }

  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(a.out);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int qi = row0 + r * 8;
    if (qi >= qlen) continue;
    const float inv = a.v_scale / l[r];
    __nv_bfloat16* orow = out + (static_cast<int64_t>(q_begin + qi) * a.Hq + h) * D + (lane & 3) * 2;
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
      *reinterpret_cast<__nv_bfloat162*>(orow + i * 8) = __floats2bfloat162_rn(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
  }
}

template <int D, typename CT>
void prefill_t(const PagedAttentionArgs& a, int max_query_len, bool skip_single, cudaStream_t s) {
  dim3 grid((max_query_len + kBM - 1) / kBM, a.Hq, a.num_seqs);
  prefill_attention_kernel<D, CT><<<grid, kThreads, 0, s>>>(a, skip_single);
  TCUDA_LAUNCH_CHECK();
}

}  // namespace

bool prefill_attention_supported(int D, DType cache_dtype) {
  return (D == 64 || D == 128) && (cache_dtype == DType::kBF16 || cache_dtype == DType::kF8E4M3);
}

void launch_prefill_attention(const PagedAttentionArgs& a, int max_query_len, bool skip_single, cudaStream_t s) {
  if (a.num_seqs == 0 || max_query_len == 0) return;
  const bool fp8 = a.cache_dtype == DType::kF8E4M3;
  if (a.D == 128) {
    fp8 ? prefill_t<128, __nv_fp8_e4m3>(a, max_query_len, skip_single, s)
        : prefill_t<128, __nv_bfloat16>(a, max_query_len, skip_single, s);
  } else {
    fp8 ? prefill_t<64, __nv_fp8_e4m3>(a, max_query_len, skip_single, s)
        : prefill_t<64, __nv_bfloat16>(a, max_query_len, skip_single, s);
  }
}

}  // namespace tessera::cuda
