// The mixture-of-experts family of the CUDA backend: the router's top-k, the routed experts
// (decode: grouped GEMVs, the one-token kernels or the fused persistent kernel; prefill: routing
// on the device and grouped GEMMs), the shared expert folded in where a kernel takes it, and the
// choice among them.
#pragma once
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_options.h"

namespace tessera::cuda {

class MoeOps {
 public:
  using MoeSharedExpert = Backend::MoeSharedExpert;
  // `be` is the backend the family belongs to: the shared expert's own ops run through it where
  // no kernel folds it in.
  MoeOps(CudaDevice& dev, const CudaOptions& options, Backend& be);
  void moe_topk(const Tensor& router_logits, int k, bool renormalize, const Tensor& topk_ids,
                const Tensor& topk_weights);
  void moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                   const Tensor& topk_weights, int expert_begin, const Tensor& out);
  void moe_topk_experts(const Tensor& router_logits, int k, bool renormalize, const Tensor& x, const Tensor& gate_up,
                        const Tensor& down, const Tensor& topk_ids, const Tensor& topk_weights, int expert_begin,
                        const Tensor& out, const MoeSharedExpert* shared);

 private:
  // At one token the split path's two one-token kernels beat the fused kernel where reading the k
  // experts dominates (Qwen3.5-35B-A3B: 8 x 6.3 MB); where they are small (the demo model's 8 x 74
  // KB) the layer is bound by kernel latency, and the fused kernel, which folds the shared expert's
  // five ops in, stays the choice.
  static constexpr int64_t kOneTokenSplitMinBytes = int64_t{8} << 20;
  static constexpr int64_t kMoeSyncInts = 2 + 16384;  // the fused MoE decode path up to H = 65536
  CudaMoeDecode moe_decode_for(int64_t T, bool shared, int64_t routed_bytes) const;
  static int64_t routed_expert_bytes(const Tensor& gate_up, int k);
  static bool fusable_shared(const MoeSharedExpert& s, int64_t H, int64_t I);
  static bool fusable_fp8_shared(const MoeSharedExpert& s, int64_t H, int64_t I);
  bool one_token_folds_shared(const Tensor& x, const Tensor& gate_up, int64_t k, const MoeSharedExpert& shared) const;
  void moe_experts_impl(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                        const Tensor& topk_weights, int expert_begin, const Tensor& out, const MoeFusedTopk* fold,
                        const MoeSharedExpert* shared);
  CudaDevice& dev_;
  const CudaOptions& options_;
  Backend& be_;
  Tensor moe_sync_;  // u32 [kMoeSyncInts]: the fused decode kernel's grid barrier and counters
};

}  // namespace tessera::cuda
