// Self-attention with rotary embeddings over the paged KV cache: GQA (KV heads split across
// TP ranks, or replicated when TP is a multiple of them, as vLLM does), optional qkv bias
// (Qwen2) and per-head q/k RMSNorm (Qwen3), and a row-parallel o_proj. Partial rotary
// embeddings come from the rope table (rotary_dim below head_dim). Gated attention
// (Qwen3-Next / Qwen3.5): q_proj yields each head's query and then its gate ([Hq, 2, D] rows);
// the output is attention * sigmoid(gate) before o_proj, and the q/k norms are zero-centred.
// A sliding window limits each query to the last W positions (AttentionOptions::sliding_window).
#pragma once
#include <string>

#include "model/layers/linear.h"

namespace tessera {

struct AttentionOptions {
  bool qkv_bias = false;              // Qwen2
  bool qk_norm = false;               // Qwen3: RMSNorm over each head of q and k before rope
  bool output_gate = false;           // Qwen3-Next / Qwen3.5 (no qkv bias)
  bool zero_centred_qk_norm = false;  // the q/k norms scale by 1 + w
  // Sliding-window attention (Mistral, Qwen2's windowed layers): the query at position p attends
  // the keys at p - W < k <= p; 0: the whole context. Set per layer (ModelConfig::layer_window).
  int sliding_window = 0;
};

class Attention {
 public:
  // Declares prefix + "q_proj.weight", ... ("model.layers.3.self_attn.").
  Attention(BlockContext& ctx, const std::string& prefix, const AttentionOptions& options);
  int local_kv_heads() const { return local_kv_heads_; }
  int sliding_window() const { return sliding_window_; }
  // out[T,H] (complete on every rank) from the normed h[T,H]; this step's K and V go into
  // the layer's caches.
  void forward(const Tensor& h, const Tensor& out, const Tensor& positions, const AttentionMetadata& meta,
               const RopeTable& rope, const Tensor& k_cache, const Tensor& v_cache, float k_scale, float v_scale) const;

 private:
  Backend& backend_;
  int64_t head_dim_;
  float eps_;
  int local_heads_, local_kv_heads_;
  int sliding_window_ = 0;
  const Tensor* qkv_ = nullptr;   // q, k, v stacked (no bias): one GEMM
  const Tensor* gate_ = nullptr;  // output_gate: this rank's gate rows of q_proj
  const Tensor *q_proj_ = nullptr, *k_proj_ = nullptr, *v_proj_ = nullptr;
  const Tensor *q_bias_ = nullptr, *k_bias_ = nullptr, *v_bias_ = nullptr;
  const Tensor *q_norm_ = nullptr, *k_norm_ = nullptr;
  RowParallelLinear o_proj_;
};

}  // namespace tessera
