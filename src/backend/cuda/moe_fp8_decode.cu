// The FP8 experts' decode path on tensor cores (CudaMoeFp8Decode::kMma): grouped GEMVs whose
// weight tiles are widened to bf16 once and multiplied with 8 pairs' x by m16n8k16 MMAs, and their
// one-token forms (CudaMoeFp8OneToken). Launched by launch_moe_decode (moe.cu).
#include <algorithm>

#include "backend/cuda/moe_decode.cuh"

namespace tessera::cuda {

namespace {

// ---------------------------------------------------------------- decode: FP8 grouped GEMV on tensor cores
// FP8 experts at decode (CudaMoeFp8Decode::kMma). The routing preamble and grid (row tiles,
// expert ranks) of moe_gemv_kernel with the maths of fp8_gemv_mma_kernel (fp8_gemm.cu): a warp
// takes a 16-row tile of the expert's matrix over a slice of K in 64-column groups; per group a
// lane (g = lane / 4, t = lane % 4) loads 16 e4m3 weights of the tile's rows g and g + 8 (one
// 16-byte load each), widens them once to bf16 (exact) into the A operand of 4 bf16 m16n8k16
// MMAs per 8 pairs, x of pair 8 j + g at the same 16 columns being B (a permutation of the
// group's k order, the same for A and B), and adds the group's sums times their 128 x 128 block
// scales (row g's and row g + 8's: one FMA an accumulator). moe_gemv_kernel's FP8 path spends a
// widening to f32 and an FMA per weight and pair, plus the unpacking of x per pair.
//   gate_up: a tile is 8 intermediate indices i0 .. i0 + 7, rows g the gate rows i0 + g and rows
//     g + 8 the up rows I + i0 + g, so a lane holds gate and up of the same (pair, i) and writes
//     silu(gate) * up.
//   down: a tile is 16 rows h0 .. h0 + 15 of H.
// A block holds kTiles tiles (gate_up 2, down 4), the 8 / kTiles warps of a tile splitting K.
// The slices of a tile add their sums in warp order through shared memory (deterministic).
// Pairs go in passes of 8 * kFp8MmaNT; an expert with more pairs streams its rows once a pass.
constexpr int kFp8MmaNT = 2;      // 8-pair MMA columns a pass
constexpr int kFp8MmaUnroll = 4;  // 64-column groups whose weight loads a warp issues before their maths

// kOneToken (T = 1, CudaMoeFp8OneToken): block y serves the y-th local pair, found by a warp
// ballot (one_token_pair) instead of the routing preamble; with one pair only MMA column 0 is
// used (kNT = 1), so fewer registers hold accumulators and x, and a lane can keep more weight
// loads in flight (kUnroll). The sums are the same in every instantiation: a slice's groups
// in ascending order whatever kUnroll, pair 0 in column 0 whatever kNT.
// kWarps: warps a block (kTiles of them per tile's K split); the sums depend on kWarps / kTiles only.
template <bool kGateUp, int kTiles, int kNT = kFp8MmaNT, int kUnroll = kFp8MmaUnroll, bool kOneToken = false,
          int kMinBlocks = 1, int kWarps = kGemvWarps>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    moe_gemv_fp8_mma_kernel(const __nv_bfloat16* __restrict__ in, const uint8_t* __restrict__ w,
                            const float* __restrict__ scale, const int32_t* __restrict__ ids, int P, int k,
                            int expert_begin, int E_local, int H, int I, __nv_bfloat16* __restrict__ out,
                            const uint8_t* __restrict__ shared_w = nullptr,
                            const float* __restrict__ shared_scale = nullptr) {
  constexpr int kSlices = kWarps / kTiles;  // warps splitting K over one tile
  __shared__ DecodeRouteSmem route;
  __shared__ float4 part[kWarps][kNT][32];
  int e = 0, n = 0, one_pair = 0;
  // kOneToken with shared_w: the grid's last row of blocks computes the shared expert (its matrix and
  // scales as one expert's) as pair P, on token 0's x.
  bool on_shared = false;
  if constexpr (kOneToken) {
    pdl_wait();  // ids and the kernel's input come from the kernels before
    // The down GEMV lets the combine kernel launch now: its two blocks then wait resident (and
    // compute the shared expert's gate) instead of launching when the last down block ends. This
    // kernel has waited, so the combine may read what came before it (device_utils.cuh).
    if constexpr (!kGateUp) pdl_launch_dependents();
    on_shared = shared_w != nullptr && blockIdx.y + 1 == gridDim.y;
    if (on_shared)
      one_pair = P;
    else if (!one_token_pair(ids, P, expert_begin, E_local, static_cast<int>(blockIdx.y), &e, &one_pair))
      return;
    n = 1;
  } else {
    if (!moe_decode_route(route, ids, P, expert_begin, E_local, &e, &n)) return;
  }
  auto list_at = [&](int p) { return kOneToken ? one_pair : route.list[p]; };
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x * kTiles + warp / kSlices, slice = warp % kSlices;
  const int K = kGateUp ? H : I;
  const int64_t expert_rows = kGateUp ? 2 * static_cast<int64_t>(I) : H;
  // This lane's weight rows: ra (fragment row g) and rb (g + 8), and whether they exist.
  int64_t ra, rb;
  bool va, vb;
  if (kGateUp) {
    const int i = tile * 8 + g;
    va = vb = i < I;
    ra = i;
    rb = static_cast<int64_t>(I) + i;
  } else {
    ra = static_cast<int64_t>(tile) * 16 + g;
    rb = ra + 8;
    va = ra < H;
    vb = rb < H;
  }
  const int kb = (K + 127) / 128;
  const int64_t scale_rows = (expert_rows + 127) / 128;
  const uint8_t* we = on_shared ? shared_w : w + static_cast<int64_t>(e) * expert_rows * K;
  const float* se = on_shared ? shared_scale : scale + static_cast<int64_t>(e) * scale_rows * kb;
  const uint8_t* wa = we + (va ? ra : 0) * K;
  const uint8_t* wb = we + (vb ? rb : 0) * K;
  const float* sa = se + ((va ? ra : 0) / 128) * kb;
  const float* sb = se + ((vb ? rb : 0) / 128) * kb;
  const int groups = (K + 63) / 64;
  for (int pass = 0; pass < n; pass += 8 * kNT) {
    const __nv_bfloat16* xr[kNT];  // x rows of pairs pass + 8 j + g (null past the expert's pairs)
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      const int p = pass + 8 * j + g;
      xr[j] = p < n ? in + static_cast<int64_t>(kGateUp ? (on_shared ? 0 : list_at(p) / k) : list_at(p)) * K : nullptr;
    }
    float acc[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
    for (int gi = slice; gi < groups; gi += kSlices * kUnroll) {
      uint4 wva[kUnroll], wvb[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int gu = gi + u * kSlices, k0 = gu * 64 + 16 * t;
        const bool kv = gu < groups && k0 < K;
        wva[u] = kv && va ? load_stream(reinterpret_cast<const uint4*>(wa + k0)) : make_uint4(0, 0, 0, 0);
        wvb[u] = kv && vb ? load_stream(reinterpret_cast<const uint4*>(wb + k0)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int gu = gi + u * kSlices, k0 = gu * 64 + 16 * t;
        if (gu >= groups) break;                                         // the same for the whole warp
        const float s_a = __ldg(sa + gu / 2), s_b = __ldg(sb + gu / 2);  // group gu lies in 128-column block gu / 2
        uint32_t a[4][4];
        widen_group(wva[u], wvb[u], a);
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          if (pass + 8 * j >= n) break;  // no pair in this MMA column: the same for the whole warp
          uint4 x0 = make_uint4(0, 0, 0, 0), x1 = x0;
          if (xr[j] && k0 < K) {
            const uint4* xm = reinterpret_cast<const uint4*>(xr[j] + k0);
            x0 = __ldg(xm);
            x1 = __ldg(xm + 1);
          }
          mma_group(a, x0, x1, s_a, s_b, acc[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kNT; ++j) part[warp][j][lane] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
    __syncthreads();
    if (slice == 0) {
      // Accumulator i of lane (g, t): weight row g + 8 (i / 2), pair 8 j + 2 t + i % 2.
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        float4 v = part[warp][j][lane];
#pragma unroll
        for (int q = 1; q < kSlices; ++q) {
          const float4 o = part[warp + q][j][lane];
          v.x += o.x;
          v.y += o.y;
          v.z += o.z;
          v.w += o.w;
        }
        const int p0 = pass + 8 * j + 2 * t;
        const float r[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          if (p0 + c >= n) continue;
          const int64_t pq = list_at(p0 + c);
          if (kGateUp) {
            if (va) out[pq * I + ra] = __float2bfloat16_rn(r[c] / (1.0f + __expf(-r[c])) * r[2 + c]);
          } else {
            if (va) out[pq * H + ra] = __float2bfloat16_rn(r[c]);
            if (vb) out[pq * H + rb] = __float2bfloat16_rn(r[2 + c]);
          }
        }
      }
    }
    __syncthreads();  // part is rewritten by the next pass
  }
  pdl_launch_dependents();
}

// Tiles a block: gate_up 2 (16 intermediate indices, 4 warps splitting K over each), down 4 (64
// rows, 2 warps each). Blocks of half those rows (twice the warps on K) took 1.16-1.22x the time
// at 8-32 tokens on the H200: each block pays the routing preamble for fewer bytes.
// kNT, kUnroll, kOneToken, kMinBlocks: moe_gemv_fp8_mma_kernel's (the grouped form by default).
// kWarps: a block's warps; the K split of a tile stays (gate_up 4 warps, down 2), so the sums
// are the same for every kWarps, and fewer warps make more, smaller blocks.
template <int kNT = kFp8MmaNT, int kUnroll = kFp8MmaUnroll, bool kOneToken = false, int kMinBlocks = 1,
          int kWarps = kGemvWarps>
void launch_moe_decode_fp8_mma(const MoeArgs& a, __nv_bfloat16* act, __nv_bfloat16* y, cudaStream_t s,
                               const MoeFusedShared* shared = nullptr) {
  const int P = a.T * a.k;
  const int slots = std::min(P, a.E_local) + (shared ? 1 : 0);  // (shared: kOneToken only)
  static_assert(kWarps % 4 == 0 && kWarps <= kGemvWarps, "a block holds whole tiles of both kernels");
  constexpr int kGuTiles = kWarps / 4, kDnTiles = kWarps / 2;
  launch_pdl(moe_gemv_fp8_mma_kernel<true, kGuTiles, kNT, kUnroll, kOneToken, kMinBlocks, kWarps>,
             dim3(ceil_div(a.I, 8 * kGuTiles), slots), kWarps * 32, 0, s, static_cast<const __nv_bfloat16*>(a.x),
             static_cast<const uint8_t*>(a.gate_up), a.gate_up_scale, a.ids, P, a.k, a.expert_begin, a.E_local, a.H,
             a.I, act, shared ? static_cast<const uint8_t*>(shared->gate_up) : nullptr,
             shared ? shared->gate_up_scale : nullptr);
  TCUDA_LAUNCH_CHECK();
  launch_pdl(moe_gemv_fp8_mma_kernel<false, kDnTiles, kNT, kUnroll, kOneToken, kMinBlocks, kWarps>,
             dim3(ceil_div(a.H, 16 * kDnTiles), slots), kWarps * 32, 0, s, static_cast<const __nv_bfloat16*>(act),
             static_cast<const uint8_t*>(a.down), a.down_scale, a.ids, P, a.k, a.expert_begin, a.E_local, a.H, a.I, y,
             shared ? static_cast<const uint8_t*>(shared->down) : nullptr, shared ? shared->down_scale : nullptr);
  TCUDA_LAUNCH_CHECK();
}

}  // namespace

bool launch_moe_decode_fp8(const MoeArgs& a, __nv_bfloat16* act, __nv_bfloat16* y, cudaStream_t s,
                           CudaMoeFp8OneToken one_token, const MoeFusedShared* shared) {
  if (a.T == 1 && a.k <= kOneTokenMaxPairs) {
    switch (one_token) {
      case CudaMoeFp8OneToken::kGrouped:
        break;
      case CudaMoeFp8OneToken::kShallow:
        launch_moe_decode_fp8_mma<1, 4, true, 3>(a, act, y, s, shared);
        return shared != nullptr;
      case CudaMoeFp8OneToken::kDeep:
        launch_moe_decode_fp8_mma<1, 8, true, 2>(a, act, y, s, shared);
        return shared != nullptr;
      case CudaMoeFp8OneToken::kFine:
        launch_moe_decode_fp8_mma<1, 4, true, 6, 4>(a, act, y, s, shared);
        return shared != nullptr;
      case CudaMoeFp8OneToken::kFineWide:
        launch_moe_decode_fp8_mma<1, 2, true, 8, 4>(a, act, y, s, shared);
        return shared != nullptr;
      case CudaMoeFp8OneToken::kFine10:
        launch_moe_decode_fp8_mma<1, 2, true, 10, 4>(a, act, y, s, shared);
        return shared != nullptr;
    }
  }
  launch_moe_decode_fp8_mma(a, act, y, s);
  return false;
}

}  // namespace tessera::cuda
