// The grouped MoE GEMM's pieces that its mma.sync kernel (moe_gemm.cu) and its wgmma kernel
// (moe_gemm_wgmma.cu) share: the tile constants, the arguments, the swizzled shared-memory
// layout, the (expert, row tile) lookup and the bf16 stage loader. moe_gemm.cu's comment says
// how the kernels work.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernel_smem.h"
#include "backend/cuda/mma_utils.cuh"

namespace tessera::cuda {

namespace moe_gemm {

constexpr int BM = kMoeTileM, BN = kMoeGemmBN, BK = kMoeGemmBK, kThreads = 256;
constexpr int kWarpN = BN / 4;              // 8 warps as 2 (rows) x 4 (columns), 64 rows each
constexpr int kNFrags = kWarpN / 8;         // n8 fragments of a warp
constexpr int kBLoads = BN * 8 / kThreads;  // 16-byte chunks of B a thread copies per stage
constexpr int kStageElems = (BM + BN) * BK;
static_assert(BM == 128 && BK == 64 && (BN == 128 || BN == 256), "loaders assume 128-row, 64-deep tiles");
// FP8: a stage is A (bf16) then B (e4m3, unswizzled rows of BK bytes); the widened bf16 B tiles
// follow the stages, then the scale table [3][kMaxScaleBlocks].
constexpr int kStageBytes8 = BM * BK * 2 + BN * BK;
constexpr int kB8Loads = BN * (BK / 16) / kThreads;  // 16-byte e4m3 chunks of B a thread copies per stage
constexpr int kBTileBytes = BN * BK * 2;
constexpr int kScaleRows = 3;
constexpr int kMaxScaleBlocks = kMaxFp8GemmK / 128;
static_assert(kStageBytes8 % 128 == 0 && kB8Loads * kThreads == BN * (BK / 16), "FP8 stage layout");
static_assert(moe_gemm_stage_bytes(false) == kStageElems * sizeof(__nv_bfloat16) &&
                  moe_gemm_stage_bytes(true) == kStageBytes8 &&
                  moe_gemm_smem_bytes(true, {1, 1}) ==
                      kStageBytes8 + size_t{kBTileBytes} + size_t{kScaleRows} * kMaxScaleBlocks * sizeof(float),
              "kernel_smem.h's sizes are this file's layouts");

struct GemmArgs {
  const __nv_bfloat16* a;  // gate_up: x [T, K]; down: act [rows, K]
  const __nv_bfloat16* w;  // [E_local, w_rows, K] (kFp8: e4m3 bytes)
  const float* scale;      // kFp8: [E_local, ceil(w_rows / 128), ceil(K / 128)]
  __nv_bfloat16* out;      // gate_up: act [rows, N]; down: y [rows, N]
  const int32_t* sorted_pair;
  const int32_t* expert_offsets;
  const int32_t* tile_offsets;
  int E_local, K, N, k;  // N: output columns (I for gate_up, H for down)
  // Dense mode (down layout only): rows of x and out; 0 = grouped by the expert offsets above.
  int dense_rows;
  int k_tiles_per_split;  // dense: 64-deep k steps of one grid.z slice (0: all)
  float* out_f32;         // dense: f32 [gridDim.z][dense_rows, N] instead of bf16 out (null: bf16)
};

// Element offset of (row, 16-byte chunk) in a [rows][BK] tile with swizzled chunks.
__device__ __forceinline__ int swz(int row, int chunk) { return row * BK + ((chunk ^ (row & 7)) << 3); }

// The rows a block of the grid computes: expert e's rows [row0, row_end) (dense mode: x's rows
// from slot * BM, e = 0). False when the slot is beyond the last tile of the routing.
struct TileRows {
  int e, row0, row_end;
};
__device__ __forceinline__ bool find_tile(const GemmArgs& g, int slot, TileRows& t) {
  t.e = 0;
  t.row0 = slot * BM;
  t.row_end = g.dense_rows;
  if (g.dense_rows > 0) return true;
  if (slot >= g.tile_offsets[g.E_local]) return false;
  // The expert whose tiles hold this slot: the last e with tile_offsets[e] <= slot.
  int lo = 0, hi = g.E_local;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (g.tile_offsets[mid] <= slot)
      lo = mid;
    else
      hi = mid;
  }
  t.e = lo;
  t.row0 = g.expert_offsets[lo] + (slot - g.tile_offsets[lo]) * BM;
  t.row_end = g.expert_offsets[lo + 1];
  return true;
}

// A thread's cp.async copies of one pipeline stage: A tile rows tid / 8 + 32 i (4 of them) and,
// for bf16 weights, B tile rows tid / 8 + 32 i (kBLoads), 16-byte chunk tid % 8, into [rows][BK]
// tiles with swizzled chunks; zeros past the rows, columns and K.
template <bool kGateUp>
struct Bf16Loader {
  const __nv_bfloat16* a_src[4];
  bool a_ok[4];
  const __nv_bfloat16* b_base;
  int b_col0, b_step;

  __device__ __forceinline__ Bf16Loader(const GemmArgs& g, const TileRows& t, int tid) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = t.row0 + (tid >> 3) + 32 * i;
      a_ok[i] = row < t.row_end;
      int64_t a_row = 0;
      if (a_ok[i]) a_row = kGateUp ? g.sorted_pair[row] / g.k : row;
      a_src[i] = g.a + a_row * g.K;
    }
    // B row r = tid / 8 + 32 i of the tile. down: weight row n0 + r. gate_up: the tile's 8-row
    // fragments alternate gate and up rows of the same 8 columns (fragment f = r / 8 holds
    // columns n0 + (f / 2) * 8 .., gate when f is even), so a thread's rows are column
    // b_col0 + 16 i of the gate (or the up) half. (FP8 weights have their own copies.)
    const int64_t w_rows = kGateUp ? 2 * static_cast<int64_t>(g.N) : g.N;
    const __nv_bfloat16* w = g.w + static_cast<int64_t>(t.e) * w_rows * g.K;
    if (kGateUp) {
      const int f0 = tid >> 6;  // fragment of row tid / 8
      b_col0 = blockIdx.y * (BN / 2) + (f0 >> 1) * 8 + ((tid >> 3) & 7);
      b_step = 16;
      b_base = w + ((f0 & 1) ? static_cast<int64_t>(g.N) : 0) * g.K;
    } else {
      b_col0 = blockIdx.y * BN + (tid >> 3);
      b_step = 32;
      b_base = w;
    }
  }
  __device__ __forceinline__ void load_a(__nv_bfloat16* sa, const GemmArgs& g, int kt, int tid) const {
    const int chunk = tid & 7, kc = kt * BK + chunk * 8;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool ok = a_ok[i] && kc < g.K;
      cp_async16_zfill(sa + swz((tid >> 3) + 32 * i, chunk), ok ? a_src[i] + kc : g.a, ok ? 16 : 0);
    }
  }
  __device__ __forceinline__ void load_b(__nv_bfloat16* sb, const GemmArgs& g, int kt, int tid) const {
    const int chunk = tid & 7, kc = kt * BK + chunk * 8;
#pragma unroll
    for (int i = 0; i < kBLoads; ++i) {
      const int col = b_col0 + b_step * i;
      const bool ok = col < g.N && kc < g.K;
      cp_async16_zfill(sb + swz((tid >> 3) + 32 * i, chunk), ok ? b_base + static_cast<int64_t>(col) * g.K + kc : g.w,
                       ok ? 16 : 0);
    }
  }
};

// More than 48 KiB of dynamic shared memory needs an opt-in, once per device and kernel.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes, std::atomic<uint64_t>& configured) {
  int dev = 0;
  TCUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (!(configured.load(std::memory_order_acquire) & bit)) {
    TCUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    configured.fetch_or(bit, std::memory_order_acq_rel);
  }
}

}  // namespace moe_gemm

// The bf16 grouped GEMM on wgmma (sm_90a code; moe_gemm_wgmma.cu), gate_up or down.
void launch_moe_grouped_wgmma(const moe_gemm::GemmArgs& g, bool gate_up, int max_tiles, cudaStream_t s);

}  // namespace tessera::cuda
