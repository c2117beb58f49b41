#include "model/dense_decoder.h"

#include <cmath>

#include "core/error.h"
#include "model/rope.h"

namespace tessera {

DenseDecoderModel::DenseDecoderModel(ModelConfig config, DenseDecoderOptions options, const ModelOptions& mo,
                                     Backend& backend)
    : config_(std::move(config)), options_(options), backend_(backend), weights_(mo.parallel) {
  const ModelConfig& c = config_;
  const int tp = mo.parallel.tp_size;
  if (c.num_heads % tp != 0)
    fail(ErrorKind::kInvalidArgument, "num_attention_heads ({}) is not divisible by --tensor-parallel-size {}",
         c.num_heads, tp);
  if (c.num_kv_heads % tp != 0)
    fail(ErrorKind::kUnsupported,
         "num_key_value_heads ({}) is not divisible by --tensor-parallel-size {}; replicated KV heads are not "
         "supported yet",
         c.num_kv_heads, tp);
  local_heads_ = c.num_heads / tp;
  local_kv_heads_ = c.num_kv_heads / tp;
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t q_rows = static_cast<int64_t>(c.num_heads) * D, kv_rows = static_cast<int64_t>(c.num_kv_heads) * D;
  WeightStore& w = weights_;
  embed_ = &w.declare("model.embed_tokens.weight", {c.vocab_size, H}, ParallelStyle::kVocab);
  for (int i = 0; i < c.num_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    Layer L{};
    L.input_norm = &w.declare(p + "input_layernorm.weight", {H}, ParallelStyle::kReplicated, DummyInit::kOnes);
    L.attn.q_proj = &w.declare(p + "self_attn.q_proj.weight", {q_rows, H}, ParallelStyle::kColumn);
    L.attn.k_proj = &w.declare(p + "self_attn.k_proj.weight", {kv_rows, H}, ParallelStyle::kColumn);
    L.attn.v_proj = &w.declare(p + "self_attn.v_proj.weight", {kv_rows, H}, ParallelStyle::kColumn);
    if (options_.qkv_bias || c.attention_bias) {
      L.attn.q_bias = &w.declare(p + "self_attn.q_proj.bias", {q_rows}, ParallelStyle::kColumn);
      L.attn.k_bias = &w.declare(p + "self_attn.k_proj.bias", {kv_rows}, ParallelStyle::kColumn);
      L.attn.v_bias = &w.declare(p + "self_attn.v_proj.bias", {kv_rows}, ParallelStyle::kColumn);
    }
    if (options_.qk_norm) {
      L.attn.q_norm = &w.declare(p + "self_attn.q_norm.weight", {D}, ParallelStyle::kReplicated, DummyInit::kOnes);
      L.attn.k_norm = &w.declare(p + "self_attn.k_norm.weight", {D}, ParallelStyle::kReplicated, DummyInit::kOnes);
    }
    L.attn.o_proj = &w.declare(p + "self_attn.o_proj.weight", {H, q_rows}, ParallelStyle::kRow);
    L.post_attention_norm =
        &w.declare(p + "post_attention_layernorm.weight", {H}, ParallelStyle::kReplicated, DummyInit::kOnes);
    L.gate_up = &w.declare_stacked(p + "mlp.gate_up_proj", {{p + "mlp.gate_proj.weight", I}, {p + "mlp.up_proj.weight", I}},
                                   H);
    L.down = &w.declare(p + "mlp.down_proj.weight", {H, I}, ParallelStyle::kRow);
    layers_.push_back(L);
  }
  final_norm_ = &w.declare("model.norm.weight", {H}, ParallelStyle::kReplicated, DummyInit::kOnes);
  lm_head_ = c.tie_word_embeddings ? &w.declare_tied("lm_head.weight", "model.embed_tokens.weight")
                                   : &w.declare("lm_head.weight", {c.vocab_size, H}, ParallelStyle::kVocab);
  max_positions_ = mo.max_positions > 0 ? mo.max_positions : c.max_position_embeddings;
  rope_ = make_rope_table(c, max_positions_, backend_);
}

std::vector<LayerCacheSpec> DenseDecoderModel::cache_specs() const {
  return std::vector<LayerCacheSpec>(static_cast<size_t>(config_.num_layers),
                                     LayerCacheSpec{CacheKind::kPagedKv, local_kv_heads_, config_.head_dim, 0});
}

void DenseDecoderModel::attention(int layer, const Tensor& h, const Tensor& out, const Tensor& positions,
                                  const AttentionMetadata& meta, KvCache& cache) {
  const Attention& a = layers_[layer].attn;
  Backend& be = backend_;
  const int64_t T = h.dim(0), D = config_.head_dim;
  DType dt = be.compute_dtype();
  Tensor q = be.scratch({T, local_heads_, D}, dt);
  Tensor k = be.scratch({T, local_kv_heads_, D}, dt);
  Tensor v = be.scratch({T, local_kv_heads_, D}, dt);
  be.linear(h, *a.q_proj, a.q_bias, q.view({T, local_heads_ * D}));
  be.linear(h, *a.k_proj, a.k_bias, k.view({T, local_kv_heads_ * D}));
  be.linear(h, *a.v_proj, a.v_bias, v.view({T, local_kv_heads_ * D}));
  if (a.q_norm) {
    Tensor qv = q.view({T * local_heads_, D}), kv = k.view({T * local_kv_heads_, D});
    be.rms_norm(qv, *a.q_norm, static_cast<float>(config_.rms_norm_eps), qv);
    be.rms_norm(kv, *a.k_norm, static_cast<float>(config_.rms_norm_eps), kv);
  }
  be.rope(q, k, positions, rope_);
  be.write_kv(k, v, cache.k[layer], cache.v[layer], meta, cache.k_scale, cache.v_scale);
  Tensor attn = be.scratch({T, local_heads_, D}, dt);
  be.paged_attention(q, cache.k[layer], cache.v[layer], meta, 1.0f / std::sqrt(static_cast<float>(D)), cache.k_scale,
                     cache.v_scale, attn);
  be.linear(attn.view({T, local_heads_ * D}), *a.o_proj, nullptr, out);
  // TP > 1: the row-parallel o_proj output is all-reduced here by the distributed layer.
}

void DenseDecoderModel::mlp(int layer, const Tensor& h, const Tensor& out) {
  const Layer& L = layers_[layer];
  Backend& be = backend_;
  const int64_t T = h.dim(0), I = L.down->dim(1);
  Tensor gate_up = be.scratch({T, 2 * I}, be.compute_dtype());
  be.linear(h, *L.gate_up, nullptr, gate_up);
  Tensor act = be.scratch({T, I}, be.compute_dtype());
  be.silu_mul(gate_up, act);
  be.linear(act, *L.down, nullptr, out);
}

Tensor DenseDecoderModel::forward(const ModelInput& in, KvCache& cache) {
  Backend& be = backend_;
  const int64_t T = static_cast<int64_t>(in.token_ids.size()), H = config_.hidden_size;
  TESSERA_CHECK(T > 0 && in.positions.size() == in.token_ids.size(), "forward: {} tokens, {} positions", T,
                in.positions.size());
  for (int32_t p : in.positions)
    if (p < 0 || p >= max_positions_)
      fail(ErrorKind::kInvalidArgument, "position {} is beyond the model's {} positions", p, max_positions_);
  DType dt = be.compute_dtype();
  Tensor ids = be.scratch({T}, DType::kI32);
  be.copy_from_host(ids, in.token_ids.data());
  Tensor positions = be.scratch({T}, DType::kI32);
  be.copy_from_host(positions, in.positions.data());
  AttentionMetadata meta = upload_attention_metadata(be, in.attention);

  // h holds each layer's normed input (and, in between, the MLP output that the next
  // add_rms_norm folds into the residual); o holds the attention output.
  Tensor residual = be.scratch({T, H}, dt);
  Tensor h = be.scratch({T, H}, dt);
  Tensor o = be.scratch({T, H}, dt);
  be.embedding(ids, *embed_, residual);
  const float eps = static_cast<float>(config_.rms_norm_eps);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& L = layers_[i];
    const size_t mark = be.scratch_mark();  // the layer's temporaries are reused by the next layer
    if (i == 0) be.rms_norm(residual, *L.input_norm, eps, h);
    else be.add_rms_norm(h, residual, *L.input_norm, eps);
    attention(static_cast<int>(i), h, o, positions, meta, cache);
    be.add_rms_norm(o, residual, *L.post_attention_norm, eps);
    mlp(static_cast<int>(i), o, h);
    be.scratch_rewind(mark);
  }
  be.add_rms_norm(h, residual, *final_norm_, eps);
  const Tensor& x = h;

  const int64_t n = static_cast<int64_t>(in.logits_indices.size());
  Tensor idx = be.scratch({n}, DType::kI32);
  be.copy_from_host(idx, in.logits_indices.data());
  Tensor rows = be.scratch({n, H}, dt);
  be.gather_rows(x, idx, rows);
  Tensor logits = be.scratch({n, config_.vocab_size}, DType::kF32);
  be.linear(rows, *lm_head_, nullptr, logits);
  return logits;
}

}  // namespace tessera
