// The Gated DeltaNet layer (linear attention) of Qwen3-Next and Qwen3.5: one fused input
// projection per rank laid out [q | k | v | z | b | a], a causal depthwise conv1d + SiLU
// over q|k|v (the conv state), the gated delta rule (the recurrent state), a gated RMSNorm
// with z, and a row-parallel out_proj. Both checkpoint layouts load into that one layout:
// Qwen3.5's separate in_proj_qkv / in_proj_z / in_proj_b / in_proj_a, and Qwen3-Next's
// in_proj_qkvz / in_proj_ba, which interleave the parts per key head (rows regrouped at
// load). TP: each rank owns Hk/tp key heads and the Hv/tp value heads that read them, a
// matching slice of every part and of the conv channels; its states are that rank's heads.
// With FP8 weights (a quantised config) b | a is a second, unquantised projection: FP8
// checkpoints keep in_proj_b / in_proj_a in bf16, and their rows are not whole scale blocks.
#pragma once
#include <string>

#include "model/layers/linear.h"
#include "model/model.h"

namespace tessera {

enum class GdnLayout {
  kSeparate,     // Qwen3.5: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
  kInterleaved,  // Qwen3-Next: in_proj_qkvz and in_proj_ba, grouped by key head
};

class GatedDeltaNet {
 public:
  // Declares prefix + "in_proj_*", "conv1d.weight", "A_log", "dt_bias", "norm.weight",
  // "out_proj.weight" ("model.layers.0.linear_attn.").
  GatedDeltaNet(BlockContext& ctx, const std::string& prefix, GdnLayout layout);
  // kStateSlot: conv state [K-1, C] and recurrent state [Hv, Dk, Dv] of this rank.
  LayerCacheSpec cache_spec() const;
  // out[T,H] (complete on every rank) from the normed h[T,H]; reads and updates the slots'
  // conv_state [slots, K-1, C] and ssm_state [slots, Hv, Dk, Dv].
  void forward(const Tensor& h, const Tensor& out, const LinearAttnMetadata& meta, const Tensor& conv_state,
               const Tensor& ssm_state) const;

 private:
  Backend& backend_;
  float eps_;
  int64_t hk_, hv_, dk_, dv_, kernel_;  // this rank's heads
  int64_t conv_channels_;               // 2 * hk * dk + hv * dv
  // [C + hv*dv + 2*hv, H]; with FP8 weights two parameters: [C + hv*dv, H] and in_proj_ba_ [2*hv, H].
  const Tensor* in_proj_ = nullptr;
  const Tensor* in_proj_ba_ = nullptr;
  const Tensor* conv_weight_ = nullptr;  // [C, K]
  const Tensor *A_log_ = nullptr, *dt_bias_ = nullptr, *norm_ = nullptr;
  RowParallelLinear out_proj_;
};

}  // namespace tessera
