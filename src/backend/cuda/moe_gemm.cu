// The prefill path of the routed experts: a grouped GEMM over the experts on tensor cores
// (mma.sync m16n8k16 bf16, ldmatrix, a cp.async pipeline), over the token rows that
// moe.cu's routing kernel permuted by expert on the device. The same kernel with one group is
// the dense FP8 linear's W8A16 GEMM above the GEMV's rows (launch_fp8_w16_gemm, at the end).
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
// FP8 weights (kFp8): the pipeline stages hold B as e4m3 (BN rows of 64 bytes, half the bytes of
// bf16). Every thread widens the 16-byte chunks it copied itself to bf16 (exact: every e4m3
// value is a bf16 value) into a bf16 B tile in the layout above, one k step ahead of the MMAs
// (two such tiles, so the widening of step kt + 1 overlaps the MMAs of step kt and a k step
// has one barrier; where shared memory is short, one tile that a step widens between two
// barriers), and the same ldmatrix / mma.sync loop runs on it. The 128 x 128 block
// scales are applied to the f32 accumulators, not to the weights: an 8-row MMA fragment lies in
// one 128-row scale block and a 64-deep k step in one 128-column block, so a fragment's
// accumulators are kept in units of the scale of the block they are on, s_run, and when the k
// walk enters a block of another scale s they are multiplied by s_run / s; the epilogue
// multiplies by the last s. The result is sum over blocks of scale * (fp8 x bf16 sums in f32),
// the arithmetic of the FP8 GEMVs and of the CPU reference (f32 w * s), where rounding each
// w * s to bf16 put a 2^-9 relative error on every weight and made a row computed here differ
// from the same row through a GEMV (the FP8 fixtures parted between batched and lone runs). The
// block's scales (at most 3 row blocks: a 256-row tile, or gate_up's 128 gate rows and 128 up
// rows) are copied to shared memory once. A block whose scale is not positive contributes
// nothing (its widened weights are zeroed).
//
// Shared memory: 4 pipeline stages take 192 KiB (bf16) and 195 KiB (FP8) a block, more than
// sm_120 and sm_121 allow (99 KiB); there the launchers take 2 stages (and one widened tile for
// FP8 weights): kernel_smem.h's kMoeGemmVariants. A thread's accumulators see the same MMAs and
// rescales in the same order in every variant, so they give the same bits.
//
// Dense mode (GemmArgs::dense_rows > 0, down layout, one "expert"): the rows are x's rows in
// order, grid.x their 128-row tiles. Few tiles (decode batches: M of 17 .. a few hundred on a
// 3072-wide projection make 12 tiles) would leave most SMs idle, so grid.z splits K: block z
// takes k_tiles_per_split 64-deep steps and writes its f32 partial sums to out_f32[z]; a second
// kernel adds the partials in z order (deterministic: no atomics) and rounds to the output.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/fp8_utils.cuh"
#include "backend/cuda/kernel_smem.h"
#include "backend/cuda/mma_utils.cuh"
#include "backend/cuda/wgmma_utils.cuh"
#include "core/error.h"

namespace tessera::cuda {

namespace {

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

// kStages, kWideTiles: a variant of kernel_smem.h's kMoeGemmVariants (kWideTiles 0 for bf16 weights).
template <bool kGateUp, bool kFp8, int kStages, int kWideTiles>
__global__ void __launch_bounds__(kThreads, BN == 128 ? 2 : 1) moe_grouped_gemm_kernel(const GemmArgs g) {
  static_assert(kStages >= 2 && (kFp8 ? kWideTiles == 1 || (kWideTiles == 2 && kStages >= 3) : kWideTiles == 0),
                "two widened tiles widen a stage ahead: 3 stages at least");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  // Stage base (A tile) in bf16 elements, and the B tile the MMAs read.
  auto stage_a = [&](int stage) {
    return kFp8 ? reinterpret_cast<__nv_bfloat16*>(smem_raw + stage * kStageBytes8) : smem + stage * kStageElems;
  };
  // kFp8 only: the widened B tiles and the scale table.
  __nv_bfloat16* const b_w16 = reinterpret_cast<__nv_bfloat16*>(smem_raw + kStages * kStageBytes8);
  float* const s_tab = reinterpret_cast<float*>(smem_raw + kStages * kStageBytes8 + kWideTiles * kBTileBytes);

  TileRows t;
  if (!find_tile(g, blockIdx.x, t)) return;
  const int e = t.e, row0 = t.row0, row_end = t.row_end;
  const int K = g.K, N = g.N;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 2, warp_n = warp & 3;
  // 16-row fragments of this warp's 64 rows that hold rows of the expert: an expert's last tile
  // is mostly empty, and its empty fragments skip their ldmatrix and mma.
  const int m_frags = max(0, min(4, (row_end - (row0 + warp_m * 64) + 15) / 16));

  const Bf16Loader<kGateUp> ld(g, t, tid);
  const int64_t w_rows = kGateUp ? 2 * static_cast<int64_t>(N) : N;

  // FP8: a thread copies (and later widens) B tile rows tid / 4 + 64 i, 16-byte chunk tid % 4
  // (16 columns); the tile row's weight row follows the same gate / up interleave. The block's
  // scale rows: down / dense, the two 128-row blocks of its 256 rows; gate_up, the gate rows'
  // block (0) and the up rows' one or two (1, 2; two where I is not a multiple of 128).
  const int b8_chunk = tid & 3;
  const uint8_t* b8_src[kB8Loads];
  int b8_srow[kB8Loads];  // scale-table row of each copied tile row
  bool b8_ok[kB8Loads];
  const int kb = (K + 127) / 128;
  const int row_blocks = static_cast<int>((w_rows + 127) / 128);
  const int up_block0 = kGateUp ? (N + static_cast<int>(blockIdx.y) * (BN / 2)) / 128 : 0;
  // Scale-table row of tile row r (a weight row of this block).
  auto scale_row = [&](int r) {
    if (!kGateUp) return r / 128;
    const int f = r >> 3;
    if (!(f & 1)) return 0;
    return 1 + (N + static_cast<int>(blockIdx.y) * (BN / 2) + (f >> 1) * 8) / 128 - up_block0;
  };
  if constexpr (kFp8) {
    const auto* w8 = reinterpret_cast<const uint8_t*>(g.w) + static_cast<int64_t>(e) * w_rows * K;
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
      b8_srow[i] = scale_row(r);
    }
    // The scale table: row j, column c = scale of weight row block (gate_up: j 0 the gate's,
    // 1 and 2 the up rows'; else 2 * blockIdx.y + j) and k block c; 0 past the matrix.
    const float* sc = g.scale + static_cast<int64_t>(e) * row_blocks * kb;
    for (int i = tid; i < kScaleRows * kb; i += kThreads) {
      const int j = i / kb, c = i - j * kb;
      const int rb =
          kGateUp ? (j == 0 ? static_cast<int>(blockIdx.y) : up_block0 + j - 1) : 2 * static_cast<int>(blockIdx.y) + j;
      s_tab[j * kMaxScaleBlocks + c] = rb < row_blocks && (kGateUp || j < 2) ? __ldg(sc + rb * kb + c) : 0.0f;
    }
  }

  // This block's k steps: [kt_begin, kt_begin + k_tiles) of the whole product.
  const int k_all = (K + BK - 1) / BK;
  const int kps = g.k_tiles_per_split > 0 ? g.k_tiles_per_split : k_all;
  const int kt_begin = blockIdx.z * kps;
  const int k_tiles = max(0, min(k_all, kt_begin + kps) - kt_begin);
  auto load_stage = [&](int stage, int kt) {
    __nv_bfloat16* sa = stage_a(stage);
    ld.load_a(sa, g, kt, tid);
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
      ld.load_b(sa + BM * BK, g, kt, tid);
    }
  };
  // FP8: this thread's e4m3 chunks of stage `stage` (k step kt) widened to bf16 into B tile
  // `buf` (zeros where the block's scale is not positive).
  auto widen_stage = [&](int stage, int kt, int buf) {
    const uint8_t* sb8 = reinterpret_cast<const uint8_t*>(stage_a(stage) + BM * BK);
    __nv_bfloat16* dst = b_w16 + buf * (BN * BK);
#pragma unroll
    for (int i = 0; i < kB8Loads; ++i) {
      const int r = (tid >> 2) + 64 * i;
      uint4 v = *reinterpret_cast<const uint4*>(sb8 + r * BK + 16 * b8_chunk);
      if (!(s_tab[b8_srow[i] * kMaxScaleBlocks + (kt * BK) / 128] > 0.0f)) v = make_uint4(0, 0, 0, 0);
      uint4 lo8, hi8;
      lo8.x = fp8x2_to_bf16x2(v.x);
      lo8.y = fp8x2_to_bf16x2(v.x >> 16);
      lo8.z = fp8x2_to_bf16x2(v.y);
      lo8.w = fp8x2_to_bf16x2(v.y >> 16);
      hi8.x = fp8x2_to_bf16x2(v.z);
      hi8.y = fp8x2_to_bf16x2(v.z >> 16);
      hi8.z = fp8x2_to_bf16x2(v.w);
      hi8.w = fp8x2_to_bf16x2(v.w >> 16);
      *reinterpret_cast<uint4*>(dst + swz(r, 2 * b8_chunk)) = lo8;
      *reinterpret_cast<uint4*>(dst + swz(r, 2 * b8_chunk + 1)) = hi8;
    }
  };

  float acc[4][kNFrags][4];
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNFrags; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;

  // The MMAs of one k step: A from stage tile sa, B from sb.
  auto mma_step = [&](const __nv_bfloat16* sa, const __nv_bfloat16* sb) {
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
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, kt_begin + s);
    cp_async_commit();
  }

  if constexpr (kFp8) {
    // The scale each fragment's accumulators are in (0: none yet), and its scale-table row.
    float s_run[kNFrags];
    int frag_srow[kNFrags];
#pragma unroll
    for (int ni = 0; ni < kNFrags; ++ni) {
      s_run[ni] = 0.0f;
      frag_srow[ni] = scale_row(warp_n * kWarpN + ni * 8);
    }
    // Before step kt's MMAs: when its k columns enter a new scale block, the accumulators into
    // that block's scale.
    int cur_kb = -1;
    auto enter_scale_block = [&](int kt) {
      const int kbi = ((kt_begin + kt) * BK) / 128;
      if (kbi == cur_kb) return;
      cur_kb = kbi;
#pragma unroll
      for (int ni = 0; ni < kNFrags; ++ni) {
        const float sn = s_tab[frag_srow[ni] * kMaxScaleBlocks + kbi];
        if (sn > 0.0f && sn != s_run[ni]) {
          const float f = s_run[ni] / sn;
#pragma unroll
          for (int mi = 0; mi < 4; ++mi)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[mi][ni][q] *= f;
          s_run[ni] = sn;
        }
      }
    };
    if constexpr (kWideTiles == 2) {
      // Step kt + 1's B is widened during step kt (this thread's own copies: complete once its
      // cp.async groups up to that stage are), into the other of the two B tiles.
      cp_async_wait<kStages - 2>();
      __syncthreads();  // the scale table
      if (k_tiles > 0) widen_stage(0, kt_begin, 0);
      for (int kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<kStages - 3>();
        __syncthreads();  // B tile kt % 2 widened by every thread; every warp done with step kt - 1
        const int next = kt + kStages - 1;
        if (next < k_tiles) load_stage(next % kStages, kt_begin + next);
        cp_async_commit();
        if (kt + 1 < k_tiles) widen_stage((kt + 1) % kStages, kt_begin + kt + 1, (kt + 1) & 1);
        enter_scale_block(kt);
        mma_step(stage_a(kt % kStages), b_w16 + (kt & 1) * (BN * BK));
      }
    } else {
      // One B tile: a step widens its own stage's B into it, then every warp multiplies.
      for (int kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<kStages - 2>();
        __syncthreads();  // stage kt landed; every warp done with step kt - 1 (the B tile is free)
        const int next = kt + kStages - 1;
        if (next < k_tiles) load_stage(next % kStages, kt_begin + next);
        cp_async_commit();
        widen_stage(kt % kStages, kt_begin + kt, 0);
        enter_scale_block(kt);
        __syncthreads();  // the B tile widened by every thread
        mma_step(stage_a(kt % kStages), b_w16);
      }
    }
#pragma unroll
    for (int ni = 0; ni < kNFrags; ++ni)
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[mi][ni][q] *= s_run[ni];
  } else {
    for (int kt = 0; kt < k_tiles; ++kt) {
      cp_async_wait<kStages - 2>();
      __syncthreads();
      const int next = kt + kStages - 1;
      if (next < k_tiles) load_stage(next % kStages, kt_begin + next);
      cp_async_commit();
      const __nv_bfloat16* sa = stage_a(kt % kStages);
      mma_step(sa, sa + BM * BK);
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
      } else if (g.out_f32) {  // dense: this k slice's partial sums (or the f32 output)
        float* frow = g.out_f32 + (static_cast<int64_t>(blockIdx.z) * g.dense_rows + row) * N;
#pragma unroll
        for (int ni = 0; ni < kNFrags; ++ni) {
          const int col = blockIdx.y * BN + warp_n * kWarpN + ni * 8 + 2 * (lane & 3);
          if (col >= N) continue;
          if ((N & 1) == 0) {
            *reinterpret_cast<float2*>(frow + col) = make_float2(acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
          } else {
            frow[col] = acc[mi][ni][2 * half];
            if (col + 1 < N) frow[col + 1] = acc[mi][ni][2 * half + 1];
          }
        }
      } else {
#pragma unroll
        for (int ni = 0; ni < kNFrags; ++ni) {
          const int col = blockIdx.y * BN + warp_n * kWarpN + ni * 8 + 2 * (lane & 3);
          if (col >= N) continue;
          if ((N & 1) == 0) {
            *reinterpret_cast<__nv_bfloat162*>(orow + col) =
                __floats2bfloat162_rn(acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
          } else {  // dense odd N: rows are not 4-byte aligned
            orow[col] = __float2bfloat16(acc[mi][ni][2 * half]);
            if (col + 1 < N) orow[col + 1] = __float2bfloat16(acc[mi][ni][2 * half + 1]);
          }
        }
      }
    }
}

// The bf16 grouped GEMM on Hopper's warpgroup MMA (wgmma, sm_90a): the same grid, tiles, rows,
// loaders and shared-memory layout as moe_grouped_gemm_kernel's bf16 path, but the two
// warpgroups of the block each take 64 rows x all 256 columns with m64n256k16 MMAs that read
// both operands from shared memory (no ldmatrix, no register fragments: mma.sync's operand
// traffic is what bounded the kernel above). A k step: wait for this thread's copies of the
// stage, fence them into the async proxy, barrier (every warpgroup is past its wait of the
// previous step, so that stage is free), issue the 4 MMAs of the stage, refill the freed stage
// S - 1 steps ahead while they run, wait for them. Both warpgroups issue their MMAs even when
// one's 64 rows are all past the expert's (it multiplies zeros): a branch around wgmma makes
// ptxas serialise the MMAs. Epilogue as the kernel above (gate_up: SiLU(gate) * up).
template <bool kGateUp>
__global__ void __launch_bounds__(kThreads, 1) moe_grouped_wgmma_kernel(const GemmArgs g) {
#if TESSERA_HAS_WGMMA
  constexpr int kStages = kMoeWgmmaStages;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // The 128-byte swizzle repeats every 1024 bytes: the stages start on such a boundary.
  __nv_bfloat16* const smem =
      reinterpret_cast<__nv_bfloat16*>(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
  TileRows t;
  if (!find_tile(g, blockIdx.x, t)) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
  const Bf16Loader<kGateUp> ld(g, t, tid);
  const int k_tiles = (g.K + BK - 1) / BK;
  auto load_stage = [&](int stage, int kt) {
    __nv_bfloat16* sa = smem + stage * kStageElems;
    ld.load_a(sa, g, kt, tid);
    ld.load_b(sa + BM * BK, g, kt, tid);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    fence_proxy_async_smem();
    __syncthreads();
    const __nv_bfloat16* sa = smem + (kt % kStages) * kStageElems;
    wgmma_pin(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)
      wgmma_m64n256k16_bf16(acc, wgmma_desc_sw128(sa + wg * 64 * BK + kk * 16),
                            wgmma_desc_sw128(sa + BM * BK + kk * 16), 1);
    wgmma_commit();
    const int next = kt + kStages - 1;
    if (next < k_tiles) load_stage(next % kStages, next);
    cp_async_commit();
    wgmma_wait<0>();
    wgmma_pin(acc);
  }
  cp_async_wait<0>();

  // acc[4 j + q]: row 16 (warp % 4) + lane / 4 + 8 (q / 2) of the warpgroup's 64, column
  // 8 j + 2 (lane % 4) + q % 2 of the tile's 256.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = t.row0 + wg * 64 + (warp & 3) * 16 + (lane >> 2) + half * 8;
    if (row >= t.row_end) continue;
    __nv_bfloat16* orow = g.out + static_cast<int64_t>(row) * g.N;
    if (kGateUp) {
#pragma unroll
      for (int pr = 0; pr < 16; ++pr) {
        const int col = blockIdx.y * (BN / 2) + pr * 8 + 2 * (lane & 3);
        if (col >= g.N) continue;
        const float* gt = &acc[8 * pr + 2 * half];
        const float* up = &acc[8 * pr + 4 + 2 * half];
        const float v0 = gt[0] / (1.0f + __expf(-gt[0])) * up[0];
        const float v1 = gt[1] / (1.0f + __expf(-gt[1])) * up[1];
        *reinterpret_cast<__nv_bfloat162*>(orow + col) = __floats2bfloat162_rn(v0, v1);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int col = blockIdx.y * BN + 8 * j + 2 * (lane & 3);
        if (col < g.N)
          *reinterpret_cast<__nv_bfloat162*>(orow + col) =
              __floats2bfloat162_rn(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
      }
    }
  }
#else
  __trap();  // never launched: the host takes this kernel on sm_90 devices only
#endif
}

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

template <bool kGateUp>
void launch_wgmma(const GemmArgs& g, int max_tiles, cudaStream_t s) {
  constexpr size_t smem_bytes = kMoeWgmmaSmemBytes;  // + the alignment to 1024 bytes
  static std::atomic<uint64_t> configured{0};
  allow_smem(moe_grouped_wgmma_kernel<kGateUp>, smem_bytes, configured);
  moe_grouped_wgmma_kernel<kGateUp>
      <<<dim3(max_tiles, ceil_div(g.N, kGateUp ? BN / 2 : BN)), kThreads, smem_bytes, s>>>(g);
  TCUDA_LAUNCH_CHECK();
}

template <bool kGateUp, bool kFp8, int kVariant>
void launch_variant(const GemmArgs& g, dim3 grid, cudaStream_t s) {
  constexpr MoeGemmVariant v = kMoeGemmVariants[kVariant];
  constexpr size_t smem_bytes = moe_gemm_smem_bytes(kFp8, v);
  auto *kernel = moe_grouped_gemm_kernel < kGateUp, kFp8, v.stages, kFp8 ? v.wide_tiles : 0 > ;
  static std::atomic<uint64_t> configured{0};
  allow_smem(kernel, smem_bytes, configured);
  kernel<<<grid, kThreads, smem_bytes, s>>>(g);
  TCUDA_LAUNCH_CHECK();
}

// The variant moe_gemm_variant picks for max_smem; false (nothing queued) when none fits.
template <bool kGateUp, bool kFp8>
bool launch_gemm(const GemmArgs& g, dim3 grid, size_t max_smem, cudaStream_t s) {
  static_assert(kMoeGemmNumVariants == 2, "a launch below for each variant");
  switch (moe_gemm_variant(kFp8, max_smem)) {
    case 0:
      launch_variant<kGateUp, kFp8, 0>(g, grid, s);
      return true;
    case 1:
      launch_variant<kGateUp, kFp8, 1>(g, grid, s);
      return true;
    default:
      return false;
  }
}

// (A variant fits max_smem: launch_moe_prefill checks before its first launch.)
template <bool kGateUp, bool kFp8>
void launch_grouped(const GemmArgs& g, int max_tiles, size_t max_smem, cudaStream_t s) {
  (void)launch_gemm<kGateUp, kFp8>(g, dim3(max_tiles, ceil_div(g.N, kGateUp ? BN / 2 : BN)), max_smem, s);
}

}  // namespace

int fp8_w16_gemm_splits(int64_t M, int64_t N, int64_t K, int num_sms) {
  const int64_t tiles = int64_t{ceil_div(M, BM)} * ceil_div(N, BN);
  const int64_t k_all = ceil_div(K, BK);
  // Few tiles (decode batches): the split with the fewest k steps per SM, one block an SM, waves
  // counted whole (ceil(tiles * z / SMs) waves of ceil(k_all / z) steps), the fewer slices on a
  // tie; a slice keeps at least 4 k steps (the pipeline's depth).
  if (tiles >= num_sms || k_all < 8) return 1;
  int64_t best = 1, best_cost = INT64_MAX;
  for (int64_t z = 1; z <= std::min<int64_t>(kMaxFp8W16Splits, k_all / 4); ++z) {
    const int64_t per = ceil_div(k_all, z);
    if (ceil_div(k_all, per) != z) continue;  // no empty slice
    const int64_t cost = ceil_div(tiles * z, num_sms) * per;
    if (cost < best_cost) {
      best = z;
      best_cost = cost;
    }
  }
  return static_cast<int>(best);
}

bool launch_fp8_w16_gemm(const void* x, const void* w, const float* scale, void* out, DType out_t, int64_t M, int64_t N,
                         int64_t K, int splits, float* partials, cudaStream_t s, size_t max_smem) {
  if (M < 1 || N < 1 || K % 16 != 0 || K < 16 || M > (int64_t{1} << 30) || N > (int64_t{1} << 30) ||
      K > int64_t{128} * kMaxScaleBlocks || splits < 1 || (splits > 1 && !partials))
    return false;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16 != 0) return false;
  if ((out_t != DType::kF32 && out_t != DType::kBF16) || moe_gemm_variant(true, max_smem) < 0) return false;
  const int64_t k_all = ceil_div(K, BK);
  const int per = ceil_div(k_all, splits);
  GemmArgs g{};
  g.a = static_cast<const __nv_bfloat16*>(x);
  g.w = static_cast<const __nv_bfloat16*>(w);
  g.scale = scale;
  g.E_local = 1;
  g.K = static_cast<int>(K);
  g.N = static_cast<int>(N);
  g.k = 1;
  g.dense_rows = static_cast<int>(M);
  g.k_tiles_per_split = per;
  const int z = ceil_div(k_all, per);
  if (z > 1)
    g.out_f32 = partials;
  else if (out_t == DType::kF32)
    g.out_f32 = static_cast<float*>(out);
  else
    g.out = static_cast<__nv_bfloat16*>(out);
  const dim3 grid(static_cast<unsigned>(ceil_div(M, BM)), static_cast<unsigned>(ceil_div(N, BN)),
                  static_cast<unsigned>(z));
  launch_gemm<false, true>(g, grid, max_smem, s);
  if (z > 1) launch_f32_partials_sum(partials, out, out_t, M * N, z, s);
  return true;
}

void launch_moe_prefill(const MoeArgs& a, const MoePrefillWorkspace& ws, bool wgmma, cudaStream_t s, size_t max_smem) {
  const bool fp8 = a.gate_up_scale != nullptr;
  wgmma = wgmma && !fp8 && kMoeWgmmaSmemBytes <= max_smem;
  if (!wgmma && moe_gemm_variant(fp8, max_smem) < 0)
    fail(ErrorKind::kUnsupported,
         "moe_grouped_gemm_kernel ({} experts) needs {} bytes of shared memory a block; this device allows {}",
         fp8 ? "FP8" : "bf16", moe_gemm_smem_bytes(fp8, kMoeGemmVariants[kMoeGemmNumVariants - 1]), max_smem);
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
  g.a = static_cast<const __nv_bfloat16*>(a.x);
  g.w = static_cast<const __nv_bfloat16*>(a.gate_up);
  g.scale = a.gate_up_scale;
  g.out = static_cast<__nv_bfloat16*>(ws.act);
  g.K = a.H;
  g.N = a.I;
  if (fp8)
    launch_grouped<true, true>(g, max_tiles, max_smem, s);
  else if (wgmma)
    launch_wgmma<true>(g, max_tiles, s);
  else
    launch_grouped<true, false>(g, max_tiles, max_smem, s);
  g.a = static_cast<const __nv_bfloat16*>(ws.act);
  g.w = static_cast<const __nv_bfloat16*>(a.down);
  g.scale = a.down_scale;
  g.out = static_cast<__nv_bfloat16*>(ws.y);
  g.K = a.I;
  g.N = a.H;
  if (fp8)
    launch_grouped<false, true>(g, max_tiles, max_smem, s);
  else if (wgmma)
    launch_wgmma<false>(g, max_tiles, s);
  else
    launch_grouped<false, false>(g, max_tiles, max_smem, s);
  launch_moe_combine(a, ws.y, ws.pair_pos, s);
}

}  // namespace tessera::cuda
