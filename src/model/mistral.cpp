// MistralForCausalLM: Llama's layout (no projection biases) with sliding-window attention on
// every layer when config.json sets sliding_window (ModelConfig::layer_windows; null: none).
#include "model/decoder.h"
#include "model/registry.h"

namespace tessera {

std::unique_ptr<Model> make_mistral(const ModelConfig& config, const ModelOptions& options, Backend& backend) {
  return std::make_unique<DecoderModel>(
      config, DecoderSpec{.attention = {.qkv_bias = config.attention_bias}, .feed_forward = nullptr}, options, backend);
}

}  // namespace tessera
