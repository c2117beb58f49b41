// The compute interface every device implements. Model code calls only this; it
// never sees CUDA or BLAS. Ops are asynchronous on the backend's stream: they
// return once queued, and results are visible to the host after synchronize()
// (the CPU backend runs them at once, which is a legal schedule of that contract).
//
// Memory: `alloc` takes long-lived buffers (weights, KV cache) from the device;
// `scratch` takes per-step activations from an arena that `reset_scratch` rewinds
// at the start of every step, so the step loop never calls the device allocator.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/sampling_row.h"
#include "core/error.h"
#include "core/tensor.h"

namespace tessera {

// Per-step attention layout over a paged KV cache, in vLLM's terms. All index
// tensors live on the backend's device; host copies are kept for CPU kernels and
// for launch-size decisions.
struct AttentionMetadata {
  int num_seqs = 0;
  int num_tokens = 0;
  int max_query_len = 0;
  int max_seq_len = 0;
  int block_size = 16;
  int max_blocks_per_seq = 0;
  // KV cache groups (a model mixing full-attention and sliding-window layers): each has its own
  // block tables and slots, group g's S rows of block_tables and T entries of slot_mapping after
  // the groups before it. An attention op gets one group's (attention_group in
  // backend/attention_metadata.h), num_kv_groups 1.
  int num_kv_groups = 1;
  Tensor query_start_loc;  // i32 [S+1]: sequence s owns query tokens [qsl[s], qsl[s+1])
  Tensor seq_lens;         // i32 [S]: context length after this step (cached + new)
  Tensor block_tables;     // i32 [G*S, max_blocks_per_seq]: physical block ids
  Tensor slot_mapping;     // i32 [G*T]: block * block_size + offset where token t's K/V go; -1 skips
  std::vector<int32_t> host_query_start_loc, host_seq_lens, host_block_tables, host_slot_mapping;
  // The counts and sizes above alone (no tensors, no host copies; one group).
  AttentionMetadata sizes() const {
    AttentionMetadata r;
    r.num_seqs = num_seqs, r.num_tokens = num_tokens, r.max_query_len = max_query_len;
    r.max_seq_len = max_seq_len, r.block_size = block_size, r.max_blocks_per_seq = max_blocks_per_seq;
    return r;
  }
};

// Per-step layout of the sequences of a linear-attention (Gated DeltaNet) layer. Such a layer
// keeps a fixed-size state per sequence in a "state slot": row `slot` of the layer's conv state
// [num_slots, K-1, C] and recurrent state [num_slots, Hv, Dk, Dv] tensors, which the engine's
// cache manager allocates (backend.alloc) and assigns. Index tensors live on the backend's
// device; host copies serve CPU kernels and launch-size decisions (upload_linear_attn_metadata
// in backend/attention_metadata.h builds both).
struct LinearAttnMetadata {
  int num_seqs = 0;
  int num_tokens = 0;
  int max_query_len = 0;     // 1 on decode steps: the backends then run their decode kernels
  Tensor query_start_loc;    // i32 [S+1]: sequence s owns tokens [qsl[s], qsl[s+1]) of this step
  Tensor state_slots;        // i32 [S]: the sequence's state slot; < 0 = a padding sequence
  Tensor has_initial_state;  // i32 [S]: 1 = continue from the slot's state, 0 = start from zeros
  // Speculative decoding (undefined / empty otherwise): i32 [T], the slot that receives the
  // state after token t (conv and recurrent), -1 = none. When given, the state is written only
  // there (not back into state_slots[s]): a verification chunk keeps the state after each of
  // its tokens, and the engine keeps the one after the last accepted token. A slot here may be
  // the sequence's own state_slots[s] (its state is read before any write).
  Tensor token_state_slots;
  std::vector<int32_t> host_query_start_loc, host_state_slots, host_has_initial_state, host_token_state_slots;
};

// Whether sequence s keeps per-token states (token_state_slots: a verification chunk) other than
// its final state in its own slot (what a sequence without drafts in a speculative step asks
// for); from the host copies.
inline bool per_token_states(const LinearAttnMetadata& m, int s) {
  if (m.host_token_state_slots.empty()) return false;
  const int32_t t0 = m.host_query_start_loc[s], t1 = m.host_query_start_loc[s + 1];
  for (int32_t t = t0; t + 1 < t1; ++t)
    if (m.host_token_state_slots[t] >= 0) return true;
  return t1 > t0 && m.host_token_state_slots[t1 - 1] != m.host_state_slots[s];
}

// Rotary embedding table: for each position, cos then sin of each frequency
// ([max_positions, rotary_dim] f32), already multiplied by any YaRN attention factor.
struct RopeTable {
  Tensor cos_sin;
  int rotary_dim = 0;
  bool neox_style = true;  // rotate halves (HF Llama/Qwen) rather than interleaved pairs
};

// An instantiated capture of queued work (a CUDA graph), replayed as one launch.
class CapturedGraph {
 public:
  virtual ~CapturedGraph() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // dtype activations are computed in (f32 on CPU, bf16 on CUDA).
  virtual DType compute_dtype() const = 0;

  // ---- memory ----
  virtual Tensor alloc(Shape shape, DType dtype) = 0;
  virtual Tensor scratch(Shape shape, DType dtype) = 0;
  virtual void reset_scratch() = 0;
  // Scratch taken after a mark is released together by rewinding to it, so each
  // layer reuses the same activation memory within a step. Stream order makes this
  // safe on asynchronous devices. The default keeps everything until reset_scratch.
  virtual size_t scratch_mark() { return 0; }
  virtual void scratch_rewind(size_t mark) { (void)mark; }
  // Scratch bytes handed out since reset_scratch (0 where scratch is plain allocation).
  virtual size_t scratch_in_use() const { return 0; }

  // ---- graphs: work queued between begin_capture and end_capture is recorded, not run;
  // replay() runs it again with the same device pointers, so a caller writes the next
  // inputs into the same buffers before each replay. Host transfers, synchronize() and
  // growth of the scratch arena are not allowed while capturing.
  virtual bool supports_graphs() const { return false; }
  virtual void begin_capture() { fail(ErrorKind::kUnsupported, "{} cannot capture graphs", name()); }
  // Ends the capture; on failure the stream is back to normal and the Error says why.
  virtual std::unique_ptr<CapturedGraph> end_capture() { return nullptr; }
  virtual void replay(const CapturedGraph& graph) { (void)graph; }
  // Whether causal_conv1d and gated_delta_rule honour LinearAttnMetadata::token_state_slots
  // (speculative decoding on hybrid models needs it).
  virtual bool supports_token_state_slots() const { return false; }
  // Bytes the device could still give to alloc (for the memory planner); CPU reports host RAM.
  virtual size_t free_memory() const = 0;
  virtual size_t total_memory() const = 0;
  // The device shares the host's memory (an integrated GPU: DGX Spark's GB10): free_memory and
  // total_memory are the host's (device_memory in backend/host_memory.h) and the planner keeps
  // room for the OS (plan::kUnifiedOsReserve). False for the CPU backend and discrete GPUs.
  virtual bool unified_memory() const { return false; }
  // The device's free memory when this backend was created, before any weight: the memory
  // planner counts this process's growth since then as its own use, so processes that share a
  // GPU each count only theirs (engine/memory_plan.h, memory_in_use). 0 where the backend does
  // not record it: the CPU backend and a GPU that shares the host's memory, whose budgets come
  // from what the host has available.
  virtual size_t free_memory_at_start() const { return 0; }

  // ---- transfers (dst and src have equal nbytes) ----
  virtual void copy_from_host(const Tensor& dst, const void* src) = 0;
  virtual void copy_to_host(void* dst, const Tensor& src) = 0;
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;  // device to device
  virtual void fill_random(const Tensor& dst, uint64_t seed, float low, float high) = 0;
  virtual void fill(const Tensor& dst, float value) = 0;
  virtual void synchronize() = 0;

  // ---- ops; shapes in comments, T = tokens ----
  // out[T,H] = table[ids[t], :]
  virtual void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) = 0;
  // Rows of the last dimension: out = x / rms(x) * w
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) = 0;
  // residual += x; x = rms_norm(residual) * w  (both in place)
  virtual void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps) = 0;
  // out[T,N] = x[T,K] @ w[N,K]^T (+ bias[N])
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out) = 0;
  // out[T,I] = silu(gate_up[:, :I]) * gate_up[:, I:]
  virtual void silu_mul(const Tensor& gate_up, const Tensor& out) = 0;
  // out = a + b (same shape)
  virtual void add(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // Rotates the first rotary_dim of each head of q[T,Hq,D] and k[T,Hk,D] in place.
  virtual void rope(const Tensor& q, const Tensor& k, const Tensor& positions, const RopeTable& table) = 0;
  // Writes k,v [T,Hk,D] into caches [num_blocks, block_size, Hk, D] at slot_mapping.
  // Caches may be in a narrower dtype (fp8) with a per-tensor scale.
  virtual void write_kv(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                        const AttentionMetadata& meta, float k_scale, float v_scale) = 0;
  // The attention prologue on a fused QKV projection qkv[T, (Hq + 2*Hk) * D] (q heads, then
  // k, then v): q and k heads RMS-normed over D by q_norm / k_norm when given (Qwen3), rotated,
  // q written to q_out[T,Hq,D], k and v written into the caches at slot_mapping as write_kv.
  // Equivalent to splitting qkv and calling rms_norm, rope and write_kv, in one pass.
  virtual void qkv_prologue(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                            const Tensor& positions, const RopeTable& table, const Tensor& k_cache,
                            const Tensor& v_cache, const AttentionMetadata& meta, float k_scale, float v_scale,
                            const Tensor& q_out) = 0;
  // Causal attention of q[T,Hq,D] over the paged cache (which already holds this
  // step's keys); out[T,Hq,D]. GQA: head h reads kv head h / (Hq/Hk). sliding_window W > 0: the
  // query at position p attends only the keys at p - W < k <= p (the last W positions, its own
  // included), and reads no cache block wholly before p - W + 1 (a sliding-window cache manager may
  // have given those blocks away); 0 attends the whole context.
  virtual void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                               const AttentionMetadata& meta, float scale, float k_scale, float v_scale,
                               int sliding_window, const Tensor& out) = 0;
  // The attention of a fused QKV projection: qkv_prologue into a q of out's shape, then
  // paged_attention of that q into out. A backend may do both in one pass (CUDA, for steps
  // where every sequence has one query token; CudaOptions::fused_decode_attention = false keeps two kernels).
  virtual void qkv_attention(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                             const Tensor& positions, const RopeTable& table, const Tensor& k_cache,
                             const Tensor& v_cache, const AttentionMetadata& meta, float scale, float k_scale,
                             float v_scale, int sliding_window, const Tensor& out) {
    Tensor q = scratch(out.shape(), out.dtype());
    qkv_prologue(qkv, q_norm, k_norm, eps, positions, table, k_cache, v_cache, meta, k_scale, v_scale, q);
    paged_attention(q, k_cache, v_cache, meta, scale, k_scale, v_scale, sliding_window, out);
  }
  // ---- mixture of experts ----
  // Routing: softmax over each row of router_logits [T,E] (f32, computed in f32), the k largest
  // probabilities (ties go to the lower expert id), divided by their sum when `renormalize`
  // (norm_topk_prob). topk_ids i32 [T,k], topk_weights f32 [T,k], both in descending weight order.
  virtual void moe_topk(const Tensor& router_logits, int k, bool renormalize, const Tensor& topk_ids,
                        const Tensor& topk_weights) = 0;
  // The routed experts of x [T,H]:
  //   out[t] = sum_j topk_weights[t,j] * down[e] @ (silu(gate_up[e][:I] @ x[t]) * gate_up[e][I:] @ x[t]),
  //   e = topk_ids[t,j] - expert_begin,
  // over this rank's experts: gate_up [E_local, 2I, H] (gate rows, then up rows), down [E_local, H, I].
  // Ids outside [expert_begin, expert_begin + E_local) add nothing (expert parallel: the rank that
  // holds that expert adds it, and the caller's all-reduce sums the ranks). out is overwritten.
  // No host synchronisation on the routing results (decode steps run inside captured graphs).
  virtual void moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                           const Tensor& topk_weights, int expert_begin, const Tensor& out) = 0;
  // A shared expert every token goes through (Qwen2-MoE, Qwen3.5): gate_up [2Is, H] (gate rows,
  // then up rows), down [H, Is], gate [1, H] or null; it adds
  //   g_t * down @ (silu(gate_up[:Is] @ x[t]) * gate_up[Is:] @ x[t]),  g_t = sigmoid(gate . x[t]) or 1.
  struct MoeSharedExpert {
    const Tensor* gate_up;
    const Tensor* down;
    const Tensor* gate;
  };
  // moe_topk of router_logits into topk_ids / topk_weights, then moe_experts with them, then (when
  // `shared` is not null) the shared expert added to out: one call, so that a backend may fold the
  // routing and the shared expert into the expert kernels (CUDA decode: CudaMoeDecode).
  virtual void moe_topk_experts(const Tensor& router_logits, int k, bool renormalize, const Tensor& x,
                                const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                                const Tensor& topk_weights, int expert_begin, const Tensor& out,
                                const MoeSharedExpert* shared) {
    moe_topk(router_logits, k, renormalize, topk_ids, topk_weights);
    moe_experts(x, gate_up, down, topk_ids, topk_weights, expert_begin, out);
    if (shared) moe_shared_expert_add(x, *shared, out);
  }
  // out += the shared expert of x (MoeSharedExpert), with linear, silu_mul, sigmoid_mul and add.
  void moe_shared_expert_add(const Tensor& x, const MoeSharedExpert& shared, const Tensor& out) {
    const int64_t T = x.dim(0), I = shared.down->dim(1);
    Tensor gate_up = scratch({T, 2 * I}, compute_dtype());
    linear(x, *shared.gate_up, nullptr, gate_up);
    Tensor act = scratch({T, I}, compute_dtype());
    silu_mul(gate_up, act);
    Tensor y = scratch(out.shape(), out.dtype());
    linear(act, *shared.down, nullptr, y);
    if (shared.gate) {
      // The gate is computed from the whole x on every rank, so scaling each rank's partial
      // sum by it scales their total.
      Tensor g = scratch({T, 1}, compute_dtype());
      linear(x, *shared.gate, nullptr, g);
      sigmoid_mul(y, g, y);
    }
    add(out, y, out);
  }
  // out = x * sigmoid(gate). gate has x's shape, or [T, 1] (one gate per row, broadcast over the
  // row: the shared expert's gate). Gated attention uses the elementwise form. out may alias x.
  virtual void sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out) = 0;

  // ---- linear attention (Gated DeltaNet: Qwen3-Next, Qwen3.5) ----
  // Shapes: T tokens of S sequences (LinearAttnMetadata); Hk key heads of Dk, Hv value heads of
  // Dv (Hv a multiple of Hk; value head h reads key head h / (Hv/Hk), repeat_interleave); the
  // conv channels C = 2*Hk*Dk + Hv*Dv are the q heads, then the k heads, then the v heads.
  // (Qwen3-Next's in_proj_qkvz / in_proj_ba interleave these per key head: a model permutes
  // their rows at load into q | k | v | z and b | a.) A sequence whose slot is < 0 is padding
  // (CUDA-graph batches): its output rows are zeroed and no state is read or written; two
  // sequences of one step never share a slot; a step may mix prefill chunks and decode tokens.
  // The ops never synchronise with the host; a step whose sequences all have one token
  // (max_query_len == 1) reads no host metadata but num_seqs and num_tokens, so it can be
  // captured in a graph and replayed with new slots and inputs. States are f32 (default) or
  // bf16, read and written in their dtype; the math is f32. CUDA limits: conv kernel size 4;
  // key head dims 16, 32, 64, 128, 256; the chunked prefill needs Dk = Dv = 128 (else the
  // recurrent kernel walks the tokens).
  // LinearAttnMetadata::token_state_slots: see supports_token_state_slots.
  // Causal depthwise conv1d (kernel K) with SiLU over each sequence's tokens:
  //   out[t, c] = silu(sum_{j<K} weight[c, j] * in[p - (K-1) + j, c]),  p = t's index in its sequence,
  // where in[i] = x[row i of the sequence, x_col + c] for i >= 0 and, for i < 0, the slot's conv
  // state row K-1+i (the sequence's last K-1 inputs before this step, oldest first), or zero
  // without an initial state. Afterwards the slot holds the last K-1 inputs (state rows included
  // when the step has fewer than K-1 tokens). x [T, X] with x_col + C <= X (so a fused projection
  // row [q k v | z | b a] is read in place); weight [C, K] (HF conv1d.weight [C, 1, K] viewed) in
  // the compute dtype or f32; conv_state [num_slots, K-1, C]; out [T, C] in x's dtype.
  virtual void causal_conv1d(const Tensor& x, int64_t x_col, const Tensor& weight, const Tensor& conv_state,
                             const LinearAttnMetadata& meta, const Tensor& out) {
    fail(ErrorKind::kUnsupported, "{} has no causal_conv1d", name());
  }
  // The gated delta rule over each sequence's tokens, starting from the slot's recurrent state
  // (zeros without an initial state) and writing the final state back in place. Per token, value
  // head h, key head kh = h / (Hv/Hk):
  //   q = l2norm(q[kh]) / sqrt(Dk), k = l2norm(k[kh]), l2norm(x) = x / sqrt(sum x^2 + 1e-6);
  //   g = -exp(A_log[h]) * softplus(a[h] + dt_bias[h]), beta = sigmoid(b[h]);
  //   S = S * exp(g);  S += k (beta * (v[h] - S^T k))^T;  out[t, h] = S^T q      (S is [Dk, Dv])
  // qkv [T, C] is the conv output; ba [T, X]: b[t, h] = ba[t, ba_col + h], a[t, h] = ba[t, ba_col +
  // Hv + h]; A_log, dt_bias [Hv] (f32 or the compute dtype); state [num_slots, Hv, Dk, Dv];
  // out [T, Hv, Dv] in qkv's dtype. Sequences of several tokens run chunked (64 tokens, the WY
  // form of flash-linear-attention), single tokens the recurrent step: the same function.
  virtual void gated_delta_rule(const Tensor& qkv, const Tensor& ba, int64_t ba_col, const Tensor& A_log,
                                const Tensor& dt_bias, const Tensor& state, const LinearAttnMetadata& meta,
                                const Tensor& out) {
    fail(ErrorKind::kUnsupported, "{} has no gated_delta_rule", name());
  }
  // Gated RMSNorm per head of x [T, H, D]:
  //   out[t, h, :] = x[t, h, :] / sqrt(mean(x[t, h, :]^2) + eps) * w * silu(z[t, z_col + h*D + :]),
  // w [D]; z [T, Z] with z_col + H*D <= Z (the z part of a fused projection, read in place);
  // out [T, H, D] in x's dtype (may alias x).
  virtual void gated_rms_norm(const Tensor& x, const Tensor& z, int64_t z_col, const Tensor& w, float eps,
                              const Tensor& out) {
    fail(ErrorKind::kUnsupported, "{} has no gated_rms_norm", name());
  }

  // out[i,:] = x[indices[i], :]
  virtual void gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out) = 0;
  // Converts between float dtypes (same shape).
  virtual void cast(const Tensor& src, const Tensor& dst) = 0;
  // Vocab-parallel embedding: out[t] = table[ids[t] - begin] when begin <= ids[t] <
  // begin + rows(table), else zeros (another rank's slice; a TP all-reduce completes it).
  virtual void embedding_slice(const Tensor& ids, const Tensor& table, int64_t begin, const Tensor& out) = 0;
  // One token per row of logits [n, V] (f32) into out (i32 [n], this device), as
  // SamplingRow says; rows has n entries. Every backend draws the same way (see
  // backend/sampling.h), up to float rounding. A row whose logits hold a NaN or +inf gets -1
  // (kNoToken) instead of a token: the caller fails that request (NaN/Inf weights, an overflow).
  virtual void sample(const Tensor& logits, const std::vector<SamplingRow>& rows, const Tensor& out) = 0;
  // The greedy token of each row of logits [n, V] (f32) into out (i32 [n]): what sample() draws
  // with temperature 0 (the lowest id among equal maxima; -1 for a row with a NaN or +inf). The CUDA backend reads
  // nothing from the host here, so a captured graph may hold it (MTP drafting).
  virtual void argmax(const Tensor& logits, const Tensor& out);
  // Tensor parallelism's greedy rows (ParallelLmHead): the best token of each row of one
  // vocabulary shard. logits [n, Vs] (f32) holds the vocabulary's columns [first, first + Vs);
  // only the first `width` (<= Vs) count, the rest pad the vocabulary to a multiple of the TP
  // size. out (i32 [n, 2]) gets (the max's f32 bits, first + the lowest column holding it); a
  // row with a NaN or +inf among its counted columns gets (NaN, -1); width 0 gives (-inf,
  // INT32_MAX), which every other pair beats. The default runs on the host over copies; the
  // CUDA kernel reads nothing from the host, so a captured graph may hold it.
  virtual void shard_argmax(const Tensor& logits, int64_t width, int64_t first, const Tensor& out);
  // The shards' pairs merged into stand-in rows. pairs (i32 [S, m, 2]): shard s's pairs of m
  // rows (shard_argmax), shards in vocabulary order. The pick is the largest max, the lower id
  // among equal ones (what argmax of the whole row picks), -1 when a shard saw a NaN or +inf.
  // Row rows[k] of logits (f32 [n, V]) becomes -inf everywhere but at the picked id, which holds
  // the max (NaN at column 0 for -1), so that argmax and sample at temperature 0 take from it
  // the token they would take from the whole row. rows: i32 [m], or undefined for rows 0..m-1
  // (then graph-safe on CUDA, like shard_argmax).
  virtual void merge_shard_argmax(const Tensor& pairs, const Tensor& rows, const Tensor& logits);
  // Structured output's token masks, before sample(): for k < m, row rows[k] of logits [n, V] (f32) gets
  // -inf at every token t whose bit is clear in mask row k (i32 [m, W] of bit words: token t is bit t % 32
  // of word t / 32; t >= 32 W counts as clear). rows: i32 [m], distinct. The default runs on the host over
  // copies; the CUDA backend's kernel works in place.
  virtual void apply_token_mask(const Tensor& logits, const Tensor& mask, const Tensor& rows);
  // Speculative decoding's acceptance on the device. S sequences of q rows each (sequence s at
  // rows [s*q, s*q + q)): tokens[s*q + 1 + j] (i32) is its draft j, sampled[s*q + j] (i32) the
  // target's token at row j. rows (i32 [S]) gets s*q + the number of leading drafts equal to the
  // target's tokens: the row whose token follows the last accepted one. The default runs on the
  // host over copies (any backend); the CUDA backend's kernel reads nothing from the host, so a
  // captured graph may hold it.
  virtual void accept_drafts(const Tensor& sampled, const Tensor& tokens, int q, const Tensor& rows);
  // The inputs of an MTP pass `ahead` positions past each sequence's accepted row (rows, from
  // accept_drafts over the step's positions, slot_mapping (i32 [S*q]) and block_tables (i32
  // [S, W] of block_size)): out_positions[s] = positions[rows[s]] + ahead, out_slots[s] its KV
  // slot (-1 when its block is past W), out_seq_lens[s] = that position + 1. A padding sequence
  // (slot_mapping[s*q] < 0) gets position 0, slot -1 and length 1. Default and CUDA as above.
  virtual void draft_positions(const Tensor& rows, const Tensor& positions, const Tensor& slot_mapping,
                               const Tensor& block_tables, int q, int block_size, int ahead,
                               const Tensor& out_positions, const Tensor& out_slots, const Tensor& out_seq_lens);
};

struct BackendOptions {
  DeviceType type = DeviceType::kCPU;
  int device_index = 0;
  int num_threads = 0;  // CPU: 0 = all cores
};

// Creates the backend for `opts.type`; fails with a clear message when the build lacks it.
std::unique_ptr<Backend> make_backend(const BackendOptions& opts);
bool cuda_backend_available();

}  // namespace tessera
