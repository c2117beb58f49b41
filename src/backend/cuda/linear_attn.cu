// Linear attention (Gated DeltaNet) kernels: causal conv1d with a conv state, the gated delta
// rule's recurrent kernel (decode, verification, short or unusual shapes; the chunked WY-form
// prefill on tensor cores is gdr_chunked.cu's), and the gated RMSNorm.
// Activations bf16, math f32, states f32 or bf16. See backend.h for the functions and
// docs/cuda.md for the kernel layout.
#include <algorithm>

#include "backend/cuda/device_utils.cuh"
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
// At least one block an SM: with the thread count alone, ptxas for sm_120 held the registers
// down and spilled 8 bytes at Dk 64 and 128.
template <int DK, typename SS>
__global__ void __launch_bounds__(128, 1) gdr_recurrent_kernel(GatedDeltaRuleArgs a) {
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

template <int DK, typename SS>
void recurrent_t(const GatedDeltaRuleArgs& a, cudaStream_t s) {
  dim3 grid(ceil_div(a.Dv, 32), a.Hv, a.num_seqs);
  launch_pdl(gdr_recurrent_kernel<DK, SS>, grid, dim3(128), 0, s, a);
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

void launch_gated_delta_rule(const GatedDeltaRuleArgs& a, bool chunked, cudaStream_t s, size_t max_smem) {
  if (a.num_seqs == 0) return;
  const bool f32 = a.state_t == DType::kF32;
  if (!chunked) {
    f32 ? recurrent_dispatch<float>(a, s) : recurrent_dispatch<bf16>(a, s);
    return;
  }
  if (a.num_chunks > 0) launch_gdr_chunked(a, s, max_smem);
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
