// The elementwise family of the CUDA backend: fills, casts, embeddings and row gathers, RMS
// norms, SiLU * up, additions and sigmoid gates (one kernel each, no choice among kernels).
#pragma once
#include "backend/cuda/cuda_device.h"

namespace tessera::cuda {

class ElementwiseOps {
 public:
  explicit ElementwiseOps(CudaDevice& dev) : dev_(dev) {}
  void fill_random(const Tensor& dst, uint64_t seed, float low, float high);
  void fill(const Tensor& dst, float value);
  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out);
  void embedding_slice(const Tensor& ids, const Tensor& table, int64_t begin, const Tensor& out);
  void gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out);
  void cast(const Tensor& src, const Tensor& dst);
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out);
  void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps);
  void silu_mul(const Tensor& gate_up, const Tensor& out);
  void add(const Tensor& a, const Tensor& b, const Tensor& out);
  void sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out);

 private:
  CudaDevice& dev_;
};

}  // namespace tessera::cuda
