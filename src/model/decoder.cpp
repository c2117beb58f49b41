#include "model/decoder.h"

#include "core/error.h"
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

MoeOptions moe_options(const ModelConfig& c) {
  MoeOptions o;
  o.num_experts = c.moe.num_experts;
  o.top_k = c.moe.num_experts_per_tok;
  o.intermediate = c.moe.moe_intermediate_size;
  o.renormalize = c.moe.norm_topk_prob;
  o.shared_intermediate = c.moe.shared_expert_intermediate_size;
  return o;
}

std::unique_ptr<FeedForward> moe_or_dense(BlockContext& ctx, int layer, const std::string& prefix,
                                          const MoeOptions& moe) {
  if (ctx.config.moe.is_moe_layer(layer)) return std::make_unique<MoeBlock>(ctx, prefix, moe);
  if (ctx.config.intermediate_size <= 0)
    fail(ErrorKind::kCorrupt, "{}: layer {} has a dense MLP but intermediate_size is not set",
         ctx.config.model_dir.empty() ? std::string("config") : ctx.config.model_dir + "/config.json", layer);
  return std::make_unique<SwiGluMlp>(ctx, prefix, ctx.config.intermediate_size);
}

DecoderModel::DecoderModel(ModelConfig config, DecoderSpec spec, const ModelOptions& mo, Backend& backend)
    : config_(std::move(config)),
      backend_(backend),
      pc_(mo.parallel),
      comm_(backend, mo.parallel, mo.runtime),
      weights_(mo.parallel) {
  const ModelConfig& c = config_;
  weights_.set_quantization(weight_quantization(c, mo));
  layer_range_ = pipeline_layer_range(c.num_layers, pc_.pp_rank, pc_.pp_size);
  BlockContext ctx{config_, backend_, weights_, comm_};
  const int64_t H = c.hidden_size;
  spec.attention.qkv_bias = spec.attention.qkv_bias || c.attention_bias;
  const bool zc = spec.zero_centred_norms;
  const std::string model = c.nested_text_config ? "model.language_model." : "model.";
  if (comm_.first_stage()) embed_.emplace(ctx, model + "embed_tokens.weight", c.vocab_size, H);
  layers_.reserve(static_cast<size_t>(layer_range_.size()));
  for (int i = layer_range_.begin; i < layer_range_.end; ++i) {
    const std::string p = model + "layers." + std::to_string(i) + ".";
    Layer L;
    L.input_norm = RmsNorm(ctx, p + "input_layernorm.weight", H, zc);
    if (c.is_linear_layer(i)) {
      L.linear_attention = std::make_unique<GatedDeltaNet>(ctx, p + "linear_attn.", spec.linear_attention);
      has_state_layers_ = true;
    } else {
      L.attention = std::make_unique<Attention>(ctx, p + "self_attn.", spec.attention);
    }
    L.post_attention_norm = RmsNorm(ctx, p + "post_attention_layernorm.weight", H, zc);
    L.feed_forward = spec.feed_forward ? spec.feed_forward(ctx, i, p + "mlp.")
                                       : std::make_unique<SwiGluMlp>(ctx, p + "mlp.", c.intermediate_size);
    layers_.push_back(std::move(L));
  }
  if (comm_.last_stage()) {
    final_norm_ = RmsNorm(ctx, model + "norm.weight", H, zc);
    lm_head_.emplace(ctx, "lm_head.weight", c.vocab_size, H, c.tie_word_embeddings, model + "embed_tokens.weight",
                     comm_.first_stage());
  }
  max_positions_ = mo.max_positions > 0 ? mo.max_positions : c.max_position_embeddings;
  rope_ = make_rope_table(c, max_positions_, backend_);
}

std::vector<LayerCacheSpec> DecoderModel::cache_specs() const {
  std::vector<LayerCacheSpec> specs;
  for (const auto& L : layers_) {
    if (L.linear_attention) {
      specs.push_back(L.linear_attention->cache_spec());
      continue;
    }
    LayerCacheSpec s;
    s.kind = CacheKind::kPagedKv;
    s.num_kv_heads = L.attention->local_kv_heads();
    s.head_dim = config_.head_dim;
    specs.push_back(s);
  }
  return specs;
}

bool DecoderModel::returns_logits() const { return comm_.last_stage() && pc_.tp_rank == 0; }

Tensor DecoderModel::forward(const ModelInput& in, KvCache& cache) {
  return run(upload_step_inputs(backend_, in, config_.vocab_size, max_positions_), cache);
}

Tensor DecoderModel::run(const StepInputs& in, KvCache& cache) {
  Backend& be = backend_;
  const int64_t T = in.token_ids.numel(), H = config_.hidden_size;
  TESSERA_CHECK(T > 0 && in.positions.numel() == T, "forward: {} tokens, {} positions", T, in.positions.numel());
  TESSERA_CHECK(cache.k.size() == layers_.size(), "forward: a cache for {} layers, this stage has {}", cache.k.size(),
                layers_.size());
  if (has_state_layers_)
    TESSERA_CHECK(
        cache.conv_state.size() == layers_.size() && cache.ssm_state.size() == layers_.size() && in.linear.num_seqs > 0,
        "forward: a hybrid model needs state caches for its {} layers ({} given) and the step's "
        "linear-attention metadata",
        layers_.size(), cache.conv_state.size());
  const DType dt = be.compute_dtype();

  // h holds each layer's normed input (and, in between, the feed-forward output that the
  // next add_rms_norm folds into the residual); o holds the attention output. Between
  // pipeline stages both travel as one [2T, H] message: residual rows first, then h.
  Tensor act = be.scratch({2 * T, H}, dt);
  Tensor residual = act.rows(0, T);
  Tensor h = act.rows(T, 2 * T);
  Tensor o = be.scratch({T, H}, dt);
  if (embed_)
    embed_->forward(in.token_ids, residual);
  else
    comm_.recv_prev_stage(act);
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& L = layers_[i];
    const size_t mark = be.scratch_mark();  // the layer's temporaries are reused by the next layer
    if (layer_range_.begin + static_cast<int>(i) == 0)
      L.input_norm.forward(residual, h);
    else
      L.input_norm.add_forward(h, residual);
    if (L.linear_attention)
      L.linear_attention->forward(h, o, in.linear, cache.conv_state[i], cache.ssm_state[i]);
    else
      L.attention->forward(h, o, in.positions, in.attention, rope_, cache.k[i], cache.v[i], cache.k_scale,
                           cache.v_scale);
    L.post_attention_norm.add_forward(o, residual);
    L.feed_forward->forward(o, h);
    be.scratch_rewind(mark);
  }
  if (!comm_.last_stage()) {
    comm_.send_next_stage(act);
    return Tensor();
  }
  final_norm_.add_forward(h, residual);
  const int64_t n = in.logits_indices.numel();
  Tensor rows = be.scratch({n, H}, dt);
  be.gather_rows(h, in.logits_indices, rows);
  return lm_head_->forward(rows);
}

}  // namespace tessera
