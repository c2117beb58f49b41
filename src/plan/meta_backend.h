// A backend that allocates nothing: every buffer is a shape and a dtype over a null pointer,
// every op is a no-op, and the bytes that `alloc` and `scratch` would have taken are counted.
// The planner builds the real model on it (its constructor declares and places the weights,
// builds the rotary table) and runs a step through it (the activation arena's peak), so a new
// model family is planned from its own code, with no GPU and no weight read.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace tessera::plan {

struct MetaBackendOptions {
  DeviceType device = DeviceType::kCUDA;  // the device being planned for
  DType compute_dtype = DType::kBF16;     // what the real backend computes (and loads weights) in
  size_t alloc_align = 256;               // the real backend's allocation granularity
  size_t total_memory = 0;                // what total_memory()/free_memory() report
};

class MetaBackend : public Backend {
 public:
  explicit MetaBackend(MetaBackendOptions o);

  size_t allocated_bytes() const { return allocated_; }  // every alloc so far (aligned)
  size_t scratch_peak() const { return high_water_; }    // largest scratch in use since reset_peak
  void reset_peak() { high_water_ = in_use_; }

  Device device() const override { return {opts_.device, 0}; }
  std::string name() const override { return "meta (planning: no memory, no compute)"; }
  DType compute_dtype() const override { return opts_.compute_dtype; }

  Tensor alloc(Shape shape, DType dtype) override;
  Tensor scratch(Shape shape, DType dtype) override;
  void reset_scratch() override;
  size_t scratch_mark() override;
  void scratch_rewind(size_t mark) override;
  size_t scratch_in_use() const override { return in_use_; }
  size_t free_memory() const override { return opts_.total_memory > allocated_ ? opts_.total_memory - allocated_ : 0; }
  size_t total_memory() const override { return opts_.total_memory; }

  void copy_from_host(const Tensor&, const void*) override {}
  void copy_to_host(void* dst, const Tensor& src) override;
  void copy(const Tensor&, const Tensor&) override {}
  void fill_random(const Tensor&, uint64_t, float, float) override {}
  void fill(const Tensor&, float) override {}
  void synchronize() override {}

  void embedding(const Tensor&, const Tensor&, const Tensor&) override {}
  void rms_norm(const Tensor&, const Tensor&, float, const Tensor&) override {}
  void add_rms_norm(const Tensor&, const Tensor&, const Tensor&, float) override {}
  // The ops whose kernels take workspace (backend/op_workspace.h) take as much scratch here.
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out) override;
  void silu_mul(const Tensor&, const Tensor&) override {}
  void add(const Tensor&, const Tensor&, const Tensor&) override {}
  void rope(const Tensor&, const Tensor&, const Tensor&, const RopeTable&) override {}
  void write_kv(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionMetadata&, float,
                float) override {}
  void qkv_prologue(const Tensor&, const Tensor*, const Tensor*, float, const Tensor&, const RopeTable&, const Tensor&,
                    const Tensor&, const AttentionMetadata&, float, float, const Tensor&) override {}
  void paged_attention(const Tensor&, const Tensor&, const Tensor&, const AttentionMetadata&, float, float, float, int,
                       const Tensor&) override {}
  void moe_topk(const Tensor&, int, bool, const Tensor&, const Tensor&) override {}
  void moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                   const Tensor& topk_weights, int expert_begin, const Tensor& out) override;
  void sigmoid_mul(const Tensor&, const Tensor&, const Tensor&) override {}
  void causal_conv1d(const Tensor&, int64_t, const Tensor&, const Tensor&, const LinearAttnMetadata&,
                     const Tensor&) override {}
  void gated_delta_rule(const Tensor&, const Tensor&, int64_t, const Tensor&, const Tensor&, const Tensor&,
                        const LinearAttnMetadata&, const Tensor&) override {}
  void gated_rms_norm(const Tensor&, const Tensor&, int64_t, const Tensor&, float, const Tensor&) override {}
  void gather_rows(const Tensor&, const Tensor&, const Tensor&) override {}
  void cast(const Tensor&, const Tensor&) override {}
  void embedding_slice(const Tensor&, const Tensor&, int64_t, const Tensor&) override {}
  void sample(const Tensor&, const std::vector<SamplingRow>&, const Tensor&) override {}
  void apply_token_mask(const Tensor&, const Tensor&, const Tensor&) override {}

 private:
  size_t align(size_t n) const;
  void take_workspace(int64_t bytes);
  MetaBackendOptions opts_;
  std::shared_ptr<Storage> arena_;  // one null storage all scratch views point into
  size_t allocated_ = 0;
  size_t in_use_ = 0, high_water_ = 0;
  std::vector<size_t> marks_;
};

}  // namespace tessera::plan
