// The decode path of the mixture-of-experts layer: the grouped GEMVs (bf16, FP8 on CUDA cores and
// on tensor cores) and the one-token kernels; the grouped GEMM is moe_gemm.cu's, the top-k, the
// routing and the combine moe_route.cu's. Nothing here reads routing results on the host, so
// every launch is capturable in a CUDA graph (moe_ops.cpp).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/fp8_utils.cuh"
#include "backend/cuda/gemv_kernel.cuh"
#include "backend/cuda/moe_decode.cuh"

namespace tessera::cuda {

namespace {

// ---------------------------------------------------------------- decode: grouped GEMV
// kFp8: the weights are e4m3 with f32 scales per 128 x 128 block of each expert's matrix
// (scale [E_local, ceil(rows / 128), ceil(K / 128)]); a 16-byte load is 16 weights, widened
// to f32 once per load and multiplied with every pair's x; each load's partial dot gets its
// block's scale with one FMA (16 columns never straddle a 128-column block). Half the bytes
// of bf16, so half the unroll keeps the same weights in flight (bf16's unroll, measured on the
// H200, needs 160-169 registers and runs at 0.6x). At least one block an SM: with the thread
// count alone, ptxas for sm_120 held the FP8 down GEMV to 128 registers and spilled.
template <bool kGateUp, bool kFp8>
__global__ void __launch_bounds__(kGemvWarps * 32, 1)
    moe_gemv_kernel(const __nv_bfloat16* __restrict__ in, const void* __restrict__ w_raw,
                    const float* __restrict__ scale, const int32_t* __restrict__ ids, int P, int k, int expert_begin,
                    int E_local, int H, int I, __nv_bfloat16* __restrict__ out) {
  constexpr int kRows = kGateUp ? 2 : 4;
  constexpr int kUnroll = (kGateUp ? 8 : 4) / (kFp8 ? 2 : 1);
  constexpr int kPerChunk = kFp8 ? 16 : 8;  // weights per 16-byte load
  constexpr int kWeightBytes = kFp8 ? 1 : 2;
  __shared__ DecodeRouteSmem route;
  int e = 0, n = 0;
  if (!moe_decode_route(route, ids, P, expert_begin, E_local, &e, &n)) return;
  const int* list = route.list;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // This warp's rows and the length K of each row (and of each input vector).
  const int K = kGateUp ? H : I;
  const int N_out = kGateUp ? I : H;
  const int r0 = (blockIdx.x * kGemvWarps + warp) * (kGateUp ? 1 : kRows);
  if (r0 >= N_out) return;
  const int64_t expert_rows = kGateUp ? 2 * static_cast<int64_t>(I) : H;
  const int kb = (K + 127) / 128;                        // scale blocks per row
  const int64_t scale_rows = (expert_rows + 127) / 128;  // scale block rows per expert
  const auto* w = static_cast<const char*>(w_raw);
  const uint4* wr[kRows];
  const float* sr[kRows];
  bool row_ok[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = kGateUp ? (r == 0 ? r0 : I + r0) : r0 + r;
    row_ok[r] = kGateUp || r0 + r < N_out;
    const int64_t rr = row_ok[r] ? row : r0;
    wr[r] = reinterpret_cast<const uint4*>(w + (e * expert_rows + rr) * K * kWeightBytes);
    sr[r] = kFp8 ? scale + (e * scale_rows + rr / 128) * kb : nullptr;
  }
  const int chunks = K / kPerChunk;
  for (int pass = 0; pass < n; pass += kGemvM) {
    const uint4* xr[kGemvM];
    bool use[kGemvM];
#pragma unroll
    for (int m = 0; m < kGemvM; ++m) {
      use[m] = pass + m < n;
      const int pq = use[m] ? list[pass + m] : list[pass];
      xr[m] = reinterpret_cast<const uint4*>(in + static_cast<int64_t>(kGateUp ? pq / k : pq) * K);
    }
    float acc[kRows][kGemvM];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int m = 0; m < kGemvM; ++m) acc[r][m] = 0.0f;
    for (int base = lane; base < chunks; base += 32 * kUnroll) {
      uint4 wv[kRows][kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          if (base + 32 * u < chunks) wv[r][u] = load_stream(wr[r] + base + 32 * u);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = base + 32 * u;
        if (c >= chunks) continue;
        if constexpr (kFp8) {
          uint4 x0[kGemvM], x1[kGemvM];
#pragma unroll
          for (int m = 0; m < kGemvM; ++m)
            if (use[m]) {
              x0[m] = __ldg(xr[m] + 2 * c);
              x1[m] = __ldg(xr[m] + 2 * c + 1);
            }
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const float sc = __ldg(sr[r] + c / 8);  // columns 16c .. 16c + 15: block 16c / 128
            float f[16];
            fp8x16_to_float(wv[r][u], f);
#pragma unroll
            for (int m = 0; m < kGemvM; ++m)
              if (use[m]) acc[r][m] = fmaf(sc, dot16f(f, x0[m], x1[m]), acc[r][m]);
          }
        } else {
#pragma unroll
          for (int m = 0; m < kGemvM; ++m)
            if (use[m]) {
              const uint4 xv = __ldg(xr[m] + c);
#pragma unroll
              for (int r = 0; r < kRows; ++r) acc[r][m] += dot8(wv[r][u], xv);
            }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kGemvM; ++m) {
      if (!use[m]) continue;  // uniform over the warp
      const int pq = list[pass + m];
      float s[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) s[r] = warp_sum(acc[r][m]);
      if (lane != 0) continue;
      if (kGateUp) {
        out[static_cast<int64_t>(pq) * I + r0] = __float2bfloat16_rn(s[0] / (1.0f + __expf(-s[0])) * s[1]);
      } else {
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          if (row_ok[r]) out[static_cast<int64_t>(pq) * H + r0 + r] = __float2bfloat16_rn(s[r]);
      }
    }
  }
  pdl_launch_dependents();
}

// ---------------------------------------------------------------- decode: one token
// bf16 experts at T = 1 (CudaMoeOneToken): k pairs, each to its own expert (top-k picks distinct
// experts), so block y of the gate_up GEMV serves the y-th local pair, found by one warp ballot
// over the k ids (the grouped kernels' routing preamble, shared-memory ranks and three barriers,
// is for experts shared by several pairs). The down GEMV takes all k pairs of a row group in one
// block, warp w the pairs w, w + 8, ..., and writes out[h] = sum_j weight_j * y_j itself in slot
// order j, y_j rounded to bf16 first, as the combine kernel does; every sum runs in the grouped
// kernels' order (a lane's chunks ascending, then warp_sum), so the result is theirs bit for bit.
// gate_up at one token: grid (ceil(I / 8), local pairs <= k); warp w of block (r, y) computes
// act[pair, i] = silu(gate_i . x) * (up_i . x) for i = r * 8 + w, kUnroll loads of each row in
// flight per lane. kEarlyTrigger: the next kernel (the down GEMV) may launch once this block's
// last loads are issued. shared_w (a shared expert's gate_up [2I, H] with the routed experts' I, or
// null): the grid's last row of blocks computes it as pair P (act row P).
template <int kUnroll, int kMinBlocks, bool kEarlyTrigger>
__global__ void __launch_bounds__(kGemvWarps * 32, kMinBlocks)
    moe_gate_up_one_token_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                 const int32_t* __restrict__ ids, int P, int expert_begin, int E_local, int H, int I,
                                 __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ shared_w) {
  pdl_wait();  // ids (the top-k kernel's) and x
  int e = 0, pair = P;
  const __nv_bfloat16* wb = shared_w;
  if (shared_w == nullptr || blockIdx.y + 1 < gridDim.y) {
    if (!one_token_pair(ids, P, expert_begin, E_local, static_cast<int>(blockIdx.y), &e, &pair)) return;
    wb = w + static_cast<int64_t>(e) * 2 * I * H;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i = static_cast<int>(blockIdx.x) * kGemvWarps + warp;
  if (i >= I) return;
  const uint4* wg = reinterpret_cast<const uint4*>(wb + static_cast<int64_t>(i) * H);
  const uint4* wu = reinterpret_cast<const uint4*>(wb + static_cast<int64_t>(i + I) * H);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  const int chunks = H / 8;
  float sg = 0.0f, su = 0.0f;
  for (int base = lane; base < chunks; base += 32 * kUnroll) {
    uint4 g[kUnroll], u[kUnroll];
#pragma unroll
    for (int v = 0; v < kUnroll; ++v)
      if (base + 32 * v < chunks) {
        g[v] = load_stream(wg + base + 32 * v);
        u[v] = load_stream(wu + base + 32 * v);
      }
    if (kEarlyTrigger && base + 32 * kUnroll >= chunks) pdl_launch_dependents();
#pragma unroll
    for (int v = 0; v < kUnroll; ++v) {
      const int c = base + 32 * v;
      if (c >= chunks) continue;
      const uint4 xv = __ldg(xr + c);
      sg += dot8(g[v], xv);
      su += dot8(u[v], xv);
    }
  }
  sg = warp_sum(sg);
  su = warp_sum(su);
  if (lane == 0) act[static_cast<int64_t>(pair) * I + i] = __float2bfloat16_rn(sg / (1.0f + __expf(-sg)) * su);
  if (!kEarlyTrigger) pdl_launch_dependents();
}

// down + combine at one token: grid ceil(H / kRows); block r computes out[h] for its kRows rows
// h of every local pair's expert, warp w the pairs w, w + 8, ... (k <= kOneTokenMaxPairs), then
// the weighted sum over the pairs in slot order. kPrefetch: each warp's first pair's weight loads
// are issued before pdl_wait. They depend on ids only, written by the top-k kernel before gate_up;
// gate_up's blocks wait for that kernel before they let this one launch, so it has finished, and
// ids is read through L2. shared (its down [H, I] not null): the shared expert is pair P (act row
// P), added as g * y_P with g = sigmoid(bf16(gate . x)) (1 without a gate), as the fused decode
// kernel's combine does.
template <int kRows, int kMinBlocks, bool kPrefetch>
__global__ void __launch_bounds__(kGemvWarps * 32, kMinBlocks)
    moe_down_one_token_kernel(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                              const int32_t* __restrict__ ids, const float* __restrict__ weights, int P,
                              int expert_begin, int E_local, int H, int I, __nv_bfloat16* __restrict__ out,
                              OneTokenShared shared) {
  constexpr int kUnroll = 4;  // chunks of a row per lane in flight: I up to 1,024 in one pass
  __shared__ float ys[kOneTokenMaxPairs + 1][kRows];
  __shared__ float shared_scale;
  const bool sh = shared.down != nullptr;
  const int pairs = P + (sh ? 1 : 0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h0 = static_cast<int>(blockIdx.x) * kRows;
  const int chunks = I / 8;
  uint4 wv[kRows][kUnroll];
  bool have = false;                     // wv holds the warp's first pair's loads (kPrefetch)
  if constexpr (!kPrefetch) pdl_wait();  // act (gate_up's), weights and (read first) ids
  // Every warp: the local pairs, and pair j's expert from lane j.
  int id;
  const unsigned local = one_token_local_pairs(ids, P, expert_begin, E_local, &id);
  // Pair j's down matrix (a warp-wide call: the expert id comes from lane j).
  auto matrix_of = [&](int j) {
    const int ej = __shfl_sync(0xffffffffu, id, j & 31) - expert_begin;
    return j == P ? shared.down : w + static_cast<int64_t>(ej) * H * I;
  };
  auto issue = [&](const __nv_bfloat16* wm, int base) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int h = min(h0 + r, H - 1);
      const uint4* wr = reinterpret_cast<const uint4*>(wm + static_cast<int64_t>(h) * I);
#pragma unroll
      for (int v = 0; v < kUnroll; ++v)
        if (base + 32 * v < chunks) wv[r][v] = load_stream(wr + base + 32 * v);
    }
  };
  if (kPrefetch && (local >> warp & 1u)) {
    issue(matrix_of(warp), lane);
    have = true;
  }
  if constexpr (kPrefetch) pdl_wait();  // act (gate_up's) and weights
  // Waited either way: the next kernel (the residual add + norm) may launch and wait resident.
  pdl_launch_dependents();
  if (sh && warp == kGemvWarps - 1) {  // the shared expert's gate, from x (the MoE input)
    float g = 1.0f;
    if (shared.gate != nullptr) {
      const uint4* gr = reinterpret_cast<const uint4*>(shared.gate);
      const uint4* xr = reinterpret_cast<const uint4*>(shared.x);
      float d = 0.0f;
      for (int c = lane; c < H / 8; c += 32) d += dot8(__ldg(gr + c), __ldg(xr + c));
      d = __bfloat162float(__float2bfloat16_rn(warp_sum(d)));  // the gate linear's bf16 output
      g = 1.0f / (1.0f + __expf(-d));
    }
    if (lane == 0) shared_scale = g;
  }
  for (int j = warp; j < pairs; j += kGemvWarps) {
    if (j < P && !(local >> j & 1u)) continue;  // the same for the whole warp
    const __nv_bfloat16* wm = matrix_of(j);
    const uint4* xr = reinterpret_cast<const uint4*>(act + static_cast<int64_t>(j) * I);
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    for (int base = lane; base < chunks; base += 32 * kUnroll) {
      if (!(have && base == lane)) issue(wm, base);
#pragma unroll
      for (int v = 0; v < kUnroll; ++v) {
        const int c = base + 32 * v;
        if (c >= chunks) continue;
        const uint4 xv = __ldg(xr + c);
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] += dot8(wv[r][v], xv);
      }
    }
    have = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float s = warp_sum(acc[r]);
      if (lane == 0) ys[j][r] = __bfloat162float(__float2bfloat16_rn(s));
    }
  }
  __syncthreads();
  if (threadIdx.x < kRows && h0 + static_cast<int>(threadIdx.x) < H) {
    float acc = 0.0f;
    for (int j = 0; j < P; ++j)
      if (local >> j & 1u) acc += __ldg(weights + j) * ys[j][threadIdx.x];
    if (sh) acc += shared_scale * ys[P][threadIdx.x];
    out[h0 + threadIdx.x] = __float2bfloat16_rn(acc);
  }
}

template <int kGuUnroll, int kGuBlocks, int kDnRows, int kDnBlocks, bool kOverlap>
void launch_moe_one_token(const MoeArgs& a, __nv_bfloat16* act, const MoeFusedShared* shared, cudaStream_t s) {
  const int P = a.k;
  const OneTokenShared sh{shared ? static_cast<const __nv_bfloat16*>(shared->down) : nullptr,
                          shared ? static_cast<const __nv_bfloat16*>(shared->gate) : nullptr,
                          static_cast<const __nv_bfloat16*>(a.x)};
  launch_pdl(moe_gate_up_one_token_kernel<kGuUnroll, kGuBlocks, kOverlap>,
             dim3(ceil_div(a.I, kGemvWarps), std::min(P, a.E_local) + (shared ? 1 : 0)), kGemvWarps * 32, 0, s,
             static_cast<const __nv_bfloat16*>(a.x), static_cast<const __nv_bfloat16*>(a.gate_up), a.ids, P,
             a.expert_begin, a.E_local, a.H, a.I, act,
             shared ? static_cast<const __nv_bfloat16*>(shared->gate_up) : nullptr);
  TCUDA_LAUNCH_CHECK();
  launch_pdl(moe_down_one_token_kernel<kDnRows, kDnBlocks, kOverlap>, dim3(ceil_div(a.H, kDnRows)), kGemvWarps * 32, 0,
             s, static_cast<const __nv_bfloat16*>(act), static_cast<const __nv_bfloat16*>(a.down), a.ids, a.weights, P,
             a.expert_begin, a.E_local, a.H, a.I, static_cast<__nv_bfloat16*>(a.out), sh);
  TCUDA_LAUNCH_CHECK();
}

template <bool kFp8>
void launch_moe_decode_gemvs(const MoeArgs& a, __nv_bfloat16* act, __nv_bfloat16* y, cudaStream_t s) {
  const int P = a.T * a.k;
  const auto* x = static_cast<const __nv_bfloat16*>(a.x);
  const int slots = std::min(P, a.E_local);  // at most this many distinct local experts
  launch_pdl(moe_gemv_kernel<true, kFp8>, dim3(ceil_div(a.I, kGemvWarps), slots), kGemvWarps * 32, 0, s, x, a.gate_up,
             a.gate_up_scale, a.ids, P, a.k, a.expert_begin, a.E_local, a.H, a.I, act);
  TCUDA_LAUNCH_CHECK();
  launch_pdl(moe_gemv_kernel<false, kFp8>, dim3(ceil_div(a.H, kGemvWarps * 4), slots), kGemvWarps * 32, 0, s,
             static_cast<const __nv_bfloat16*>(act), a.down, a.down_scale, a.ids, P, a.k, a.expert_begin, a.E_local,
             a.H, a.I, y);
  TCUDA_LAUNCH_CHECK();
}

}  // namespace

bool launch_moe_decode(const MoeArgs& a, void* act, void* y, cudaStream_t s, CudaMoeFp8Decode fp8_kernel,
                       CudaMoeOneToken one_token, CudaMoeFp8OneToken fp8_one_token, const MoeFusedShared* shared) {
  auto* actb = static_cast<__nv_bfloat16*>(act);
  auto* yb = static_cast<__nv_bfloat16*>(y);
  if (!a.gate_up_scale && a.T == 1 && a.k <= kOneTokenMaxPairs) {
    // Template arguments: gate_up loads per row in flight and blocks per SM, down rows per warp
    // and blocks per SM, overlap.
    switch (one_token) {
      case CudaMoeOneToken::kGrouped:
        break;
      case CudaMoeOneToken::kDeep:
        launch_moe_one_token<8, 2, 4, 2, false>(a, actb, shared, s);
        return shared != nullptr;
      case CudaMoeOneToken::kDeepOverlap:
        launch_moe_one_token<8, 2, 4, 2, true>(a, actb, shared, s);
        return shared != nullptr;
      case CudaMoeOneToken::kNarrow:
        launch_moe_one_token<4, 4, 2, 4, false>(a, actb, shared, s);
        return shared != nullptr;
      case CudaMoeOneToken::kNarrowOverlap:
        launch_moe_one_token<4, 4, 2, 4, true>(a, actb, shared, s);
        return shared != nullptr;
      case CudaMoeOneToken::kMixedOverlap:
        launch_moe_one_token<4, 4, 4, 2, true>(a, actb, shared, s);
        return shared != nullptr;
      case CudaMoeOneToken::kWideOverlap:
        launch_moe_one_token<2, 6, 4, 2, true>(a, actb, shared, s);
        return shared != nullptr;
    }
  }
  bool folded = false;  // the shared expert (FP8) as pair k of the one-token kernels, added by the combine
  if (!a.gate_up_scale)
    launch_moe_decode_gemvs<false>(a, actb, yb, s);
  else if (fp8_kernel == CudaMoeFp8Decode::kMma)
    folded = launch_moe_decode_fp8(a, actb, yb, s, fp8_one_token, shared && shared->gate_up_scale ? shared : nullptr);
  else
    launch_moe_decode_gemvs<true>(a, actb, yb, s);
  launch_moe_combine(a, yb, nullptr, s, folded ? shared : nullptr);
  return folded;
}

}  // namespace tessera::cuda
