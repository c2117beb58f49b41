// Every fixture model against transformers: last-position logits and greedy tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <optional>

#include "backend/cpu/cpu_backend.h"
#include "backend/forwarding_backend.h"
#include "bf16_emulation.h"
#include "core/error.h"
#include "fixture_util.h"
#include "loader/checkpoint.h"
#include "model/registry.h"

namespace tessera {
namespace {

using testing::all_supported_fixture_names;
using testing::argmax;
using testing::fixtures_dir;
using testing::hybrid_fixture_names;
using testing::load_reference;
using testing::SeqPart;
using testing::step_of;
using testing::to_host;
using testing::top2_gap;

struct Loaded {
  std::unique_ptr<Backend> owned = testing::make_test_backend();
  Backend& backend = *owned;
  std::unique_ptr<Model> model;
  KvCache cache;
};

// KV blocks of 16 tokens: enough for the longest prompt (300) and its greedy tokens.
constexpr int kBlocks = 24;

// The cache every layer declares: paged K/V for attention layers; for Gated DeltaNet layers
// `slots` state slots (conv state in the compute dtype, the recurrent state in f32, as the
// engine's defaults).
std::unique_ptr<Loaded> load(const std::string& name, int num_blocks = kBlocks, std::optional<DType> kv_dtype = {},
                             int slots = 4) {
  auto l = std::make_unique<Loaded>();
  ModelConfig cfg = load_model_config(fixtures_dir() + "/" + name);
  l->model = create_model(cfg, ModelOptions{}, l->backend);
  Checkpoint ckpt(cfg.model_dir);
  l->model->weights().load(ckpt, l->backend);
  l->cache = testing::alloc_test_cache(l->backend, l->model->cache_specs(), num_blocks,
                                       kv_dtype.value_or(l->backend.compute_dtype()), slots);
  return l;
}

// One sequence occupying blocks 0..n-1 in order and state slot 0: run tokens [start, start+len).
ModelInput single_sequence_step(const std::vector<int32_t>& all_tokens, int start, int len, int num_blocks) {
  return step_of({SeqPart{&all_tokens, start, len, 0, num_blocks, 0}});
}

class FixtureTest : public ::testing::TestWithParam<std::string> {};

// The largest standard deviation of the reference's last logits over the fixture's prompts.
double logit_spread(const nlohmann::json& ref) {
  double spread = 0;
  for (const auto& c : ref["cases"]) {
    auto v = c["last_logits"].get<std::vector<double>>();
    double mean = 0, sq = 0;
    for (double x : v) mean += x;
    mean /= static_cast<double>(v.size());
    for (double x : v) sq += (x - mean) * (x - mean);
    spread = std::max(spread, std::sqrt(sq / static_cast<double>(v.size())));
  }
  return spread;
}

// A model and its cache on any backend (a decorator over the test backend included).
struct OnBackend {
  std::unique_ptr<Model> model;
  KvCache cache;
};
OnBackend load_on(const std::string& name, Backend& be, std::optional<DType> kv_dtype) {
  OnBackend l;
  ModelConfig cfg = load_model_config(fixtures_dir() + "/" + name);
  l.model = create_model(cfg, ModelOptions{}, be);
  Checkpoint ckpt(cfg.model_dir);
  l.model->weights().load(ckpt, be);
  l.cache = testing::alloc_test_cache(be, l.model->cache_specs(), kBlocks, kv_dtype.value_or(be.compute_dtype()), 4);
  return l;
}

// The prompt prefilled in steps of `chunk` tokens (0: one step), then greedy decode: the logits
// of the prefill's last position and of every decode step, on each of `runs` in lockstep; the
// tokens fed back are run 0's argmax (the backend under test, free-running as a server would).
std::vector<std::vector<std::vector<float>>> run_lockstep(const std::vector<std::pair<Backend*, OnBackend*>>& runs,
                                                          std::vector<int32_t> tokens, int steps, int chunk) {
  std::vector<std::vector<std::vector<float>>> out(runs.size());
  auto forward = [&](const ModelInput& in) {
    for (size_t r = 0; r < runs.size(); ++r) {
      runs[r].first->reset_scratch();
      out[r].push_back(to_host(*runs[r].first, runs[r].second->model->forward(in, runs[r].second->cache)));
    }
  };
  const int len = static_cast<int>(tokens.size()), step = chunk > 0 ? chunk : len;
  for (int start = 0; start < len; start += step) {
    for (auto& o : out) o.clear();  // only the last prefill step's logits are kept
    forward(single_sequence_step(tokens, start, std::min(step, len - start), kBlocks));
  }
  for (int s = 0; s < steps; ++s) {
    tokens.push_back(argmax(out[0].back()));
    forward(single_sequence_step(tokens, static_cast<int>(tokens.size()) - 1, 1, kBlocks));
  }
  return out;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

// Whether `token` is among the n largest of `logits` (vLLM's check_logprobs_close: a token in
// the other side's top-n logprobs).
bool in_top_n(const std::vector<float>& logits, int token, int n) {
  int above = 0;
  for (float x : logits) above += x > logits[static_cast<size_t>(token)];
  return above < n;
}

// vLLM's usual number of logprobs compared at a greedy divergence.
constexpr int kTopN = 5;

struct CaseVerdict {
  bool ok = false;
  std::string rule;    // which rule accepted the case ("" when none did)
  std::string detail;  // what was measured, for the line printed and the failure message
  size_t compared = 0;
};

// The reference rule: logits within `tol` of transformers' at the prompt's last position, then
// greedy tokens identical except where the reference's own margin is within `close` (from there
// the continuations legitimately diverge).
CaseVerdict reference_rule(const nlohmann::json& c, const std::vector<std::vector<float>>& logits, double tol,
                           double close) {
  CaseVerdict v;
  const auto want = c["last_logits"].get<std::vector<float>>();
  const auto greedy = c["greedy"].get<std::vector<int32_t>>();
  const auto margins = c["margins"].get<std::vector<double>>();
  EXPECT_EQ(logits[0].size(), want.size());
  const float err = max_abs_diff(logits[0], want);
  char buf[256];
  std::snprintf(buf, sizeof buf, "last-logits err %.4g (tol %.4g)", err, tol);
  v.detail = buf;
  v.ok = err < tol;
  for (size_t i = 0; i < greedy.size(); ++i, ++v.compared) {
    const int got = argmax(logits[i]);
    if (got == greedy[i]) continue;
    std::snprintf(buf, sizeof buf, "; greedy step %zu: %d, transformers %d (reference margin %.3g, close %.3g)", i, got,
                  greedy[i], margins[i], close);
    v.detail += buf;
    v.ok = v.ok && margins[i] <= close;
    break;
  }
  if (v.ok) v.rule = "reference rule";
  return v;
}

// The bf16 rule, for a bf16 backend on a MoE model where the reference rule fails: the case is
// accepted only when the backend's departure from transformers is demonstrated to be a router
// near tie decided the other way, and the backend otherwise computes what the CPU computes:
//  - routing: the backend's top-k choices are imposed on an f32 CPU run of the same steps
//    (RoutingReplay); at least one token row must be re-routed (a near tie decided the other way
//    by the backend's own router logits), and every recorded choice must be the top-k of the
//    backend's own router logits: a choice its own logits do not support is a wrong top-k kernel,
//    which the replay would otherwise impose on the CPU run too;
//  - logits: at the prompt's last position within `tol` (the reference rule's bf16 tolerance) of
//    that CPU run, which is the f32 model given the backend's decisions;
//  - greedy (vLLM's check_logprobs_close): tokens equal to transformers' until the first
//    difference, where the backend's token must be in the reference's top-5 (the plain f32 CPU
//    run on the same context, which the CPU test holds to transformers' logits) and the
//    reference's token in the backend's top-5, or, where the re-routed rows took the
//    continuation elsewhere, the step's logits within `tol` of the f32 CPU run with the backend's
//    routing and the backend's token in that run's top-5; the sequence is not compared after it.
CaseVerdict bf16_rule(const std::string& name, const nlohmann::json& c, Backend& primary, std::optional<DType> kv_dtype,
                      double tol, int chunk) {
  testing::RoutingRecorder rec(primary);
  CpuBackend replay_cpu, plain;
  testing::RoutingReplay replay(replay_cpu, rec.routes);
  OnBackend lp = load_on(name, rec, kv_dtype), lr = load_on(name, replay, kv_dtype),
            lf = load_on(name, plain, kv_dtype);
  const auto greedy = c["greedy"].get<std::vector<int32_t>>();
  const auto logits = run_lockstep({{&rec, &lp}, {&replay, &lr}, {&plain, &lf}},
                                   c["prompt_ids"].get<std::vector<int32_t>>(), static_cast<int>(greedy.size()), chunk);
  CaseVerdict v;
  const float replay_err = max_abs_diff(logits[0][0], logits[1][0]);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%d token rows re-routed against the f32 CPU's choice (largest CPU router-logit gap crossed %.3g), "
                "%d choices not the top-k of the backend's own router logits; last logits %.4g from the f32 CPU "
                "given the same routing (tol %.4g)",
                replay.differing_rows, replay.max_rerouted_gap, rec.inconsistent_rows, replay_err, tol);
  v.detail = buf;
  const bool near_tie = replay.differing_rows > 0 && rec.inconsistent_rows == 0;
  v.ok = near_tie && replay_err < tol;
  for (size_t i = 0; i < greedy.size(); ++i, ++v.compared) {
    const std::vector<float>& mine = logits[0][i];
    const std::vector<float>& replayed = logits[1][i];
    const std::vector<float>& ref = logits[2][i];
    const int got = argmax(mine);
    if (got == greedy[i]) continue;
    const bool near_ref = in_top_n(ref, got, kTopN) && in_top_n(mine, greedy[i], kTopN);
    // Or the step is what the f32 model computes given the backend's routing (re-routed rows
    // change the continuation far more than a near tie of the last step): its logits within
    // `tol` of the replay's and the backend's token in the replay's top-5.
    const float step_err = max_abs_diff(mine, replayed);
    const bool as_replayed = step_err < tol && in_top_n(replayed, got, kTopN);
    std::snprintf(buf, sizeof buf,
                  "; greedy step %zu: %d, transformers %d, %s each other's top-%d; step logits %.4g from the f32 CPU "
                  "given the same routing (its token %d)",
                  i, got, greedy[i], near_ref ? "in" : "NOT in", kTopN, step_err, argmax(replayed));
    v.detail += buf;
    v.ok = v.ok && (near_ref || as_replayed);
    break;
  }
  if (v.ok) v.rule = "bf16 rule (routing replay + top-5 greedy), NOT an exact match";
  return v;
}

// One reference case on `be`: the reference rule, then (a bf16 backend on a MoE model only) the
// bf16 rule. Prints which rule accepted the case, or why none did.
CaseVerdict check_case(const std::string& name, const nlohmann::json& c, Backend& be, bool bf16,
                       std::optional<DType> kv_dtype, double logit_tol, double close_call, int chunk) {
  const double bf16_noise =
      bf16 && c.contains("bf16_last_logits_err") ? 2.0 * c["bf16_last_logits_err"].get<double>() : 0.0;
  const double tol = std::max(logit_tol, bf16_noise), close = std::max(close_call, bf16_noise);
  const int steps = static_cast<int>(c["greedy"].size());
  CaseVerdict v;
  {
    OnBackend l = load_on(name, be, kv_dtype);
    v = reference_rule(c, run_lockstep({{&be, &l}}, c["prompt_ids"].get<std::vector<int32_t>>(), steps, chunk)[0], tol,
                       close);
  }
  const bool moe = load_model_config(fixtures_dir() + "/" + name).moe.num_experts > 0;
  std::string why_not;
  if (!v.ok && bf16 && moe) {
    const CaseVerdict relaxed = bf16_rule(name, c, be, kv_dtype, tol, chunk);
    v.detail += " | bf16 rule: " + relaxed.detail;
    if (relaxed.ok) {
      v.ok = true;
      v.rule = relaxed.rule;
      v.compared = relaxed.compared;
    }
  } else if (!v.ok) {
    v.detail += bf16 ? " | bf16 rule: not applicable (no MoE router)" : " | bf16 rule: not applicable (f32 backend)";
  }
  std::printf("[fixture-rule] %s prompt length %zu%s: %s: %s\n", name.c_str(), c["prompt_ids"].size(),
              kv_dtype ? " (fp8 KV)" : "", v.ok ? ("accepted by the " + v.rule).c_str() : "REJECTED", v.detail.c_str());
  return v;
}

// Every case of the fixture on the test backend (CPU: f32 with 1e-3 close calls; CUDA: bf16). A
// backend computing in bf16 gets at least twice the error transformers itself makes in bf16 on
// that prompt (`bf16_last_logits_err`, measured by tools/fixture_bf16_spread.py), and on MoE
// models the bf16 rule where the reference rule fails (check_case). The prompt is prefilled in
// steps of `chunk` tokens (0: one step), the state and KV cache carried from one step to the next.
void check_against_reference(const std::string& name, std::optional<DType> kv_dtype, double logit_tol,
                             double close_call, int chunk = 0) {
  auto ref = load_reference(name);
  if (kv_dtype) {
    // A relative error per cached value moves the logits in proportion to their scale: the
    // fp8 bounds below were measured on logits of std <= 1.35 and widen for wider ones
    // (qwen3_dense_fp8: std 2.45).
    const double factor = std::max(1.0, logit_spread(ref) / 1.35);
    logit_tol *= factor;
    close_call *= factor;
  }
  auto be = testing::make_test_backend();
  const bool bf16 = be->compute_dtype() == DType::kBF16;
  size_t compared_total = 0;
  for (const auto& c : ref["cases"]) {
    const CaseVerdict v = check_case(name, c, *be, bf16, kv_dtype, logit_tol, close_call, chunk);
    EXPECT_TRUE(v.ok) << name << " prompt length " << c["prompt_ids"].size() << ": " << v.detail;
    compared_total += v.compared;
  }
  // With bf16 a close call can come at the first step of a prompt; over the fixture's three
  // prompts enough steps must still be compared for the test to mean something.
  EXPECT_GE(compared_total, 8u) << "fixture margins too small to be a useful test";
}

TEST_P(FixtureTest, LastLogitsAndGreedyMatchTransformers) {
  // CPU: fp32 compute on the bf16 weights, as the reference (1e-3 close calls). CUDA: bf16
  // activations (0.05).
  const bool cuda = testing::testing_on_cuda();
  check_against_reference(GetParam(), std::nullopt, cuda ? 0.15 : 2e-3, cuda ? 0.05 : 1e-3);
}

// An fp8 (e4m3, scale 1) KV cache: 3 mantissa bits per cached key and value (rounding up to
// 6.25%), so logits (spread ~6, std ~1.15 on these fixtures) move by up to ~0.4 (measured on
// CPU: 0.09-0.40) and close calls widen accordingly.
TEST_P(FixtureTest, Fp8KvCacheStaysWithinFp8Tolerance) {
  const bool cuda = testing::testing_on_cuda();
  check_against_reference(GetParam(), DType::kF8E4M3, cuda ? 0.6 : 0.5, 0.3);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureTest, ::testing::ValuesIn(all_supported_fixture_names()),
                         [](const auto& info) { return info.param; });

// ---- the bf16 rule on the CPU: bf16 activations (Bf16ActivationsBackend) stand in for CUDA.

// The issue 16/17 cases that fail the reference rule on the H200 (fixture, case index).
const std::vector<std::pair<std::string, size_t>> kIssueCases = {
    {"qwen2_moe_shared", 1}, {"qwen3_5_moe_text_tiny", 1}, {"qwen3_moe_e8_k2_norm", 2}, {"qwen3_next_tiny", 3}};

// Every issue case with bf16 activations on the CPU is accepted, by the reference rule or, where
// bf16 rounding flips a near-tied router choice as on the H200 (qwen3_5_moe_text_tiny's 7-token
// prompt: last logits 0.99 from transformers'), by the bf16 rule.
TEST(Bf16Rule, Bf16ActivationsOnTheCpuPassTheIssueCases) {
  int by_bf16_rule = 0;
  for (const auto& [name, i] : kIssueCases) {
    CpuBackend cpu;
    testing::Bf16ActivationsBackend be(cpu);
    const CaseVerdict v = check_case(name, load_reference(name)["cases"][i], be, true, std::nullopt, 0.15, 0.05, 0);
    EXPECT_TRUE(v.ok) << name << " case " << i << ": " << v.detail;
    by_bf16_rule += v.rule.rfind("bf16 rule", 0) == 0;
  }
  EXPECT_GE(by_bf16_rule, 1) << "no issue case needed the bf16 rule: the stand-in does not reproduce the H200";
}

// A kernel fault: the n-th moe_experts call of every step computes experts a and b with each
// other's weights (a wrong expert offset), everything else bf16 as above.
class SwappedExpertsBackend final : public ForwardingBackend {
 public:
  SwappedExpertsBackend(Backend& inner, int call, int a, int b) : ForwardingBackend(inner), call_(call), a_(a), b_(b) {}
  void moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& ids, const Tensor& w,
                   int begin, const Tensor& out) override {
    const bool fault = calls_++ == call_;
    int32_t* id = ids.data<int32_t>();
    std::vector<int32_t> saved(id, id + ids.numel());
    if (fault)
      for (int64_t i = 0; i < ids.numel(); ++i) id[i] = id[i] == a_ ? b_ : id[i] == b_ ? a_ : id[i];
    inner().moe_experts(x, gate_up, down, ids, w, begin, out);
    std::copy(saved.begin(), saved.end(), id);
  }

  void reset_scratch() override {
    calls_ = 0;
    ForwardingBackend::reset_scratch();
  }

 private:
  int call_, a_, b_, calls_ = 0;
};

// A top-k fault: in the n-th moe_topk call of every step every row's last expert is replaced by the expert of
// the lowest router logit (a far choice, not a near tie; weights as the op computes them).
class FarTopkBackend final : public ForwardingBackend {
 public:
  FarTopkBackend(Backend& inner, int call) : ForwardingBackend(inner), call_(call) {}
  void moe_topk(const Tensor& logits, int k, bool renormalize, const Tensor& ids, const Tensor& w) override {
    inner().moe_topk(logits, k, renormalize, ids, w);
    if (calls_++ != call_) return;
    const int64_t T = logits.dim(0), E = logits.dim(1);
    for (int64_t t = 0; t < T; ++t) {
      const float* r = logits.data<float>() + t * E;
      ids.data<int32_t>()[t * k + k - 1] = static_cast<int32_t>(std::min_element(r, r + E) - r);
    }
  }

  void reset_scratch() override {
    calls_ = 0;
    ForwardingBackend::reset_scratch();
  }

 private:
  int call_, calls_ = 0;
};

// The bf16 rule still fails a real kernel bug on the issue cases it would otherwise accept: two
// experts swapped in the first MoE block of the prefill.
TEST(Bf16Rule, SwappedExpertsAreRejected) {
  for (const auto& [name, i] : kIssueCases) {
    CpuBackend cpu;
    testing::Bf16ActivationsBackend bf16(cpu);
    const auto ref = load_reference(name);
    const auto& c = ref["cases"][i];
    SwappedExpertsBackend be(bf16, 0, 0, 1);
    const CaseVerdict v = check_case(name, c, be, true, std::nullopt, 0.15, 0.05, 0);
    EXPECT_FALSE(v.ok) << name << " case " << i << " accepted with two experts swapped: " << v.detail;
  }
}

// A top-k kernel choosing a far expert is not a near tie: the routing replay refuses it (the
// bf16 rule would otherwise impose the wrong choice on the CPU run too).
TEST(Bf16Rule, AFarTopkChoiceIsRejected) {
  for (const auto& [name, i] : kIssueCases) {
    CpuBackend cpu;
    testing::Bf16ActivationsBackend bf16(cpu);
    FarTopkBackend be(bf16, 0);
    const CaseVerdict v = check_case(name, load_reference(name)["cases"][i], be, true, std::nullopt, 0.15, 0.05, 0);
    EXPECT_FALSE(v.ok) << name << " case " << i << " accepted with a far top-k choice: " << v.detail;
    // Refused by the top-k check itself, not only by the logits it moves.
    EXPECT_EQ(v.detail.find(" 0 choices not the top-k"), std::string::npos) << v.detail;
  }
}

// Dense fixtures keep the reference rule: a bf16 backend whose logits leave transformers' (the
// n-th linear of every step, layer 0's down projection, 50% off) gets no second rule.
class ScaledLinearBackend final : public ForwardingBackend {
 public:
  ScaledLinearBackend(Backend& inner, int call, float factor) : ForwardingBackend(inner), call_(call), f_(factor) {}
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out) override {
    inner().linear(x, w, bias, out);
    if (calls_++ != call_) return;
    float* p = out.data<float>();
    for (int64_t i = 0; i < out.numel(); ++i) p[i] *= f_;
  }

  void reset_scratch() override {
    calls_ = 0;
    ForwardingBackend::reset_scratch();
  }

 private:
  int call_;
  float f_;
  int calls_ = 0;
};

TEST(Bf16Rule, DenseFixturesKeepTheReferenceRule) {
  CpuBackend cpu;
  testing::Bf16ActivationsBackend bf16(cpu);
  ScaledLinearBackend be(bf16, 3, 1.5f);
  const CaseVerdict v = check_case("qwen3_gqa4_hd32", load_reference("qwen3_gqa4_hd32")["cases"][1], be, true,
                                   std::nullopt, 0.15, 0.05, 0);
  EXPECT_FALSE(v.ok) << v.detail;
  EXPECT_NE(v.detail.find("not applicable (no MoE router)"), std::string::npos) << v.detail;
}

class HybridFixtureTest : public ::testing::TestWithParam<std::string> {};

// Prefill in steps of 32 tokens (the 300-token prompt crosses 10 steps and several 64-token
// chunks of the gated delta rule): each step continues from the slot's conv and recurrent
// state, and the logits and greedy tokens are transformers' as with one prefill step.
TEST_P(HybridFixtureTest, ChunkedPrefillCarriesTheState) {
  const bool cuda = testing::testing_on_cuda();
  check_against_reference(GetParam(), std::nullopt, cuda ? 0.15 : 2e-3, cuda ? 0.05 : 1e-3, 32);
}

// Two sequences in one step, in state slots 3 and 1 and their own KV blocks: a 33-token
// prompt and the 300-token one (whose first 40 tokens ran in an earlier step alone, so one
// sequence continues from its state while the other starts from zeros). Then one decode step
// of both. Each sequence must get what it gets alone in its slot:
//  - CPU (f32): transformers' last logits (2e-3) and first two greedy tokens (close calls 1e-3);
//  - CUDA (bf16): the same backend's logits for the sequence run alone, within twice the error
//    transformers itself makes in bf16 on that prompt (at least 0.15), and the same decode
//    token unless the solo run called it within that noise. (Against transformers a bf16
//    backend may part at a near tie: FixtureTest holds the solo runs to the reference with the
//    bf16 rule; this test is about slots, which a mix-up breaks by far more than the noise.)
struct TwoSeqLogits {
  std::vector<float> prefill, decode;  // each sequence's row of V, a then b where both ran
};

TEST_P(HybridFixtureTest, TwoSequencesInOneStepKeepTheirOwnSlots) {
  const std::string name = GetParam();
  auto ref = load_reference(name);
  const auto& cases = ref["cases"];
  ASSERT_GE(cases.size(), 4u);
  const auto& ca = cases[2];
  const auto& cb = cases[3];
  const std::vector<int32_t> pa = ca["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> pb = cb["prompt_ids"].get<std::vector<int32_t>>();
  const int la = static_cast<int>(pa.size()), lb = static_cast<int>(pb.size());
  ASSERT_LT(la + 1, 4 * 16);
  const size_t V = ca["last_logits"].size();
  // Sequence a: blocks [0, 4), slot 3. Sequence b: blocks [4, 25), slot 1. `which`: 1 a alone,
  // 2 b alone, 3 both; returns [prefill a][prefill b] and [decode a][decode b] of those that ran.
  auto run = [&](int which) {
    auto l = load(name, 4 + 21);
    std::vector<int32_t> a = pa, b = pb;
    const bool with_a = which & 1, with_b = which & 2;
    if (with_b) l->model->forward(step_of({SeqPart{&b, 0, 40, 4, 21, 1}}), l->cache);
    l->backend.reset_scratch();
    std::vector<SeqPart> step;
    if (with_a) step.push_back(SeqPart{&a, 0, la, 0, 4, 3});
    if (with_b) step.push_back(SeqPart{&b, 40, lb - 40, 4, 21, 1});
    TwoSeqLogits r;
    r.prefill = to_host(l->backend, l->model->forward(step_of(step), l->cache));
    size_t row = 0;
    if (with_a) a.push_back(argmax(std::vector<float>(r.prefill.begin(), r.prefill.begin() + V))), ++row;
    if (with_b) b.push_back(argmax(std::vector<float>(r.prefill.begin() + row * V, r.prefill.begin() + (row + 1) * V)));
    step.clear();
    if (with_a) step.push_back(SeqPart{&a, la, 1, 0, 4, 3});
    if (with_b) step.push_back(SeqPart{&b, lb, 1, 4, 21, 1});
    l->backend.reset_scratch();
    r.decode = to_host(l->backend, l->model->forward(step_of(step), l->cache));
    return r;
  };
  auto row = [&](const std::vector<float>& v, size_t k) {
    return std::vector<float>(v.begin() + static_cast<long>(k * V), v.begin() + static_cast<long>((k + 1) * V));
  };
  const TwoSeqLogits both = run(3);
  ASSERT_EQ(both.prefill.size(), 2 * V);
  ASSERT_EQ(both.decode.size(), 2 * V);
  const bool cuda = testing::testing_on_cuda();
  for (int k = 0; k < 2; ++k) {
    const auto& c = k == 0 ? ca : cb;
    const char* what = k == 0 ? "the 33-token prompt" : "the 300-token prompt, continued from its slot";
    const std::vector<float> got_prefill = row(both.prefill, k), got_decode = row(both.decode, k);
    std::vector<float> want_prefill, want_decode;
    int want_first, want_second;
    double tol, close;
    if (!cuda) {
      want_prefill = c["last_logits"].get<std::vector<float>>();
      const auto greedy = c["greedy"].get<std::vector<int32_t>>();
      const auto margins = c["margins"].get<std::vector<double>>();
      want_first = greedy[0], want_second = greedy[1];
      tol = 2e-3, close = 1e-3;
      if (argmax(got_prefill) != want_first) {
        EXPECT_LE(margins[0], close) << name << ": " << what << ", first token";
        continue;
      }
      if (margins[1] > close) EXPECT_EQ(argmax(got_decode), want_second) << name << ": " << what << ", decode step";
    } else {
      const TwoSeqLogits alone = run(k == 0 ? 1 : 2);
      want_prefill = alone.prefill, want_decode = alone.decode;
      const double noise = 2.0 * c.value("bf16_last_logits_err", 0.0);
      tol = std::max(0.15, noise), close = std::max(0.05, noise);
      want_first = argmax(want_prefill);
      if (argmax(got_prefill) != want_first) {
        EXPECT_LE(top2_gap(want_prefill), close) << name << ": " << what << ", first token";
        continue;
      }
      if (top2_gap(want_decode) > close)
        EXPECT_EQ(argmax(got_decode), argmax(want_decode)) << name << ": " << what << ", decode step";
    }
    EXPECT_LT(max_abs_diff(got_prefill, want_prefill), tol) << name << ": " << what << ", last prefill logits";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HybridFixtureTest, ::testing::ValuesIn(hybrid_fixture_names()),
                         [](const auto& info) { return info.param; });

// Every hybrid fixture (Qwen3-Next, Qwen3.5 MoE text, the multimodal wrapper, dense) runs.
TEST(ModelRegistry, HybridFixturesRun) { EXPECT_GE(hybrid_fixture_names().size(), 4u); }

// Fixtures of families not supported yet (FP8 checkpoints) are refused with kUnsupported
// naming what is missing, at config parsing or model creation; every Qwen2-MoE / Qwen3-MoE
// fixture runs.
TEST(ModelRegistry, FixturesOfUnsupportedFamiliesAreRefusedClearly) {
  CpuBackend be;
  size_t moe = 0;
  for (const auto& name : testing::all_fixture_names()) {
    const bool qwen_moe = name.rfind("qwen3_moe_", 0) == 0 || name.rfind("qwen2_moe_", 0) == 0 ||
                          name.rfind("qwen3_next", 0) == 0 || name.rfind("qwen3_5_", 0) == 0;
    if (testing::fixture_supported(name)) {
      moe += qwen_moe;
      continue;
    }
    EXPECT_FALSE(qwen_moe && name.find("fp8") == std::string::npos) << name << " is a MoE family tessera runs";
    try {
      ModelConfig cfg = load_model_config(fixtures_dir() + "/" + name);
      create_model(cfg, ModelOptions{}, be);
      ADD_FAILURE() << name << ": expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("not supported"), std::string::npos) << name << ": " << e.what();
    }
  }
  EXPECT_GE(moe, 9u) << "the Qwen2-MoE, Qwen3-MoE, Qwen3-Next and Qwen3.5 fixtures";
}

TEST(ModelRegistry, UnknownArchitectureListsSupportedOnes) {
  CpuBackend be;
  ModelConfig cfg = load_model_config(fixtures_dir() + "/llama_gqa2");
  cfg.architecture = "GPT2LMHeadModel";
  try {
    create_model(cfg, ModelOptions{}, be);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Qwen3ForCausalLM"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
