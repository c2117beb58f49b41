// Qwen3MoeForCausalLM: Qwen3's attention (q/k norm); MoE blocks without a shared expert in
// the sparse layers (decoder_sparse_step, mlp_only_layers), dense SwiGLU MLPs in the others.
#include "model/decoder.h"
#include "model/registry.h"

namespace tessera {

std::unique_ptr<Model> make_qwen3_moe(const ModelConfig& config, const ModelOptions& options, Backend& backend) {
  MoeOptions moe = moe_options(config);
  moe.shared_intermediate = 0;  // transformers' Qwen3-MoE has no shared expert
  DecoderSpec spec{.attention = {.qkv_bias = config.attention_bias, .qk_norm = true},
                   .feed_forward = [moe](BlockContext& ctx, int layer, const std::string& prefix) {
                     return moe_or_dense(ctx, layer, prefix, moe);
                   }};
  return std::make_unique<DecoderModel>(config, std::move(spec), options, backend);
}

}  // namespace tessera
