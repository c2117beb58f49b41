#include "model/layers/gated_deltanet.h"

#include "core/error.h"

namespace tessera {

GatedDeltaNet::GatedDeltaNet(BlockContext& ctx, const std::string& p, GdnLayout layout)
    : backend_(ctx.backend), eps_(static_cast<float>(ctx.config.rms_norm_eps)) {
  const LinearAttnConfig& l = ctx.config.linear;
  const int tp = ctx.comm.tp_size(), r = ctx.comm.tp_rank();
  if (l.num_key_heads % tp != 0 || l.num_value_heads % tp != 0)
    fail(ErrorKind::kUnsupported,
         "linear_num_key_heads ({}) and linear_num_value_heads ({}) must both be divisible by "
         "--tensor-parallel-size {}",
         l.num_key_heads, l.num_value_heads, tp);
  const int64_t H = ctx.config.hidden_size, Hk = l.num_key_heads, Hv = l.num_value_heads;
  dk_ = l.key_head_dim;
  dv_ = l.value_head_dim;
  kernel_ = l.conv_kernel;
  hk_ = Hk / tp;
  hv_ = Hv / tp;
  const int64_t ratio = Hv / Hk, Dk = dk_, Dv = dv_;
  conv_channels_ = 2 * hk_ * Dk + hv_ * Dv;
  const int64_t k0 = r * hk_, v0 = r * hv_;  // this rank's first key head and value head
  using Block = WeightStore::RowBlock;
  std::vector<Block> rows;
  if (layout == GdnLayout::kSeparate) {
    const Shape qkv{2 * Hk * Dk + Hv * Dv, H};
    rows.push_back({p + "in_proj_qkv.weight", qkv, k0 * Dk, hk_ * Dk});
    rows.push_back({p + "in_proj_qkv.weight", qkv, Hk * Dk + k0 * Dk, hk_ * Dk});
    rows.push_back({p + "in_proj_qkv.weight", qkv, 2 * Hk * Dk + v0 * Dv, hv_ * Dv});
    rows.push_back({p + "in_proj_z.weight", Shape{Hv * Dv, H}, v0 * Dv, hv_ * Dv});
    rows.push_back({p + "in_proj_b.weight", Shape{Hv, H}, v0, hv_});
    rows.push_back({p + "in_proj_a.weight", Shape{Hv, H}, v0, hv_});
  } else {
    // in_proj_qkvz: per key head [q (Dk), k (Dk), v (ratio*Dv), z (ratio*Dv)]; in_proj_ba:
    // per key head [b (ratio), a (ratio)]. Value heads kh*ratio .. kh*ratio+ratio-1 follow
    // key head kh, so taking each part head by head gives q | k | v | z in head order.
    const int64_t group = 2 * Dk + 2 * ratio * Dv;
    const Shape qkvz{Hk * group, H}, ba{Hk * 2 * ratio, H};
    const std::string w = p + "in_proj_qkvz.weight", wba = p + "in_proj_ba.weight";
    for (int64_t kh = k0; kh < k0 + hk_; ++kh) rows.push_back({w, qkvz, kh * group, Dk});
    for (int64_t kh = k0; kh < k0 + hk_; ++kh) rows.push_back({w, qkvz, kh * group + Dk, Dk});
    for (int64_t kh = k0; kh < k0 + hk_; ++kh) rows.push_back({w, qkvz, kh * group + 2 * Dk, ratio * Dv});
    for (int64_t kh = k0; kh < k0 + hk_; ++kh) rows.push_back({w, qkvz, kh * group + 2 * Dk + ratio * Dv, ratio * Dv});
    for (int64_t kh = k0; kh < k0 + hk_; ++kh) rows.push_back({wba, ba, kh * 2 * ratio, ratio});
    for (int64_t kh = k0; kh < k0 + hk_; ++kh) rows.push_back({wba, ba, kh * 2 * ratio + ratio, ratio});
  }
  WeightStore& w = ctx.weights;
  if (w.quantization().fp8()) {
    // FP8 checkpoints keep in_proj_b / in_proj_a (or in_proj_ba) unquantised and their rows
    // are not whole 128-row scale blocks: q | k | v | z and b | a become two parameters, the
    // first FP8 where the checkpoint (or the quantisation) makes it so.
    std::vector<Block> ba(std::make_move_iterator(rows.end() - 2 * (layout == GdnLayout::kSeparate ? 1 : hk_)),
                          std::make_move_iterator(rows.end()));
    rows.resize(rows.size() - ba.size());
    in_proj_ = &w.declare_row_blocks(p + "in_proj_qkvz", std::move(rows), {conv_channels_ + hv_ * Dv, H});
    in_proj_ba_ = &w.declare_row_blocks(p + "in_proj_ba", std::move(ba), {2 * hv_, H});
  } else {
    in_proj_ = &w.declare_row_blocks(p + "in_proj", std::move(rows), {conv_channels_ + hv_ * Dv + 2 * hv_, H});
  }
  // conv1d.weight [C, 1, K], channels q | k | v like in_proj_qkv: this rank's channels of each.
  const Shape conv{2 * Hk * Dk + Hv * Dv, 1, kernel_};
  const std::string cw = p + "conv1d.weight";
  conv_weight_ = &w.declare_row_blocks(cw,
                                       {{cw, conv, k0 * Dk, hk_ * Dk},
                                        {cw, conv, Hk * Dk + k0 * Dk, hk_ * Dk},
                                        {cw, conv, 2 * Hk * Dk + v0 * Dv, hv_ * Dv}},
                                       {conv_channels_, kernel_});
  A_log_ = &w.declare_f32(p + "A_log", {Hv}, ParallelStyle::kColumn);
  dt_bias_ = &w.declare_f32(p + "dt_bias", {Hv}, ParallelStyle::kColumn);
  // The gated norm scales by w itself (not 1 + w).
  norm_ = &w.declare(p + "norm.weight", {Dv}, ParallelStyle::kReplicated, DummyInit::kOnes);
  out_proj_ = RowParallelLinear(ctx, p + "out_proj.weight", H, Hv * Dv);
}

LayerCacheSpec GatedDeltaNet::cache_spec() const {
  LayerCacheSpec s;
  s.kind = CacheKind::kStateSlot;
  s.conv_state_shape = Shape{kernel_ - 1, conv_channels_};
  s.ssm_state_shape = Shape{hv_, dk_, dv_};
  return s;
}

void GatedDeltaNet::forward(const Tensor& h, const Tensor& out, const LinearAttnMetadata& meta,
                            const Tensor& conv_state, const Tensor& ssm_state) const {
  Backend& be = backend_;
  const int64_t T = h.dim(0), C = conv_channels_, Z = hv_ * dv_;
  TESSERA_CHECK(meta.num_tokens == T && meta.num_seqs > 0,
                "linear attention: metadata for {} tokens in {} sequences, "
                "the step has {} tokens",
                meta.num_tokens, meta.num_seqs, T);
  TESSERA_CHECK(conv_state.defined() && ssm_state.defined(), "linear attention: the layer's state cache is missing");
  const DType dt = be.compute_dtype();
  Tensor proj = be.scratch({T, C + Z + (in_proj_ba_ ? 0 : 2 * hv_)}, dt);  // [q k v | z | b a]
  be.linear(h, *in_proj_, nullptr, proj);
  Tensor ba = proj;  // b | a at column ba_col
  int64_t ba_col = C + Z;
  if (in_proj_ba_) {
    ba = be.scratch({T, 2 * hv_}, dt);
    be.linear(h, *in_proj_ba_, nullptr, ba);
    ba_col = 0;
  }
  Tensor qkv = be.scratch({T, C}, dt);
  be.causal_conv1d(proj, 0, *conv_weight_, conv_state, meta, qkv);
  Tensor core = be.scratch({T, hv_, dv_}, dt);
  be.gated_delta_rule(qkv, ba, ba_col, *A_log_, *dt_bias_, ssm_state, meta, core);
  be.gated_rms_norm(core, proj, C, *norm_, eps_, core);
  out_proj_.forward(core.view({T, hv_ * dv_}), out);
}

}  // namespace tessera
