#include "model/layers/attention.h"

#include <cmath>

#include "core/error.h"

namespace tessera {

Attention::Attention(BlockContext& ctx, const std::string& p, const AttentionOptions& options)
    : backend_(ctx.backend),
      head_dim_(ctx.config.head_dim),
      eps_(static_cast<float>(ctx.config.rms_norm_eps)),
      sliding_window_(options.sliding_window) {
  const ModelConfig& c = ctx.config;
  const int tp = ctx.comm.tp_size();
  if (c.num_heads % tp != 0)
    fail(ErrorKind::kInvalidArgument, "num_attention_heads ({}) is not divisible by --tensor-parallel-size {}",
         c.num_heads, tp);
  // KV heads: split when TP divides them; replicated (each rank keeps the one head its query
  // heads read) when TP is a multiple of them, as vLLM does.
  const bool replicate_kv = c.num_kv_heads < tp;
  if (replicate_kv ? tp % c.num_kv_heads != 0 : c.num_kv_heads % tp != 0)
    fail(ErrorKind::kUnsupported,
         "num_key_value_heads ({}) and --tensor-parallel-size {}: one must divide the other (KV heads are split, "
         "or replicated when TP is a multiple of them)",
         c.num_kv_heads, tp);
  local_heads_ = c.num_heads / tp;
  local_kv_heads_ = replicate_kv ? 1 : c.num_kv_heads / tp;
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int64_t q_rows = static_cast<int64_t>(c.num_heads) * D, kv_rows = static_cast<int64_t>(c.num_kv_heads) * D;
  const int64_t kv_head = replicate_kv ? ctx.comm.tp_rank() / (tp / c.num_kv_heads) : 0;
  WeightStore& w = ctx.weights;
  auto kv_param = [&](const std::string& name, Shape shape) -> const Tensor& {
    if (!replicate_kv) return w.declare(name, shape, ParallelStyle::kColumn);
    return w.declare_row_block(name, shape, kv_head * D, D);
  };
  const bool bias = options.qkv_bias;
  if (options.output_gate) {
    // q_proj rows are [Hq, 2, D]: each head's query, then its gate. This rank's heads'
    // query rows, k and v rows go into one fused projection; the gate rows into another.
    if (bias) fail(ErrorKind::kUnsupported, "{}: gated attention with a qkv bias is not supported", p);
    const Shape q_full{2 * q_rows, H}, kv_full{kv_rows, H};
    const int64_t h0 = static_cast<int64_t>(ctx.comm.tp_rank()) * local_heads_;
    const int64_t k0 = replicate_kv ? kv_head * D : static_cast<int64_t>(ctx.comm.tp_rank()) * local_kv_heads_ * D;
    const int64_t kv_local = static_cast<int64_t>(local_kv_heads_) * D;
    std::vector<WeightStore::RowBlock> qkv, gate;
    for (int64_t h = h0; h < h0 + local_heads_; ++h) {
      qkv.push_back({p + "q_proj.weight", q_full, 2 * h * D, D});
      gate.push_back({p + "q_proj.weight", q_full, 2 * h * D + D, D});
    }
    qkv.push_back({p + "k_proj.weight", kv_full, k0, kv_local});
    qkv.push_back({p + "v_proj.weight", kv_full, k0, kv_local});
    qkv_ = &w.declare_row_blocks(p + "qkv_proj", std::move(qkv), {(local_heads_ + 2 * local_kv_heads_) * D, H});
    gate_ = &w.declare_row_blocks(p + "gate_proj", std::move(gate), {local_heads_ * D, H});
  } else if (!bias && !replicate_kv) {
    qkv_ = &w.declare_stacked(
        p + "qkv_proj", {{p + "q_proj.weight", q_rows}, {p + "k_proj.weight", kv_rows}, {p + "v_proj.weight", kv_rows}},
        H);
  } else {
    q_proj_ = &w.declare(p + "q_proj.weight", {q_rows, H}, ParallelStyle::kColumn);
    k_proj_ = &kv_param(p + "k_proj.weight", {kv_rows, H});
    v_proj_ = &kv_param(p + "v_proj.weight", {kv_rows, H});
  }
  if (bias) {
    q_bias_ = &w.declare(p + "q_proj.bias", {q_rows}, ParallelStyle::kColumn);
    k_bias_ = &kv_param(p + "k_proj.bias", {kv_rows});
    v_bias_ = &kv_param(p + "v_proj.bias", {kv_rows});
  }
  if (options.qk_norm && options.zero_centred_qk_norm) {
    // 1 + w in the compute dtype: the fused qkv prologue takes bf16 norm weights on GPU.
    q_norm_ = &w.declare_offset(p + "q_norm.weight", {D}, 1.0f);
    k_norm_ = &w.declare_offset(p + "k_norm.weight", {D}, 1.0f);
  } else if (options.qk_norm) {
    q_norm_ = &w.declare(p + "q_norm.weight", {D}, ParallelStyle::kReplicated, DummyInit::kOnes);
    k_norm_ = &w.declare(p + "k_norm.weight", {D}, ParallelStyle::kReplicated, DummyInit::kOnes);
  }
  o_proj_ = RowParallelLinear(ctx, p + "o_proj.weight", H, q_rows);
}

void Attention::forward(const Tensor& h, const Tensor& out, const Tensor& positions, const AttentionMetadata& meta,
                        const RopeTable& rope, const Tensor& k_cache, const Tensor& v_cache, float k_scale,
                        float v_scale) const {
  Backend& be = backend_;
  const int64_t T = h.dim(0), D = head_dim_;
  const DType dt = be.compute_dtype();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  Tensor attn = be.scratch({T, local_heads_, D}, dt);
  if (qkv_) {  // one GEMM, then norm + rope + KV write in one op
    Tensor qkv = be.scratch({T, (local_heads_ + 2 * local_kv_heads_) * D}, dt);
    be.linear(h, *qkv_, nullptr, qkv);
    be.qkv_attention(qkv, q_norm_, k_norm_, eps_, positions, rope, k_cache, v_cache, meta, scale, k_scale, v_scale,
                     sliding_window_, attn);
  } else {
    Tensor q = be.scratch({T, local_heads_, D}, dt);
    Tensor k = be.scratch({T, local_kv_heads_, D}, dt);
    Tensor v = be.scratch({T, local_kv_heads_, D}, dt);
    be.linear(h, *q_proj_, q_bias_, q.view({T, local_heads_ * D}));
    be.linear(h, *k_proj_, k_bias_, k.view({T, local_kv_heads_ * D}));
    be.linear(h, *v_proj_, v_bias_, v.view({T, local_kv_heads_ * D}));
    if (q_norm_) {
      Tensor qv = q.view({T * local_heads_, D}), kv = k.view({T * local_kv_heads_, D});
      be.rms_norm(qv, *q_norm_, eps_, qv);
      be.rms_norm(kv, *k_norm_, eps_, kv);
    }
    be.rope(q, k, positions, rope);
    be.write_kv(k, v, k_cache, v_cache, meta, k_scale, v_scale);
    be.paged_attention(q, k_cache, v_cache, meta, scale, k_scale, v_scale, sliding_window_, attn);
  }
  if (gate_) {
    Tensor gate = be.scratch({T, local_heads_ * D}, dt);
    be.linear(h, *gate_, nullptr, gate);
    be.sigmoid_mul(attn.view({T, local_heads_ * D}), gate, attn.view({T, local_heads_ * D}));
  }
  o_proj_.forward(attn.view({T, local_heads_ * D}), out);
}

}  // namespace tessera
