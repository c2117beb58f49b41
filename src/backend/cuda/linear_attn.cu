// Linear attention (Gated DeltaNet) kernels: causal conv1d with a conv state, the gated delta
// rule (a recurrent kernel for decode and short or unusual shapes; a chunked WY-form prefill on
// tensor cores in four kernels, as flash-linear-attention splits it), and the gated RMSNorm.
// Activations bf16, math f32, states f32 or bf16. See backend.h for the functions and
// docs/cuda.md for the kernel layout.
#include <mma.h>

#include <algorithm>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernel_smem.h"
#include "core/error.h"

namespace tessera::cuda {

namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(__expf(x)); }

// ---------------------------------------------------------------- causal conv1d
// A thread owns one channel of up to kConvSeg consecutive tokens of one sequence: grid
// (channel blocks, segments, sequences). The window of the K-1 inputs before the segment comes
// from x, or from the slot's conv state before the sequence's first token. With update_state
// (every sequence fits one segment: decode, short prefill) the thread that read the old state
// also writes the new one; otherwise conv_state_update_kernel runs afterwards (other segments'
// threads still read the old state).
constexpr int kConvSeg = 64;
constexpr int kConvThreads = 128;

template <int K, typename SS>
__global__ void __launch_bounds__(kConvThreads)
    conv1d_kernel(const bf16* __restrict__ x, int64_t X, int64_t x_col, const void* __restrict__ w, DType wt,
                  SS* __restrict__ state, const int32_t* __restrict__ qsl, const int32_t* __restrict__ slots,
                  const int32_t* __restrict__ has_init, const int32_t* __restrict__ token_slots, bf16* __restrict__ out,
                  int C, bool update_state) {
  pdl_launch_dependents();  // programmatic dependent launch: see device_utils.cuh
  pdl_wait();
  const int c = blockIdx.x * kConvThreads + threadIdx.x, s = blockIdx.z;
  if (c >= C) return;
  const int t0 = qsl[s], L = qsl[s + 1] - t0, p0 = blockIdx.y * kConvSeg;
  if (p0 >= L) return;
  const int p1 = min(L, p0 + kConvSeg), slot = slots[s];
  if (slot < 0) {
    for (int p = p0; p < p1; ++p) out[static_cast<int64_t>(t0 + p) * C + c] = __float2bfloat16_rn(0.0f);
    return;
  }
  // Speculative decoding: the state after each token goes to token_slots[t] (a verification
  // chunk is shorter than a segment, so this thread read the old state before writing any).
  const bool per_token = token_slots != nullptr && token_slots[t0 + L - 1] != slot;
  float wv[K], win[K - 1];
#pragma unroll
  for (int j = 0; j < K; ++j) wv[j] = load_as_float(w, wt, static_cast<int64_t>(c) * K + j);
  const bool init = has_init[s] != 0;
  const SS* st = state + static_cast<int64_t>(slot) * (K - 1) * C + c;
#pragma unroll
  for (int j = 0; j < K - 1; ++j) {
    const int idx = p0 - (K - 1) + j;
    win[j] = idx >= 0 ? __bfloat162float(x[static_cast<int64_t>(t0 + idx) * X + x_col + c])
             : init   ? to_float(st[static_cast<int64_t>(K - 1 + idx) * C])
                      : 0.0f;
  }
  for (int p = p0; p < p1; ++p) {
    const float xv = __bfloat162float(x[static_cast<int64_t>(t0 + p) * X + x_col + c]);
    float acc = wv[K - 1] * xv;
#pragma unroll
    for (int j = 0; j < K - 1; ++j) acc += wv[j] * win[j];
    out[static_cast<int64_t>(t0 + p) * C + c] = __float2bfloat16_rn(silu_f(acc));
#pragma unroll
    for (int j = 0; j < K - 2; ++j) win[j] = win[j + 1];
    win[K - 2] = xv;
    if (per_token && token_slots[t0 + p] >= 0) {
      SS* dst = state + static_cast<int64_t>(token_slots[t0 + p]) * (K - 1) * C + c;
#pragma unroll
      for (int j = 0; j < K - 1; ++j) dst[static_cast<int64_t>(j) * C] = from_float<SS>(win[j]);
    }
  }
  if (update_state && p1 == L && !per_token) {
    SS* dst = state + static_cast<int64_t>(slot) * (K - 1) * C + c;
#pragma unroll
    for (int j = 0; j < K - 1; ++j) dst[static_cast<int64_t>(j) * C] = from_float<SS>(win[j]);
  }
}

// The new conv state of each sequence after a multi-segment step: row r holds input L-(K-1)+r,
// from x, or (a step shorter than K-1) the old state row r+L, read before row r+L is written
// (rows ascend) by the same thread.
template <int K, typename SS>
__global__ void conv_state_update_kernel(const bf16* __restrict__ x, int64_t X, int64_t x_col, SS* __restrict__ state,
                                         const int32_t* __restrict__ qsl, const int32_t* __restrict__ slots,
                                         const int32_t* __restrict__ has_init, const int32_t* __restrict__ token_slots,
                                         int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, s = blockIdx.y;
  if (c >= C) return;
  const int t0 = qsl[s], L = qsl[s + 1] - t0, slot = slots[s];
  if (slot < 0 || L == 0) return;
  if (token_slots != nullptr && token_slots[t0 + L - 1] != slot) return;  // per-token states (conv1d_kernel)
  SS* st = state + static_cast<int64_t>(slot) * (K - 1) * C + c;
  const bool init = has_init[s] != 0;
  for (int r = 0; r < K - 1; ++r) {
    const int idx = L - (K - 1) + r;
    const float v = idx >= 0 ? __bfloat162float(x[static_cast<int64_t>(t0 + idx) * X + x_col + c])
                    : init   ? to_float(st[static_cast<int64_t>(r + L) * C])
                             : 0.0f;
    st[static_cast<int64_t>(r) * C] = from_float<SS>(v);
  }
}

// ---------------------------------------------------------------- gated RMSNorm
// One warp per (token, head) row of D.
__global__ void gated_rms_norm_kernel(const bf16* __restrict__ x, const bf16* __restrict__ z, int64_t Z, int64_t z_col,
                                      const void* __restrict__ w, DType wt, bf16* out, int64_t rows, int H, int D,
                                      float eps) {
  pdl_launch_dependents();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int64_t r = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const int64_t t = r / H;
  const int h = static_cast<int>(r % H);
  const bf16* xr = x + r * D;
  const bf16* zr = z + t * Z + z_col + static_cast<int64_t>(h) * D;
  float ss = 0.0f;
  for (int i = lane; i < D; i += 32) {
    const float v = __bfloat162float(xr[i]);
    ss += v * v;
  }
  const float inv = rsqrtf(warp_sum(ss) / static_cast<float>(D) + eps);
  for (int i = lane; i < D; i += 32)  // each lane reads then writes its own elements (out may alias x)
    out[r * D + i] =
        __float2bfloat16_rn(__bfloat162float(xr[i]) * inv * load_as_float(w, wt, i) * silu_f(__bfloat162float(zr[i])));
}

// ---------------------------------------------------------------- gated delta rule, recurrent
// grid (ceil(Dv/32), Hv, S), 4 warps. Lane l owns value column v = 32*blockIdx.x + l; warp w
// owns the state rows [w*DK/4, (w+1)*DK/4) of that column in registers, so a sequence's state
// is read once and written once however many tokens the block walks through. Per token: q and
// k of the key head go through shared memory, each warp computes their norms, and the two
// column sums (S^T k, then S^T q) are reduced across the 4 warps in shared memory.
template <int DK, typename SS>
__global__ void __launch_bounds__(128) gdr_recurrent_kernel(GatedDeltaRuleArgs a) {
  constexpr int R = DK / 4;
  __shared__ float qs[DK], ks[DK], red_k[4][32], red_q[4][32];
  pdl_launch_dependents();
  pdl_wait();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int s = blockIdx.z, h = blockIdx.y, v = blockIdx.x * 32 + lane;
  if (a.skip_seqs && a.skip_seqs[s]) return;
  const int t0 = a.qsl[s], t1 = a.qsl[s + 1], slot = a.slots[s];
  const bool vok = v < a.Dv;
  bf16* out = static_cast<bf16*>(a.out);
  if (slot < 0) {
    if (warp == 0 && vok)
      for (int t = t0; t < t1; ++t) out[(static_cast<int64_t>(t) * a.Hv + h) * a.Dv + v] = __float2bfloat16_rn(0.0f);
    return;
  }
  if (t1 == t0) return;
  // Speculative decoding: the state after each token goes to token_slots[t] (read first, in
  // registers, so a token slot may be the sequence's own).
  const bool per_token = a.token_slots != nullptr && a.token_slots[t1 - 1] != slot;
  SS* sp = static_cast<SS*>(a.state) + ((static_cast<int64_t>(slot) * a.Hv + h) * DK + warp * R) * a.Dv + v;
  float S[R];
  const bool init = a.has_init[s] != 0;
#pragma unroll
  for (int r = 0; r < R; ++r) S[r] = init && vok ? to_float(sp[static_cast<int64_t>(r) * a.Dv]) : 0.0f;
  const int kh = h / (a.Hv / a.Hk);
  const float A = -__expf(load_as_float(a.A_log, a.param_t, h)), dtb = load_as_float(a.dt_bias, a.param_t, h);
  const bf16* qkv = static_cast<const bf16*>(a.qkv);
  const bf16* ba = static_cast<const bf16*>(a.ba);
  const int64_t C = 2 * static_cast<int64_t>(a.Hk) * DK + static_cast<int64_t>(a.Hv) * a.Dv;
  for (int t = t0; t < t1; ++t) {
    const bf16* row = qkv + static_cast<int64_t>(t) * C;
    for (int i = threadIdx.x; i < DK; i += 128) {
      qs[i] = __bfloat162float(row[kh * DK + i]);
      ks[i] = __bfloat162float(row[(a.Hk + kh) * DK + i]);
    }
    __syncthreads();
    float sq = 0.0f, sk = 0.0f;
    for (int i = lane; i < DK; i += 32) sq += qs[i] * qs[i], sk += ks[i] * ks[i];
    const float rq = rsqrtf(warp_sum(sq) + 1e-6f) * a.scale, rk = rsqrtf(warp_sum(sk) + 1e-6f);
    const bf16* bar = ba + static_cast<int64_t>(t) * a.ba_stride + a.ba_col;
    const float g = A * softplus_f(__bfloat162float(bar[a.Hv + h]) + dtb);
    const float beta = 1.0f / (1.0f + __expf(-__bfloat162float(bar[h])));
    const float decay = __expf(g);
    const float vv = vok ? __bfloat162float(row[2 * a.Hk * DK + static_cast<int64_t>(h) * a.Dv + v]) : 0.0f;
    float mem = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      S[r] *= decay;
      mem += S[r] * ks[warp * R + r];
    }
    red_k[warp][lane] = mem;
    __syncthreads();
    mem = (red_k[0][lane] + red_k[1][lane] + red_k[2][lane] + red_k[3][lane]) * rk;
    const float delta = beta * (vv - mem) * rk;  // k_normed = ks * rk
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      S[r] += ks[warp * R + r] * delta;
      o += S[r] * qs[warp * R + r];
    }
    red_q[warp][lane] = o;
    __syncthreads();
    if (warp == 0 && vok)
      out[(static_cast<int64_t>(t) * a.Hv + h) * a.Dv + v] =
          __float2bfloat16_rn((red_q[0][lane] + red_q[1][lane] + red_q[2][lane] + red_q[3][lane]) * rq);
    if (per_token && vok && a.token_slots[t] >= 0) {
      SS* tp =
          static_cast<SS*>(a.state) + ((static_cast<int64_t>(a.token_slots[t]) * a.Hv + h) * DK + warp * R) * a.Dv + v;
#pragma unroll
      for (int r = 0; r < R; ++r) tp[static_cast<int64_t>(r) * a.Dv] = from_float<SS>(S[r]);
    }
  }
  if (vok && !per_token)
#pragma unroll
    for (int r = 0; r < R; ++r) sp[static_cast<int64_t>(r) * a.Dv] = from_float<SS>(S[r]);
}

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

template <int DK, typename SS>
void recurrent_t(const GatedDeltaRuleArgs& a, cudaStream_t s) {
  dim3 grid(ceil_div(a.Dv, 32), a.Hv, a.num_seqs);
  launch_pdl(gdr_recurrent_kernel<DK, SS>, grid, dim3(128), 0, s, a);
  TCUDA_LAUNCH_CHECK();
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

template <typename SS>
void recurrent_dispatch(const GatedDeltaRuleArgs& a, cudaStream_t s) {
  switch (a.Dk) {
    case 16:
      return recurrent_t<16, SS>(a, s);
    case 32:
      return recurrent_t<32, SS>(a, s);
    case 64:
      return recurrent_t<64, SS>(a, s);
    case 128:
      return recurrent_t<128, SS>(a, s);
    case 256:
      return recurrent_t<256, SS>(a, s);
    default:
      break;
  }
}

}  // namespace

bool gdr_recurrent_supported(int Dk) { return Dk == 16 || Dk == 32 || Dk == 64 || Dk == 128 || Dk == 256; }
bool gdr_chunked_supported(int Dk, int Dv) { return Dk == 128 && Dv == 128; }

namespace {
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

void launch_gated_delta_rule(const GatedDeltaRuleArgs& a, bool chunked, cudaStream_t s, size_t max_smem) {
  if (a.num_seqs == 0) return;
  const bool f32 = a.state_t == DType::kF32;
  if (!chunked) {
    f32 ? recurrent_dispatch<float>(a, s) : recurrent_dispatch<bf16>(a, s);
    return;
  }
  if (a.num_chunks == 0) return;
  f32 ? chunked_t<128, 128, float>(a, s, max_smem) : chunked_t<128, 128, bf16>(a, s, max_smem);
}

void launch_causal_conv1d(const void* x, int64_t X, int64_t x_col, const void* w, DType wt, void* state, DType st,
                          const int32_t* qsl, const int32_t* slots, const int32_t* has_init, const int32_t* token_slots,
                          void* out, int C, int S, int max_query_len, cudaStream_t s) {
  if (S == 0 || C == 0) return;
  const int segs = std::max(1, ceil_div(max_query_len, kConvSeg));
  const bool one_pass = segs == 1;
  dim3 grid(ceil_div(C, kConvThreads), segs, S);
  const auto* xb = static_cast<const bf16*>(x);
  auto* ob = static_cast<bf16*>(out);
  if (st == DType::kF32)
    launch_pdl(conv1d_kernel<4, float>, grid, dim3(kConvThreads), 0, s, xb, X, x_col, w, wt, static_cast<float*>(state),
               qsl, slots, has_init, token_slots, ob, C, one_pass);
  else
    launch_pdl(conv1d_kernel<4, bf16>, grid, dim3(kConvThreads), 0, s, xb, X, x_col, w, wt, static_cast<bf16*>(state),
               qsl, slots, has_init, token_slots, ob, C, one_pass);
  TCUDA_LAUNCH_CHECK();
  if (one_pass) return;
  dim3 g2(ceil_div(C, 256), S);
  if (st == DType::kF32)
    conv_state_update_kernel<4, float>
        <<<g2, 256, 0, s>>>(xb, X, x_col, static_cast<float*>(state), qsl, slots, has_init, token_slots, C);
  else
    conv_state_update_kernel<4, bf16>
        <<<g2, 256, 0, s>>>(xb, X, x_col, static_cast<bf16*>(state), qsl, slots, has_init, token_slots, C);
  TCUDA_LAUNCH_CHECK();
}

void launch_gated_rms_norm(const void* x, const void* z, int64_t Z, int64_t z_col, const void* w, DType wt, void* out,
                           int64_t T, int H, int D, float eps, cudaStream_t s) {
  const int64_t rows = T * H;
  if (rows == 0) return;
  launch_pdl(gated_rms_norm_kernel, dim3(ceil_div(rows, 4)), dim3(128), 0, s, static_cast<const bf16*>(x),
             static_cast<const bf16*>(z), Z, z_col, w, wt, static_cast<bf16*>(out), rows, H, D, eps);
  TCUDA_LAUNCH_CHECK();
}

}  // namespace tessera::cuda
