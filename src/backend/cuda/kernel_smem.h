// Dynamic shared memory of the CUDA kernels that take it: the layouts and byte counts the
// launchers size their launches from. Host code includes it too: scripts/smem_table.cpp prints
// these numbers for scripts/ptxas_report.sh, which adds ptxas's static shared memory and checks
// the sum against each architecture's per-block limit.
#pragma once
#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_ops.h"

namespace tessera::cuda {

// ---- moe_gemm.cu: the grouped GEMM (block tile kMoeTileM x 256 x 64, a cp.async pipeline) ----
constexpr int kMoeGemmBN = 256, kMoeGemmBK = 64;
// A pipeline stage: the A tile (bf16) and the B tile (bf16, or e4m3 for FP8 weights).
constexpr size_t moe_gemm_stage_bytes(bool fp8) {
  return size_t{kMoeTileM} * kMoeGemmBK * 2 + size_t{kMoeGemmBN} * kMoeGemmBK * (fp8 ? 1 : 2);
}
// The kernel's variants: pipeline stages and, for FP8 weights, widened bf16 B tiles (2: step
// kt + 1's tile is widened while step kt's MMAs run; 1: each step widens, then multiplies, a
// barrier between). Every variant computes the same bits (the same products summed in the same
// order); the launchers take the first that fits the device's shared memory per block: 4
// stages on Hopper (196,608 bytes bf16, 199,680 FP8), 2 stages and one widened tile on sm_120
// and sm_121 (98,304 bytes bf16, 101,376 FP8: their whole limit).
struct MoeGemmVariant {
  int stages, wide_tiles;
};
constexpr MoeGemmVariant kMoeGemmVariants[] = {{4, 2}, {2, 1}};
constexpr int kMoeGemmNumVariants = sizeof(kMoeGemmVariants) / sizeof(kMoeGemmVariants[0]);
// FP8 weights: the stages, then the widened bf16 B tiles, then the block's scale table
// [3][kMaxFp8GemmK / 128] (f32).
constexpr size_t moe_gemm_smem_bytes(bool fp8, MoeGemmVariant v) {
  return v.stages * moe_gemm_stage_bytes(fp8) +
         (fp8 ? v.wide_tiles * size_t{kMoeGemmBN} * kMoeGemmBK * 2 + 3 * size_t{kMaxFp8GemmK / 128} * sizeof(float)
              : 0);
}
// The index in kMoeGemmVariants of the variant launched where a block may have max_smem bytes;
// -1 when none fits.
constexpr int moe_gemm_variant(bool fp8, size_t max_smem) {
  for (int i = 0; i < kMoeGemmNumVariants; ++i)
    if (moe_gemm_smem_bytes(fp8, kMoeGemmVariants[i]) <= max_smem) return i;
  return -1;
}
// The warpgroup-MMA kernel (sm_90a, bf16): the first variant's stages and up to 1,024 bytes to
// align them.
constexpr size_t kMoeWgmmaSmemBytes = moe_gemm_smem_bytes(false, kMoeGemmVariants[0]) + 1024;
constexpr int kMoeWgmmaStages = kMoeGemmVariants[0].stages;

// ---- attention_prefill.cu: Q (row_frags x 64 rows), one K and one V tile of `keys` rows,
// rows of D + 8 bf16; an fp8 cache (cache_bytes 1) adds a staging tile of D bytes a row for K
// and for V ----
constexpr size_t prefill_smem_bytes(int D, int cache_bytes, int row_frags, int keys) {
  return size_t(row_frags * 64 + 2 * keys) * (D + 8) * 2 + (cache_bytes == 1 ? size_t{2} * keys * D : 0);
}
// The tile the launcher takes: 32-key tiles and one row fragment a warp at D = 256 (its output
// alone is 128 registers); else two row fragments (128 query rows a block) where a sequence has
// more than 64 query tokens, 64-key tiles (measured: docs/performance.md).
struct PrefillTile {
  int row_frags, keys;
};
constexpr PrefillTile prefill_tile(int D, bool long_query) {
  return D == 256 ? PrefillTile{1, 32} : long_query ? PrefillTile{2, 64} : PrefillTile{1, 64};
}

// ---- qkv_prologue.cu: a warp per head, the head's D floats in shared memory ----
constexpr int kQkvPrologueHeads = 4;  // heads (warps) a block
constexpr size_t qkv_prologue_smem_bytes(int D) { return size_t{kQkvPrologueHeads} * D * sizeof(float); }

// ---- linear_attn.cu: the chunked gated delta rule's kernels (see there). At Dk = Dv = 128 the
// three layouts take 99,264, 78,080 and 97,536 bytes: each under sm_120's 101,376, as buffers
// that are dead by the time another is first written share their bytes (a union) ----
namespace gdr {

using bf16 = __nv_bfloat16;
constexpr int kBT = 64;  // tokens a chunk

// Shared-memory leading dimensions (elements): rows stay 32-byte aligned for WMMA, banks shift.
template <int D>
constexpr int ld_bf16() {
  return D + 8;
}
template <int D>
constexpr int ld_f32() {
  return D + 4;
}

// 2. WY representation.
template <int DK, int DV>
struct WySmem {
  bf16 k[kBT][ld_bf16<DK>()];     // normalised keys
  bf16 kb[kBT][ld_bf16<DK>()];    // beta k exp(gc)
  bf16 vb[kBT][ld_bf16<DV>()];    // beta v
  union {                         // A until T is built (then a barrier), then the stage tiles
    float A[kBT][ld_f32<kBT>()];  // k k^T, then the strictly lower A
    float stage[4][256];          // a warp's W or U tile on its way to global memory
  };
  float Tf[kBT][kBT + 1];         // (I + A)^-1
  float X[kBT / 16 - 1][16][17];  // the blocked inverse's sums
  bf16 Tb[kBT][ld_bf16<kBT>()];   // the same in bf16
  float gc[kBT], beta[kBT];
};

// 3. The state pass: a 32-column slice of the state.
template <int DK, int DV>
struct StateSmem {
  float hf[DK][ld_f32<32>()];   // the state slice in f32 (load / store staging)
  bf16 hb[DK][ld_bf16<32>()];   // the state slice as an mma operand
  bf16 w[kBT][ld_bf16<DK>()];   // -W of the chunk
  bf16 kd[kBT][ld_bf16<DK>()];  // k exp(gc_last - gc)
  float vf[kBT][ld_f32<32>()];  // U, then V = U - W H
  bf16 vb[kBT][ld_bf16<32>()];  // V as an mma operand
  float gc[kBT];
};

// 4. Outputs: 64 value columns.
template <int DK>
struct OutSmem {
  union {                          // q until q k^T is computed (then a barrier), then pb
    bf16 q[kBT][ld_bf16<DK>()];    // normalised, scaled q
    bf16 pb[kBT][ld_bf16<kBT>()];  // the decayed causal q k^T
  };
  bf16 qd[kBT][ld_bf16<DK>()];  // q exp(gc)
  bf16 k[kBT][ld_bf16<DK>()];   // normalised k
  bf16 h[DK][ld_bf16<64>()];    // the state at the chunk's start, 64 value columns
  bf16 v[kBT][ld_bf16<64>()];   // V of the chunk, 64 value columns
  float p[kBT][ld_f32<64>()];   // q k^T, then the outputs
  float gc[kBT];
};

}  // namespace gdr

}  // namespace tessera::cuda
