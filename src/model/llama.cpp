// LlamaForCausalLM (Llama 2/3.x, and Mistral-style checkpoints that share its layout).
#include "model/dense_decoder.h"
#include "model/registry.h"

namespace tessera {

std::unique_ptr<Model> make_llama(const ModelConfig& config, const ModelOptions& options, Backend& backend) {
  return std::make_unique<DenseDecoderModel>(config, DenseDecoderOptions{.qkv_bias = config.attention_bias}, options,
                                             backend);
}

}  // namespace tessera
