// The attention family of the CUDA backend: RoPE, the KV-cache write, the fused QKV prologue,
// and paged attention (the split-K decode kernel, the tensor-core prefill kernel, the exact
// generic kernel), with the choice among them.
#pragma once
#include <limits>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_options.h"

namespace tessera::cuda {

class AttentionOps {
 public:
  AttentionOps(CudaDevice& dev, const CudaOptions& options) : dev_(dev), options_(options) {}
  void rope(const Tensor& q, const Tensor& k, const Tensor& positions, const RopeTable& table);
  void write_kv(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                const AttentionMetadata& meta, float k_scale, float v_scale);
  void qkv_prologue(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& positions,
                    const RopeTable& table, const Tensor& k_cache, const Tensor& v_cache, const AttentionMetadata& meta,
                    float k_scale, float v_scale, const Tensor& q_out);
  void qkv_attention(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& positions,
                     const RopeTable& table, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionMetadata& meta, float scale, float k_scale, float v_scale, int sliding_window,
                     const Tensor& out);
  // sliding_window: Backend::paged_attention's.
  void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionMetadata& meta,
                       float scale, float k_scale, float v_scale, int sliding_window, const Tensor& out);

 private:
  static constexpr int kAnyQuery = std::numeric_limits<int>::max();
  static bool fast_attention_supported(int D, DType cache_dtype);
  QkvPrologueArgs prologue_args(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                                const Tensor& positions, const RopeTable& table, const Tensor& k_cache,
                                const Tensor& v_cache, const AttentionMetadata& meta, float k_scale, float v_scale,
                                const Tensor& q_out);
  PagedAttentionArgs attention_args(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                    const AttentionMetadata& meta, float scale, float k_scale, float v_scale,
                                    int sliding_window, const Tensor& out);
  void decode_attention(const PagedAttentionArgs& a, const AttentionMetadata& meta, int max_query,
                        const QkvPrologueArgs* fused);
  CudaDevice& dev_;
  const CudaOptions& options_;
};

}  // namespace tessera::cuda
