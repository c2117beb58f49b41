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
// The bf16 grouped GEMM on Hopper's warpgroup MMA is moe_gemm_wgmma.cu's; the tile constants, the
// loaders and the routing lookup both use are moe_gemm.cuh's.
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
#include "backend/cuda/moe_gemm.cuh"
#include "core/error.h"

namespace tessera::cuda {

namespace {

using namespace moe_gemm;

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
    launch_moe_grouped_wgmma(g, true, max_tiles, s);
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
    launch_moe_grouped_wgmma(g, false, max_tiles, s);
  else
    launch_grouped<false, false>(g, max_tiles, max_smem, s);
  launch_moe_combine(a, ws.y, ws.pair_pos, s);
}

}  // namespace tessera::cuda
