// The decoder every family composes: an embedding, layers of a pre-norm token mixer (self-
// attention, or in hybrid models a Gated DeltaNet on the layers config.layer_types marks
// linear_attention) and a feed-forward block (a dense SwiGLU MLP or a mixture of experts,
// chosen per layer by the family), a final norm and the lm_head, with pipeline stages owning
// a contiguous range of layers. A family file (llama.cpp, qwen2.cpp, qwen3.cpp,
// qwen2_moe.cpp, qwen3_moe.cpp, qwen3_next.cpp, qwen3_5.cpp) sets the options and the
// feed-forward factory. Weights live under "model." ("model.language_model." for a
// multimodal wrapper's text model, whose other weights are never read) and "lm_head.".
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "model/layers/attention.h"
#include "model/layers/embedding.h"
#include "model/layers/gated_deltanet.h"
#include "model/layers/mlp.h"
#include "model/layers/moe.h"
#include "model/layers/norm.h"
#include "model/model.h"

namespace tessera {

struct DecoderSpec {
  AttentionOptions attention;
  // The feed-forward block of global layer `layer`, declared under `prefix`
  // ("model.layers.3.mlp."). Empty: a SwiGLU MLP of intermediate_size.
  std::function<std::unique_ptr<FeedForward>(BlockContext& ctx, int layer, const std::string& prefix)> feed_forward;
  // The layer, final and q/k norms scale by 1 + w (Qwen3-Next, Qwen3.5).
  bool zero_centred_norms = false;
  // The checkpoint layout of the Gated DeltaNet layers (config.is_linear_layer).
  GdnLayout linear_attention = GdnLayout::kSeparate;
};

// A dense MLP of intermediate_size, or (config.moe.is_moe_layer) a MoE block with `moe`'s
// options: the layer rule of the Qwen MoE families.
std::unique_ptr<FeedForward> moe_or_dense(BlockContext& ctx, int layer, const std::string& prefix,
                                          const MoeOptions& moe);
// MoeOptions from config.moe (the shared expert when shared_expert_intermediate_size > 0).
MoeOptions moe_options(const ModelConfig& config);
// The parts Qwen3-Next and Qwen3.5 share, their Gated DeltaNet weights laid out as `layout`:
// which layers are linear attention (the config must name them), and gated attention with
// zero-centred norms.
DecoderSpec hybrid_decoder_spec(const ModelConfig& config, GdnLayout layout);

class DecoderModel : public Model {
 public:
  DecoderModel(ModelConfig config, DecoderSpec spec, const ModelOptions& model_options, Backend& backend);
  const ModelConfig& config() const override { return config_; }
  std::vector<LayerCacheSpec> cache_specs() const override;
  WeightStore& weights() override { return weights_; }
  Tensor forward(const ModelInput& input, KvCache& cache) override;
  Tensor forward_argmax_rows(const ModelInput& input, KvCache& cache, std::span<const int32_t> argmax_rows) override;
  Tensor run(const StepInputs& input, KvCache& cache) override;
  bool graph_safe() const override { return comm_.graph_safe(); }
  bool returns_logits() const override;
  bool shards_logits() const override { return comm_.tp_size() > 1; }
  bool has_mtp() const override { return mtp_.has_value(); }
  Tensor run_mtp(const StepInputs& input, const Tensor& hidden, const Tensor& hidden_out, KvCache& cache) override;
  void share_sampled(const Tensor& ids) override;

 private:
  struct Layer {
    RmsNorm input_norm;
    std::unique_ptr<Attention> attention;             // full-attention layers
    std::unique_ptr<GatedDeltaNet> linear_attention;  // linear-attention layers
    RmsNorm post_attention_norm;
    std::unique_ptr<FeedForward> feed_forward;
  };

  // The multi-token-prediction layer (ModelOptions::mtp; vLLM's qwen3_next_mtp / qwen3_5_mtp),
  // under "mtp.": at position t, h = fc([pre_fc_norm_embedding(embed(x[t+1])) |
  // pre_fc_norm_hidden(hidden[t])]), then one full-attention decoder layer of the family's kind
  // (mtp.layers.0, its feed-forward block chosen as for layer 0), then norm; the embedding and
  // lm_head are the model's. It lives on the last pipeline stage; under TP its attention and
  // feed-forward block are split as the other layers' are, and fc (small: [H, 2H]) is
  // replicated, so it adds no collective to a pass.
  struct Mtp {
    RmsNorm pre_fc_norm_embedding, pre_fc_norm_hidden, norm;
    const Tensor* fc = nullptr;  // [H, 2H], no bias: the embedding half's columns first
    Layer layer;
    std::optional<VocabParallelEmbedding> embed;  // a copy of the embedding where the stage has none (PP)
  };

  ModelConfig config_;
  Backend& backend_;
  ParallelContext pc_;
  ModelComm comm_;
  WeightStore weights_;
  LayerRange layer_range_;                       // this pipeline stage's layers (global indices)
  std::optional<VocabParallelEmbedding> embed_;  // first stage only
  std::vector<Layer> layers_;                    // layer_range_.begin + i
  RmsNorm final_norm_;                           // last stage only
  std::optional<ParallelLmHead> lm_head_;        // last stage only
  RopeTable rope_;
  int max_positions_;
  bool has_state_layers_ = false;  // this stage holds Gated DeltaNet layers
  std::optional<Mtp> mtp_;         // its KV is the cache's last layer
};

}  // namespace tessera
