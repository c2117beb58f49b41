// The SwiGLU MLP: gate and up projections stacked into one column-parallel GEMM, then
// silu(gate) * up and the row-parallel down projection.
#pragma once
#include <string>

#include "model/layers/linear.h"

namespace tessera {

class SwiGluMlp : public FeedForward {
 public:
  SwiGluMlp() = default;
  // Declares prefix + "gate_proj.weight", "up_proj.weight", "down_proj.weight" ("model.layers.3.mlp.").
  SwiGluMlp(BlockContext& ctx, const std::string& prefix, int64_t intermediate);
  void forward(const Tensor& x, const Tensor& out) override;
  // This rank's partial sum of the down projection (before the TP all-reduce).
  void forward_partial(const Tensor& x, const Tensor& out) const;
  // This rank's weights: gate_up [2I, H] (gate rows, then up rows) and down [H, I].
  const Tensor& gate_up_weight() const { return *gate_up_; }
  const Tensor& down_weight() const { return down_.weight(); }

 private:
  Backend* backend_ = nullptr;
  ModelComm* comm_ = nullptr;
  const Tensor* gate_up_ = nullptr;
  RowParallelLinear down_;
};

}  // namespace tessera
