#include "model/decoder.h"

#include "core/error.h"
#include "loader/config_source.h"
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

namespace {
// `options` with layer `layer`'s sliding window (ModelConfig::layer_window).
AttentionOptions window_options(AttentionOptions options, const ModelConfig& config, int layer) {
  options.sliding_window = config.layer_window(layer);
  return options;
}
}  // namespace

DecoderSpec hybrid_decoder_spec(const ModelConfig& config, GdnLayout layout) {
  if (!config.is_hybrid())
    fail(ErrorKind::kCorrupt,
         "{}: {} needs layer_types (or full_attention_interval) naming its linear_attention layers",
         config_source(config), config.architecture);
  DecoderSpec spec;
  spec.attention = {.qkv_bias = false, .qk_norm = true, .output_gate = true, .zero_centred_qk_norm = true};
  spec.zero_centred_norms = true;
  spec.linear_attention = layout;
  return spec;
}

std::unique_ptr<FeedForward> moe_or_dense(BlockContext& ctx, int layer, const std::string& prefix,
                                          const MoeOptions& moe) {
  if (ctx.config.moe.is_moe_layer(layer)) return std::make_unique<MoeBlock>(ctx, prefix, moe);
  if (ctx.config.intermediate_size <= 0)
    fail(ErrorKind::kCorrupt, "{}: layer {} has a dense MLP but intermediate_size is not set",
         config_source(ctx.config), layer);
  return std::make_unique<SwiGluMlp>(ctx, prefix, ctx.config.intermediate_size);
}

DecoderModel::DecoderModel(ModelConfig config, DecoderSpec spec, const ModelOptions& mo, Backend& backend)
    : config_(std::move(config)),
      backend_(backend),
      pc_(mo.parallel),
      comm_(backend, mo.parallel, mo.runtime),
      weights_(mo.parallel) {
  if (mo.disable_sliding_window) disable_sliding_window(config_);
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
  // Decoder layer `i` under `p` ("model.layers.3."); `linear`: a Gated DeltaNet token mixer.
  auto make_layer = [&](int i, const std::string& p, bool linear) {
    Layer L;
    L.input_norm = RmsNorm(ctx, p + "input_layernorm.weight", H, zc);
    if (linear)
      L.linear_attention = std::make_unique<GatedDeltaNet>(ctx, p + "linear_attn.", spec.linear_attention);
    else
      L.attention = std::make_unique<Attention>(ctx, p + "self_attn.", window_options(spec.attention, c, i));
    L.post_attention_norm = RmsNorm(ctx, p + "post_attention_layernorm.weight", H, zc);
    L.feed_forward = spec.feed_forward ? spec.feed_forward(ctx, i, p + "mlp.")
                                       : std::make_unique<SwiGluMlp>(ctx, p + "mlp.", c.intermediate_size);
    return L;
  };
  for (int i = layer_range_.begin; i < layer_range_.end; ++i) {
    layers_.push_back(make_layer(i, model + "layers." + std::to_string(i) + ".", c.is_linear_layer(i)));
    has_state_layers_ = has_state_layers_ || c.is_linear_layer(i);
  }
  if (mo.mtp && comm_.last_stage()) {  // (vLLM too places the MTP layer on the last stage)
    const std::string where = config_source(c);
    if (!zc || c.num_mtp_layers <= 0)
      fail(ErrorKind::kUnsupported,
           "--speculative-config method 'mtp' needs a checkpoint with a multi-token-prediction layer (Qwen3-Next or "
           "Qwen3.5 with mtp.* weights); {} ({}) has {}; use {{\"method\": \"ngram\", ...}} or run without "
           "--speculative-config",
           where, c.architecture,
           zc ? "mtp_num_hidden_layers / num_nextn_predict_layers 0" : "no MTP layer in this model family");
    if (c.num_mtp_layers != 1)
      fail(ErrorKind::kUnsupported, "{}: {} MTP layers; tessera runs checkpoints with one (mtp_num_hidden_layers 1)",
           where, c.num_mtp_layers);
    Mtp m;
    m.pre_fc_norm_embedding = RmsNorm(ctx, "mtp.pre_fc_norm_embedding.weight", H, zc);
    m.pre_fc_norm_hidden = RmsNorm(ctx, "mtp.pre_fc_norm_hidden.weight", H, zc);
    m.fc = &weights_.declare("mtp.fc.weight", {H, 2 * H}, ParallelStyle::kReplicated);
    m.layer = make_layer(0, "mtp.layers.0.", /*linear=*/false);  // (families with MTP have no windows)
    m.norm = RmsNorm(ctx, "mtp.norm.weight", H, zc);
    // A last stage that does not embed (PP) holds its own copy of the embedding, split over its
    // TP ranks as the first stage's (as vLLM's MTP module does): the passes embed the tokens
    // they draft, so fetching rows from the first stage would cost a round trip per pass. A tied
    // lm_head shares that copy.
    if (!embed_) m.embed.emplace(ctx, model + "embed_tokens.weight", c.vocab_size, H);
    mtp_.emplace(std::move(m));
  }
  if (comm_.last_stage()) {
    final_norm_ = RmsNorm(ctx, model + "norm.weight", H, zc);
    lm_head_.emplace(ctx, "lm_head.weight", c.vocab_size, H, c.tie_word_embeddings, model + "embed_tokens.weight",
                     comm_.first_stage() || (mtp_ && mtp_->embed));
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
    s.sliding_window = L.attention->sliding_window();
    specs.push_back(s);
  }
  if (mtp_) {
    LayerCacheSpec s;
    s.kind = CacheKind::kPagedKv;
    s.num_kv_heads = mtp_->layer.attention->local_kv_heads();
    s.head_dim = config_.head_dim;
    specs.push_back(s);
  }
  return specs;
}

bool DecoderModel::returns_logits() const { return comm_.last_stage() && pc_.tp_rank == 0; }

Tensor DecoderModel::forward(const ModelInput& in, KvCache& cache) {
  return run(upload_step_inputs(backend_, in, config_.vocab_size, max_positions_), cache);
}

Tensor DecoderModel::forward_argmax_rows(const ModelInput& in, KvCache& cache, std::span<const int32_t> argmax_rows) {
  StepInputs si = upload_step_inputs(backend_, in, config_.vocab_size, max_positions_);
  si.argmax_rows.assign(argmax_rows.begin(), argmax_rows.end());
  return run(si, cache);
}

Tensor DecoderModel::run(const StepInputs& in, KvCache& cache) {
  Backend& be = backend_;
  const int64_t T = in.token_ids.numel(), H = config_.hidden_size;
  TESSERA_CHECK(T > 0 && in.positions.numel() == T, "forward: {} tokens, {} positions", T, in.positions.numel());
  const size_t cache_layers = layers_.size() + (mtp_ ? 1 : 0);
  TESSERA_CHECK(cache.k.size() == cache_layers, "forward: a cache for {} layers, this stage has {}", cache.k.size(),
                cache_layers);
  if (has_state_layers_)
    TESSERA_CHECK(
        cache.conv_state.size() == cache_layers && cache.ssm_state.size() == cache_layers && in.linear.num_seqs > 0,
        "forward: a hybrid model needs state caches for its {} layers ({} given) and the step's "
        "linear-attention metadata",
        cache_layers, cache.conv_state.size());
  const DType dt = be.compute_dtype();
  // Each attention layer reads its KV cache group's block tables and slots.
  const int G = in.attention.num_kv_groups;
  TESSERA_CHECK(G == 1 || cache.layer_group.size() == cache_layers,
                "forward: a step of {} KV cache groups for a cache without layer groups", G);
  std::vector<AttentionMetadata> group_meta;
  for (int g = 0; G > 1 && g < G; ++g) group_meta.push_back(attention_group(in.attention, g));
  auto attention_of = [&](size_t layer) -> const AttentionMetadata& {
    const int g = cache.layer_group.empty() ? 0 : cache.layer_group[layer];
    TESSERA_CHECK(g >= 0 && g < G, "forward: layer {} reads KV cache group {} of {}", layer, g, G);
    return G == 1 ? in.attention : group_meta[static_cast<size_t>(g)];
  };

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
      L.attention->forward(h, o, in.positions, attention_of(i), rope_, cache.k[i], cache.v[i], cache.k_scale,
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
  if (in.hidden_states.defined()) {
    TESSERA_CHECK(in.hidden_states.dim(0) == T && in.hidden_states.dim(1) == H,
                  "forward: hidden output {} for {} tokens", in.hidden_states.str(), T);
    be.copy(in.hidden_states, h);
  }
  const int64_t n = in.logits_indices.numel();
  Tensor rows = be.scratch({n, H}, dt);
  be.gather_rows(h, in.logits_indices, rows);
  return lm_head_->forward(rows, in.argmax_all, in.argmax_rows);
}

Tensor DecoderModel::run_mtp(const StepInputs& in, const Tensor& hidden, const Tensor& hidden_out, KvCache& cache) {
  TESSERA_CHECK(mtp_.has_value(), "run_mtp on a rank without the MTP layer (it is on the last pipeline stage)");
  Backend& be = backend_;
  const int64_t T = in.token_ids.numel(), H = config_.hidden_size;
  const size_t kv = layers_.size();
  TESSERA_CHECK(T > 0 && in.positions.numel() == T && hidden.ndim() == 2 && hidden.dim(0) == T && hidden.dim(1) == H,
                "run_mtp: {} tokens, {} positions, hidden {}", T, in.positions.numel(), hidden.str());
  TESSERA_CHECK(cache.k.size() == kv + 1, "run_mtp: a cache for {} layers, the model has {} and the MTP layer",
                cache.k.size(), kv);
  const DType dt = be.compute_dtype();
  Mtp& m = *mtp_;
  // fc's input row t is [normed embedding of x[t+1] | normed hidden[t]]: both normed into one
  // [2T, H] block, then rows interleaved (t, T + t) into [T, 2H].
  Tensor halves = be.scratch({2 * T, H}, dt);
  const VocabParallelEmbedding& embed = m.embed ? *m.embed : *embed_;
  embed.forward(in.token_ids, halves.rows(0, T), /*sampled_ids=*/true);  // (-1: a NaN row, see Backend::sample)
  m.pre_fc_norm_embedding.forward(halves.rows(0, T), halves.rows(0, T));
  m.pre_fc_norm_hidden.forward(hidden, halves.rows(T, 2 * T));
  Tensor order_d = in.mtp_fc_order;
  if (!order_d.defined()) {
    std::vector<int32_t> order(static_cast<size_t>(2 * T));
    mtp_fc_order(T, order.data());
    order_d = be.scratch({2 * T}, DType::kI32);
    be.copy_from_host(order_d, order.data());
  }
  TESSERA_CHECK(order_d.numel() == 2 * T, "run_mtp: fc order of {} rows for {} tokens", order_d.numel(), T);
  Tensor cat = be.scratch({T, 2 * H}, dt);
  be.gather_rows(halves, order_d, cat.view({2 * T, H}));

  Tensor act = be.scratch({2 * T, H}, dt);
  Tensor residual = act.rows(0, T), h = act.rows(T, 2 * T);
  Tensor o = be.scratch({T, H}, dt);
  be.linear(cat, *m.fc, nullptr, residual);
  Layer& L = m.layer;
  L.input_norm.forward(residual, h);
  TESSERA_CHECK(in.attention.num_kv_groups == 1, "run_mtp: a step of {} KV cache groups", in.attention.num_kv_groups);
  L.attention->forward(h, o, in.positions, in.attention, rope_, cache.k[kv], cache.v[kv], cache.k_scale, cache.v_scale);
  L.post_attention_norm.add_forward(o, residual);
  L.feed_forward->forward(o, h);
  m.norm.add_forward(h, residual);
  if (hidden_out.defined()) be.copy(hidden_out, h);
  const int64_t n = in.logits_indices.numel();
  Tensor rows = be.scratch({n, H}, dt);
  be.gather_rows(h, in.logits_indices, rows);
  return lm_head_->forward(rows, /*argmax_all=*/true);  // (the drafts are greedy)
}

void DecoderModel::share_sampled(const Tensor& ids) { comm_.broadcast_from_first(ids); }

}  // namespace tessera
