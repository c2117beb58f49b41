// LlamaForCausalLM (Llama 2/3.x).
#include "model/decoder.h"
#include "model/registry.h"

namespace tessera {

std::unique_ptr<Model> make_llama(const ModelConfig& config, const ModelOptions& options, Backend& backend) {
  return std::make_unique<DecoderModel>(
      config, DecoderSpec{.attention = {.qkv_bias = config.attention_bias}, .feed_forward = nullptr}, options, backend);
}

}  // namespace tessera
