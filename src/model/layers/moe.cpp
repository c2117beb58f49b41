#include "model/layers/moe.h"

#include "core/error.h"

namespace tessera {

MoeBlock::MoeBlock(BlockContext& ctx, const std::string& p, const MoeOptions& o)
    : backend_(ctx.backend), comm_(ctx.comm), options_(o) {
  TESSERA_CHECK(o.num_experts > 0 && o.top_k >= 1 && o.top_k <= o.num_experts && o.intermediate > 0,
                "{}: {} experts, top {}, intermediate {}", p, o.num_experts, o.top_k, o.intermediate);
  const int64_t H = ctx.config.hidden_size;
  WeightStore& w = ctx.weights;
  router_ = &w.declare(p + "gate.weight", {o.num_experts, H}, ParallelStyle::kReplicated);
  experts_ = w.declare_experts(p + "experts", o.num_experts, o.intermediate, H);
  if (o.shared_intermediate > 0) {
    shared_.emplace(ctx, p + "shared_expert.", o.shared_intermediate);
    if (o.shared_expert_gate)
      shared_gate_ = &w.declare(p + "shared_expert_gate.weight", {1, H}, ParallelStyle::kReplicated);
  }
}

void MoeBlock::forward(const Tensor& x, const Tensor& out) {
  Backend& be = backend_;
  const int64_t T = x.dim(0), E = options_.num_experts;
  const int k = options_.top_k;
  Tensor logits = be.scratch({T, E}, DType::kF32);
  be.linear(x, *router_, nullptr, logits);
  Tensor ids = be.scratch({T, k}, DType::kI32);
  Tensor weights = be.scratch({T, k}, DType::kF32);
  Backend::MoeSharedExpert shared{};
  if (shared_) shared = {&shared_->gate_up_weight(), &shared_->down_weight(), shared_gate_};
  be.moe_topk_experts(logits, k, options_.renormalize, x, *experts_.gate_up, *experts_.down, ids, weights,
                      static_cast<int>(experts_.shard.expert_begin), out, shared_ ? &shared : nullptr);
  comm_.all_reduce(out);
}

}  // namespace tessera
