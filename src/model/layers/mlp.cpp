#include "model/layers/mlp.h"

namespace tessera {

SwiGluMlp::SwiGluMlp(BlockContext& ctx, const std::string& p, int64_t intermediate)
    : backend_(&ctx.backend), comm_(&ctx.comm) {
  const int64_t H = ctx.config.hidden_size;
  gate_up_ = &ctx.weights.declare_stacked(
      p + "gate_up_proj", {{p + "gate_proj.weight", intermediate}, {p + "up_proj.weight", intermediate}}, H);
  down_ = RowParallelLinear(ctx, p + "down_proj.weight", H, intermediate);
}

void SwiGluMlp::forward_partial(const Tensor& x, const Tensor& out) const {
  Backend& be = *backend_;
  const int64_t T = x.dim(0), I = down_.local_in_features();
  Tensor gate_up = be.scratch({T, 2 * I}, be.compute_dtype());
  be.linear(x, *gate_up_, nullptr, gate_up);
  Tensor act = be.scratch({T, I}, be.compute_dtype());
  be.silu_mul(gate_up, act);
  down_.forward_partial(act, out);
}

void SwiGluMlp::forward(const Tensor& x, const Tensor& out) {
  forward_partial(x, out);
  comm_->all_reduce(out);  // row-parallel down_proj
}

}  // namespace tessera
