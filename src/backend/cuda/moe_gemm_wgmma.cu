// The bf16 grouped MoE GEMM on Hopper's warpgroup MMA (wgmma: sm_90a code only; elsewhere the
// kernel compiles empty and the backend never takes it: CudaArch::wgmma).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/moe_gemm.cuh"
#include "backend/cuda/wgmma_utils.cuh"

namespace tessera::cuda {

namespace {

using namespace moe_gemm;

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

template <bool kGateUp>
void launch_wgmma(const GemmArgs& g, int max_tiles, cudaStream_t s) {
  constexpr size_t smem_bytes = kMoeWgmmaSmemBytes;  // + the alignment to 1024 bytes
  static std::atomic<uint64_t> configured{0};
  allow_smem(moe_grouped_wgmma_kernel<kGateUp>, smem_bytes, configured);
  moe_grouped_wgmma_kernel<kGateUp>
      <<<dim3(max_tiles, ceil_div(g.N, kGateUp ? BN / 2 : BN)), kThreads, smem_bytes, s>>>(g);
  TCUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_moe_grouped_wgmma(const GemmArgs& g, bool gate_up, int max_tiles, cudaStream_t s) {
  if (gate_up)
    launch_wgmma<true>(g, max_tiles, s);
  else
    launch_wgmma<false>(g, max_tiles, s);
}

}  // namespace tessera::cuda
