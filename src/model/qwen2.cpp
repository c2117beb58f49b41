// Qwen2ForCausalLM: Llama's layout with a bias on the q, k and v projections.
#include "model/decoder.h"
#include "model/registry.h"

namespace tessera {

std::unique_ptr<Model> make_qwen2(const ModelConfig& config, const ModelOptions& options, Backend& backend) {
  return std::make_unique<DecoderModel>(config, DecoderSpec{.attention = {.qkv_bias = true}, .feed_forward = nullptr},
                                        options, backend);
}

}  // namespace tessera
