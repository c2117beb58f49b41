// CPU emulations of a bf16 backend's precision and decisions, shared by the fixture test's
// bf16 rule (model_fixture_test) and the CUDA diagnosis (cuda_model_check_test).
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/forwarding_backend.h"
#include "core/dtype.h"
#include "core/error.h"

namespace tessera::testing {

// Rounds every float operand an op reads to bf16 in place, as CUDA stores activations, KV
// caches and conv states; keeps f32 where CUDA does (router logits into moe_topk, top-k weights,
// the recurrent state, norm weights). The math stays the CPU's f32.
class Bf16ActivationsBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  static void round(const Tensor& t) {
    if (!t.defined() || t.dtype() != DType::kF32) return;
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
  }
  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override {
    round(table);
    inner().embedding(ids, table, out);
  }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override {
    round(x);
    inner().rms_norm(x, w, eps, out);
  }
  void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps) override {
    round(x);
    round(residual);
    inner().add_rms_norm(x, residual, w, eps);
    round(residual);
  }
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out) override {
    round(x);
    round(w);
    if (bias) round(*bias);
    inner().linear(x, w, bias, out);
  }
  void silu_mul(const Tensor& gate_up, const Tensor& out) override {
    round(gate_up);
    inner().silu_mul(gate_up, out);
  }
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    round(a);
    round(b);
    inner().add(a, b, out);
  }
  void rope(const Tensor& q, const Tensor& k, const Tensor& positions, const RopeTable& table) override {
    round(q);
    round(k);
    inner().rope(q, k, positions, table);
    round(q);
    round(k);
  }
  void write_kv(const Tensor& k, const Tensor& v, const Tensor& kc, const Tensor& vc, const AttentionMetadata& m,
                float ks, float vs) override {
    round(k);
    round(v);
    inner().write_kv(k, v, kc, vc, m, ks, vs);
  }
  void paged_attention(const Tensor& q, const Tensor& kc, const Tensor& vc, const AttentionMetadata& m, float scale,
                       float ks, float vs, int window, const Tensor& out) override {
    round(q);
    round(kc);
    round(vc);
    inner().paged_attention(q, kc, vc, m, scale, ks, vs, window, out);
  }
  void qkv_attention(const Tensor& qkv, const Tensor* qn, const Tensor* kn, float eps, const Tensor& positions,
                     const RopeTable& table, const Tensor& kc, const Tensor& vc, const AttentionMetadata& m,
                     float scale, float ks, float vs, int window, const Tensor& out) override {
    round(qkv);
    if (qn) round(*qn);  // bf16 (1 + w) on CUDA
    if (kn) round(*kn);
    Tensor q = scratch(out.shape(), out.dtype());
    inner().qkv_prologue(qkv, qn, kn, eps, positions, table, kc, vc, m, ks, vs, q);
    paged_attention(q, kc, vc, m, scale, ks, vs, window, out);
  }
  void moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& ids, const Tensor& w,
                   int begin, const Tensor& out) override {
    round(x);
    round(gate_up);
    round(down);
    inner().moe_experts(x, gate_up, down, ids, w, begin, out);
  }
  void sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out) override {
    round(x);
    round(gate);
    inner().sigmoid_mul(x, gate, out);
  }
  void causal_conv1d(const Tensor& x, int64_t x_col, const Tensor& w, const Tensor& state, const LinearAttnMetadata& m,
                     const Tensor& out) override {
    round(x);
    round(state);
    inner().causal_conv1d(x, x_col, w, state, m, out);
  }
  void gated_delta_rule(const Tensor& qkv, const Tensor& ba, int64_t ba_col, const Tensor& A_log, const Tensor& dt_bias,
                        const Tensor& state, const LinearAttnMetadata& m, const Tensor& out) override {
    round(qkv);
    round(ba);
    inner().gated_delta_rule(qkv, ba, ba_col, A_log, dt_bias, state, m, out);
  }
  void gated_rms_norm(const Tensor& x, const Tensor& z, int64_t z_col, const Tensor& w, float eps,
                      const Tensor& out) override {
    round(x);
    round(z);
    inner().gated_rms_norm(x, z, z_col, w, eps, out);
  }
  void gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out) override {
    round(x);
    inner().gather_rows(x, indices, out);
  }
};

// Records the primary's top-k choices (expert ids per token row, one entry per moe_topk call),
// and counts the token rows whose choice is not a top-k of the primary's own router logits (an
// expert chosen below one left out: a wrong top-k, not a near tie).
class RoutingRecorder final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::vector<std::vector<int32_t>> routes;
  int inconsistent_rows = 0;
  void moe_topk(const Tensor& logits, int k, bool renormalize, const Tensor& ids, const Tensor& w) override {
    inner().moe_topk(logits, k, renormalize, ids, w);
    std::vector<int32_t> h(static_cast<size_t>(ids.numel()));
    inner().copy_to_host(h.data(), ids);
    TESSERA_CHECK(logits.dtype() == DType::kF32, "routing recorder: router logits are expected in f32");
    const int64_t T = logits.dim(0), E = logits.dim(1);
    std::vector<float> l(static_cast<size_t>(T * E));
    inner().copy_to_host(l.data(), logits);
    inner().synchronize();
    for (int64_t t = 0; t < T; ++t) {
      const float* r = l.data() + t * E;
      std::vector<char> chosen(static_cast<size_t>(E), 0);
      float lowest_chosen = INFINITY, highest_left = -INFINITY;
      for (int j = 0; j < k; ++j) {
        const int32_t e = h[static_cast<size_t>(t * k + j)];
        if (e < 0 || e >= E) {
          lowest_chosen = -INFINITY;
          continue;
        }
        chosen[static_cast<size_t>(e)] = 1;
        lowest_chosen = std::min(lowest_chosen, r[e]);
      }
      for (int64_t e = 0; e < E; ++e)
        if (!chosen[static_cast<size_t>(e)]) highest_left = std::max(highest_left, r[e]);
      inconsistent_rows += highest_left > lowest_chosen;
    }
    routes.push_back(std::move(h));
  }
};

// Imposes recorded top-k choices on the inner backend's run of the same steps: the recorded
// experts, weighted by the inner run's own router probabilities for them (renormalised as the
// op does). With the routing equal, what is left between the two runs is arithmetic.
class RoutingReplay final : public ForwardingBackend {
 public:
  RoutingReplay(Backend& inner, const std::vector<std::vector<int32_t>>& routes)
      : ForwardingBackend(inner), routes_(routes) {}
  int differing_rows = 0;  // rows where the recorded experts are not the CPU's own choice
  // Over those rows, the largest router-logit gap the recorded choice leaves: the CPU's k-th
  // largest logit minus the smallest logit among the recorded experts (0 for an exact tie). A
  // near tie that bf16 rounding flipped leaves a small gap; a wrong top-k kernel a large one.
  double max_rerouted_gap = 0;
  void moe_topk(const Tensor& logits, int k, bool renormalize, const Tensor& ids, const Tensor& w) override {
    inner().moe_topk(logits, k, renormalize, ids, w);
    TESSERA_CHECK(next_ < routes_.size(), "routing replay: more moe_topk calls than recorded");
    const std::vector<int32_t>& route = routes_[next_++];
    const int64_t T = logits.dim(0), E = logits.dim(1);
    TESSERA_CHECK(static_cast<int64_t>(route.size()) == T * k, "routing replay: the recorded call has other shapes");
    for (int64_t t = 0; t < T; ++t) {
      const float* r = logits.data<float>() + t * E;
      int32_t* id = ids.data<int32_t>() + t * k;
      float* wt = w.data<float>() + t * k;
      std::vector<int32_t> mine(id, id + k), theirs(route.begin() + t * k, route.begin() + (t + 1) * k);
      std::sort(mine.begin(), mine.end());
      std::sort(theirs.begin(), theirs.end());
      if (mine == theirs) continue;
      ++differing_rows;
      float kth = INFINITY, worst_recorded = INFINITY;
      for (int32_t e : mine) kth = std::min(kth, r[e]);
      for (int32_t e : theirs) {
        TESSERA_CHECK(e >= 0 && e < E, "routing replay: a recorded expert id out of range");
        worst_recorded = std::min(worst_recorded, r[e]);
      }
      max_rerouted_gap = std::max(max_rerouted_gap, static_cast<double>(kth - worst_recorded));
      const float mx = *std::max_element(r, r + E);
      double sum = 0, picked = 0;
      for (int64_t e = 0; e < E; ++e) sum += std::exp(r[e] - mx);
      for (int j = 0; j < k; ++j) {
        id[j] = route[static_cast<size_t>(t * k + j)];
        picked += wt[j] = static_cast<float>(std::exp(r[id[j]] - mx) / sum);
      }
      if (renormalize)
        for (int j = 0; j < k; ++j) wt[j] = static_cast<float>(wt[j] / picked);
    }
  }

 private:
  const std::vector<std::vector<int32_t>>& routes_;
  size_t next_ = 0;
};

}  // namespace tessera::testing
