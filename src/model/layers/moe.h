// A sparse mixture-of-experts block (Qwen2-MoE / Qwen3-MoE, and the MoE layers of
// Qwen3-Next / Qwen3.5): a replicated router linear gives f32 logits [T, E]; moe_topk picks
// k experts per token (softmax in f32, renormalised when norm_topk_prob); moe_experts runs
// this rank's experts (each expert's intermediate slice under TP, whole experts under
// expert parallelism); both through Backend::moe_topk_experts, which a backend may fuse. An optional shared expert (a
// SwiGLU MLP every token goes through), scaled by sigmoid(shared_expert_gate(x)), is added. The ranks' partial sums
// meet in one all-reduce at the end.
#pragma once
#include <optional>
#include <string>

#include "model/layers/mlp.h"

namespace tessera {

struct MoeOptions {
  int64_t num_experts = 0;
  int top_k = 0;
  int64_t intermediate = 0;         // moe_intermediate_size
  bool renormalize = false;         // norm_topk_prob
  int64_t shared_intermediate = 0;  // the shared expert's intermediate size; 0: none
  bool shared_expert_gate = true;   // a sigmoid gate [1, H] on the shared expert's output
};

class MoeBlock : public FeedForward {
 public:
  // Declares prefix + "gate.weight" (the router), the experts under prefix + "experts", and
  // the shared expert under prefix + "shared_expert." with prefix + "shared_expert_gate.weight".
  MoeBlock(BlockContext& ctx, const std::string& prefix, const MoeOptions& options);
  void forward(const Tensor& x, const Tensor& out) override;

 private:
  Backend& backend_;
  ModelComm& comm_;
  MoeOptions options_;
  const Tensor* router_ = nullptr;  // [E, H]
  WeightStore::Experts experts_;
  std::optional<SwiGluMlp> shared_;
  const Tensor* shared_gate_ = nullptr;  // [1, H]
};

}  // namespace tessera
