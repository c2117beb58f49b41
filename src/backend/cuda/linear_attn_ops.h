// The linear-attention family of the CUDA backend (Gated DeltaNet: Qwen3-Next, Qwen3.5): the
// causal conv1d, the gated delta rule (chunked tensor-core prefill or the recurrent kernel, and
// the choice per sequence under speculative decoding) and the gated RMSNorm.
#pragma once
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_options.h"

namespace tessera::cuda {

class LinearAttnOps {
 public:
  LinearAttnOps(CudaDevice& dev, const CudaOptions& options) : dev_(dev), options_(options) {}
  void causal_conv1d(const Tensor& x, int64_t x_col, const Tensor& weight, const Tensor& conv_state,
                     const LinearAttnMetadata& meta, const Tensor& out);
  void gated_delta_rule(const Tensor& qkv, const Tensor& ba, int64_t ba_col, const Tensor& A_log, const Tensor& dt_bias,
                        const Tensor& state, const LinearAttnMetadata& meta, const Tensor& out);
  void gated_rms_norm(const Tensor& x, const Tensor& z, int64_t z_col, const Tensor& w, float eps, const Tensor& out);

 private:
  void check_linear_meta(const LinearAttnMetadata& m, int64_t T, const char* op) const;
  CudaDevice& dev_;
  const CudaOptions& options_;
};

}  // namespace tessera::cuda
