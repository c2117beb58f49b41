// AttentionOps (attention_ops.h).
#include "backend/cuda/attention_ops.h"

#include <algorithm>
#include <string>

namespace tessera::cuda {

void AttentionOps::rope(const Tensor& q, const Tensor& k, const Tensor& positions, const RopeTable& table) {
  CUDA_REQUIRE(q.ndim() == 3 && k.ndim() == 3 && q.dim(0) == k.dim(0) && q.dim(2) == k.dim(2) &&
                   q.dtype() == k.dtype() && act(q),
               "rope", q.str() + ", " + k.str());
  CUDA_REQUIRE(positions.dtype() == DType::kI32 && positions.numel() == q.dim(0), "rope", "positions must be i32 [T]");
  CUDA_REQUIRE(table.cos_sin.dtype() == DType::kF32 && table.cos_sin.dim(1) == table.rotary_dim &&
                   table.rotary_dim <= q.dim(2) && table.rotary_dim % 2 == 0,
               "rope", "cos_sin table must be f32 [max_positions, rotary_dim]");
  dev_.need_cuda(table.cos_sin, "rope (cos/sin table)");
  dev_.need_cuda(positions, "rope");
  dev_.bind();
  launch_rope(q.raw(), k.raw(), q.dtype(), positions.data<int32_t>(), table.cos_sin.data<float>(), q.dim(0),
              static_cast<int>(q.dim(1)), static_cast<int>(k.dim(1)), static_cast<int>(q.dim(2)), table.rotary_dim,
              table.neox_style, table.cos_sin.dim(0), dev_.error_flag(), dev_.stream());
}

void AttentionOps::write_kv(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                            const AttentionMetadata& meta, float k_scale, float v_scale) {
  CUDA_REQUIRE(k.ndim() == 3 && k.numel() == v.numel() && k_cache.ndim() == 4 &&
                   k_cache.dim(2) * k_cache.dim(3) == k.dim(1) * k.dim(2) && k_cache.numel() == v_cache.numel() &&
                   k_cache.dtype() == v_cache.dtype(),
               "write_kv", k.str() + " -> " + k_cache.str());
  CUDA_REQUIRE(is_float_dtype(k_cache.dtype()) && act(k), "write_kv", "unsupported cache dtype " + k_cache.str());
  dev_.need_cuda(meta.slot_mapping, "write_kv (slot_mapping)");
  dev_.bind();
  launch_write_kv(k.raw(), v.raw(), k.dtype(), k_cache.raw(), v_cache.raw(), k_cache.dtype(),
                  meta.slot_mapping.data<int32_t>(), k.dim(0), k.dim(1) * k.dim(2), k_cache.dim(0) * k_cache.dim(1),
                  k_scale, v_scale, dev_.error_flag(), dev_.stream());
}

// The prologue's arguments, checked; q_out is null for the fused decode path.
QkvPrologueArgs AttentionOps::prologue_args(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                                            const Tensor& positions, const RopeTable& table, const Tensor& k_cache,
                                            const Tensor& v_cache, const AttentionMetadata& meta, float k_scale,
                                            float v_scale, const Tensor& q_out) {
  CUDA_REQUIRE(q_out.ndim() == 3 && k_cache.ndim() == 4 && qkv.dtype() == DType::kBF16 &&
                   q_out.dtype() == DType::kBF16 && k_cache.dim(3) == q_out.dim(2) &&
                   qkv.numel() == q_out.dim(0) * (q_out.dim(1) + 2 * k_cache.dim(2)) * q_out.dim(2) &&
                   k_cache.dtype() == v_cache.dtype() && is_float_dtype(k_cache.dtype()),
               "qkv_prologue", qkv.str() + " -> " + q_out.str() + ", cache " + k_cache.str());
  CUDA_REQUIRE((!q_norm || (q_norm->numel() == q_out.dim(2) && q_norm->dtype() == DType::kBF16)) &&
                   (!k_norm || (k_norm->numel() == q_out.dim(2) && k_norm->dtype() == DType::kBF16)) &&
                   (q_norm == nullptr) == (k_norm == nullptr),
               "qkv_prologue", "q_norm and k_norm must both be bf16 [head_dim], or both absent");
  CUDA_REQUIRE(positions.dtype() == DType::kI32 && positions.numel() == q_out.dim(0) &&
                   table.cos_sin.dtype() == DType::kF32 && table.rotary_dim <= q_out.dim(2) &&
                   table.rotary_dim % 2 == 0,
               "qkv_prologue", "positions i32 [T] and an f32 cos/sin table");
  dev_.need_cuda(meta.slot_mapping, "qkv_prologue (slot_mapping)");
  QkvPrologueArgs a{};
  a.qkv = qkv.raw();
  a.q_norm = q_norm ? q_norm->raw() : nullptr;
  a.k_norm = k_norm ? k_norm->raw() : nullptr;
  a.eps = eps;
  a.positions = positions.data<int32_t>();
  a.cos_sin = table.cos_sin.data<float>();
  a.rotary_dim = table.rotary_dim;
  a.neox = table.neox_style;
  a.max_pos = table.cos_sin.dim(0);
  a.k_cache = k_cache.raw();
  a.v_cache = v_cache.raw();
  a.slots = meta.slot_mapping.data<int32_t>();
  a.num_slots = k_cache.dim(0) * k_cache.dim(1);
  a.inv_k_scale = 1.0f / k_scale;
  a.inv_v_scale = 1.0f / v_scale;
  a.q_out = q_out.raw();
  a.Hq = static_cast<int>(q_out.dim(1));
  a.Hk = static_cast<int>(k_cache.dim(2));
  a.D = static_cast<int>(q_out.dim(2));
  a.err = dev_.error_flag();
  return a;
}

void AttentionOps::qkv_prologue(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                                const Tensor& positions, const RopeTable& table, const Tensor& k_cache,
                                const Tensor& v_cache, const AttentionMetadata& meta, float k_scale, float v_scale,
                                const Tensor& q_out) {
  QkvPrologueArgs a =
      prologue_args(qkv, q_norm, k_norm, eps, positions, table, k_cache, v_cache, meta, k_scale, v_scale, q_out);
  dev_.bind();
  launch_qkv_prologue(a, q_out.dim(0), k_cache.dtype(), dev_.stream());
}

void AttentionOps::qkv_attention(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                                 const Tensor& positions, const RopeTable& table, const Tensor& k_cache,
                                 const Tensor& v_cache, const AttentionMetadata& meta, float scale, float k_scale,
                                 float v_scale, int sliding_window, const Tensor& out) {
  const int D = out.ndim() == 3 ? static_cast<int>(out.dim(2)) : 0;
  const bool fused = options_.fused_decode_attention && meta.max_query_len == 1 && out.ndim() == 3 && out.dim(0) > 0 &&
                     meta.num_seqs > 0 && fast_attention_supported(D, k_cache.dtype());
  if (!fused) {
    Tensor q = dev_.scratch(out.shape(), out.dtype());
    qkv_prologue(qkv, q_norm, k_norm, eps, positions, table, k_cache, v_cache, meta, k_scale, v_scale, q);
    paged_attention(q, k_cache, v_cache, meta, scale, k_scale, v_scale, sliding_window, out);
    return;
  }
  // One kernel: q from the QKV row, the newest key and value into the cache, attention.
  QkvPrologueArgs pro =
      prologue_args(qkv, q_norm, k_norm, eps, positions, table, k_cache, v_cache, meta, k_scale, v_scale, out);
  pro.q_out = nullptr;
  PagedAttentionArgs a = attention_args(out, k_cache, v_cache, meta, scale, k_scale, v_scale, sliding_window, out);
  a.q = nullptr;
  dev_.bind();
  decode_attention(a, meta, kAnyQuery, &pro);
}

// Whether the split-K decode and the tensor-core prefill kernels both take this head size
// and cache dtype (else paged attention runs the exact, slow generic kernel).
bool AttentionOps::fast_attention_supported(int D, DType cache_dtype) {
  return decode_attention_supported(D, cache_dtype) && prefill_attention_supported(D, cache_dtype);
}

// The split-K decode kernel (and its merge) over `a`, its workspace from scratch.
// max_query: the decode kernel takes the sequences of at most this many query tokens.
void AttentionOps::decode_attention(const PagedAttentionArgs& a, const AttentionMetadata& meta, int max_query,
                                    const QkvPrologueArgs* fused) {
  // A sliding window bounds the keys a sequence's queries read: its last W + (queries - 1).
  const int keys =
      a.window > 0 ? std::min(meta.max_seq_len, a.window + std::max(1, meta.max_query_len) - 1) : meta.max_seq_len;
  const int splits = decode_attention_num_splits(a.num_tokens, a.Hk, a.Hq / a.Hk, keys, dev_.arch().sms);
  float* ws = nullptr;
  if (splits > 1)
    ws = dev_.scratch({static_cast<int64_t>(a.num_tokens) * a.Hq * splits * (a.D + 2)}, DType::kF32).data<float>();
  launch_decode_attention(a, splits, max_query, ws, fused, dev_.stream(), options_.decode_heads_per_block,
                          options_.decode_early_merge);
}

// Paged attention's arguments, checked (q's shape is out's).
PagedAttentionArgs AttentionOps::attention_args(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                                const AttentionMetadata& meta, float scale, float k_scale,
                                                float v_scale, int sliding_window, const Tensor& out) {
  CUDA_REQUIRE(q.ndim() == 3 && k_cache.ndim() == 4 && q.dtype() == DType::kBF16 && out.dtype() == DType::kBF16 &&
                   out.numel() == q.numel() && k_cache.dim(3) == q.dim(2) && q.dim(1) % k_cache.dim(2) == 0,
               "paged_attention", "q " + q.str() + ", cache " + k_cache.str() + ", out " + out.str());
  const int T = static_cast<int>(q.dim(0));
  CUDA_REQUIRE(meta.num_tokens == T, "paged_attention",
               "metadata has " + std::to_string(meta.num_tokens) + " tokens, q has " + std::to_string(T));
  CUDA_REQUIRE(sliding_window >= 0, "paged_attention", "negative sliding window " + std::to_string(sliding_window));
  PagedAttentionArgs a{};
  a.q = q.raw();
  a.k_cache = k_cache.raw();
  a.v_cache = v_cache.raw();
  a.out = out.raw();
  a.query_start_loc = meta.query_start_loc.data<int32_t>();
  a.seq_lens = meta.seq_lens.data<int32_t>();
  a.block_tables = meta.block_tables.data<int32_t>();
  a.num_seqs = meta.num_seqs;
  a.num_tokens = T;
  a.Hq = static_cast<int>(q.dim(1));
  a.Hk = static_cast<int>(k_cache.dim(2));
  a.D = static_cast<int>(q.dim(2));
  a.block_size = static_cast<int>(k_cache.dim(1));
  a.max_blocks_per_seq = static_cast<int>(meta.block_tables.numel() / std::max(1, meta.num_seqs));
  a.scale = scale;
  a.k_scale = k_scale;
  a.v_scale = v_scale;
  a.cache_dtype = k_cache.dtype();
  a.window = sliding_window;
  return a;
}

void AttentionOps::paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                   const AttentionMetadata& meta, float scale, float k_scale, float v_scale,
                                   int sliding_window, const Tensor& out) {
  CUDA_REQUIRE(q.ndim() == 3 && k_cache.ndim() == 4, "paged_attention",
               "q " + q.str() + ", cache " + k_cache.str() + ", out " + out.str());
  const int T = static_cast<int>(q.dim(0)), D = static_cast<int>(q.dim(2));
  if (T == 0 || meta.num_seqs == 0) return;
  const bool fast = fast_attention_supported(D, k_cache.dtype());
  if (!fast && !generic_attention_supported(D))
    fail(ErrorKind::kUnsupported, "CUDA paged attention supports head_dim up to 512, not {}", D);
  PagedAttentionArgs a = attention_args(q, k_cache, v_cache, meta, scale, k_scale, v_scale, sliding_window, out);
  dev_.bind();

  if (!fast) {  // unusual head_dim or cache dtype: the exact, slow kernel
    launch_generic_attention(a, dev_.stream());
    return;
  }
  // Sequences of up to decode_attention_max_query query tokens (decode, speculative
  // verification) take the split-K decode kernel, each token over its own causal range; longer
  // ones the prefill kernel. A step whose longest query is that short reads no host metadata.
  const int short_q = std::max(1, options_.decode_attention_max_query);
  bool any_long = meta.max_query_len > short_q, any_short = !any_long;
  if (any_long)
    for (int s = 0; s < meta.num_seqs && !any_short; ++s)
      any_short = meta.host_query_start_loc[s + 1] - meta.host_query_start_loc[s] <= short_q;
  if (any_long)
    launch_prefill_attention(a, meta.max_query_len, any_short ? short_q : 0, dev_.stream(),
                             dev_.arch().smem_per_block_optin);
  if (any_short) decode_attention(a, meta, any_long ? short_q : kAnyQuery, nullptr);
}

}  // namespace tessera::cuda
