#include "model/dense_decoder.h"

#include <cmath>

#include "core/error.h"
#include "dist/communicator.h"
#include "model/rope.h"

namespace tessera {

LayerRange pipeline_layer_range(int num_layers, int pp_rank, int pp_size) {
  if (pp_size < 1 || pp_rank < 0 || pp_rank >= pp_size)
    fail(ErrorKind::kInvalidArgument, "pipeline rank {} of {}", pp_rank, pp_size);
  if (num_layers < pp_size)
    fail(ErrorKind::kInvalidArgument, "--pipeline-parallel-size {} is larger than the model's {} layers", pp_size,
         num_layers);
  std::vector<int> sizes(static_cast<size_t>(pp_size), num_layers / pp_size);
  for (int i = 0; i < num_layers % pp_size; ++i) ++sizes[static_cast<size_t>(pp_size - 2 - i)];
  LayerRange r;
  for (int i = 0; i < pp_rank; ++i) r.begin += sizes[static_cast<size_t>(i)];
  r.end = r.begin + sizes[static_cast<size_t>(pp_rank)];
  return r;
}

DenseDecoderModel::DenseDecoderModel(ModelConfig config, DenseDecoderOptions options, const ModelOptions& mo,
                                     Backend& backend)
    : config_(std::move(config)),
      options_(options),
      backend_(backend),
      pc_(mo.parallel),
      rt_(mo.runtime),
      weights_(mo.parallel) {
  const ModelConfig& c = config_;
  const int tp = pc_.tp_size;
  if (tp > 1 && (!rt_.tp || rt_.tp->size() != tp || rt_.tp->rank() != pc_.tp_rank))
    fail(ErrorKind::kInternal, "tensor parallel size {} needs the matching TP communicator", tp);
  if (pc_.pp_size > 1 && (!rt_.pp || rt_.pp->size() != pc_.pp_size || rt_.pp->rank() != pc_.pp_rank))
    fail(ErrorKind::kInternal, "pipeline parallel size {} needs the matching PP communicator", pc_.pp_size);
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
  layer_range_ = pipeline_layer_range(c.num_layers, pc_.pp_rank, pc_.pp_size);
  const bool first_stage = pc_.pp_rank == 0, last_stage = pc_.pp_rank == pc_.pp_size - 1;
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t q_rows = static_cast<int64_t>(c.num_heads) * D, kv_rows = static_cast<int64_t>(c.num_kv_heads) * D;
  const int64_t kv_head = replicate_kv ? pc_.tp_rank / (tp / c.num_kv_heads) : 0;
  WeightStore& w = weights_;
  auto kv_param = [&](const std::string& name, Shape shape) -> const Tensor& {
    if (!replicate_kv) return w.declare(name, shape, ParallelStyle::kColumn);
    return w.declare_row_block(name, shape, kv_head * D, D);
  };
  if (first_stage) embed_ = &w.declare("model.embed_tokens.weight", {c.vocab_size, H}, ParallelStyle::kVocab);
  for (int i = layer_range_.begin; i < layer_range_.end; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    Layer L{};
    L.input_norm = &w.declare(p + "input_layernorm.weight", {H}, ParallelStyle::kReplicated, DummyInit::kOnes);
    const bool bias = options_.qkv_bias || c.attention_bias;
    if (!bias && !replicate_kv) {
      L.attn.qkv = &w.declare_stacked(p + "self_attn.qkv_proj",
                                      {{p + "self_attn.q_proj.weight", q_rows},
                                       {p + "self_attn.k_proj.weight", kv_rows},
                                       {p + "self_attn.v_proj.weight", kv_rows}},
                                      H);
    } else {
      L.attn.q_proj = &w.declare(p + "self_attn.q_proj.weight", {q_rows, H}, ParallelStyle::kColumn);
      L.attn.k_proj = &kv_param(p + "self_attn.k_proj.weight", {kv_rows, H});
      L.attn.v_proj = &kv_param(p + "self_attn.v_proj.weight", {kv_rows, H});
    }
    if (bias) {
      L.attn.q_bias = &w.declare(p + "self_attn.q_proj.bias", {q_rows}, ParallelStyle::kColumn);
      L.attn.k_bias = &kv_param(p + "self_attn.k_proj.bias", {kv_rows});
      L.attn.v_bias = &kv_param(p + "self_attn.v_proj.bias", {kv_rows});
    }
    if (options_.qk_norm) {
      L.attn.q_norm = &w.declare(p + "self_attn.q_norm.weight", {D}, ParallelStyle::kReplicated, DummyInit::kOnes);
      L.attn.k_norm = &w.declare(p + "self_attn.k_norm.weight", {D}, ParallelStyle::kReplicated, DummyInit::kOnes);
    }
    L.attn.o_proj = &w.declare(p + "self_attn.o_proj.weight", {H, q_rows}, ParallelStyle::kRow);
    L.post_attention_norm =
        &w.declare(p + "post_attention_layernorm.weight", {H}, ParallelStyle::kReplicated, DummyInit::kOnes);
    L.gate_up =
        &w.declare_stacked(p + "mlp.gate_up_proj", {{p + "mlp.gate_proj.weight", I}, {p + "mlp.up_proj.weight", I}}, H);
    L.down = &w.declare(p + "mlp.down_proj.weight", {H, I}, ParallelStyle::kRow);
    layers_.push_back(L);
  }
  if (last_stage) {
    final_norm_ = &w.declare("model.norm.weight", {H}, ParallelStyle::kReplicated, DummyInit::kOnes);
    // Tied embeddings on a last stage that does not embed: read the embedding table itself.
    lm_head_ = !c.tie_word_embeddings ? &w.declare("lm_head.weight", {c.vocab_size, H}, ParallelStyle::kVocab)
               : first_stage          ? &w.declare_tied("lm_head.weight", "model.embed_tokens.weight")
                             : &w.declare("model.embed_tokens.weight", {c.vocab_size, H}, ParallelStyle::kVocab);
  }
  max_positions_ = mo.max_positions > 0 ? mo.max_positions : c.max_position_embeddings;
  rope_ = make_rope_table(c, max_positions_, backend_);
}

std::vector<LayerCacheSpec> DenseDecoderModel::cache_specs() const {
  return std::vector<LayerCacheSpec>(static_cast<size_t>(layer_range_.size()),
                                     LayerCacheSpec{CacheKind::kPagedKv, local_kv_heads_, config_.head_dim, 0});
}

void DenseDecoderModel::attention(int layer, const Tensor& h, const Tensor& out, const Tensor& positions,
                                  const AttentionMetadata& meta, KvCache& cache) {
  const Attention& a = layers_[layer].attn;
  Backend& be = backend_;
  const int64_t T = h.dim(0), D = config_.head_dim;
  DType dt = be.compute_dtype();
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (a.qkv) {  // one GEMM, then norm + rope + KV write in one op
    Tensor qkv = be.scratch({T, (local_heads_ + 2 * local_kv_heads_) * D}, dt);
    be.linear(h, *a.qkv, nullptr, qkv);
    Tensor attn = be.scratch({T, local_heads_, D}, dt);
    be.qkv_attention(qkv, a.q_norm, a.k_norm, eps, positions, rope_, cache.k[layer], cache.v[layer], meta, scale,
                     cache.k_scale, cache.v_scale, attn);
    be.linear(attn.view({T, local_heads_ * D}), *a.o_proj, nullptr, out);
    all_reduce(out);
    return;
  }
  Tensor q = be.scratch({T, local_heads_, D}, dt);
  Tensor k = be.scratch({T, local_kv_heads_, D}, dt);
  Tensor v = be.scratch({T, local_kv_heads_, D}, dt);
  be.linear(h, *a.q_proj, a.q_bias, q.view({T, local_heads_ * D}));
  be.linear(h, *a.k_proj, a.k_bias, k.view({T, local_kv_heads_ * D}));
  be.linear(h, *a.v_proj, a.v_bias, v.view({T, local_kv_heads_ * D}));
  if (a.q_norm) {
    Tensor qv = q.view({T * local_heads_, D}), kv = k.view({T * local_kv_heads_, D});
    be.rms_norm(qv, *a.q_norm, eps, qv);
    be.rms_norm(kv, *a.k_norm, eps, kv);
  }
  be.rope(q, k, positions, rope_);
  be.write_kv(k, v, cache.k[layer], cache.v[layer], meta, cache.k_scale, cache.v_scale);
  Tensor attn = be.scratch({T, local_heads_, D}, dt);
  be.paged_attention(q, cache.k[layer], cache.v[layer], meta, scale, cache.k_scale, cache.v_scale, attn);
  be.linear(attn.view({T, local_heads_ * D}), *a.o_proj, nullptr, out);
  all_reduce(out);  // row-parallel o_proj: each rank holds a partial sum
}

void DenseDecoderModel::all_reduce(const Tensor& t) {
  if (pc_.tp_size == 1) return;
  // A host-side communicator reads the buffer outside the backend's stream.
  if (!rt_.tp->stream_ordered()) backend_.synchronize();
  rt_.tp->all_reduce(t);
}

bool DenseDecoderModel::returns_logits() const { return pc_.pp_rank == pc_.pp_size - 1 && pc_.tp_rank == 0; }

// Vocab-parallel embedding: each rank looks up the tokens of its vocabulary slice, leaves
// zero rows for the others, and the TP all-reduce completes every row.
void DenseDecoderModel::embed(const Tensor& ids, const Tensor& out) {
  Backend& be = backend_;
  if (pc_.tp_size == 1) {
    be.embedding(ids, *embed_, out);
    return;
  }
  be.embedding_slice(ids, *embed_, pc_.tp_rank * embed_->dim(0), out);
  all_reduce(out);
}

// Vocab-parallel lm_head: each rank computes its slice of the logits; TP rank 0 gathers the
// slices ([tp, n, V/tp]) and lays them out as [n, V]. Other ranks return an undefined tensor.
Tensor DenseDecoderModel::lm_head(const Tensor& rows) {
  Backend& be = backend_;
  const int64_t n = rows.dim(0), V = config_.vocab_size;
  if (pc_.tp_size == 1) {
    Tensor logits = be.scratch({n, V}, DType::kF32);
    be.linear(rows, *lm_head_, nullptr, logits);
    return logits;
  }
  const int tp = pc_.tp_size;
  const int64_t Vs = lm_head_->dim(0);
  Tensor local = be.scratch({n, Vs}, DType::kF32);
  be.linear(rows, *lm_head_, nullptr, local);
  if (!rt_.tp->stream_ordered()) be.synchronize();
  const bool root = pc_.tp_rank == 0;
  Tensor gathered = root ? be.scratch({tp * n, Vs}, DType::kF32) : Tensor();
  rt_.tp->gather(local, gathered, 0);
  if (!root) return Tensor();
  Tensor logits = be.scratch({n, V}, DType::kF32);
  for (int r = 0; r < tp; ++r)
    for (int64_t i = 0; i < n; ++i) {
      Tensor dst(logits.storage(), logits.offset_bytes() + static_cast<size_t>(i * V + r * Vs) * 4, Shape{Vs},
                 DType::kF32);
      Tensor src(gathered.storage(), gathered.offset_bytes() + static_cast<size_t>((r * n + i) * Vs) * 4, Shape{Vs},
                 DType::kF32);
      be.copy(dst, src);
    }
  return logits;
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
  all_reduce(out);  // row-parallel down_proj
}

Tensor DenseDecoderModel::forward(const ModelInput& in, KvCache& cache) {
  return run(upload_step_inputs(backend_, in, config_.vocab_size, max_positions_), cache);
}

bool DenseDecoderModel::graph_safe() const {
  return pc_.pp_size == 1 && (pc_.tp_size == 1 || rt_.tp->stream_ordered());
}

Tensor DenseDecoderModel::run(const StepInputs& in, KvCache& cache) {
  Backend& be = backend_;
  const int64_t T = in.token_ids.numel(), H = config_.hidden_size;
  TESSERA_CHECK(T > 0 && in.positions.numel() == T, "forward: {} tokens, {} positions", T, in.positions.numel());
  TESSERA_CHECK(cache.k.size() == layers_.size(), "forward: a cache for {} layers, this stage has {}", cache.k.size(),
                layers_.size());
  DType dt = be.compute_dtype();
  const Tensor& positions = in.positions;
  const AttentionMetadata& meta = in.attention;

  // h holds each layer's normed input (and, in between, the MLP output that the next
  // add_rms_norm folds into the residual); o holds the attention output. Between pipeline
  // stages both travel as one [2T, H] message: residual rows first, then h.
  Tensor act = be.scratch({2 * T, H}, dt);
  Tensor residual = act.rows(0, T);
  Tensor h = act.rows(T, 2 * T);
  Tensor o = be.scratch({T, H}, dt);
  const bool first_stage = pc_.pp_rank == 0, last_stage = pc_.pp_rank == pc_.pp_size - 1;
  if (first_stage)
    embed(in.token_ids, residual);
  else
    rt_.pp->recv(act, pc_.pp_rank - 1);
  const float eps = static_cast<float>(config_.rms_norm_eps);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& L = layers_[i];
    const size_t mark = be.scratch_mark();  // the layer's temporaries are reused by the next layer
    if (layer_range_.begin + static_cast<int>(i) == 0)
      be.rms_norm(residual, *L.input_norm, eps, h);
    else
      be.add_rms_norm(h, residual, *L.input_norm, eps);
    attention(static_cast<int>(i), h, o, positions, meta, cache);
    be.add_rms_norm(o, residual, *L.post_attention_norm, eps);
    mlp(static_cast<int>(i), o, h);
    be.scratch_rewind(mark);
  }
  if (!last_stage) {
    if (!rt_.pp->stream_ordered()) be.synchronize();
    rt_.pp->send(act, pc_.pp_rank + 1);
    return Tensor();
  }
  be.add_rms_norm(h, residual, *final_norm_, eps);
  const Tensor& x = h;

  const int64_t n = in.logits_indices.numel();
  Tensor rows = be.scratch({n, H}, dt);
  be.gather_rows(x, in.logits_indices, rows);
  return lm_head(rows);
}

}  // namespace tessera
