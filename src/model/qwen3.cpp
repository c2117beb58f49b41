// Qwen3ForCausalLM: no qkv bias (unless attention_bias), RMSNorm on each q and k head.
#include "model/dense_decoder.h"
#include "model/registry.h"

namespace tessera {

std::unique_ptr<Model> make_qwen3(const ModelConfig& config, const ModelOptions& options, Backend& backend) {
  return std::make_unique<DenseDecoderModel>(
      config, DenseDecoderOptions{.qkv_bias = config.attention_bias, .qk_norm = true}, options, backend);
}

}  // namespace tessera
