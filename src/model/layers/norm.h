// RMSNorm over the last dimension, replicated on every rank. Zero-centred (Qwen3-Next,
// Qwen3.5: the checkpoint holds w and the norm scales by 1 + w) stores 1 + w at load, in f32
// (the norm kernels take f32 weights; in bf16 1 + w would lose w's low bits), so the same
// kernels run both.
#pragma once
#include <string>

#include "model/layers/block.h"

namespace tessera {

class RmsNorm {
 public:
  RmsNorm() = default;
  RmsNorm(BlockContext& ctx, const std::string& name, int64_t dim)
      : backend_(&ctx.backend),
        weight_(&ctx.weights.declare(name, {dim}, ParallelStyle::kReplicated, DummyInit::kOnes)),
        eps_(static_cast<float>(ctx.config.rms_norm_eps)) {}
  RmsNorm(BlockContext& ctx, const std::string& name, int64_t dim, bool zero_centred)
      : backend_(&ctx.backend),
        weight_(zero_centred ? &ctx.weights.declare_offset(name, {dim}, 1.0f, /*f32=*/true)
                             : &ctx.weights.declare(name, {dim}, ParallelStyle::kReplicated, DummyInit::kOnes)),
        eps_(static_cast<float>(ctx.config.rms_norm_eps)) {}
  const Tensor& weight() const { return *weight_; }
  float eps() const { return eps_; }
  // out = rms_norm(x) * w
  void forward(const Tensor& x, const Tensor& out) const { backend_->rms_norm(x, *weight_, eps_, out); }
  // residual += x; x = rms_norm(residual) * w
  void add_forward(const Tensor& x, const Tensor& residual) const {
    backend_->add_rms_norm(x, residual, *weight_, eps_);
  }

 private:
  Backend* backend_ = nullptr;
  const Tensor* weight_ = nullptr;
  float eps_ = 1e-6f;
};

}  // namespace tessera
