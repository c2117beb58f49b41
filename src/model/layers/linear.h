// A linear layer whose weight [out, in] is split along its input features across the TP
// ranks: each rank's product is a partial sum, and the layer owns the all-reduce that
// completes it.
#pragma once
#include <string>

#include "model/layers/block.h"

namespace tessera {

class RowParallelLinear {
 public:
  RowParallelLinear() = default;
  RowParallelLinear(BlockContext& ctx, const std::string& name, int64_t out_features, int64_t in_features)
      : backend_(&ctx.backend),
        comm_(&ctx.comm),
        weight_(&ctx.weights.declare(name, {out_features, in_features}, ParallelStyle::kRow)) {}
  int64_t local_in_features() const { return weight_->dim(1); }
  const Tensor& weight() const { return *weight_; }
  // out[T, out_features] = x[T, local_in] @ w_local^T, summed over the TP ranks.
  void forward(const Tensor& x, const Tensor& out) const {
    forward_partial(x, out);
    comm_->all_reduce(out);
  }
  // This rank's partial sum only, for a caller that adds other partial sums (a shared
  // expert, routed experts) before one all-reduce.
  void forward_partial(const Tensor& x, const Tensor& out) const { backend_->linear(x, *weight_, nullptr, out); }

 private:
  Backend* backend_ = nullptr;
  ModelComm* comm_ = nullptr;
  const Tensor* weight_ = nullptr;
};

}  // namespace tessera
