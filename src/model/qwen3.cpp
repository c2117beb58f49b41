// Qwen3ForCausalLM: no qkv bias (unless attention_bias), RMSNorm on each q and k head.
#include "model/decoder.h"
#include "model/registry.h"

namespace tessera {

std::unique_ptr<Model> make_qwen3(const ModelConfig& config, const ModelOptions& options, Backend& backend) {
  return std::make_unique<DecoderModel>(
      config, DecoderSpec{.attention = {.qkv_bias = config.attention_bias, .qk_norm = true}, .feed_forward = nullptr},
      options, backend);
}

}  // namespace tessera
