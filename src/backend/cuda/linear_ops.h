// The linear family of the CUDA backend: bf16 and FP8 block-scaled linear layers, and the
// choice among their kernels (GEMV, small-M, tensor-core GEMMs, cuBLASLt).
#pragma once
#include <memory>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_options.h"

namespace tessera::cuda {

class Gemm;

class LinearOps {
 public:
  LinearOps(CudaDevice& dev, const CudaOptions& options);
  ~LinearOps();
  // Backend::linear.
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out);

 private:
  void linear_fp8(const Tensor& x, const Tensor& w, const Tensor& out, int64_t M, int64_t N, int64_t K);
  bool fp8_w8a8(const Tensor& x, const float* wscale, const Tensor& w, const Tensor& out, int64_t M, int64_t N,
                int64_t K);
  CudaDevice& dev_;
  const CudaOptions& options_;
  std::unique_ptr<Gemm> gemm_;
};

}  // namespace tessera::cuda
