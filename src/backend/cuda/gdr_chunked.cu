// The gated delta rule's chunked prefill on tensor cores (Gated DeltaNet: Qwen3-Next, Qwen3.5):
// four kernels in the WY form, as flash-linear-attention splits it, and the workspace they share.
// launch_gated_delta_rule (linear_attn.cu) calls it for sequences of several tokens. Activations
// bf16, math f32, states f32 or bf16; docs/cuda.md has the kernel layout.
#include <mma.h>

#include <algorithm>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernel_smem.h"
#include "core/error.h"

namespace tessera::cuda {

namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(__expf(x)); }

// ---------------------------------------------------------------- gated delta rule, chunked
// Chunks of kBT tokens, never crossing a sequence; chunk ci has the row {first token, length,
// sequence} in a.chunks, and sequence s owns chunks [a.seq_chunks[s], a.seq_chunks[s+1]).
// Per chunk and value head (gc = cumulative log decay within the chunk):
//   1. prep:   q, k l2-normed (q also scaled) per key head, g and beta per value head, into
//              chunk-padded buffers (rows past the chunk's length are zeros);
//   2. wy:     A = beta_i k_i.k_j exp(gc_i - gc_j) (j < i), T = (I + A)^-1 in 16 x 16 blocks
//              (f32), W = T (beta k exp(gc)) and U = T (beta v) (bf16 mma);
//   3. state:  per sequence, value head and 32 value columns, walking its chunks in order:
//              H_c (the state at the chunk's start) saved, V = U - W H, H = exp(gc_last) H +
//              (k exp(gc_last - gc))^T V; the slot's state read first and written last;
//   4. output: O = (q exp(gc)) H_c + ((q k^T) exp(gc_i - gc_j), j <= i) V, per 64 value columns.
// Matrix products use WMMA 16x16x16 bf16 with f32 accumulation, operands staged in shared memory
// (the layouts: kernel_smem.h).
using gdr::kBT;
using gdr::ld_bf16;
using gdr::ld_f32;
using gdr::OutSmem;
using gdr::StateSmem;
using gdr::WySmem;
using namespace nvcuda;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAc = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBc = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// 1. One warp per chunk row; grid (num_chunks, kBT / 8), 8 warps.
template <int DK>
__global__ void __launch_bounds__(256) gdr_prep_kernel(GatedDeltaRuleArgs a) {
  const int lane = threadIdx.x & 31, i = blockIdx.y * 8 + (threadIdx.x >> 5);
  const int ci = blockIdx.x;
  const int t_first = a.chunks[3 * ci], len = a.chunks[3 * ci + 1];
  const bool valid = i < len;
  const int64_t t = t_first + i;
  const int64_t C = 2 * static_cast<int64_t>(a.Hk) * DK + static_cast<int64_t>(a.Hv) * a.Dv;
  const bf16* row = static_cast<const bf16*>(a.qkv) + t * C;
  for (int kh = 0; kh < a.Hk; ++kh) {
    constexpr int E = DK / 32;
    float q[E], k[E], sq = 0.0f, sk = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      q[e] = valid ? __bfloat162float(row[kh * DK + e * 32 + lane]) : 0.0f;
      k[e] = valid ? __bfloat162float(row[(a.Hk + kh) * DK + e * 32 + lane]) : 0.0f;
      sq += q[e] * q[e], sk += k[e] * k[e];
    }
    const float rq = rsqrtf(warp_sum(sq) + 1e-6f) * a.scale, rk = rsqrtf(warp_sum(sk) + 1e-6f);
    const int64_t o = ((static_cast<int64_t>(ci) * a.Hk + kh) * kBT + i) * DK;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      a.qn[o + e * 32 + lane] = __float2bfloat16_rn(q[e] * rq);
      a.kn[o + e * 32 + lane] = __float2bfloat16_rn(k[e] * rk);
    }
  }
  const bf16* bar = static_cast<const bf16*>(a.ba) + t * a.ba_stride + a.ba_col;
  for (int h = lane; h < a.Hv; h += 32) {
    float g = 0.0f, beta = 0.0f;
    if (valid) {
      const float A = -__expf(load_as_float(a.A_log, a.param_t, h));
      g = A * softplus_f(__bfloat162float(bar[a.Hv + h]) + load_as_float(a.dt_bias, a.param_t, h));
      beta = 1.0f / (1.0f + __expf(-__bfloat162float(bar[h])));
    }
    const int64_t o = (static_cast<int64_t>(ci) * a.Hv + h) * kBT + i;
    a.g[o] = g;
    a.beta[o] = beta;
  }
}

// 8 bf16 from src to dst (both 16-byte aligned), each times f (f = 1 and -1 are exact).
__device__ __forceinline__ void copy8(bf16* dst, const bf16* src, float f = 1.0f) {
  uint4 raw = *reinterpret_cast<const uint4*>(src);
  if (f != 1.0f) {
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = __bfloat1622float2(h[i]);
      h[i] = __floats2bfloat162_rn(v.x * f, v.y * f);
    }
  }
  *reinterpret_cast<uint4*>(dst) = raw;
}

// A 16x16 f32 accumulator tile to bf16 global memory (row stride ld), through a per-warp
// staging tile; rows >= rows_valid are skipped.
__device__ __forceinline__ void store_tile_bf16(const FragC& f, float* stage, bf16* dst, int64_t ld, int rows_valid,
                                                int lane) {
  wmma::store_matrix_sync(stage, f, 16, wmma::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 256; e += 32) {
    const int r = e / 16, c = e % 16;
    if (r < rows_valid) dst[r * ld + c] = __float2bfloat16_rn(stage[e]);
  }
  __syncwarp();
}

// Row tile `warp` of X Y^T for column tiles 0..warp (the causal lower half of a 64 x 64
// product): X, Y [64][ld_bf16<DK>] bf16 and out [64][ld_f32<64>] f32, all in shared memory.
template <int DK>
__device__ __forceinline__ void lower_xyt(const bf16* x, const bf16* y, float* out, int warp) {
  constexpr int ld = ld_bf16<DK>(), ldo = ld_f32<kBT>();
  for (int ct = 0; ct <= warp; ++ct) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < DK; kk += 16) {
      FragA fa;
      FragBc fb;  // Y^T: element (k, n) at y[n][k]
      wmma::load_matrix_sync(fa, x + warp * 16 * ld + kk, ld);
      wmma::load_matrix_sync(fb, y + ct * 16 * ld + kk, ld);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + warp * 16 * ldo + ct * 16, acc, ldo, wmma::mem_row_major);
  }
}

// 2. WY representation. grid (num_chunks, Hv), 4 warps; warp w owns rows [16w, 16w+16).

template <int DK, int DV>
__global__ void __launch_bounds__(128) gdr_wy_kernel(GatedDeltaRuleArgs a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<WySmem<DK, DV>*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ci = blockIdx.x, h = blockIdx.y, kh = h / (a.Hv / a.Hk);
  const int t_first = a.chunks[3 * ci], len = a.chunks[3 * ci + 1];
  const int64_t gofs = (static_cast<int64_t>(ci) * a.Hv + h) * kBT;
  if (tid < 32) {  // cumulative log decay: a warp scan over 2 x 32 rows
    float g0 = a.g[gofs + lane], g1 = a.g[gofs + 32 + lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float u0 = __shfl_up_sync(0xffffffffu, g0, o), u1 = __shfl_up_sync(0xffffffffu, g1, o);
      if (lane >= o) g0 += u0, g1 += u1;
    }
    g1 += __shfl_sync(0xffffffffu, g0, 31);
    sm.gc[lane] = g0;
    sm.gc[32 + lane] = g1;
    a.gc[gofs + lane] = g0;
    a.gc[gofs + 32 + lane] = g1;
  }
  if (tid >= 64 && tid < 128) sm.beta[tid - 64] = a.beta[gofs + tid - 64];
  __syncthreads();
  const bf16* kn = a.kn + (static_cast<int64_t>(ci) * a.Hk + kh) * kBT * DK;
  for (int e = tid; e < kBT * DK / 8; e += 128) {  // 8 elements a step
    const int r = e / (DK / 8), c = e % (DK / 8) * 8;
    copy8(&sm.k[r][c], kn + r * DK + c);
    copy8(&sm.kb[r][c], kn + r * DK + c, sm.beta[r] * __expf(sm.gc[r]));
  }
  const int64_t C = 2 * static_cast<int64_t>(a.Hk) * DK + static_cast<int64_t>(a.Hv) * DV;
  const bf16* qkv = static_cast<const bf16*>(a.qkv);
  for (int e = tid; e < kBT * DV; e += 128) {
    const int r = e / DV, c = e % DV;
    const float v = r < len ? __bfloat162float(qkv[(t_first + r) * C + 2 * a.Hk * DK + h * DV + c]) : 0.0f;
    sm.vb[r][c] = __float2bfloat16_rn(v * sm.beta[r]);
  }
  __syncthreads();
  lower_xyt<DK>(&sm.k[0][0], &sm.k[0][0], &sm.A[0][0], warp);  // k k^T
  __syncthreads();
  for (int e = tid; e < kBT * kBT; e += 128) {
    const int i = e / kBT, j = e % kBT;
    sm.A[i][j] = j < i ? sm.A[i][j] * sm.beta[i] * __expf(sm.gc[i] - sm.gc[j]) : 0.0f;
  }
  __syncthreads();
  // T = (I + A)^-1 in 16 x 16 blocks. The diagonal blocks first, by forward substitution (a
  // thread per column: column c of block b solves x_r = -sum_{c <= m < r} A[16b+r][16b+m] x_m);
  // then the blocks below them by distance d: T_ij = -T_ii sum_{j <= k < i} A_ik T_kj, i = j + d,
  // whose T_kj are all closer to the diagonal.
  for (int e = tid; e < kBT * kBT; e += 128) sm.Tf[e / kBT][e % kBT] = 0.0f;
  __syncthreads();
  if (tid < kBT) {
    const int b0 = (tid / 16) * 16, c = tid % 16, j = b0 + c;
    sm.Tf[j][j] = 1.0f;
    for (int r = c + 1; r < 16; ++r) {
      float acc = 0.0f;
      for (int m = c; m < r; ++m) acc += sm.A[b0 + r][b0 + m] * sm.Tf[b0 + m][j];
      sm.Tf[b0 + r][j] = -acc;
    }
  }
  __syncthreads();
  for (int d = 1; d < kBT / 16; ++d) {
    const int pairs = kBT / 16 - d;  // block rows i = j + d for j < pairs
    for (int e = tid; e < pairs * 256; e += 128) {
      const int jb = e / 256, ib = jb + d, r = (e % 256) / 16, c = e % 16;
      float acc = 0.0f;
      for (int k = jb * 16; k < ib * 16; ++k) acc += sm.A[ib * 16 + r][k] * sm.Tf[k][jb * 16 + c];
      sm.X[jb][r][c] = acc;
    }
    __syncthreads();
    for (int e = tid; e < pairs * 256; e += 128) {
      const int jb = e / 256, ib = jb + d, r = (e % 256) / 16, c = e % 16;
      float acc = 0.0f;
      for (int m = 0; m < 16; ++m) acc += sm.Tf[ib * 16 + r][ib * 16 + m] * sm.X[jb][m][c];
      sm.Tf[ib * 16 + r][jb * 16 + c] = -acc;
    }
    __syncthreads();
  }
  for (int e = tid; e < kBT * kBT; e += 128) sm.Tb[e / kBT][e % kBT] = __float2bfloat16_rn(sm.Tf[e / kBT][e % kBT]);
  __syncthreads();
  // W = T kb and U = T vb: T is lower triangular, so row tile w needs k tiles 0..w only.
  bf16* W = a.w + gofs * DK;
  bf16* U = a.u + gofs * DV;
  for (int ct = 0; ct < (DK + DV) / 16; ++ct) {
    const bool is_w = ct < DK / 16;
    const int c0 = is_w ? ct * 16 : ct * 16 - DK;
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kt = 0; kt <= warp; ++kt) {
      FragA fa;
      FragB fb;
      wmma::load_matrix_sync(fa, &sm.Tb[warp * 16][kt * 16], ld_bf16<kBT>());
      if (is_w)
        wmma::load_matrix_sync(fb, &sm.kb[kt * 16][c0], ld_bf16<DK>());
      else
        wmma::load_matrix_sync(fb, &sm.vb[kt * 16][c0], ld_bf16<DV>());
      wmma::mma_sync(acc, fa, fb, acc);
    }
    if (is_w)
      store_tile_bf16(acc, sm.stage[warp], W + static_cast<int64_t>(warp * 16) * DK + c0, DK, 16, lane);
    else
      store_tile_bf16(acc, sm.stage[warp], U + static_cast<int64_t>(warp * 16) * DV + c0, DV, 16, lane);
  }
}

// 3. The state pass. grid (DV / 32, Hv, S), 4 warps; warp w owns state rows [w*DK/4, (w+1)*DK/4)
// (DK/64 row tiles) x the block's 32 value columns (2 column tiles), as accumulators.

template <int DK, int DV, typename SS>
__global__ void __launch_bounds__(128) gdr_state_kernel(GatedDeltaRuleArgs a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<StateSmem<DK, DV>*>(smem_raw);
  constexpr int RT = DK / 64;  // row tiles per warp
  const int tid = threadIdx.x, warp = tid >> 5;
  const int v0 = blockIdx.x * 32, h = blockIdx.y, s = blockIdx.z, kh = h / (a.Hv / a.Hk);
  const int c_begin = a.seq_chunks[s], c_end = a.seq_chunks[s + 1], slot = a.slots[s];
  if (slot < 0 || c_begin == c_end) return;
  SS* st = static_cast<SS*>(a.state) + (static_cast<int64_t>(slot) * a.Hv + h) * DK * DV + v0;
  const bool init = a.has_init[s] != 0;
  for (int e = tid; e < DK * 32; e += 128) {
    const int r = e / 32, c = e % 32;
    sm.hf[r][c] = init ? to_float(st[static_cast<int64_t>(r) * DV + c]) : 0.0f;
  }
  __syncthreads();
  FragC hacc[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int ct = 0; ct < 2; ++ct)
      wmma::load_matrix_sync(hacc[rt][ct], &sm.hf[(warp * RT + rt) * 16][ct * 16], ld_f32<32>(), wmma::mem_row_major);
  for (int ci = c_begin; ci < c_end; ++ci) {
    const int64_t gofs = (static_cast<int64_t>(ci) * a.Hv + h) * kBT;
    __syncthreads();  // the previous chunk's readers of hf / hb / w / kd / vb are done
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int ct = 0; ct < 2; ++ct)
        wmma::store_matrix_sync(&sm.hf[(warp * RT + rt) * 16][ct * 16], hacc[rt][ct], ld_f32<32>(),
                                wmma::mem_row_major);
    if (tid < kBT) sm.gc[tid] = a.gc[gofs + tid];
    const bf16* W = a.w + gofs * DK;
    const bf16* kn = a.kn + (static_cast<int64_t>(ci) * a.Hk + kh) * kBT * DK;
    const bf16* U = a.u + gofs * DV + v0;
    for (int e = tid; e < kBT * 32; e += 128) sm.vf[e / 32][e % 32] = __bfloat162float(U[(e / 32) * DV + e % 32]);
    __syncthreads();
    const float last = sm.gc[kBT - 1];
    bf16* Hs = a.hs + (static_cast<int64_t>(ci) * a.Hv + h) * DK * DV + v0;
    for (int e = tid; e < DK * 32; e += 128) {
      const int r = e / 32, c = e % 32;
      const bf16 hv = __float2bfloat16_rn(sm.hf[r][c]);
      sm.hb[r][c] = hv;
      Hs[static_cast<int64_t>(r) * DV + c] = hv;
    }
    for (int e = tid; e < kBT * DK / 8; e += 128) {
      const int r = e / (DK / 8), c = e % (DK / 8) * 8;
      copy8(&sm.w[r][c], W + r * DK + c, -1.0f);
      copy8(&sm.kd[r][c], kn + r * DK + c, __expf(last - sm.gc[r]));
    }
    __syncthreads();
    // V = U + (-W) H: row tile = warp, 2 column tiles.
#pragma unroll
    for (int ct = 0; ct < 2; ++ct) {
      FragC acc;
      wmma::load_matrix_sync(acc, &sm.vf[warp * 16][ct * 16], ld_f32<32>(), wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < DK; kk += 16) {
        FragA fa;
        FragB fb;
        wmma::load_matrix_sync(fa, &sm.w[warp * 16][kk], ld_bf16<DK>());
        wmma::load_matrix_sync(fb, &sm.hb[kk][ct * 16], ld_bf16<32>());
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(&sm.vf[warp * 16][ct * 16], acc, ld_f32<32>(), wmma::mem_row_major);
    }
    __syncthreads();
    bf16* Vn = a.vnew + gofs * DV + v0;
    for (int e = tid; e < kBT * 32; e += 128) {
      const int r = e / 32, c = e % 32;
      const bf16 vv = __float2bfloat16_rn(sm.vf[r][c]);
      sm.vb[r][c] = vv;
      Vn[static_cast<int64_t>(r) * DV + c] = vv;
    }
    __syncthreads();
    // H = exp(last) H + kd^T V.
    const float decay = __expf(last);
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int ct = 0; ct < 2; ++ct) {
        FragC& acc = hacc[rt][ct];
#pragma unroll
        for (int e = 0; e < acc.num_elements; ++e) acc.x[e] *= decay;
#pragma unroll
        for (int kk = 0; kk < kBT; kk += 16) {
          FragAc fa;  // kd^T: element (row r, token k) at kd[k][r]
          FragB fb;
          wmma::load_matrix_sync(fa, &sm.kd[kk][(warp * RT + rt) * 16], ld_bf16<DK>());
          wmma::load_matrix_sync(fb, &sm.vb[kk][ct * 16], ld_bf16<32>());
          wmma::mma_sync(acc, fa, fb, acc);
        }
      }
  }
  __syncthreads();
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int ct = 0; ct < 2; ++ct)
      wmma::store_matrix_sync(&sm.hf[(warp * RT + rt) * 16][ct * 16], hacc[rt][ct], ld_f32<32>(), wmma::mem_row_major);
  __syncthreads();
  for (int e = tid; e < DK * 32; e += 128) {
    const int r = e / 32, c = e % 32;
    st[static_cast<int64_t>(r) * DV + c] = from_float<SS>(sm.hf[r][c]);
  }
}

// 4. Outputs. grid (num_chunks, Hv, DV / 64), 4 warps; warp w owns output rows [16w, 16w+16).

template <int DK, int DV>
__global__ void __launch_bounds__(128) gdr_output_kernel(GatedDeltaRuleArgs a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<OutSmem<DK>*>(smem_raw);
  const int tid = threadIdx.x, warp = tid >> 5;
  const int ci = blockIdx.x, h = blockIdx.y, v0 = blockIdx.z * 64, kh = h / (a.Hv / a.Hk);
  const int t_first = a.chunks[3 * ci], len = a.chunks[3 * ci + 1], s = a.chunks[3 * ci + 2];
  bf16* out = static_cast<bf16*>(a.out);
  if (a.slots[s] < 0) {
    for (int e = tid; e < len * 64; e += 128)
      out[(static_cast<int64_t>(t_first + e / 64) * a.Hv + h) * DV + v0 + e % 64] = __float2bfloat16_rn(0.0f);
    return;
  }
  const int64_t gofs = (static_cast<int64_t>(ci) * a.Hv + h) * kBT;
  if (tid < kBT) sm.gc[tid] = a.gc[gofs + tid];
  __syncthreads();
  const int64_t qo = (static_cast<int64_t>(ci) * a.Hk + kh) * kBT * DK;
  for (int e = tid; e < kBT * DK / 8; e += 128) {
    const int r = e / (DK / 8), c = e % (DK / 8) * 8;
    copy8(&sm.q[r][c], a.qn + qo + r * DK + c);
    copy8(&sm.qd[r][c], a.qn + qo + r * DK + c, __expf(sm.gc[r]));
    copy8(&sm.k[r][c], a.kn + qo + r * DK + c);
  }
  const bf16* Hs = a.hs + (static_cast<int64_t>(ci) * a.Hv + h) * DK * DV + v0;
  for (int e = tid; e < DK * 8; e += 128)
    copy8(&sm.h[e / 8][e % 8 * 8], Hs + static_cast<int64_t>(e / 8) * DV + e % 8 * 8);
  const bf16* Vn = a.vnew + gofs * DV + v0;
  for (int e = tid; e < kBT * 8; e += 128)
    copy8(&sm.v[e / 8][e % 8 * 8], Vn + static_cast<int64_t>(e / 8) * DV + e % 8 * 8);
  __syncthreads();
  lower_xyt<DK>(&sm.q[0][0], &sm.k[0][0], &sm.p[0][0], warp);  // q k^T
  __syncthreads();
  for (int e = tid; e < kBT * kBT; e += 128) {
    const int i = e / kBT, j = e % kBT;
    sm.pb[i][j] = __float2bfloat16_rn(j <= i ? sm.p[i][j] * __expf(sm.gc[i] - sm.gc[j]) : 0.0f);
  }
  __syncthreads();
  for (int ct = 0; ct < 4; ++ct) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < DK; kk += 16) {
      FragA fa;
      FragB fb;
      wmma::load_matrix_sync(fa, &sm.qd[warp * 16][kk], ld_bf16<DK>());
      wmma::load_matrix_sync(fb, &sm.h[kk][ct * 16], ld_bf16<64>());
      wmma::mma_sync(acc, fa, fb, acc);
    }
    for (int kt = 0; kt <= warp; ++kt) {
      FragA fa;
      FragB fb;
      wmma::load_matrix_sync(fa, &sm.pb[warp * 16][kt * 16], ld_bf16<kBT>());
      wmma::load_matrix_sync(fb, &sm.v[kt * 16][ct * 16], ld_bf16<64>());
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(&sm.p[warp * 16][ct * 16], acc, ld_f32<64>(), wmma::mem_row_major);
  }
  __syncthreads();
  for (int e = tid; e < len * 64; e += 128) {
    const int r = e / 64, c = e % 64;
    out[(static_cast<int64_t>(t_first + r) * a.Hv + h) * DV + v0 + c] = __float2bfloat16_rn(sm.p[r][c]);
  }
}

// One attribute call per kernel. The kernel is a template argument, not a parameter: every
// kernel here has the same type (void(GatedDeltaRuleArgs)), so a static keyed on the type
// would raise the limit of the first kernel only and the others would fail to launch.
template <auto Kernel>
void set_smem(size_t bytes) {
  static bool done = false;
  if (!done) {
    TCUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    done = true;
  }
}

template <int DK, int DV, typename SS>
void chunked_t(const GatedDeltaRuleArgs& a, cudaStream_t s, size_t max_smem) {
  const size_t most = std::max({sizeof(WySmem<DK, DV>), sizeof(StateSmem<DK, DV>), sizeof(OutSmem<DK>)});
  if (most > max_smem)
    fail(ErrorKind::kUnsupported,
         "the chunked gated delta rule's kernels (gdr_wy_kernel, gdr_state_kernel, gdr_output_kernel) need {} bytes of "
         "shared memory a block; this device allows {}",
         most, max_smem);
  gdr_prep_kernel<DK><<<dim3(a.num_chunks, kBT / 8), 256, 0, s>>>(a);
  TCUDA_LAUNCH_CHECK();
  set_smem<gdr_wy_kernel<DK, DV>>(sizeof(WySmem<DK, DV>));
  gdr_wy_kernel<DK, DV><<<dim3(a.num_chunks, a.Hv), 128, sizeof(WySmem<DK, DV>), s>>>(a);
  TCUDA_LAUNCH_CHECK();
  set_smem<gdr_state_kernel<DK, DV, SS>>(sizeof(StateSmem<DK, DV>));
  gdr_state_kernel<DK, DV, SS><<<dim3(DV / 32, a.Hv, a.num_seqs), 128, sizeof(StateSmem<DK, DV>), s>>>(a);
  TCUDA_LAUNCH_CHECK();
  set_smem<gdr_output_kernel<DK, DV>>(sizeof(OutSmem<DK>));
  gdr_output_kernel<DK, DV><<<dim3(a.num_chunks, a.Hv, DV / 64), 128, sizeof(OutSmem<DK>), s>>>(a);
  TCUDA_LAUNCH_CHECK();
}

// The chunked path's buffers in ws, in order; returns the bytes used (each piece 256-aligned).
size_t carve(GatedDeltaRuleArgs* a, char* ws, int64_t num_chunks, int Hk, int Hv, int Dk, int Dv) {
  size_t off = 0;
  auto take = [&](int64_t elems, size_t elem_bytes) {
    char* p = ws ? ws + off : nullptr;
    off += (static_cast<size_t>(elems) * elem_bytes + 255) / 256 * 256;
    return p;
  };
  const int64_t rows = num_chunks * kBT;
  char* qn = take(rows * Hk * Dk, 2);
  char* kn = take(rows * Hk * Dk, 2);
  char* w = take(rows * Hv * Dk, 2);
  char* u = take(rows * Hv * Dv, 2);
  char* vnew = take(rows * Hv * Dv, 2);
  char* hs = take(num_chunks * Hv * Dk * Dv, 2);
  char* g = take(rows * Hv, 4);
  char* beta = take(rows * Hv, 4);
  char* gc = take(rows * Hv, 4);
  if (a) {
    a->qn = reinterpret_cast<bf16*>(qn), a->kn = reinterpret_cast<bf16*>(kn);
    a->w = reinterpret_cast<bf16*>(w), a->u = reinterpret_cast<bf16*>(u), a->vnew = reinterpret_cast<bf16*>(vnew);
    a->hs = reinterpret_cast<bf16*>(hs);
    a->g = reinterpret_cast<float*>(g), a->beta = reinterpret_cast<float*>(beta), a->gc = reinterpret_cast<float*>(gc);
  }
  return off;
}

}  // namespace

size_t gdr_chunked_workspace_bytes(int64_t num_chunks, int Hk, int Hv, int Dk, int Dv) {
  return carve(nullptr, nullptr, num_chunks, Hk, Hv, Dk, Dv);
}

void gdr_carve_workspace(GatedDeltaRuleArgs& a, void* ws) {
  carve(&a, static_cast<char*>(ws), a.num_chunks, a.Hk, a.Hv, a.Dk, a.Dv);
}

void launch_gdr_chunked(const GatedDeltaRuleArgs& a, cudaStream_t s, size_t max_smem) {
  if (a.state_t == DType::kF32)
    chunked_t<128, 128, float>(a, s, max_smem);
  else
    chunked_t<128, 128, bf16>(a, s, max_smem);
}

}  // namespace tessera::cuda
