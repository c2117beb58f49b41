// A Backend that forwards every call to another one: the base of decorators that change or
// observe a few ops (CheckingBackend; tests that inject a fault into one op).
#pragma once
#include <string>
#include <vector>

#include "backend/backend.h"

namespace tessera {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}
  Backend& inner() const { return inner_; }

  Device device() const override { return inner_.device(); }
  std::string name() const override { return inner_.name(); }
  DType compute_dtype() const override { return inner_.compute_dtype(); }

  Tensor alloc(Shape shape, DType dtype) override { return inner_.alloc(shape, dtype); }
  Tensor scratch(Shape shape, DType dtype) override { return inner_.scratch(shape, dtype); }
  void reset_scratch() override { inner_.reset_scratch(); }
  size_t scratch_mark() override { return inner_.scratch_mark(); }
  void scratch_rewind(size_t mark) override { inner_.scratch_rewind(mark); }
  size_t scratch_in_use() const override { return inner_.scratch_in_use(); }
  bool supports_graphs() const override { return inner_.supports_graphs(); }
  bool supports_token_state_slots() const override { return inner_.supports_token_state_slots(); }
  void begin_capture() override { inner_.begin_capture(); }
  std::unique_ptr<CapturedGraph> end_capture() override { return inner_.end_capture(); }
  void replay(const CapturedGraph& graph) override { inner_.replay(graph); }
  size_t free_memory() const override { return inner_.free_memory(); }
  size_t total_memory() const override { return inner_.total_memory(); }
  bool unified_memory() const override { return inner_.unified_memory(); }
  size_t free_memory_at_start() const override { return inner_.free_memory_at_start(); }

  void copy_from_host(const Tensor& dst, const void* src) override { inner_.copy_from_host(dst, src); }
  void copy_to_host(void* dst, const Tensor& src) override { inner_.copy_to_host(dst, src); }
  void copy(const Tensor& dst, const Tensor& src) override { inner_.copy(dst, src); }
  void fill_random(const Tensor& dst, uint64_t seed, float low, float high) override {
    inner_.fill_random(dst, seed, low, high);
  }
  void fill(const Tensor& dst, float value) override { inner_.fill(dst, value); }
  void synchronize() override { inner_.synchronize(); }

  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override {
    inner_.embedding(ids, table, out);
  }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override {
    inner_.rms_norm(x, w, eps, out);
  }
  void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps) override {
    inner_.add_rms_norm(x, residual, w, eps);
  }
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out) override {
    inner_.linear(x, w, bias, out);
  }
  void silu_mul(const Tensor& gate_up, const Tensor& out) override { inner_.silu_mul(gate_up, out); }
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override { inner_.add(a, b, out); }
  void rope(const Tensor& q, const Tensor& k, const Tensor& positions, const RopeTable& table) override {
    inner_.rope(q, k, positions, table);
  }
  void write_kv(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                const AttentionMetadata& meta, float k_scale, float v_scale) override {
    inner_.write_kv(k, v, k_cache, v_cache, meta, k_scale, v_scale);
  }
  void qkv_prologue(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& positions,
                    const RopeTable& table, const Tensor& k_cache, const Tensor& v_cache, const AttentionMetadata& meta,
                    float k_scale, float v_scale, const Tensor& q_out) override {
    inner_.qkv_prologue(qkv, q_norm, k_norm, eps, positions, table, k_cache, v_cache, meta, k_scale, v_scale, q_out);
  }
  void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionMetadata& meta,
                       float scale, float k_scale, float v_scale, int sliding_window, const Tensor& out) override {
    inner_.paged_attention(q, k_cache, v_cache, meta, scale, k_scale, v_scale, sliding_window, out);
  }
  void qkv_attention(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& positions,
                     const RopeTable& table, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionMetadata& meta, float scale, float k_scale, float v_scale, int sliding_window,
                     const Tensor& out) override {
    inner_.qkv_attention(qkv, q_norm, k_norm, eps, positions, table, k_cache, v_cache, meta, scale, k_scale, v_scale,
                         sliding_window, out);
  }
  void moe_topk(const Tensor& router_logits, int k, bool renormalize, const Tensor& topk_ids,
                const Tensor& topk_weights) override {
    inner_.moe_topk(router_logits, k, renormalize, topk_ids, topk_weights);
  }
  void moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                   const Tensor& topk_weights, int expert_begin, const Tensor& out) override {
    inner_.moe_experts(x, gate_up, down, topk_ids, topk_weights, expert_begin, out);
  }
  void sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out) override {
    inner_.sigmoid_mul(x, gate, out);
  }
  void causal_conv1d(const Tensor& x, int64_t x_col, const Tensor& weight, const Tensor& conv_state,
                     const LinearAttnMetadata& meta, const Tensor& out) override {
    inner_.causal_conv1d(x, x_col, weight, conv_state, meta, out);
  }
  void gated_delta_rule(const Tensor& qkv, const Tensor& ba, int64_t ba_col, const Tensor& A_log, const Tensor& dt_bias,
                        const Tensor& state, const LinearAttnMetadata& meta, const Tensor& out) override {
    inner_.gated_delta_rule(qkv, ba, ba_col, A_log, dt_bias, state, meta, out);
  }
  void gated_rms_norm(const Tensor& x, const Tensor& z, int64_t z_col, const Tensor& w, float eps,
                      const Tensor& out) override {
    inner_.gated_rms_norm(x, z, z_col, w, eps, out);
  }
  void gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out) override {
    inner_.gather_rows(x, indices, out);
  }
  void cast(const Tensor& src, const Tensor& dst) override { inner_.cast(src, dst); }
  void embedding_slice(const Tensor& ids, const Tensor& table, int64_t begin, const Tensor& out) override {
    inner_.embedding_slice(ids, table, begin, out);
  }
  void argmax(const Tensor& logits, const Tensor& out) override { inner_.argmax(logits, out); }
  void shard_argmax(const Tensor& logits, int64_t width, int64_t first, const Tensor& out) override {
    inner_.shard_argmax(logits, width, first, out);
  }
  void merge_shard_argmax(const Tensor& pairs, const Tensor& rows, const Tensor& logits) override {
    inner_.merge_shard_argmax(pairs, rows, logits);
  }
  void apply_token_mask(const Tensor& logits, const Tensor& mask, const Tensor& rows) override {
    inner_.apply_token_mask(logits, mask, rows);
  }
  void accept_drafts(const Tensor& sampled, const Tensor& tokens, int q, const Tensor& rows) override {
    inner_.accept_drafts(sampled, tokens, q, rows);
  }
  void draft_positions(const Tensor& rows, const Tensor& positions, const Tensor& slot_mapping,
                       const Tensor& block_tables, int q, int block_size, int ahead, const Tensor& out_positions,
                       const Tensor& out_slots, const Tensor& out_seq_lens) override {
    inner_.draft_positions(rows, positions, slot_mapping, block_tables, q, block_size, ahead, out_positions, out_slots,
                           out_seq_lens);
  }
  void sample(const Tensor& logits, const std::vector<SamplingRow>& rows, const Tensor& out) override {
    inner_.sample(logits, rows, out);
  }

 private:
  Backend& inner_;
};

}  // namespace tessera
