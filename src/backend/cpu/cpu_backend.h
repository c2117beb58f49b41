// Reference backend: plain C++ loops, OpenBLAS for GEMM, f32 activations.
// Every other backend's op tests compare against this one.
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace tessera {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int num_threads = 0);
  Device device() const override { return Device{}; }
  std::string name() const override { return "cpu"; }
  DType compute_dtype() const override { return DType::kF32; }

  Tensor alloc(Shape shape, DType dtype) override;
  Tensor scratch(Shape shape, DType dtype) override;
  void reset_scratch() override;
  size_t scratch_mark() override;
  void scratch_rewind(size_t mark) override;
  size_t free_memory() const override;
  size_t total_memory() const override;

  void copy_from_host(const Tensor& dst, const void* src) override;
  void copy_to_host(void* dst, const Tensor& src) override;
  void copy(const Tensor& dst, const Tensor& src) override;
  void fill_random(const Tensor& dst, uint64_t seed, float low, float high) override;
  void fill(const Tensor& dst, float value) override;
  void synchronize() override {}

  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override;
  void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out) override;
  void silu_mul(const Tensor& gate_up, const Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void rope(const Tensor& q, const Tensor& k, const Tensor& positions, const RopeTable& table) override;
  void write_kv(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                const AttentionMetadata& meta, float k_scale, float v_scale) override;
  void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionMetadata& meta,
                       float scale, float k_scale, float v_scale, int sliding_window, const Tensor& out) override;
  void moe_topk(const Tensor& router_logits, int k, bool renormalize, const Tensor& topk_ids,
                const Tensor& topk_weights) override;
  void moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                   const Tensor& topk_weights, int expert_begin, const Tensor& out) override;
  void sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out) override;
  void gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out) override;
  void cast(const Tensor& src, const Tensor& dst) override;
  void qkv_prologue(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& positions,
                    const RopeTable& table, const Tensor& k_cache, const Tensor& v_cache, const AttentionMetadata& meta,
                    float k_scale, float v_scale, const Tensor& q_out) override;
  // Linear attention (cpu_linear_attn.cpp).
  bool supports_token_state_slots() const override { return true; }
  void causal_conv1d(const Tensor& x, int64_t x_col, const Tensor& weight, const Tensor& conv_state,
                     const LinearAttnMetadata& meta, const Tensor& out) override;
  void gated_delta_rule(const Tensor& qkv, const Tensor& ba, int64_t ba_col, const Tensor& A_log, const Tensor& dt_bias,
                        const Tensor& state, const LinearAttnMetadata& meta, const Tensor& out) override;
  void gated_rms_norm(const Tensor& x, const Tensor& z, int64_t z_col, const Tensor& w, float eps,
                      const Tensor& out) override;
  void embedding_slice(const Tensor& ids, const Tensor& table, int64_t begin, const Tensor& out) override;
  void sample(const Tensor& logits, const std::vector<SamplingRow>& rows, const Tensor& out) override;

 private:
  // Bump arena for per-step activations: chunks are kept and merged into one on reset.
  std::vector<Tensor> chunks_;
  size_t chunk_used_ = 0;
  size_t scratch_high_water_ = 0, scratch_in_use_ = 0;
  struct Mark {
    size_t chunks, used, in_use;
  };
  std::vector<Mark> marks_;
};

}  // namespace tessera
