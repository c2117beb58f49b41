// The checking backend (backend/checking_backend.h) on two CPU backends: identical backends
// record nothing; a fault injected into one op of the primary (a ForwardingBackend that
// perturbs one output) is recorded as that op, with the output, element, step and layer, and
// nothing downstream of it is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/attention_metadata.h"
#include "backend/checking_backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/forwarding_backend.h"

namespace tessera {
namespace {

// Adds `delta` to element `index` of the named op's output after the real op ran.
class FaultyBackend final : public ForwardingBackend {
 public:
  explicit FaultyBackend(Backend& inner) : ForwardingBackend(inner) {}
  std::string fault_op;
  int64_t index = 0;
  float delta = 0;
  bool fault_state = false;  // gated_delta_rule: perturb the state, not the output

  void paged_attention(const Tensor& q, const Tensor& kc, const Tensor& vc, const AttentionMetadata& m, float s,
                       float ks, float vs, int window, const Tensor& out) override {
    inner().paged_attention(q, kc, vc, m, s, ks, vs, window, out);
    poke("paged_attention", out);
  }
  void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps) override {
    inner().add_rms_norm(x, residual, w, eps);
    poke("add_rms_norm", residual);
  }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override {
    inner().rms_norm(x, w, eps, out);
    poke("rms_norm", out);
  }
  void gated_delta_rule(const Tensor& qkv, const Tensor& ba, int64_t ba_col, const Tensor& A_log, const Tensor& dt_bias,
                        const Tensor& state, const LinearAttnMetadata& meta, const Tensor& out) override {
    inner().gated_delta_rule(qkv, ba, ba_col, A_log, dt_bias, state, meta, out);
    poke("gated_delta_rule", fault_state ? state : out);
  }
  // Breaks ties towards the higher expert id (the contract says the lower one).
  void moe_topk(const Tensor& logits, int k, bool renormalize, const Tensor& ids, const Tensor& w) override {
    inner().moe_topk(logits, k, renormalize, ids, w);
    if (fault_op != "moe_topk") return;
    const int64_t T = logits.dim(0), E = logits.dim(1);
    for (int64_t t = 0; t < T; ++t) {
      int32_t& id = ids.data<int32_t>()[t * k];
      for (int64_t e = E - 1; e > id; --e)
        if (logits.data<float>()[t * E + e] == logits.data<float>()[t * E + id]) {
          id = static_cast<int32_t>(e);
          break;
        }
    }
  }

 private:
  void poke(const char* op, const Tensor& t) {
    if (fault_op == op) t.data<float>()[index] += delta;
  }
};

class CheckingBackendTest : public ::testing::Test {
 protected:
  CheckingBackendTest() : faulty_(primary_), check_(faulty_, reference_, options()) {}
  static CheckOptions options() {
    CheckOptions o;
    o.log = nullptr;
    return o;
  }
  Tensor rand(Shape s, float lo = -1, float hi = 1) {
    Tensor t = check_.alloc(s, DType::kF32);
    std::uniform_real_distribution<float> d(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng_);
    return t;
  }

  // One sequence of `len` tokens written into a cache of 16-token blocks, then attended.
  void attention_step(int len, int Hq, int Hk, int D, const Tensor& out) {
    const int blocks = (len + 15) / 16;
    Tensor k_cache = check_.alloc({blocks, 16, Hk, D}, DType::kF32);
    Tensor v_cache = check_.alloc({blocks, 16, Hk, D}, DType::kF32);
    check_.fill(k_cache, 0);
    check_.fill(v_cache, 0);
    AttentionLayout l;
    l.query_start_loc = {0, len};
    l.seq_lens = {len};
    l.max_blocks_per_seq = blocks;
    for (int b = 0; b < blocks; ++b) l.block_tables.push_back(b);
    for (int t = 0; t < len; ++t) l.slot_mapping.push_back(t);
    AttentionMetadata meta = upload_attention_metadata(check_, l);
    check_.write_kv(rand({len, Hk, D}), rand({len, Hk, D}), k_cache, v_cache, meta, 1, 1);
    check_.paged_attention(rand({len, Hq, D}), k_cache, v_cache, meta, 0.3f, 1, 1, 0, out);
  }

  std::mt19937 rng_{5};
  CpuBackend primary_, reference_;
  FaultyBackend faulty_;
  CheckingBackend check_;
};

TEST_F(CheckingBackendTest, IdenticalBackendsRecordNothing) {
  Tensor x = rand({40, 24}), w = rand({24}), out = check_.alloc({40, 24}, DType::kF32);
  check_.rms_norm(x, w, 1e-6f, out);
  Tensor lin = check_.alloc({40, 10}, DType::kF32);
  check_.linear(out, rand({10, 24}), nullptr, lin);
  Tensor attn = check_.alloc({40, 4, 16}, DType::kF32);
  attention_step(40, 4, 2, 16, attn);
  EXPECT_EQ(check_.ops_checked(), 4);  // rms_norm, linear, write_kv, paged_attention (fills are not ops)
  EXPECT_TRUE(check_.mismatches().empty()) << check_.mismatches().front().str();
  // The primary's results are the op's results (the decorator forwards them).
  Tensor want = reference_.alloc({40, 24}, DType::kF32);
  reference_.rms_norm(x, w, 1e-6f, want);
  for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(out.data<float>()[i], want.data<float>()[i]);
  EXPECT_NE(check_.summary().find("paged_attention"), std::string::npos) << check_.summary();
}

TEST_F(CheckingBackendTest, FaultyOpIsRecordedWithItsElementAndNothingDownstream) {
  faulty_.fault_op = "paged_attention";
  faulty_.index = (37 * 4 + 1) * 16 + 5;  // [37, 1, 5]
  faulty_.delta = 0.5f;
  Tensor attn = check_.alloc({40, 4, 16}, DType::kF32);
  attention_step(40, 4, 2, 16, attn);
  // Downstream of the fault, on the faulty values: checked on the primary's own inputs.
  Tensor normed = check_.alloc({40 * 4, 16}, DType::kF32);
  check_.rms_norm(attn.view({40 * 4, 16}), rand({16}), 1e-6f, normed);
  ASSERT_EQ(check_.mismatches().size(), 1u) << check_.summary();
  const OpMismatch& m = check_.mismatches()[0];
  EXPECT_EQ(m.op, "paged_attention");
  EXPECT_EQ(m.output, "out");
  EXPECT_EQ(m.worst_at, "[37, 1, 5]");
  EXPECT_EQ(m.first_bad_at, "[37, 1, 5]");
  EXPECT_EQ(m.bad, 1);
  EXPECT_NEAR(m.max_abs, 0.5, 1e-5);
  EXPECT_NEAR(m.got - m.want, 0.5f, 1e-5);
  EXPECT_EQ(m.op_index, 1);  // write_kv, then paged_attention
  EXPECT_NE(m.shapes.find("seq_lens 40"), std::string::npos) << m.shapes;
  EXPECT_NE(m.str().find("paged_attention"), std::string::npos);
}

TEST_F(CheckingBackendTest, ErrorsWithinTheToleranceAreNotRecorded) {
  faulty_.fault_op = "rms_norm";
  faulty_.index = 7;
  Tensor x = rand({8, 32}), w = rand({32}, 0.5f, 1.5f), out = check_.alloc({8, 32}, DType::kF32);
  Tensor scale_probe = reference_.alloc({8, 32}, DType::kF32);
  reference_.rms_norm(x, w, 1e-6f, scale_probe);
  float scale = 0;
  for (int64_t i = 0; i < scale_probe.numel(); ++i) scale = std::max(scale, std::fabs(scale_probe.data<float>()[i]));
  faulty_.delta = 0.01f * scale;  // 1% of the output's scale: under the 3% tolerance
  check_.rms_norm(x, w, 1e-6f, out);
  EXPECT_TRUE(check_.mismatches().empty());
  faulty_.delta = 0.05f * scale;  // 5%: over it
  check_.rms_norm(x, w, 1e-6f, out);
  ASSERT_EQ(check_.mismatches().size(), 1u);
  EXPECT_EQ(check_.mismatches()[0].worst_at, "[0, 7]");
}

TEST_F(CheckingBackendTest, InPlaceOutputsAndLayerAndStepAreReported) {
  Tensor w = rand({16});
  Tensor x = rand({4, 16}), res = rand({4, 16}), out = check_.alloc({4, 16}, DType::kF32);
  check_.reset_scratch();
  check_.rms_norm(x, w, 1e-6f, out);      // layer 0's input norm
  check_.add_rms_norm(x, res, w, 1e-6f);  // layer 0's post-attention norm
  check_.add_rms_norm(x, res, w, 1e-6f);  // layer 1's input norm
  faulty_.fault_op = "add_rms_norm";
  faulty_.index = 3 * 16 + 2;
  faulty_.delta = 10;
  check_.add_rms_norm(x, res, w, 1e-6f);  // layer 1's post-attention norm: the residual is wrong
  ASSERT_EQ(check_.mismatches().size(), 1u) << check_.summary();
  const OpMismatch& m = check_.mismatches()[0];
  EXPECT_EQ(m.output, "residual");
  EXPECT_EQ(m.worst_at, "[3, 2]");
  EXPECT_EQ(m.layer, 1);
  EXPECT_EQ(m.op_index, 3);
  const int64_t step = m.step;
  check_.set_context("decode step 4");
  check_.reset_scratch();
  check_.add_rms_norm(x, res, w, 1e-6f);
  ASSERT_EQ(check_.mismatches().size(), 2u);
  EXPECT_EQ(check_.mismatches()[1].step, step + 1);
  EXPECT_EQ(check_.mismatches()[1].op_index, 0);
  EXPECT_EQ(check_.mismatches()[1].layer, 0);
  EXPECT_EQ(check_.mismatches()[1].context, "decode step 4");
}

TEST_F(CheckingBackendTest, TopkTiesBrokenOtherwiseThanTheContractAreRecorded) {
  const int T = 3, E = 6;
  Tensor logits = rand({T, E}, -1, 0);
  check_.moe_topk(logits, 2, true, check_.alloc({T, 2}, DType::kI32), check_.alloc({T, 2}, DType::kF32));
  EXPECT_TRUE(check_.mismatches().empty());
  // Row 1: experts 1 and 4 tie for the largest logit; the faulty primary picks 4.
  logits.data<float>()[1 * E + 1] = 2;
  logits.data<float>()[1 * E + 4] = 2;
  faulty_.fault_op = "moe_topk";
  check_.moe_topk(logits, 1, true, check_.alloc({T, 1}, DType::kI32), check_.alloc({T, 1}, DType::kF32));
  ASSERT_EQ(check_.mismatches().size(), 1u) << check_.summary();
  const OpMismatch& m = check_.mismatches()[0];
  EXPECT_EQ(m.output, "topk_ids");
  EXPECT_EQ(m.first_bad_at, "[1]");
  EXPECT_NE(m.note.find("0 rows choose other experts, 1 rows break exact ties"), std::string::npos) << m.note;
}

TEST_F(CheckingBackendTest, LinearAttentionStateIsCompared) {
  const int Hk = 1, Hv = 2, Dk = 16, Dv = 16, C = 2 * Hk * Dk + Hv * Dv, T = 20;
  Tensor state = check_.alloc({2, Hv, Dk, Dv}, DType::kF32);
  check_.fill(state, 0);
  LinearAttnLayout l;
  l.query_start_loc = {0, T};
  l.state_slots = {1};
  l.has_initial_state = {0};
  LinearAttnMetadata meta = upload_linear_attn_metadata(check_, l);
  Tensor qkv = rand({T, C}), ba = rand({T, 2 * Hv}), A_log = rand({Hv}), dt = rand({Hv});
  Tensor out = check_.alloc({T, Hv, Dv}, DType::kF32);
  check_.gated_delta_rule(qkv, ba, 0, A_log, dt, state, meta, out);
  EXPECT_TRUE(check_.mismatches().empty()) << check_.mismatches().front().str();
  faulty_.fault_op = "gated_delta_rule";
  faulty_.fault_state = true;
  faulty_.index = Hv * Dk * Dv + 1 * Dk * Dv + 3 * Dv + 9;  // slot 1, head 1, [3, 9]
  faulty_.delta = 5;
  l.has_initial_state = {1};
  meta = upload_linear_attn_metadata(check_, l);
  check_.gated_delta_rule(qkv, ba, 0, A_log, dt, state, meta, out);
  ASSERT_EQ(check_.mismatches().size(), 1u) << check_.summary();
  EXPECT_EQ(check_.mismatches()[0].output, "state");
  EXPECT_EQ(check_.mismatches()[0].worst_at, "[1, 1, 3, 9]");
  EXPECT_NE(check_.mismatches()[0].shapes.find("has_initial_state 1"), std::string::npos);
}

// Speculative decoding's per-token state slots reach the reference too (it keeps the state after
// each token in the same slots as the primary, not in the sequence's own slot), and the checking
// backend supports them when both backends do (the primary here is a ForwardingBackend).
TEST_F(CheckingBackendTest, PerTokenStateSlotsReachTheReference) {
  EXPECT_TRUE(check_.supports_token_state_slots());
  const int Hk = 1, Hv = 2, Dk = 16, Dv = 16, C = 2 * Hk * Dk + Hv * Dv, T = 3;
  Tensor state = check_.alloc({4, Hv, Dk, Dv}, DType::kF32);
  check_.fill(state, 0);
  LinearAttnLayout l;
  l.query_start_loc = {0, T};
  l.state_slots = {0};
  l.has_initial_state = {0};
  l.token_state_slots = {0, 2, 3};
  LinearAttnMetadata meta = upload_linear_attn_metadata(check_, l);
  Tensor qkv = rand({T, C}), ba = rand({T, 2 * Hv}), A_log = rand({Hv}), dt = rand({Hv});
  Tensor out = check_.alloc({T, Hv, Dv}, DType::kF32);
  check_.gated_delta_rule(qkv, ba, 0, A_log, dt, state, meta, out);
  EXPECT_TRUE(check_.mismatches().empty()) << check_.summary();
  std::vector<float> host(static_cast<size_t>(state.numel()));
  check_.copy_to_host(host.data(), state);
  const size_t slot = static_cast<size_t>(Hv) * Dk * Dv;
  auto nonzero = [&](size_t s) {
    return std::any_of(host.begin() + static_cast<ptrdiff_t>(s * slot),
                       host.begin() + static_cast<ptrdiff_t>((s + 1) * slot), [](float v) { return v != 0; });
  };
  EXPECT_TRUE(nonzero(0) && nonzero(2) && nonzero(3)) << "a token's state was not kept in its slot";
  EXPECT_FALSE(nonzero(1)) << "slot 1 is no token's";
}

// A buffer that changes between the op that wrote it and the op that reads it (here a stray
// host write into the primary's memory) is recorded against the reader, naming the writer;
// outputs, in-place updates, uploads and fills are not.
TEST_F(CheckingBackendTest, InputsChangedBehindTheOpsBacksAreRecorded) {
  Tensor x = check_.alloc({6, 16}, DType::kF32);
  std::vector<float> host(96);
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.01f * static_cast<float>(i) - 0.3f;
  check_.copy_from_host(x, host.data());
  Tensor w = rand({16}), h = check_.alloc({6, 16}, DType::kF32), res = rand({6, 16});
  check_.rms_norm(x, w, 1e-6f, h);
  check_.add_rms_norm(h, res, w, 1e-6f);  // in place: h and res rewritten by an op
  check_.rms_norm(h, w, 1e-6f, h);        // in place again
  Tensor lin = check_.alloc({6, 4}, DType::kF32);
  check_.linear(h, rand({4, 16}), nullptr, lin);
  check_.fill(lin, 0);
  check_.add(lin, lin, lin);
  EXPECT_TRUE(check_.mismatches().empty()) << check_.mismatches().front().str();

  h.data<float>()[17] += 1;  // behind the ops' backs
  check_.linear(h, rand({4, 16}), nullptr, lin);
  ASSERT_EQ(check_.mismatches().size(), 1u) << check_.summary();
  const OpMismatch& m = check_.mismatches()[0];
  EXPECT_EQ(m.op, "linear");
  EXPECT_EQ(m.output, "clobbered input");
  EXPECT_NE(m.note.find("op #2 rms_norm (out)"), std::string::npos) << m.note;
  // Reported once; an upload makes the contents known again.
  check_.linear(h, rand({4, 16}), nullptr, lin);
  x.data<float>()[0] = 5;
  check_.copy_from_host(x, host.data());
  check_.rms_norm(x, w, 1e-6f, h);
  EXPECT_EQ(check_.mismatches().size(), 1u) << check_.summary();
}

TEST(CheckingBackend, RefusesANonCpuReference) {
  CpuBackend cpu;
  struct NotCpu : ForwardingBackend {
    using ForwardingBackend::ForwardingBackend;
    DType compute_dtype() const override { return DType::kBF16; }
  } bf16(cpu);
  EXPECT_THROW(CheckingBackend(cpu, bf16), Error);
}

}  // namespace
}  // namespace tessera
