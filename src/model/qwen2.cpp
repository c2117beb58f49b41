// Qwen2ForCausalLM: Llama's layout with a bias on the q, k and v projections.
#include "model/dense_decoder.h"
#include "model/registry.h"

namespace tessera {

std::unique_ptr<Model> make_qwen2(const ModelConfig& config, const ModelOptions& options, Backend& backend) {
  return std::make_unique<DenseDecoderModel>(config, DenseDecoderOptions{.qkv_bias = true}, options, backend);
}

}  // namespace tessera
