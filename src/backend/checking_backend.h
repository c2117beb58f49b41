// A diagnostic Backend decorator: every op runs on the primary backend (CUDA) and, on host
// copies of the same inputs, on a reference CPU backend; the outputs are compared and the
// ops whose error exceeds a bf16-sized tolerance are recorded and printed with the op name,
// shapes, the step and op index, the layer (counted from the attention / linear-attention
// ops of the step) and the worst element. Each op is checked on the primary's own inputs, so
// an error does not propagate into later checks: the first recorded op is where the primary
// first computes something the reference does not.
//
// It never captures graphs (supports_graphs() is false), so engines and runners on top of it
// run eagerly, and it synchronises the primary after every op: it is a debugging tool for
// tests and tools (tests/model/cuda_model_check_test), never part of serving.
#pragma once
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/forwarding_backend.h"

namespace tessera {

struct CheckOptions {
  // An output fails when max|primary - reference| > rel_tol * max|reference| over the tensor
  // (bf16 rounding of the primary's result is ~0.4% of that scale; kernels keeping bf16
  // intermediates reach ~1-2%). Outputs stored in fp8 (KV caches) use at least fp8_rel_tol.
  double rel_tol = 3e-2;
  double fp8_rel_tol = 0.13;
  // Mismatches printed as they happen (all are recorded and counted in summary()).
  int max_printed = 20;
  // Where mismatches and the summary are printed; nullptr prints nothing.
  std::FILE* log = stderr;
};

// One output of one op that exceeded the tolerance.
struct OpMismatch {
  int64_t step = 0;      // reset_scratch calls before the op (one per model step)
  int64_t op_index = 0;  // checked ops since that reset_scratch
  int layer = -1;        // attention / linear-attention ops of the step before this one, -1: before the first
  std::string context;   // the caller's label (set_context) when the op ran
  std::string op;        // backend op name
  std::string output;    // which output ("out", "k_cache", "state", "topk_ids", ...)
  std::string shapes;    // the op's operands, with the step's metadata where it has some
  double max_abs = 0;    // max |primary - reference| (inf: non-finite primary values)
  double scale = 0;      // max |reference|
  double rel = 0;        // max_abs / scale
  double tol = 0;        // the relative tolerance it exceeded
  int64_t bad = 0;       // elements over tol * scale
  int64_t numel = 0;
  std::string worst_at;  // index of the worst element, e.g. "[287, 3, 17]"
  float got = 0, want = 0;
  std::string first_bad_at;  // index of the first element over the tolerance
  std::string note;          // op-specific detail (ties in top-k, metadata differences)
  std::string str() const;
};

class CheckingBackend final : public ForwardingBackend {
 public:
  // `reference` must be a CPU backend (host memory, f32 compute); both must outlive this.
  CheckingBackend(Backend& primary, Backend& reference, CheckOptions options = {});

  // A label printed with every mismatch (e.g. "qwen3_next_tiny prompt 2 decode step 10").
  void set_context(std::string context) { context_ = std::move(context); }
  const std::vector<OpMismatch>& mismatches() const { return mismatches_; }
  int64_t ops_checked() const { return ops_checked_; }
  // Per op: calls, mismatches and the worst relative error seen (with where), one line each.
  std::string summary() const;
  void print_summary() const;
  // Forgets the recorded mismatches and statistics (the step counter keeps counting).
  void clear();
  // The smallest gap between the k-th and the (k+1)-th largest router logit of any token in the
  // moe_topk calls since the last call of this function (a near tie that bf16 rounding upstream
  // can flip), and the layer it was in; gap < 0 when there was no moe_topk call.
  struct TopkGap {
    double gap = -1;
    int layer = -1;
  };
  TopkGap take_min_topk_gap() { return std::exchange(min_topk_gap_, TopkGap{}); }

  std::string name() const override { return "checking(" + primary_.name() + ")"; }
  // Eager only: every op must be checked as it runs.
  bool supports_graphs() const override { return false; }
  bool supports_token_state_slots() const override {
    return primary_.supports_token_state_slots() && reference_.supports_token_state_slots();
  }
  void begin_capture() override { fail(ErrorKind::kUnsupported, "the checking backend runs eagerly (no graphs)"); }
  void reset_scratch() override;

  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override;
  void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out) override;
  void silu_mul(const Tensor& gate_up, const Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void rope(const Tensor& q, const Tensor& k, const Tensor& positions, const RopeTable& table) override;
  void write_kv(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                const AttentionMetadata& meta, float k_scale, float v_scale) override;
  void qkv_prologue(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& positions,
                    const RopeTable& table, const Tensor& k_cache, const Tensor& v_cache, const AttentionMetadata& meta,
                    float k_scale, float v_scale, const Tensor& q_out) override;
  void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionMetadata& meta,
                       float scale, float k_scale, float v_scale, int sliding_window, const Tensor& out) override;
  void qkv_attention(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& positions,
                     const RopeTable& table, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionMetadata& meta, float scale, float k_scale, float v_scale, int sliding_window,
                     const Tensor& out) override;
  void moe_topk(const Tensor& router_logits, int k, bool renormalize, const Tensor& topk_ids,
                const Tensor& topk_weights) override;
  void moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                   const Tensor& topk_weights, int expert_begin, const Tensor& out) override;
  void sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out) override;
  void causal_conv1d(const Tensor& x, int64_t x_col, const Tensor& weight, const Tensor& conv_state,
                     const LinearAttnMetadata& meta, const Tensor& out) override;
  void gated_delta_rule(const Tensor& qkv, const Tensor& ba, int64_t ba_col, const Tensor& A_log, const Tensor& dt_bias,
                        const Tensor& state, const LinearAttnMetadata& meta, const Tensor& out) override;
  void gated_rms_norm(const Tensor& x, const Tensor& z, int64_t z_col, const Tensor& w, float eps,
                      const Tensor& out) override;
  void gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out) override;
  void cast(const Tensor& src, const Tensor& dst) override;
  void embedding_slice(const Tensor& ids, const Tensor& table, int64_t begin, const Tensor& out) override;
  // Sampling draws at random: forwarded, not checked. Transfers and fills are forwarded and
  // tracked: each op's inputs are compared with what the last op, upload or copy that wrote
  // those bytes left there, so a buffer that changes behind the ops' backs (scratch handed out
  // twice, an out-of-bounds write of a kernel, a state slot written by another sequence) is
  // recorded as the output "clobbered input" of the op that reads it.
  void copy_from_host(const Tensor& dst, const void* src) override;
  void copy(const Tensor& dst, const Tensor& src) override;
  void fill_random(const Tensor& dst, uint64_t seed, float low, float high) override;
  void fill(const Tensor& dst, float value) override;
  void sample(const Tensor& logits, const std::vector<SamplingRow>& rows, const Tensor& out) override;
  void apply_token_mask(const Tensor& logits, const Tensor& mask, const Tensor& rows) override;

 private:
  class Op;
  friend class Op;
  struct Stat {
    int64_t calls = 0, mismatches = 0;
    double worst_rel = 0;
    std::string worst_where;
  };
  void record(OpMismatch m);
  // The bytes [p, p + n) now hold contents of this hash, written by `by`; entries overlapping
  // them are dropped (a partial write makes an overlapping buffer's hash unknown).
  void note_written(const void* p, size_t n, uint64_t hash, std::string by);
  void forget(const void* p, size_t n);
  struct Written {
    size_t bytes = 0;
    uint64_t hash = 0;
    std::string by;
  };
  std::map<uintptr_t, Written> written_;
  TopkGap min_topk_gap_;

  Backend& primary_;
  Backend& reference_;
  CheckOptions options_;
  std::string context_;
  int64_t step_ = 0, op_in_step_ = 0, ops_checked_ = 0;
  int mixers_in_step_ = 0;
  std::vector<OpMismatch> mismatches_;
  std::map<std::string, Stat> stats_;
};

}  // namespace tessera
