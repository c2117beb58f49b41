// Qwen3.5: Qwen3-Next's hybrid decoder with the Gated DeltaNet projections stored
// separately (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a).
//   Qwen3_5MoeForCausalLM: MoE blocks with a sigmoid-gated shared expert in every layer.
//   Qwen3_5MoeForConditionalGeneration: the released multimodal wrapper of the same text
//     model (text_config, weights under model.language_model.); the vision tower is never
//     declared, so its weights are never read.
//   Qwen3_5ForCausalLM: dense SwiGLU MLPs.
#include "core/error.h"
#include "loader/config_source.h"
#include "model/decoder.h"
#include "model/registry.h"

namespace tessera {

std::unique_ptr<Model> make_qwen3_5_moe(const ModelConfig& config, const ModelOptions& options, Backend& backend) {
  DecoderSpec spec = hybrid_decoder_spec(config, GdnLayout::kSeparate);
  MoeOptions moe = moe_options(config);
  if (config.moe.num_experts <= 0)
    fail(ErrorKind::kCorrupt, "{}: {} needs num_experts > 0", config_source(config), config.architecture);
  moe.renormalize = true;  // Qwen3.5's router always renormalises its top-k (no norm_topk_prob field)
  spec.feed_forward = [moe](BlockContext& ctx, int layer, const std::string& prefix) {
    return moe_or_dense(ctx, layer, prefix, moe);
  };
  return std::make_unique<DecoderModel>(config, std::move(spec), options, backend);
}

std::unique_ptr<Model> make_qwen3_5(const ModelConfig& config, const ModelOptions& options, Backend& backend) {
  DecoderSpec spec = hybrid_decoder_spec(config, GdnLayout::kSeparate);
  return std::make_unique<DecoderModel>(config, std::move(spec), options, backend);
}

}  // namespace tessera
