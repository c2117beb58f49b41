// The decoder shared by the dense Llama-like families: pre-norm attention with
// rotary embeddings and GQA, then a SwiGLU MLP. Families differ by a few options
// (qkv bias, q/k norm), set in their own files (llama.cpp, qwen2.cpp, qwen3.cpp).
#pragma once
#include <vector>

#include "model/model.h"

namespace tessera {

struct DenseDecoderOptions {
  bool qkv_bias = false;  // Qwen2
  bool qk_norm = false;   // Qwen3: RMSNorm over each head of q and k before rope
};

class DenseDecoderModel : public Model {
 public:
  DenseDecoderModel(ModelConfig config, DenseDecoderOptions options, const ModelOptions& model_options,
                    Backend& backend);
  const ModelConfig& config() const override { return config_; }
  std::vector<LayerCacheSpec> cache_specs() const override;
  WeightStore& weights() override { return weights_; }
  Tensor forward(const ModelInput& input, KvCache& cache) override;
  Tensor run(const StepInputs& input, KvCache& cache) override;
  bool graph_safe() const override;
  bool returns_logits() const override;

 private:
  struct Attention {
    const Tensor* qkv = nullptr;  // q, k, v stacked (no bias, KV heads split): one GEMM
    const Tensor *q_proj = nullptr, *k_proj = nullptr, *v_proj = nullptr, *o_proj = nullptr;
    const Tensor *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr;
    const Tensor *q_norm = nullptr, *k_norm = nullptr;
  };
  struct Layer {
    const Tensor* input_norm;
    Attention attn;
    const Tensor* post_attention_norm;
    const Tensor *gate_up, *down;
  };
  void attention(int layer, const Tensor& h, const Tensor& out, const Tensor& positions, const AttentionMetadata& meta,
                 KvCache& cache);
  void mlp(int layer, const Tensor& h, const Tensor& out);
  void all_reduce(const Tensor& t);  // TP sum of a row-parallel output (no-op at TP 1)
  void embed(const Tensor& ids, const Tensor& out);
  Tensor lm_head(const Tensor& rows);

  ModelConfig config_;
  DenseDecoderOptions options_;
  Backend& backend_;
  ParallelContext pc_;
  ParallelRuntime rt_;
  LayerRange layer_range_;  // this pipeline stage's layers (global indices)
  WeightStore weights_;
  int local_heads_, local_kv_heads_;
  const Tensor* embed_ = nullptr;       // first stage only
  std::vector<Layer> layers_;           // layer_range_.begin + i
  const Tensor* final_norm_ = nullptr;  // last stage only
  const Tensor* lm_head_ = nullptr;     // last stage only
  RopeTable rope_;
  int max_positions_;
};

}  // namespace tessera
