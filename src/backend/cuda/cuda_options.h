// Kernel choices of the CUDA backend that stay selectable, for benchmarks and tests that run
// the variants side by side (bench/kernels/moe_bench, cuda_ops_test). The defaults here are the
// sm_90 row's; the architecture table (cuda_arch.h) changes those that differ on other GPUs.
// TESSERA_CUDA_OPTIONS="name=value,..." sets any of them for a whole process, read once
// (cuda_options.cpp, the backend's only reader of the environment). What each variant measured
// is in docs/performance.md. Plain C++ (no CUDA headers): host code and kernels both include it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

// How moe_experts runs its decode path (T * k <= 256 pairs); prefill always takes the grouped GEMM.
enum class CudaMoeDecode {
  kAuto,                  // production: kFusedTopkKernel for T = 2 with a shared expert to fold (Qwen3.5 /
                          // Qwen3-Next), and at T = 1 where CudaOptions::moe_one_token is kGrouped or the k experts
                          // hold under 8 MiB (latency-bound: the demo model); kSplit otherwise (measured with
                          // moe_bench --variants: docs/performance.md)
  kSplit,                 // three kernels: gate_up grouped GEMV (+ SiLU * up), down grouped GEMV, combine
                          // (after the top-k kernel)
  kFused,                 // one persistent kernel: the router's top-k (moe_topk_experts), gate_up, grid
                          // barrier, down (its first loads issued before the barrier), combine by the
                          // last warp of each row group
  kFusedTopkKernel,       // kFused with the top-k as its own kernel before it
  kFusedNoPrefetch,       // kFused without the down loads before the barrier
  kFusedSeparateCombine,  // kFused's top-k, gate_up and down, then the combine kernel of kSplit
};
inline constexpr CudaMoeDecode kAllCudaMoeDecode[] = {CudaMoeDecode::kSplit, CudaMoeDecode::kFused,
                                                      CudaMoeDecode::kFusedTopkKernel, CudaMoeDecode::kFusedNoPrefetch,
                                                      CudaMoeDecode::kFusedSeparateCombine};
inline const char* cuda_moe_decode_name(CudaMoeDecode v) {
  switch (v) {
    case CudaMoeDecode::kAuto:
      return "auto";
    case CudaMoeDecode::kSplit:
      return "split";
    case CudaMoeDecode::kFused:
      return "fused";
    case CudaMoeDecode::kFusedTopkKernel:
      return "fused_topk_kern";
    case CudaMoeDecode::kFusedNoPrefetch:
      return "fused_nopre";
    case CudaMoeDecode::kFusedSeparateCombine:
      return "fused_sepcomb";
  }
  return "?";
}

// The decode-path grouped GEMVs of FP8 experts (moe_experts with T * k <= 256 pairs).
enum class CudaMoeFp8Decode {
  kMma,        // tensor cores: per 64-column group a lane's 16 weights of two rows widened to bf16 once, the A
               // operand of bf16 m16n8k16 MMAs against 8 pairs' x (moe.cu, moe_gemv_fp8_mma_kernel)
  kCudaCores,  // moe_gemv_kernel: weights widened to f32, one FMA per weight and pair
};
inline constexpr CudaMoeFp8Decode kAllCudaMoeFp8Decode[] = {CudaMoeFp8Decode::kMma, CudaMoeFp8Decode::kCudaCores};
inline const char* cuda_moe_fp8_decode_name(CudaMoeFp8Decode v) {
  switch (v) {
    case CudaMoeFp8Decode::kMma:
      return "mma";
    case CudaMoeFp8Decode::kCudaCores:
      return "cuda_cores";
  }
  return "?";
}

// The decode path of bf16 experts at one token (T = 1: k pairs, each to its own expert), where
// the split path (CudaMoeDecode::kSplit) runs. Not kGrouped: two kernels instead of three (moe.cu,
// "decode: one token"): the gate_up GEMV finds its block's expert with one warp ballot (no
// routing preamble), and the down GEMV takes every selected expert's rows of a row group in one
// block and writes the combined output itself (no combine kernel). Bit for bit the grouped
// kernels' result. The variants differ in loads in flight and blocks per SM:
enum class CudaMoeOneToken {
  kGrouped,        // the grouped GEMVs and the combine kernel, as at every T
  kDeep,           // gate_up 8 loads per row in flight (2 blocks an SM), down 4 rows a warp
  kDeepOverlap,    // kDeep; gate_up lets the down GEMV launch once its loads are issued, and the down
                   // GEMV issues its first weight loads before it waits for gate_up's output
  kNarrow,         // gate_up 4 loads per row in flight (4 blocks an SM), down 2 rows a warp
  kNarrowOverlap,  // kNarrow with kDeepOverlap's early launch and loads
  kMixedOverlap,   // kNarrow's gate_up and kDeep's down, with kDeepOverlap's early launch and loads
  kWideOverlap,    // kMixedOverlap with gate_up 2 loads per row in flight at 6 blocks an SM, so that
                   // Qwen3-30B-A3B's 768 gate_up blocks (Qwen3.5-35B-A3B's 576) are resident at once:
                   // the default
};
inline constexpr CudaMoeOneToken kAllCudaMoeOneToken[] = {
    CudaMoeOneToken::kGrouped,    CudaMoeOneToken::kDeep,          CudaMoeOneToken::kDeepOverlap,
    CudaMoeOneToken::kNarrow,     CudaMoeOneToken::kNarrowOverlap, CudaMoeOneToken::kMixedOverlap,
    CudaMoeOneToken::kWideOverlap};
inline const char* cuda_moe_one_token_name(CudaMoeOneToken v) {
  switch (v) {
    case CudaMoeOneToken::kGrouped:
      return "grouped";
    case CudaMoeOneToken::kDeep:
      return "deep";
    case CudaMoeOneToken::kDeepOverlap:
      return "deep_overlap";
    case CudaMoeOneToken::kNarrow:
      return "narrow";
    case CudaMoeOneToken::kNarrowOverlap:
      return "narrow_overlap";
    case CudaMoeOneToken::kMixedOverlap:
      return "mixed_overlap";
    case CudaMoeOneToken::kWideOverlap:
      return "wide_overlap";
  }
  return "?";
}

// FP8 experts at one token (T = 1) on CudaMoeFp8Decode::kMma: the same kernels' maths and the same
// sums bit for bit, with the block's expert found by one warp ballot (no routing preamble) and one
// MMA column of pairs (fewer registers), so more weight loads stay in flight:
enum class CudaMoeFp8OneToken {
  kGrouped,   // the grouped kernels, as at every T
  kShallow,   // 4 groups of 64 columns in flight a lane, 3 blocks an SM
  kDeep,      // 8 groups in flight a lane, 2 blocks an SM
  kFine,      // kShallow's loads in blocks of 4 warps (a gate_up block 8 intermediate indices, a down
              // block 32 rows), 6 an SM: twice the blocks, so the SMs end more evenly
  kFineWide,  // kFine's blocks with 2 groups in flight a lane, 8 blocks an SM
  kFine10,    // kFine's blocks with 2 groups in flight a lane, 10 blocks an SM: the default
};
inline constexpr CudaMoeFp8OneToken kAllCudaMoeFp8OneToken[] = {
    CudaMoeFp8OneToken::kGrouped, CudaMoeFp8OneToken::kShallow,  CudaMoeFp8OneToken::kDeep,
    CudaMoeFp8OneToken::kFine,    CudaMoeFp8OneToken::kFineWide, CudaMoeFp8OneToken::kFine10};
inline const char* cuda_moe_fp8_one_token_name(CudaMoeFp8OneToken v) {
  switch (v) {
    case CudaMoeFp8OneToken::kGrouped:
      return "grouped";
    case CudaMoeFp8OneToken::kShallow:
      return "shallow";
    case CudaMoeFp8OneToken::kDeep:
      return "deep";
    case CudaMoeFp8OneToken::kFine:
      return "fine";
    case CudaMoeFp8OneToken::kFineWide:
      return "fine_wide";
    case CudaMoeFp8OneToken::kFine10:
      return "fine10";
  }
  return "?";
}

// "a, b, c": the names of an option's values (kAllCudaMoeOneToken with cuda_moe_one_token_name, ...).
template <typename E, size_t N>
std::string names_of(const E (&all)[N], const char* (*name)(E)) {
  std::string names;
  for (E d : all) names += (names.empty() ? "" : ", ") + std::string(name(d));
  return names;
}

// Sets *out to the value named v; false when no value has that name.
template <typename E, size_t N>
bool pick_named(std::string_view v, const E (&all)[N], const char* (*name)(E), E* out) {
  for (E d : all)
    if (v == name(d)) {
      *out = d;
      return true;
    }
  return false;
}

struct CudaOptions {
  CudaMoeDecode moe_decode = CudaMoeDecode::kAuto;
  // The MoE prefill of bf16 experts (the grouped GEMMs) on Hopper's warpgroup MMA (wgmma) where the
  // device is sm_90; false: the mma.sync kernel, which every device and FP8 experts take.
  bool moe_prefill_wgmma = true;
  CudaMoeFp8Decode moe_fp8_decode = CudaMoeFp8Decode::kMma;
  CudaMoeOneToken moe_one_token = CudaMoeOneToken::kWideOverlap;
  // At one token on the one-token kernels (bf16: moe_one_token; FP8: moe_fp8_one_token), a shared
  // expert of the routed experts' I and format (Qwen3.5, the flagship) is their pair k: gate_up
  // computes it in one more row of blocks, and the down GEMV (bf16) or the combine kernel (FP8) adds
  // it scaled by its sigmoid gate; false: the shared expert's own ops (two GEMVs, silu_mul, the gate's
  // GEMV, sigmoid_mul, add).
  bool moe_one_token_shared = true;
  CudaMoeFp8OneToken moe_fp8_one_token = CudaMoeFp8OneToken::kFine10;
  // Decode steps run the attention prologue (q/k norm, RoPE, KV write) inside the decode
  // attention kernel; false: two kernels (the op test compares both).
  bool fused_decode_attention = true;
  // Query heads of a kv head's group that one decode-attention block takes: 1, 2, 4 or 8; 0: by
  // the measured rule (decode_attention_heads_per_block in cuda_ops.h). The same bits either way.
  int decode_heads_per_block = 0;
  // Decode attention split over key slices: the attention kernel lets the merge kernel launch at its
  // start (it waits resident) instead of when the attention ends. The same bits either way.
  bool decode_early_merge = true;
  // Sequences with at most this many query tokens in a step (decode; speculative verification,
  // 1 + drafts) take the split-K decode attention kernel, each token over its own causal range;
  // longer ones the prefill kernel, whose grid has one block per query head and 64-row tile and
  // reads the whole context in each (a verification chunk over a long context left most SMs
  // idle). 1: only one-token sequences.
  int decode_attention_max_query = 16;
  // Prefill of the gated delta rule through the chunked tensor-core kernel where the head
  // dims allow; false: the recurrent kernel, token by token.
  bool chunked_gated_delta = true;
  // FP8 linear layers above the GEMV size through a dequantised bf16 weight copy instead of
  // cuBLASLt's block-scaled FP8 GEMM (the fallback where that has no algorithm).
  bool fp8_gemm_dequant = false;
  // FP8 linear layers from this many rows (tokens in the step) quantise their activations to e4m3
  // per token and 128 columns and run cuBLASLt's block-scaled FP8 GEMM (W8A8, the FP8 tensor-core
  // rate), except weights of at most fp8_small_max_weights up to 64 rows, where the small-M W8A16
  // kernel is faster. Below it they keep bf16 activations (W8A16) like the GEMV and the CPU
  // backend: the GEMV up to 16 rows, the small-M kernel up to 64, then the W8A16 tensor-core
  // GEMM. The default, 17, is the measured speed choice (docs/performance.md: at 20 and 64 rows
  // W8A8 is faster on the large projections, the W8A16 GEMM slower at every M); INT64_MAX keeps bf16 activations at
  // every size (each row then rounds as it does alone, up to the order of f32 sums).
  int64_t fp8_w8a8_min_rows = 17;
  // FP8 weights of at most this many bytes (N * K) take the small-M W8A16 kernel at 17-64 rows
  // whatever fp8_w8a8_min_rows says (measured faster than W8A8 there, docs/cuda.md "FP8 weights");
  // 0: never (fp8_gemm_bench's pure W8A8 column).
  int64_t fp8_small_max_weights = int64_t{1} << 23;
  // The scratch arena's first chunk (it grows on demand); at least 16.
  size_t initial_scratch_mib = 256;
  // Programmatic dependent launch of the decode-path kernels (device_utils.cuh) where the
  // architecture has it; false: plain launches (a kill switch for diagnosis).
  bool pdl = true;
  // moe_experts' decode path (grouped GEMVs) for T * k <= kMoeDecodeMaxPairs; false: the
  // grouped-GEMM (prefill) path at every T (A/B runs).
  bool moe_gemv = true;
};

// Applies "name=value,..." (TESSERA_CUDA_OPTIONS' syntax: bools as 0 / 1, integers, variants by
// their names) to `o`; the item arch=<profile> is skipped here (cuda_options_profile reads it).
// Fails naming the item: an unknown name (listing the known ones), a value of the wrong kind.
void apply_cuda_options(std::string_view text, CudaOptions& o);
// The value of the text's arch= item ("" when it has none): the architecture profile whose
// table row the backend takes (cuda_arch.h; "sm120" makes a Hopper GPU take sm_120's choices).
std::string cuda_options_profile(std::string_view text);
// The names apply_cuda_options knows, in table order, arch first.
std::vector<std::string> cuda_option_names();
// TESSERA_CUDA_OPTIONS of this process, "" when unset: the CUDA backend's one reading of the
// environment.
std::string cuda_options_from_env();

}  // namespace tessera
