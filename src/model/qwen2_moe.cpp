// Qwen2MoeForCausalLM: Qwen2's attention (qkv bias); MoE blocks with a shared expert of
// shared_expert_intermediate_size scaled by sigmoid(shared_expert_gate) in the sparse layers.
#include "core/error.h"
#include "loader/config_source.h"
#include "model/decoder.h"
#include "model/registry.h"

namespace tessera {

std::unique_ptr<Model> make_qwen2_moe(const ModelConfig& config, const ModelOptions& options, Backend& backend) {
  const MoeOptions moe = moe_options(config);
  if (config.moe.num_experts > 0 && moe.shared_intermediate <= 0)
    fail(ErrorKind::kCorrupt, "{}: Qwen2MoeForCausalLM needs shared_expert_intermediate_size > 0 (its shared expert)",
         config_source(config));
  const auto it = config.raw.find("qkv_bias");  // newer transformers spell out the default
  const bool qkv_bias = it == config.raw.end() || !it->is_boolean() || it->get<bool>();
  DecoderSpec spec{.attention = {.qkv_bias = qkv_bias},
                   .feed_forward = [moe](BlockContext& ctx, int layer, const std::string& prefix) {
                     return moe_or_dense(ctx, layer, prefix, moe);
                   }};
  return std::make_unique<DecoderModel>(config, std::move(spec), options, backend);
}

}  // namespace tessera
