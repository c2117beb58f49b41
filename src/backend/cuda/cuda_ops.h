// Host-side pieces of the CUDA backend shared by its files: error checks that
// become tessera::Error and the launcher declarations (llama.cpp style: each
// op is a static kernel, a launcher taking a stream, and an entry in CudaBackend).
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_options.h"
#include "core/dtype.h"

namespace tessera::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* what, const char* file, int line);

#define TCUDA_CHECK(call)                                                                        \
  do {                                                                                           \
    cudaError_t err_ = (call);                                                                   \
    if (err_ != cudaSuccess) ::tessera::cuda::throw_cuda_error(err_, #call, __FILE__, __LINE__); \
  } while (0)
#define TCUBLAS_CHECK(call)                                                                                \
  do {                                                                                                     \
    cublasStatus_t st_ = (call);                                                                           \
    if (st_ != CUBLAS_STATUS_SUCCESS) ::tessera::cuda::throw_cublas_error(st_, #call, __FILE__, __LINE__); \
  } while (0)
// After every launch: a bad configuration shows here, a fault at the next sync.
#define TCUDA_LAUNCH_CHECK() TCUDA_CHECK(cudaGetLastError())

// Device-side error flags, raised by kernels that meet bad input (token id out of
// the vocabulary...) and turned into an Error at the next synchronize().
enum DeviceError : int {
  kErrNone = 0,
  kErrTokenId = 1,
  kErrGatherIndex = 2,
  kErrRopePosition = 3,
  kErrKvSlot = 4,
  kErrMoeGridBarrier = 5,
};

inline bool is_float_dtype(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kF8E4M3 || t == DType::kF8E5M2;
}

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Shared memory: launchers whose kernels take more than 48 KiB a block have a last parameter
// max_smem, the bytes a block may opt into on the device (cudaDevAttrMaxSharedMemoryPerBlockOptin),
// and launch the largest variant of their kernel that fits it (kernel_smem.h has the layouts;
// scripts/ptxas_report.sh checks them per architecture). The default is Hopper's; sm_120 and
// sm_121 (RTX 5090, DGX Spark) allow kBlackwellDesktopMaxSmem. Where no variant fits, a void
// launcher throws Error (kUnsupported) before queuing anything and a bool one returns false.
constexpr size_t kHopperMaxSmem = 232448;
constexpr size_t kBlackwellDesktopMaxSmem = 101376;

// ---- launchers (elementwise.cu) ----
void launch_fill(void* dst, DType t, int64_t n, float value, cudaStream_t s);
void launch_fill_random(void* dst, DType t, int64_t n, uint64_t seed, float low, float high, cudaStream_t s);
void launch_cast(const void* src, DType st, void* dst, DType dt, int64_t n, cudaStream_t s);
// out[i] = x[idx[i] - begin] row by row (row_bytes each); an index outside [begin, begin +
// num_rows) raises err_code, or gives a zero row when zero_outside.
void launch_gather_rows(const void* x, const int32_t* idx, void* out, int64_t n, int64_t row_bytes, int64_t num_rows,
                        int err_code, int* err, cudaStream_t s, int64_t begin = 0, bool zero_outside = false);
void launch_rms_norm(const void* x, DType xt, const void* w, DType wt, void* out, int64_t rows, int64_t D, float eps,
                     cudaStream_t s);
void launch_add_rms_norm(void* x, void* residual, DType t, const void* w, DType wt, int64_t rows, int64_t D, float eps,
                         cudaStream_t s);
void launch_silu_mul(const void* gate_up, void* out, DType t, int64_t T, int64_t I, cudaStream_t s);
void launch_add(const void* a, const void* b, void* out, DType t, int64_t n, cudaStream_t s);
void launch_add_bias(void* out, DType ot, const void* bias, DType bt, int64_t M, int64_t N, cudaStream_t s);
void launch_rope(void* q, void* k, DType t, const int32_t* positions, const float* cos_sin, int64_t T, int Hq, int Hk,
                 int D, int rotary_dim, bool neox, int64_t max_pos, int* err, cudaStream_t s);
void launch_write_kv(const void* k, const void* v, DType in_t, void* k_cache, void* v_cache, DType cache_t,
                     const int32_t* slot_mapping, int64_t T, int64_t row, int64_t num_slots, float k_scale,
                     float v_scale, int* err, cudaStream_t s);

// ---- attention prologue on a fused QKV projection (qkv_prologue.cu) ----
struct QkvPrologueArgs {
  const void* qkv;              // bf16 [T, (Hq + 2 Hk) * D]
  const void *q_norm, *k_norm;  // bf16 [D] or null
  float eps;
  const int32_t* positions;  // [T]
  const float* cos_sin;      // [max_pos, rotary_dim]
  int rotary_dim;
  bool neox;
  int64_t max_pos;
  void *k_cache, *v_cache;  // [num_blocks, block_size, Hk, D] in the cache dtype
  const int32_t* slots;     // [T]; -1 skips the KV write
  int64_t num_slots;
  float inv_k_scale, inv_v_scale;
  void* q_out;  // bf16 [T, Hq, D]
  int Hq, Hk, D;
  int* err;
};
void launch_qkv_prologue(const QkvPrologueArgs& a, int64_t T, DType cache_t, cudaStream_t s);

// ---- sampling (sampling.cu): backend/sampling.h's rule, one block per row ----
// rows: device array of n tessera::SamplingRow.
void launch_sample(const float* logits, int64_t n, int64_t V, const void* rows, int32_t* out, cudaStream_t s);
// Backend::shard_argmax (logits [n, Vs], the first `width` columns counted; out [n, 2]) and
// Backend::merge_shard_argmax (pairs [S, m, 2]; rows nullptr: rows 0..m-1 of logits [., V]).
void launch_shard_argmax(const float* logits, int64_t n, int64_t Vs, int64_t width, int64_t first, int32_t* out,
                         cudaStream_t s);
void launch_merge_shard_argmax(const int32_t* pairs, int S, int64_t m, const int32_t* rows, float* logits, int64_t V,
                               cudaStream_t s);
// Backend::apply_token_mask: rows[k] of logits [., V] -> -inf where bit t of mask row k ([m, W] words) is clear.
void launch_apply_token_mask(float* logits, int64_t V, const uint32_t* mask, int64_t m, int64_t W, const int32_t* rows,
                             cudaStream_t s);
// Backend::accept_drafts and Backend::draft_positions (block_tables [S, W]).
void launch_accept_drafts(const int32_t* sampled, const int32_t* tokens, int S, int q, int32_t* rows, cudaStream_t s);
void launch_draft_positions(const int32_t* rows, const int32_t* positions, const int32_t* slot_mapping,
                            const int32_t* tables, int S, int q, int W, int block_size, int ahead, int32_t* out_pos,
                            int32_t* out_slot, int32_t* out_len, cudaStream_t s);

// ---- attention (attention_*.cu) ----
struct PagedAttentionArgs {
  const void* q;        // bf16 [T, Hq, D]
  const void* k_cache;  // [num_blocks, block_size, Hk, D]
  const void* v_cache;
  void* out;  // bf16 [T, Hq, D]
  const int32_t* query_start_loc;
  const int32_t* seq_lens;
  const int32_t* block_tables;
  int num_seqs, num_tokens, Hq, Hk, D, block_size, max_blocks_per_seq;
  float scale, k_scale, v_scale;
  DType cache_dtype;
  // Sliding window W (0: none): the query at position p attends the keys at p - W < k <= p, and no
  // kernel reads a cache block wholly before p - W + 1.
  int window = 0;
};
bool decode_attention_supported(int D, DType cache_dtype);
bool prefill_attention_supported(int D, DType cache_dtype);
// Token-parallel split-K attention, each token over its own causal range. max_query: skip the
// tokens of sequences with more query tokens than this (the prefill kernel takes them).
// workspace: float[num_tokens * Hq * num_splits * (D + 2)]. fused: also do the attention
// prologue (launch_qkv_prologue's work) in the same kernel, for steps where every sequence
// has one query token (a.q and fused->q_out are not used); nullptr: a.q is ready.
// heads_per_block: query heads of one kv head's group that a block takes (1, 2, 4 or 8; 0: the
// measured rule of decode_attention_heads_per_block). Every choice gives the same bits.
int decode_attention_num_splits(int num_tokens, int Hk, int group, int max_seq_len, int num_sms);
int decode_attention_heads_per_block(int num_tokens, int group);
// early_merge: the attention kernel lets the merge kernel launch at its start (programmatic dependent
// launch), so the merge waits resident instead of launching when the attention ends; the same bits.
void launch_decode_attention(const PagedAttentionArgs& a, int num_splits, int max_query, float* workspace,
                             const QkvPrologueArgs* fused, cudaStream_t s, int heads_per_block, bool early_merge);
// FlashAttention-2 style over the paged cache; the sequences of at most skip_upto query tokens
// are left to the decode kernel (0: none). Its tiles take at most 86,016 bytes of shared memory
// (kernel_smem.h): every max_smem of sm_90, sm_120 and sm_121.
void launch_prefill_attention(const PagedAttentionArgs& a, int max_query_len, int skip_upto, cudaStream_t s,
                              size_t max_smem = kHopperMaxSmem);
// Fallback for head dims / cache dtypes the two kernels above do not cover (slow, exact).
bool generic_attention_supported(int D);
void launch_generic_attention(const PagedAttentionArgs& a, cudaStream_t s);

// ---- linear attention, Gated DeltaNet (linear_attn.cu) ----
// Causal depthwise conv1d (kernel 4) + SiLU, bf16 x/out, weight [C, 4] bf16 or f32, state
// [num_slots, 3, C] f32 or bf16. max_query_len <= 64: one kernel (the decode step); longer:
// a second kernel writes the conv states. token_slots (speculative decoding, else null): [T], as
// GatedDeltaRuleArgs::token_slots (a per-token sequence must be at most 64 tokens).
void launch_causal_conv1d(const void* x, int64_t X, int64_t x_col, const void* w, DType wt, void* state, DType st,
                          const int32_t* qsl, const int32_t* slots, const int32_t* has_init, const int32_t* token_slots,
                          void* out, int C, int S, int max_query_len, cudaStream_t s);
// out[t, h] = rms_norm(x[t, h]) * w * silu(z[t, z_col + h*D ...]); bf16 x, z, out.
void launch_gated_rms_norm(const void* x, const void* z, int64_t Z, int64_t z_col, const void* w, DType wt, void* out,
                           int64_t T, int H, int D, float eps, cudaStream_t s);
struct GatedDeltaRuleArgs {
  const void* qkv;  // bf16 [T, 2*Hk*Dk + Hv*Dv] (conv output: q heads, k heads, v heads)
  const void* ba;   // bf16 [T, ba_stride]: b at ba_col + h, a at ba_col + Hv + h
  int64_t ba_stride, ba_col;
  const void *A_log, *dt_bias;  // [Hv], both of param_t (f32 or bf16)
  DType param_t;
  void* state;  // [num_slots, Hv, Dk, Dv] of state_t (f32 or bf16)
  DType state_t;
  const int32_t *qsl, *slots, *has_init;  // [S+1], [S], [S]
  // Speculative decoding (null otherwise): [T], the slot that gets the state after token t
  // (-1 none). A sequence whose last token's entry is not its own slot writes only there
  // (recurrent path only); the others write their final state in place as usual.
  const int32_t* token_slots;
  // Recurrent path (null: none): [S], 1 = leave sequence s alone (the chunked path of the same
  // step takes it).
  const int32_t* skip_seqs;
  void* out;  // bf16 [T, Hv, Dv]
  int num_seqs, Hk, Hv, Dk, Dv;
  float scale;  // 1 / sqrt(Dk)
  // Chunked path only (gdr_carve_workspace fills the buffers):
  const int32_t* chunks;      // [num_chunks, 3]: first token, length (<= 64), sequence
  const int32_t* seq_chunks;  // [S+1]: sequence s owns chunks [seq_chunks[s], seq_chunks[s+1])
  int num_chunks;
  __nv_bfloat16 *qn, *kn;       // [num_chunks, Hk, 64, Dk]
  __nv_bfloat16 *w, *u, *vnew;  // [num_chunks, Hv, 64, Dk / Dv / Dv]
  __nv_bfloat16* hs;            // [num_chunks, Hv, Dk, Dv]: the state at each chunk's start
  float *g, *beta, *gc;         // [num_chunks, Hv, 64]
};
bool gdr_recurrent_supported(int Dk);
bool gdr_chunked_supported(int Dk, int Dv);
size_t gdr_chunked_workspace_bytes(int64_t num_chunks, int Hk, int Hv, int Dk, int Dv);
// Points a's chunked-path buffers into ws (gdr_chunked_workspace_bytes of it, 256-byte aligned).
void gdr_carve_workspace(GatedDeltaRuleArgs& a, void* ws);
// chunked: the four-kernel tensor-core prefill (needs gdr_chunked_supported and the chunk
// tables); else the recurrent kernel walks every sequence's tokens (decode: one launch). The
// chunked kernels take at most 99,264 bytes of shared memory a block (kernel_smem.h): every
// max_smem of sm_90, sm_120 and sm_121.
void launch_gated_delta_rule(const GatedDeltaRuleArgs& a, bool chunked, cudaStream_t s,
                             size_t max_smem = kHopperMaxSmem);
// The chunked path alone (gdr_chunked.cu), for launch_gated_delta_rule (linear_attn.cu).
void launch_gdr_chunked(const GatedDeltaRuleArgs& a, cudaStream_t s, size_t max_smem);

// ---- skinny GEMM for decode (gemv.cu) ----
// Programmatic dependent launch for the decode-path kernels (device_utils.cuh): off until a
// backend sets it for the process (its architecture has PDL and CudaOptions::pdl is on).
bool pdl_enabled();
void set_pdl_enabled(bool on);

constexpr int64_t kMaxGemvRows = 4;  // measured: at M = 8 x's reloads make cuBLASLt faster
// out[M,N] = x[M,K] @ w[N,K]^T for M <= kMaxGemvRows, bf16 x and w (16-byte aligned, K % 8 == 0),
// bf16 or f32 out. Returns false (nothing queued) for shapes it does not take.
bool launch_gemv(const void* x, const void* w, void* out, DType out_t, int64_t M, int64_t N, int64_t K, int num_sms,
                 cudaStream_t s);

// ---- FP8 block-scaled linear (fp8_gemm.cu, gemm.cpp): w e4m3 [N, K] with f32 scales
// [ceil(N/128), ceil(K/128)] (Tensor::block_scale) ----
constexpr int64_t kMaxFp8GemvRows = 16;
// out[M,N] = x[M,K] @ dequant(w)^T for M <= kMaxFp8GemvRows, bf16 x (16-byte aligned, K % 16 == 0),
// bf16 or f32 out; the scales applied in the dot product. Returns false (nothing queued) otherwise.
bool launch_fp8_gemv(const void* x, const void* w, const float* scale, void* out, DType out_t, int64_t M, int64_t N,
                     int64_t K, cudaStream_t s);
// Per-token activation quantisation (K % 128 == 0): q e4m3 [M, K], scale f32 [K/128][M] (M-major),
// scale = amax / 448 of each 128 columns of a row (1 for all-zero ones), q = x / scale.
void launch_quantize_act_fp8(const void* x, void* q, float* scale, int64_t M, int64_t K, cudaStream_t s);
// out bf16 [N, K] = dequant(w): the prefill fallback where cuBLASLt has no block-scaled algorithm.
void launch_dequant_fp8(const void* w, const float* scale, void* out, int64_t N, int64_t K, cudaStream_t s);
// W8A16 above the GEMV's rows (bf16 activations: the arithmetic of the GEMV and of the CPU
// backend, block scales applied to f32 sums of exact e4m3 x bf16 products, so a row's result
// does not depend on how many rows share the call beyond the order of f32 sums). Both write f32
// partials [splits, M, N] over K slices and add them with launch_f32_partials_sum; x and w
// 16-byte aligned, K % 16 == 0, bf16 or f32 out; false (nothing queued) for what they do not take.
constexpr int kMaxFp8W16Splits = 16;
// 17 .. kMaxFp8SmallRows rows (decode batches, speculative verification): the MMA GEMV's maths
// with x staged in shared memory for 64 output rows a block (fp8_gemm.cu), always through the
// partials (fp8_w16_small_splits K slices).
constexpr int64_t kMaxFp8SmallRows = 64;
int fp8_w16_small_splits(int64_t N, int64_t K);
bool launch_fp8_w16_small(const void* x, const void* w, const float* scale, void* out, DType out_t, int64_t M,
                          int64_t N, int64_t K, int splits, float* partials, cudaStream_t s);
// Any M: moe_gemm.cu's tensor-core GEMM with one group (each weight tile widened to bf16 in
// shared memory, the scales on the accumulators); the partials only where fp8_w16_gemm_splits
// splits K (few 128 x 256 tiles), `partials` may be null otherwise. Every max_smem it fits gives
// the same bits; false where none fits (the caller's fallbacks take the product).
constexpr int64_t kMaxFp8GemmK = 32768;  // K (and an FP8 expert's H and I) the tensor-core FP8 GEMM takes
int fp8_w16_gemm_splits(int64_t M, int64_t N, int64_t K, int num_sms);
bool launch_fp8_w16_gemm(const void* x, const void* w, const float* scale, void* out, DType out_t, int64_t M, int64_t N,
                         int64_t K, int splits, float* partials, cudaStream_t s, size_t max_smem = kHopperMaxSmem);
// out (bf16 or f32) [n] = the sum of `splits` f32 partials [splits][n], added in order (split-K
// kernels: the same bits every run).
void launch_f32_partials_sum(const float* partials, void* out, DType out_t, int64_t n, int splits, cudaStream_t s);

// ---- mixture of experts (moe.cu, moe_gemm.cu; Backend::moe_* say what they compute) ----
// Router softmax + top-k, one warp per token with the row in registers: E <= kMoeMaxExperts,
// k <= 32, T < 2^31.
void launch_moe_topk(const float* logits, int64_t T, int E, int k, bool renormalize, int32_t* ids, float* weights,
                     cudaStream_t s);
constexpr int kMoeMaxExperts = 1024;     // experts per rank (one routing block counts them)
constexpr int kMoeDecodeMaxPairs = 256;  // T * k up to this: the decode (grouped GEMV) path
constexpr int kMoeTileM = 128;           // rows of a grouped-GEMM tile (routing counts tiles of this)
struct MoeArgs {
  const void* x;        // bf16 [T, H]
  const void* gate_up;  // bf16 [E_local, 2I, H], or e4m3 with gate_up_scale
  const void* down;     // bf16 [E_local, H, I], or e4m3 with down_scale
  // FP8 experts (both or neither): f32 scales per 128 x 128 block of each expert's matrix,
  // [E_local, ceil(2I / 128), ceil(H / 128)] and [E_local, ceil(H / 128), ceil(I / 128)]
  // (Tensor::block_scale); H and I multiples of 16. Null: bf16 experts.
  const float* gate_up_scale = nullptr;
  const float* down_scale = nullptr;
  const int32_t* ids;    // [T, k]
  const float* weights;  // [T, k]
  void* out;             // bf16 [T, H]
  int T, k, H, I, E_local, expert_begin;
};
// A shared expert (Backend::MoeSharedExpert) folded into the decode kernels: bf16 gate_up [2I, H],
// down [H, I], gate [1, H] or null.
struct MoeFusedShared {
  const void *gate_up, *down, *gate;
  // FP8 (e4m3) gate_up and down: their 128 x 128 block scales (null: bf16). Only the one-token FP8
  // kernels take an FP8 shared expert.
  const float* gate_up_scale = nullptr;
  const float* down_scale = nullptr;
};
// Decode: act bf16 [T*k, I] and y bf16 [T*k, H] are workspace. Three launches: gate_up GEMV
// with SiLU*up, down GEMV, combine; each expert's weights are read once per pass over its tokens
// (4 a pass; FP8 on `fp8_kernel` kMma: widened to bf16 for tensor-core MMAs, 16 a pass; f32
// accumulation either way).
// bf16 experts at T = 1 take two kernels unless one_token is kGrouped (CudaMoeOneToken; the down
// GEMV writes out, y is unused); FP8 experts on kMma at T = 1 the one-token form of their kernels
// unless fp8_one_token is kGrouped (CudaMoeFp8OneToken).
// shared (bf16, the routed experts' I; act then holds T*k + 1 rows): at T = 1 on the bf16 one-token
// kernels the shared expert is their pair k, scaled by its sigmoid gate in the down kernel's combine;
// returns whether it was (else the caller adds it).
bool launch_moe_decode(const MoeArgs& a, void* act, void* y, cudaStream_t s, CudaMoeFp8Decode fp8_kernel,
                       CudaMoeOneToken one_token, CudaMoeFp8OneToken fp8_one_token, const MoeFusedShared* shared);
// Decode in one persistent kernel (moe_fused.cu; CudaMoeDecode::kFused*; kSplit is launch_moe_decode).
// sync: moe_decode_sync_ints(H) u32, zero before the first launch and left zero by every launch
// (grid barrier and per-row-group counters); err: the device error flag (kErrMoeGridBarrier).
struct MoeDecodeWorkspace {
  void *act, *y;  // bf16 [T*k, I] and [T*k, H]
  unsigned* sync;
  int* err;
};
int64_t moe_decode_sync_ints(int64_t H);
// The router's top-k folded into the decode kernels (Backend::moe_topk_experts): a.ids and
// a.weights are then outputs (written as moe_topk writes them). E <= 256, k <= min(E, 32).
struct MoeFusedTopk {
  const float* logits;  // f32 [T, E]
  int E;
  bool renormalize;
};
bool moe_decode_fused_topk_supported(int E, int k);
// A shared expert folded into the fused kernel (MoeFusedShared, with the routed experts' I): act and
// y then hold T*k + T rows.
bool moe_decode_fused_shared_supported(CudaMoeDecode kind, int T, int k);
void launch_moe_decode_fused(const MoeArgs& a, const MoeDecodeWorkspace& ws, CudaMoeDecode kind, int num_sms,
                             cudaStream_t s, const MoeFusedTopk* fold = nullptr,
                             const MoeFusedShared* shared = nullptr);
// Prefill workspace (i32 unless said): expert_offsets and tile_offsets [E_local + 1],
// sorted_pair and pair_pos [T*k]; act bf16 [T*k, I]; y bf16 [T*k, H].
struct MoePrefillWorkspace {
  int32_t *expert_offsets, *tile_offsets, *sorted_pair, *pair_pos;
  void *act, *y;
};
// Routing on the device (counts, offsets, the permutation), the grouped GEMMs, the combine.
// bf16 experts with `wgmma` (sm_90 devices only): the warpgroup-MMA kernel; else mma.sync.
// FP8 experts: each weight tile is widened to bf16 in shared memory (exact) and runs the
// mma.sync GEMM, the 128 x 128 block scales applied to its f32 accumulators. Every max_smem
// the mma.sync GEMM fits gives the same bits (kernel_smem.h: its pipeline variants).
void launch_moe_prefill(const MoeArgs& a, const MoePrefillWorkspace& ws, bool wgmma, cudaStream_t s,
                        size_t max_smem = kHopperMaxSmem);
void launch_moe_route(const MoeArgs& a, int32_t* expert_offsets, int32_t* tile_offsets, int32_t* sorted_pair,
                      int32_t* pair_pos, cudaStream_t s);
// out[t] = sum_j weights[t,j] * y[row(t,j)] (see moe.cu); pair_pos null: y is indexed by pair.
// shared (T = 1): y row k holds the shared expert's output, added scaled by its sigmoid gate.
void launch_moe_combine(const MoeArgs& a, const void* y, const int32_t* pair_pos, cudaStream_t s,
                        const MoeFusedShared* shared = nullptr);
// out = x * sigmoid(gate[i / row]) over n elements (row = 1: elementwise); bf16 or f32.
void launch_sigmoid_mul(const void* x, const void* gate, void* out, DType t, int64_t n, int64_t row, cudaStream_t s);

// ---- GEMM (gemm.cpp) ----
class Gemm {
 public:
  explicit Gemm(int device);
  ~Gemm();
  // out[M,N] = x[M,K] @ w[N,K]^T; x, w bf16; out bf16 or f32.
  void run(const void* x, const void* w, void* out, DType out_t, int64_t M, int64_t N, int64_t K, cudaStream_t s);
  // The block-scaled FP8 product on Hopper (cuBLAS >= 12.9, sm_90): out[M,N] = (xq * x_scale) @
  // (w * w_scale)^T with xq e4m3 [M,K] and x_scale f32 [K/128][M] (launch_quantize_act_fp8: the
  // VEC128_32F mode), w e4m3 [N,K] with w_scale f32 [N/128][K/128] (BLK128x128_32F). Needs
  // K % 128 == 0 and (K/128) % 4 == 0 (16-byte scale rows). Returns false, queuing nothing, when
  // cuBLASLt has no algorithm for it (other GPUs, older cuBLAS): the caller falls back.
  bool run_fp8_block(const void* xq, const float* x_scale, const void* w, const float* w_scale, void* out, DType out_t,
                     int64_t M, int64_t N, int64_t K, cudaStream_t s);
  // Per-tensor-scaled FP8 (the dense FP8 rate the block-scaled GEMM is compared with in
  // bench/kernels/fp8_gemm_bench): out = a_scale * b_scale * xq @ w^T, scales f32 on the device.
  bool run_fp8_tensor(const void* xq, const float* x_scale, const void* w, const float* w_scale, void* out, DType out_t,
                      int64_t M, int64_t N, int64_t K, cudaStream_t s);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace tessera::cuda
