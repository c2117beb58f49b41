// The prefill path of the routed experts: a grouped GEMM over the experts on tensor cores
// (mma.sync m16n8k16 bf16, ldmatrix, a 4-stage cp.async pipeline), over the token rows that
// moe.cu's routing kernel permuted by expert on the device.
//
// Why not cuBLAS grouped GEMM: its per-group sizes (tokens per expert) are host arguments, so
// the host would have to read the routing back (a synchronisation per MoE layer, and no CUDA
// graph for the step). Here the grid is sized for the worst case (ceil(T*k / 128) + E_local
// row tiles x the column tiles) and each block finds its (expert, row tile) from the device-side
// tile offsets, exiting at once when it is beyond the last tile.
//
// Block tile 128 x 256 x 64 (BN; 128 also works, two blocks an SM), 8 warps as 2 (rows) x 4
// (columns) of 64 x 64; shared memory rows of 64 bf16 (128 bytes) with the 16-byte chunks
// XOR-swizzled by row, so cp.async stores and ldmatrix reads are free of bank conflicts.
//   gate_up (kGateUp): A = x rows gathered by token (sorted_pair[row] / k), B = gate_up[e]. A
//     block owns BN / 2 intermediate columns: its B tile interleaves 8 gate rows and the same 8
//     up rows, so each thread holds gate and up of the same outputs and writes silu(gate) * up.
//   down: A = act (rows already in expert order), B = down[e]; y[row, :] bf16.
// FP8 experts (kFp8): the pipeline stages hold B as e4m3 (BN rows of 64 bytes, half the bytes of
// bf16); each k step, every thread widens the 16-byte chunks it copied itself to bf16 times
// their 128 x 128 block's scale (rounded to bf16, the dequantised weight) into one bf16 B tile
// in the layout above, and the same ldmatrix / mma.sync loop runs on it. A 64-deep k step lies
// in one 128-column scale block, so a chunk needs one scale. 160 KiB of shared memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/fp8_utils.cuh"
#include "backend/cuda/mma_utils.cuh"

namespace tessera::cuda {

namespace {

constexpr int BM = kMoeTileM, BN = 256, BK = 64, kStages = 4, kThreads = 256;
constexpr int kWarpN = BN / 4;              // 8 warps as 2 (rows) x 4 (columns), 64 rows each
constexpr int kNFrags = kWarpN / 8;         // n8 fragments of a warp
constexpr int kBLoads = BN * 8 / kThreads;  // 16-byte chunks of B a thread copies per stage
constexpr int kStageElems = (BM + BN) * BK;
constexpr size_t kSmemBytes = size_t{kStages} * kStageElems * sizeof(__nv_bfloat16);
static_assert(BM == 128 && BK == 64 && (BN == 128 || BN == 256), "loaders assume 128-row, 64-deep tiles");
// FP8: a stage is A (bf16) then B (e4m3, unswizzled rows of BK bytes); the dequantised bf16 B
// tile follows the stages.
constexpr int kStageBytes8 = BM * BK * 2 + BN * BK;
constexpr int kB8Loads = BN * (BK / 16) / kThreads;  // 16-byte e4m3 chunks of B a thread copies per stage
constexpr size_t kSmemBytes8 = size_t{kStages} * kStageBytes8 + size_t{BN} * BK * sizeof(__nv_bfloat16);
static_assert(kStageBytes8 % 128 == 0 && kB8Loads * kThreads == BN * (BK / 16), "FP8 stage layout");

struct GemmArgs {
  const __nv_bfloat16* a;  // gate_up: x [T, K]; down: act [rows, K]
  const __nv_bfloat16* w;  // [E_local, w_rows, K] (kFp8: e4m3 bytes)
  const float* scale;      // kFp8: [E_local, ceil(w_rows / 128), ceil(K / 128)]
  __nv_bfloat16* out;      // gate_up: act [rows, N]; down: y [rows, N]
  const int32_t* sorted_pair;
  const int32_t* expert_offsets;
  const int32_t* tile_offsets;
  int E_local, K, N, k;  // N: output columns (I for gate_up, H for down)
};

// Element offset of (row, 16-byte chunk) in a [rows][BK] tile with swizzled chunks.
__device__ __forceinline__ int swz(int row, int chunk) { return row * BK + ((chunk ^ (row & 7)) << 3); }

template <bool kGateUp, bool kFp8>
__global__ void __launch_bounds__(kThreads, BN == 128 ? 2 : 1) moe_grouped_gemm_kernel(const GemmArgs g) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  // Stage base (A tile) in bf16 elements, and the B tile the MMAs read.
  auto stage_a = [&](int stage) {
    return kFp8 ? reinterpret_cast<__nv_bfloat16*>(smem_raw + stage * kStageBytes8) : smem + stage * kStageElems;
  };
  __nv_bfloat16* const b_dq = reinterpret_cast<__nv_bfloat16*>(smem_raw + kStages * kStageBytes8);  // kFp8 only

  const int slot = blockIdx.x;
  if (slot >= g.tile_offsets[g.E_local]) return;
  // The expert whose tiles hold this slot: the last e with tile_offsets[e] <= slot.
  int lo = 0, hi = g.E_local;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (g.tile_offsets[mid] <= slot)
      lo = mid;
    else
      hi = mid;
  }
  const int e = lo;
  const int row0 = g.expert_offsets[e] + (slot - g.tile_offsets[e]) * BM;
  const int row_end = g.expert_offsets[e + 1];
  const int K = g.K, N = g.N;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 2, warp_n = warp & 3;
  // 16-row fragments of this warp's 64 rows that hold rows of the expert: an expert's last tile
  // is mostly empty, and its empty fragments skip their ldmatrix and mma.
  const int m_frags = max(0, min(4, (row_end - (row0 + warp_m * 64) + 15) / 16));

  // A thread copies tile rows tid / 8 + 32 i (4 of A, kBLoads of B), chunk tid % 8, each stage.
  const int ld_chunk = tid & 7;
  const __nv_bfloat16* a_src[4];
  bool a_ok[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = row0 + (tid >> 3) + 32 * i;
    a_ok[i] = row < row_end;
    int64_t a_row = 0;
    if (a_ok[i]) a_row = kGateUp ? g.sorted_pair[row] / g.k : row;
    a_src[i] = g.a + a_row * K;
  }
  // B row r = tid / 8 + 32 i of the tile. down: weight row n0 + r. gate_up: the tile's 8-row
  // fragments alternate gate and up rows of the same 8 columns (fragment f = r / 8 holds
  // columns n0 + (f / 2) * 8 .., gate when f is even), so a thread's rows are column
  // b_col0 + 16 i of the gate (or the up) half.
  const int64_t w_rows = kGateUp ? 2 * static_cast<int64_t>(N) : N;
  const __nv_bfloat16* w = kFp8 ? g.w : g.w + static_cast<int64_t>(e) * w_rows * K;  // bf16 path only
  int b_col0, b_step;
  const __nv_bfloat16* b_base;
  if (kGateUp) {
    const int f0 = tid >> 6;  // fragment of row tid / 8
    b_col0 = blockIdx.y * (BN / 2) + (f0 >> 1) * 8 + ((tid >> 3) & 7);
    b_step = 16;
    b_base = w + ((f0 & 1) ? static_cast<int64_t>(N) : 0) * K;
  } else {
    b_col0 = blockIdx.y * BN + (tid >> 3);
    b_step = 32;
    b_base = w;
  }

  // FP8: a thread copies (and later dequantises) B tile rows tid / 4 + 64 i, 16-byte chunk
  // tid % 4 (16 columns); the tile row's weight row follows the same gate / up interleave.
  const int b8_chunk = tid & 3;
  const uint8_t* b8_src[kB8Loads];
  const float* b8_scale[kB8Loads];
  bool b8_ok[kB8Loads];
  const int kb = (K + 127) / 128;
  if constexpr (kFp8) {
    const auto* w8 = reinterpret_cast<const uint8_t*>(g.w) + static_cast<int64_t>(e) * w_rows * K;
    const float* sc = g.scale + static_cast<int64_t>(e) * ((w_rows + 127) / 128) * kb;
#pragma unroll
    for (int i = 0; i < kB8Loads; ++i) {
      const int r = (tid >> 2) + 64 * i;
      int col;
      int64_t wrow;
      if (kGateUp) {
        const int f = r >> 3;
        col = blockIdx.y * (BN / 2) + (f >> 1) * 8 + (r & 7);
        wrow = ((f & 1) ? static_cast<int64_t>(N) : 0) + col;
      } else {
        col = blockIdx.y * BN + r;
        wrow = col;
      }
      b8_ok[i] = col < N;
      if (!b8_ok[i]) wrow = 0;
      b8_src[i] = w8 + wrow * K + 16 * b8_chunk;
      b8_scale[i] = sc + (wrow / 128) * kb;
    }
  }

  const int k_tiles = (K + BK - 1) / BK;
  auto load_stage = [&](int stage, int kt) {
    __nv_bfloat16* sa = stage_a(stage);
    const int kc = kt * BK + ld_chunk * 8;
    const bool k_ok = kc < K;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool ao = a_ok[i] && k_ok;
      cp_async16_zfill(sa + swz((tid >> 3) + 32 * i, ld_chunk), ao ? a_src[i] + kc : g.a, ao ? 16 : 0);
    }
    if constexpr (kFp8) {
      uint8_t* sb8 = reinterpret_cast<uint8_t*>(sa + BM * BK);
      const int kc8 = kt * BK + 16 * b8_chunk;
#pragma unroll
      for (int i = 0; i < kB8Loads; ++i) {
        const bool bo = b8_ok[i] && kc8 < K;  // K % 16 == 0: a chunk is all in or all out
        cp_async16_zfill(sb8 + ((tid >> 2) + 64 * i) * BK + 16 * b8_chunk,
                         bo ? static_cast<const void*>(b8_src[i] + kt * BK) : g.w, bo ? 16 : 0);
      }
    } else {
      __nv_bfloat16* sb = sa + BM * BK;
#pragma unroll
      for (int i = 0; i < kBLoads; ++i) {
        const int col = b_col0 + b_step * i;
        const bool bo = col < N && k_ok;
        cp_async16_zfill(sb + swz((tid >> 3) + 32 * i, ld_chunk),
                         bo ? b_base + static_cast<int64_t>(col) * K + kc : g.w, bo ? 16 : 0);
      }
    }
  };
  // FP8: this thread's e4m3 chunks of stage `stage` (k step kt) times their scales into b_dq.
  auto dequant_stage = [&](int stage, int kt) {
    const uint8_t* sb8 = reinterpret_cast<const uint8_t*>(stage_a(stage) + BM * BK);
#pragma unroll
    for (int i = 0; i < kB8Loads; ++i) {
      const int r = (tid >> 2) + 64 * i;
      const uint4 v = *reinterpret_cast<const uint4*>(sb8 + r * BK + 16 * b8_chunk);
      const float sc = __ldg(b8_scale[i] + (kt * BK) / 128);
      uint4 lo8, hi8;
      lo8.x = fp8x2_to_bf16x2_scaled(v.x, sc);
      lo8.y = fp8x2_to_bf16x2_scaled(v.x >> 16, sc);
      lo8.z = fp8x2_to_bf16x2_scaled(v.y, sc);
      lo8.w = fp8x2_to_bf16x2_scaled(v.y >> 16, sc);
      hi8.x = fp8x2_to_bf16x2_scaled(v.z, sc);
      hi8.y = fp8x2_to_bf16x2_scaled(v.z >> 16, sc);
      hi8.z = fp8x2_to_bf16x2_scaled(v.w, sc);
      hi8.w = fp8x2_to_bf16x2_scaled(v.w >> 16, sc);
      *reinterpret_cast<uint4*>(b_dq + swz(r, 2 * b8_chunk)) = lo8;
      *reinterpret_cast<uint4*>(b_dq + swz(r, 2 * b8_chunk + 1)) = hi8;
    }
  };

  float acc[4][kNFrags][4];
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNFrags; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < k_tiles) load_stage(next % kStages, next);
    cp_async_commit();

    const __nv_bfloat16* sa = stage_a(kt % kStages);
    const __nv_bfloat16* sb = sa + BM * BK;
    if constexpr (kFp8) {
      // Every warp finished the previous step's MMAs on b_dq (the barrier above); the chunks
      // read are this thread's own copies, complete after its cp_async_wait.
      dequant_stage(kt % kStages, kt);
      __syncthreads();
      sb = b_dq;
    }
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[4][4], bf[kNFrags][2];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        const int row = warp_m * 64 + mi * 16 + (lane & 15);
        if (mi < m_frags) ldmatrix_x4(af[mi], sa + swz(row, kk * 2 + (lane >> 4)));
      }
#pragma unroll
      for (int nj = 0; nj < kNFrags / 2; ++nj) {
        const int row = warp_n * kWarpN + nj * 16 + ((lane >> 4) << 3) + (lane & 7);
        uint32_t r[4];
        ldmatrix_x4(r, sb + swz(row, kk * 2 + ((lane >> 3) & 1)));
        bf[2 * nj][0] = r[0];
        bf[2 * nj][1] = r[1];
        bf[2 * nj + 1][0] = r[2];
        bf[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
        if (mi < m_frags) {
#pragma unroll
          for (int ni = 0; ni < kNFrags; ++ni) mma_bf16(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
        }
    }
  }
  cp_async_wait<0>();

  // Epilogue: accumulator q of fragment (mi, ni) is row (lane / 4) + 8 (q / 2) of the m16 tile,
  // column 2 (lane % 4) + q % 2 of the n8 tile.
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + warp_m * 64 + mi * 16 + (lane >> 2) + half * 8;
      if (row >= row_end) continue;
      __nv_bfloat16* orow = g.out + static_cast<int64_t>(row) * N;
      if (kGateUp) {
#pragma unroll
        for (int pr = 0; pr < kNFrags / 2; ++pr) {
          const int col = blockIdx.y * (BN / 2) + (warp_n * (kNFrags / 2) + pr) * 8 + 2 * (lane & 3);
          if (col >= N) continue;
          const float* gt = &acc[mi][2 * pr][2 * half];
          const float* up = &acc[mi][2 * pr + 1][2 * half];
          const float v0 = gt[0] / (1.0f + __expf(-gt[0])) * up[0];
          const float v1 = gt[1] / (1.0f + __expf(-gt[1])) * up[1];
          *reinterpret_cast<__nv_bfloat162*>(orow + col) = __floats2bfloat162_rn(v0, v1);
        }
      } else {
#pragma unroll
        for (int ni = 0; ni < kNFrags; ++ni) {
          const int col = blockIdx.y * BN + warp_n * kWarpN + ni * 8 + 2 * (lane & 3);
          if (col >= N) continue;
          *reinterpret_cast<__nv_bfloat162*>(orow + col) =
              __floats2bfloat162_rn(acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
        }
      }
    }
}

template <bool kGateUp, bool kFp8>
void launch_gemm(const GemmArgs& g, int max_tiles, cudaStream_t s) {
  constexpr size_t smem_bytes = kFp8 ? kSmemBytes8 : kSmemBytes;
  // More than 48 KiB of dynamic shared memory needs an opt-in, once per device.
  static std::atomic<uint64_t> configured{0};
  int dev = 0;
  TCUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (!(configured.load(std::memory_order_acquire) & bit)) {
    TCUDA_CHECK(cudaFuncSetAttribute(moe_grouped_gemm_kernel<kGateUp, kFp8>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes)));
    configured.fetch_or(bit, std::memory_order_acq_rel);
  }
  const int col_tiles = ceil_div(g.N, kGateUp ? BN / 2 : BN);
  moe_grouped_gemm_kernel<kGateUp, kFp8><<<dim3(max_tiles, col_tiles), kThreads, smem_bytes, s>>>(g);
  TCUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_moe_prefill(const MoeArgs& a, const MoePrefillWorkspace& ws, cudaStream_t s) {
  const int P = a.T * a.k;
  launch_moe_route(a, ws.expert_offsets, ws.tile_offsets, ws.sorted_pair, ws.pair_pos, s);
  // Worst case of sum_e ceil(rows_e / BM) over the experts.
  const int max_tiles = ceil_div(P, BM) + a.E_local;
  GemmArgs g{};
  g.sorted_pair = ws.sorted_pair;
  g.expert_offsets = ws.expert_offsets;
  g.tile_offsets = ws.tile_offsets;
  g.E_local = a.E_local;
  g.k = a.k;
  const bool fp8 = a.gate_up_scale != nullptr;
  g.a = static_cast<const __nv_bfloat16*>(a.x);
  g.w = static_cast<const __nv_bfloat16*>(a.gate_up);
  g.scale = a.gate_up_scale;
  g.out = static_cast<__nv_bfloat16*>(ws.act);
  g.K = a.H;
  g.N = a.I;
  if (fp8)
    launch_gemm<true, true>(g, max_tiles, s);
  else
    launch_gemm<true, false>(g, max_tiles, s);
  g.a = static_cast<const __nv_bfloat16*>(ws.act);
  g.w = static_cast<const __nv_bfloat16*>(a.down);
  g.scale = a.down_scale;
  g.out = static_cast<__nv_bfloat16*>(ws.y);
  g.K = a.I;
  g.N = a.H;
  if (fp8)
    launch_gemm<false, true>(g, max_tiles, s);
  else
    launch_gemm<false, false>(g, max_tiles, s);
  launch_moe_combine(a, ws.y, ws.pair_pos, s);
}

}  // namespace tessera::cuda
