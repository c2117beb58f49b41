// Localises where the CUDA backend departs from the CPU on the fixture models (issues 16, 17).
//
// ModelCheck runs each fixture's reference prompts through prefill and a teacher-forced
// greedy decode (the reference's tokens fed back, so every step sees transformers' context)
// on a CheckingBackend over CUDA: every op also runs on the CPU backend on host copies of the
// same inputs, and the ops whose outputs differ beyond a bf16 tolerance are printed as they
// happen ("[check] MISMATCH #n step .. op #.. <op> (layer ..) [<fixture> prompt .. prefill|decode
// step ..]: <output> rel err .."). Per prompt it prints the end-to-end last-logits error and the
// decode steps whose argmax differs from the reference; per fixture a summary of every op
// (calls, mismatches, worst relative error and where). No mismatch but a large end-to-end
// error means bf16 rounding accumulating (no single op is wrong); a mismatch names the op.
//
// EngineCheck runs HybridEngineTest's case (every prompt together, 32-token step budget) three
// ways: through the checking backend (eager), on plain CUDA eagerly, and on plain CUDA with
// decode graphs, and prints where each one's tokens leave the reference; a failure only with
// graphs points at graph capture/replay rather than at a kernel.
//
// Without a CUDA device the CUDA tests skip; ModelCheckSelfTest runs everywhere (CPU against
// CPU with a fault injected into one layer's op) and shows the tool finds it.
//
// Environment (optional): TESSERA_CHECK_FIXTURES=a,b (fixtures; default the four of the
// issues), TESSERA_CHECK_PROMPTS=1,3 (case indices), TESSERA_CHECK_TOL=0.03 (relative
// tolerance), TESSERA_CHECK_PRINT=20 (mismatches printed per fixture),
// TESSERA_TEST_FIXTURES=<dir> (fixtures folder, as the other fixture tests).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <sstream>

#include "backend/checking_backend.h"
#ifdef TESSERA_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "backend/cpu/cpu_backend.h"
#include "backend/forwarding_backend.h"
#include "bf16_emulation.h"
#include "core/dtype.h"
#include "engine/engine.h"
#include "engine/model_loader.h"
#include "fixture_util.h"
#include "loader/checkpoint.h"
#include "model/registry.h"

namespace tessera {
namespace {

using testing::argmax;
using testing::Bf16ActivationsBackend;
using testing::RoutingRecorder;
using testing::RoutingReplay;
using testing::to_host;
using testing::top2_gap;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::vector<std::string> check_fixtures() {
  const char* e = std::getenv("TESSERA_CHECK_FIXTURES");
  if (e && *e) return split(e);
  return {"qwen3_next_tiny", "qwen3_5_moe_text_tiny", "qwen2_moe_shared", "qwen3_moe_e8_k2_norm"};
}

bool case_selected(size_t i) {
  const char* e = std::getenv("TESSERA_CHECK_PROMPTS");
  if (!e || !*e) return true;
  for (const auto& s : split(e))
    if (std::stoul(s) == i) return true;
  return false;
}

CheckOptions check_options() {
  CheckOptions o;
  if (const char* e = std::getenv("TESSERA_CHECK_TOL")) o.rel_tol = std::stod(e);
  if (const char* e = std::getenv("TESSERA_CHECK_PRINT")) o.max_printed = std::stoi(e);
  o.log = stdout;
  return o;
}

bool have_cuda() { return cuda_backend_available(); }

std::unique_ptr<Backend> make_cuda() {
  BackendOptions o;
  o.type = DeviceType::kCUDA;
  return make_backend(o);
}

constexpr int kBlocks = 24;  // 384 tokens: the longest prompt (300) and its 20 greedy tokens

struct Loaded {
  std::unique_ptr<Model> model;
  KvCache cache;
};

Loaded load(const std::string& name, Backend& be) {
  Loaded l;
  ModelConfig cfg = load_model_config(testing::fixtures_dir() + "/" + name);
  l.model = create_model(cfg, ModelOptions{}, be);
  Checkpoint ckpt(cfg.model_dir);
  l.model->weights().load(ckpt, be);
  l.cache = testing::alloc_test_cache(be, l.model->cache_specs(), kBlocks, be.compute_dtype(), 4);
  return l;
}

// What one prompt did end to end (printed; the op mismatches are the checking backend's).
struct CaseResult {
  float last_logits_err = 0;
  int first_wrong_step = -1;  // first decode step whose argmax is not the reference's token
  // The fixture test's bounds on CUDA: logits within max(0.15, 2 x transformers' bf16 error),
  // argmax different only where the reference's margin is within max(0.05, that error).
  bool within_bounds = true;
  float max_shadow_diff = 0;  // largest max |logits - the CPU shadow's| over the steps
};

// The same steps on the CPU backend (f32) in lockstep with the checked run: per step, how far
// the logits are from the CPU's, beside the smallest router top-k gap of the step.
struct Shadow {
  Backend* be;
  Loaded* l;
};

// One reference case: the prompt prefilled in steps of `chunk` tokens (0: one step), then
// one decode step per reference greedy token, each feeding the reference's token.
CaseResult run_case(const std::string& name, size_t index, const nlohmann::json& c, Backend& be, CheckingBackend* check,
                    Loaded& l, int chunk, const std::string& tag = "[case]", Shadow* shadow = nullptr) {
  std::string diffs, gaps;
  float shadow_diff = 0;
  // One forward on `be` (and on the shadow); the step's smallest router gap is folded into *gap.
  auto forward = [&](const ModelInput& in, CheckingBackend::TopkGap* gap) {
    be.reset_scratch();
    Tensor lg = l.model->forward(in, l.cache);
    if (check) {
      const CheckingBackend::TopkGap g = check->take_min_topk_gap();
      if (g.gap >= 0 && (gap->gap < 0 || g.gap < gap->gap)) *gap = g;
    }
    std::vector<float> got = to_host(be, lg);
    if (shadow) {
      shadow->be->reset_scratch();
      const std::vector<float> ref = to_host(*shadow->be, shadow->l->model->forward(in, shadow->l->cache));
      float d = 0;
      for (size_t i = 0; i < got.size() && i < ref.size(); ++i) d = std::max(d, std::fabs(got[i] - ref[i]));
      shadow_diff = d;
    }
    return got;
  };
  auto note_step = [&](const CheckingBackend::TopkGap& gap) {
    char buf[64];
    if (shadow) {
      std::snprintf(buf, sizeof buf, " %.2g", shadow_diff);
      diffs += buf;
    }
    if (gap.gap >= 0) {
      std::snprintf(buf, sizeof buf, " %.2g@L%d", gap.gap, gap.layer);
      gaps += buf;
    }
  };
  std::vector<int32_t> tokens = c["prompt_ids"].get<std::vector<int32_t>>();
  const int len = static_cast<int>(tokens.size());
  const int step = chunk > 0 ? chunk : len;
  const std::string label = name + " prompt " + std::to_string(index) + " (len " + std::to_string(len) + ")";
  std::vector<float> got;
  CheckingBackend::TopkGap prefill_gap;
  for (int start = 0; start < len; start += step) {
    const int n = std::min(step, len - start);
    if (check)
      check->set_context(label + " prefill tokens [" + std::to_string(start) + ", " + std::to_string(start + n) + ")");
    got = forward(testing::step_of({testing::SeqPart{&tokens, start, n, 0, kBlocks, 0}}), &prefill_gap);
  }
  note_step(prefill_gap);
  CaseResult r;
  r.max_shadow_diff = shadow_diff;
  const auto want = c["last_logits"].get<std::vector<float>>();
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    r.last_logits_err = std::max(r.last_logits_err, std::fabs(got[i] - want[i]));
  const double bf16 = c.value("bf16_last_logits_err", 0.0);
  const auto greedy = c["greedy"].get<std::vector<int32_t>>();
  const auto margins = c["margins"].get<std::vector<double>>();
  const double tol = std::max(0.15, 2 * bf16), close = std::max(0.05, 2 * bf16);
  r.within_bounds = r.last_logits_err < tol;
  std::printf("%s %s: last-logits max err %.4g (transformers' own bf16 err %.4g; the fixture test allows %.4g)\n",
              tag.c_str(), label.c_str(), r.last_logits_err, bf16, tol);
  std::string wrong;
  int next = argmax(got);
  float gap = top2_gap(got);
  for (size_t s = 0; s < greedy.size(); ++s) {
    if (next != greedy[s]) {
      if (r.first_wrong_step < 0) r.first_wrong_step = static_cast<int>(s);
      if (margins[s] > close) r.within_bounds = false;
      char buf[160];
      std::snprintf(buf, sizeof buf, " step %zu: argmax %d, reference %d (reference margin %.3g, our top-2 gap %.3g);",
                    s, next, greedy[s], margins[s], gap);
      if (wrong.size() < 600) wrong += buf;
    }
    if (s + 1 == greedy.size()) break;
    tokens.push_back(greedy[s]);  // teacher forcing: the reference's token, whatever we chose
    const int pos = static_cast<int>(tokens.size()) - 1;
    if (check)
      check->set_context(label + " decode step " + std::to_string(s + 1) + " (position " + std::to_string(pos) + ")");
    CheckingBackend::TopkGap router_gap;
    const std::vector<float> lg =
        forward(testing::step_of({testing::SeqPart{&tokens, pos, 1, 0, kBlocks, 0}}), &router_gap);
    note_step(router_gap);
    r.max_shadow_diff = std::max(r.max_shadow_diff, shadow_diff);
    next = argmax(lg);
    gap = top2_gap(lg);
  }
  if (shadow)
    std::printf("%s %s: per step (prefill, then decode 1, 2, ..): logits max |this - CPU f32|%s\n", tag.c_str(),
                label.c_str(), diffs.c_str());
  if (!gaps.empty())
    std::printf("%s %s: per step: smallest router top-k logit gap @ layer%s\n", tag.c_str(), label.c_str(),
                gaps.c_str());
  if (!wrong.empty()) wrong.pop_back();  // the last ';'
  std::printf("%s %s: greedy (teacher-forced) %s; %s\n", tag.c_str(), label.c_str(),
              wrong.empty() ? "matches the reference at every step" : ("differs at" + wrong).c_str(),
              r.within_bounds ? "within the fixture test's bounds" : "OUTSIDE the fixture test's bounds");
  return r;
}

// ---------------------------------------------------------------- the CUDA checks

std::pair<float, double> routing_replay_case(const std::string& name, size_t index, const nlohmann::json& c,
                                             Backend& primary, const std::string& tag);

class ModelCheck : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_cuda()) GTEST_SKIP() << "no CUDA device on this machine";
  }
  // Every selected case of the fixture through the checking backend; prefill in `chunk` steps.
  void check_fixture(int chunk) {
    const std::string name = GetParam();
    const auto ref = testing::load_reference(name);
    auto cuda = make_cuda();
    CpuBackend cpu;
    CheckingBackend check(*cuda, cpu, check_options());
    Loaded l = load(name, check);
    CpuBackend shadow_be;
    Loaded shadow_l = load(name, shadow_be);
    Shadow shadow{&shadow_be, &shadow_l};
    std::printf("[check] %s: CUDA checked against the CPU op by op, prefill %s\n", name.c_str(),
                chunk > 0 ? ("in steps of " + std::to_string(chunk) + " tokens").c_str() : "in one step");
    for (size_t i = 0; i < ref["cases"].size(); ++i)
      if (case_selected(i))
        EXPECT_TRUE(run_case(name, i, ref["cases"][i], check, &check, l, chunk, "[case]", &shadow).within_bounds)
            << name << " prompt " << i << " through the checking backend (eager, synchronised after every op)";
    check.print_summary();
    EXPECT_TRUE(check.mismatches().empty())
        << name << ": the first op where CUDA departs from the CPU: " << check.mismatches().front().str();
  }
};

TEST_P(ModelCheck, EveryOpMatchesTheCpuInPrefillAndDecode) { check_fixture(0); }

TEST_P(ModelCheck, EveryOpMatchesTheCpuInPrefillChunksOf32) {
  if (!testing::fixture_is_hybrid(GetParam())) GTEST_SKIP() << "no state carried between chunks";
  check_fixture(32);
}

// One way to run the CUDA backend with a kernel path off: a CudaOptions field (the label names
// which; TESSERA_CUDA_OPTIONS sets the same names for a whole process).
struct KernelPathOff {
  const char* label;
#ifdef TESSERA_HAVE_CUDA
  void (*set)(CudaOptions&);  // nullptr: the defaults
#endif
};

std::unique_ptr<Backend> make_cuda_with(const KernelPathOff& off) {
#ifdef TESSERA_HAVE_CUDA
  if (!off.set) return make_cuda_backend(0);
  CudaOptions options;
  off.set(options);
  return make_cuda_backend(0, options);
#else
  (void)off;
  return make_cuda();
#endif
}

// The same prompts on plain CUDA (no checking, no synchronisation between ops), once with the
// defaults and once with each kernel path of the CUDA backend off: the variant whose line
// matches the reference where the default does not names the kernel path at fault.
// (Programmatic dependent launch is a process-wide setting: run the binary again with
// TESSERA_CUDA_OPTIONS=pdl=0 for it.)
TEST_P(ModelCheck, PlainCudaWithEachKernelPathSwitchedOff) {
  const std::string name = GetParam();
  const auto ref = testing::load_reference(name);
#ifdef TESSERA_HAVE_CUDA
  const std::vector<KernelPathOff> variants = {
      {"defaults", nullptr},
      {"moe_gemv=0", [](CudaOptions& o) { o.moe_gemv = false; }},
      {"moe_decode=split", [](CudaOptions& o) { o.moe_decode = CudaMoeDecode::kSplit; }},
      {"chunked_gated_delta=false", [](CudaOptions& o) { o.chunked_gated_delta = false; }},
      {"fused_decode_attention=false", [](CudaOptions& o) { o.fused_decode_attention = false; }},
  };
#else
  const std::vector<KernelPathOff> variants = {{"defaults"}};
#endif
  for (const KernelPathOff& v : variants) {
    auto cuda = make_cuda_with(v);
    Loaded l = load(name, *cuda);
    const bool defaults = &v == &variants.front();
    for (size_t i = 0; i < ref["cases"].size(); ++i) {
      if (!case_selected(i)) continue;
      const CaseResult r =
          run_case(name, i, ref["cases"][i], *cuda, nullptr, l, 0, std::string("[plain ") + v.label + "]");
      if (defaults) EXPECT_TRUE(r.within_bounds) << name << " prompt " << i << " on plain CUDA";
    }
  }
}

// CUDA against the CPU in f32 with CUDA's routing imposed on the CPU run (routing_replay_case
// below; `[replay]` lines): what is left once near-tied expert choices are taken out. Compare
// with the `[replay-bf16-cpu]` lines (bf16 activations on the CPU, no CUDA kernel): CUDA far
// beyond them points at a kernel, CUDA near them at bf16.
TEST_P(ModelCheck, PlainCudaAgainstTheCpuGivenTheSameRouting) {
  const std::string name = GetParam();
  const auto ref = testing::load_reference(name);
  for (size_t i = 0; i < ref["cases"].size(); ++i) {
    if (!case_selected(i)) continue;
    auto cuda = make_cuda();
    const auto [worst, bound] = routing_replay_case(name, i, ref["cases"][i], *cuda, "[replay]");
    // bf16 on the CPU stays under 1 on every issue case (worst: qwen3_next_tiny's 300-token
    // prompt, 0.61 at one decode step); a kernel bug of the size of the issues' errors shows.
    EXPECT_LT(worst, std::max(1.0, 4 * bound)) << name << " prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelCheck, ::testing::ValuesIn(check_fixtures()),
                         [](const auto& info) { return info.param; });

// HybridEngineTest.ChunkedPrefillOf32TokensGivesTheReferenceTokens (every prompt together, a
// 32-token step budget) on `be`: prints where each request's tokens leave the reference and
// returns how many leave it at a step the reference does not call close (0.05).
int run_engine(const std::string& fixture, Backend& be, bool eager, const std::string& how) {
  const auto ref = testing::load_reference(fixture);
  LoadOptions lo;
  lo.model_dir = testing::fixtures_dir() + "/" + fixture;
  EngineConfig ec;
  ec.num_blocks_override = 128;
  ec.scheduler.max_num_seqs = 8;
  ec.scheduler.max_num_batched_tokens = 32;
  ec.scheduler.max_model_len = 512;
  ec.enforce_eager = eager;
  LLMEngine engine(load_model(lo, be), be, ec);
  std::map<std::string, std::vector<int32_t>> want, got;
  std::map<std::string, std::vector<double>> margins;
  int i = 0;
  for (const auto& c : ref["cases"]) {
    const std::string id = std::to_string(i++);
    want[id] = c["greedy"].get<std::vector<int32_t>>();
    margins[id] = c["margins"].get<std::vector<double>>();
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = static_cast<int>(want[id].size());
    p.ignore_eos = true;
    EXPECT_TRUE(engine.add_request(id, c["prompt_ids"].get<std::vector<int32_t>>(), p).ok());
  }
  int steps = 0;
  while (engine.has_unfinished()) {
    ++steps;
    for (const auto& o : engine.step())
      got[o.request_id].insert(got[o.request_id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
  }
  int bad = 0;
  for (const auto& [id, w] : want) {
    const auto& g = got[id];
    std::string verdict = "matches the reference";
    for (size_t k = 0; k < w.size() && k < g.size(); ++k) {
      if (g[k] == w[k]) continue;
      const bool close = margins[id][k] <= 0.05;
      bad += !close;
      verdict = "leaves the reference at token " + std::to_string(k) + " (" + std::to_string(g[k]) + " vs " +
                std::to_string(w[k]) + ", reference margin " + std::to_string(margins[id][k]) +
                (close ? ", a close call)" : ", NOT a close call)");
      break;
    }
    std::printf("[engine] %s %s request %s (prompt len %zu): %s\n", fixture.c_str(), how.c_str(), id.c_str(),
                ref["cases"][std::stoul(id)]["prompt_ids"].size(), verdict.c_str());
  }
  std::printf("[engine] %s %s: %d steps, %d requests off the reference\n", fixture.c_str(), how.c_str(), steps, bad);
  return bad;
}

// That case run three ways.
class EngineCheck : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_cuda()) GTEST_SKIP() << "no CUDA device on this machine";
    if (!testing::fixture_is_hybrid(GetParam())) GTEST_SKIP() << "not a hybrid fixture";
  }
  int run(Backend& be, bool eager, const std::string& how) { return run_engine(GetParam(), be, eager, how); }
};

TEST_P(EngineCheck, ChunkedPrefillOf32TokensCheckedOpByOp) {
  auto cuda = make_cuda();
  CpuBackend cpu;
  CheckingBackend check(*cuda, cpu, check_options());
  check.set_context(GetParam() + " engine, 32-token steps");
  const int bad = run(check, true, "checking backend (eager)");
  check.print_summary();
  EXPECT_TRUE(check.mismatches().empty()) << check.mismatches().front().str();
  EXPECT_EQ(bad, 0);
}

TEST_P(EngineCheck, ChunkedPrefillOf32TokensEagerAndWithGraphs) {
  auto cuda = make_cuda();
  const int eager = run(*cuda, true, "plain CUDA eager");
  cuda->reset_scratch();
  auto cuda2 = make_cuda();
  const int graphs = run(*cuda2, false, "plain CUDA with decode graphs");
  EXPECT_EQ(eager, 0) << "eager CUDA leaves the reference: see ChunkedPrefillOf32TokensCheckedOpByOp for the op";
  EXPECT_EQ(graphs, 0) << (eager == 0 ? "only with graphs: the graph capture/replay of the decode step"
                                      : "with graphs as eagerly");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineCheck, ::testing::ValuesIn(check_fixtures()),
                         [](const auto& info) { return info.param; });

// ---------------------------------------------------------------- kernel or bf16? (on the CPU)
// Two CPU experiments that tell a CUDA kernel bug from what bf16 activations do to these tiny
// random MoE models, whose routers have near ties (top-k logit gaps of 0.01): no GPU needed.

// The f32 CPU run with one router decision changed: in the `flip_call`-th moe_topk call (the
// MoE block of that rank in the step), the token whose k-th and (k+1)-th largest logits are
// closest takes the (k+1)-th expert instead of the k-th (weights recomputed as the op does).
class RouterFlipBackend final : public ForwardingBackend {
 public:
  RouterFlipBackend(Backend& inner, int flip_call) : ForwardingBackend(inner), flip_call_(flip_call) {}
  int flipped_token = -1;
  double flipped_gap = 0;
  void moe_topk(const Tensor& logits, int k, bool renormalize, const Tensor& ids, const Tensor& w) override {
    inner().moe_topk(logits, k, renormalize, ids, w);
    if (calls_++ != flip_call_) return;
    const int64_t T = logits.dim(0), E = logits.dim(1);
    if (k >= E) return;
    int next = -1;
    for (int64_t t = 0; t < T; ++t) {
      const float* r = logits.data<float>() + t * E;
      std::vector<int> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return r[a] > r[b]; });
      const double gap = static_cast<double>(r[order[k - 1]]) - r[order[k]];
      if (flipped_token < 0 || gap < flipped_gap) {
        flipped_gap = gap;
        flipped_token = static_cast<int>(t);
        next = order[k];
      }
    }
    const float* r = logits.data<float>() + static_cast<int64_t>(flipped_token) * E;
    const float mx = *std::max_element(r, r + E);
    double sum = 0, picked = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(r[e] - mx);
    int32_t* id = ids.data<int32_t>() + static_cast<int64_t>(flipped_token) * k;
    float* wt = w.data<float>() + static_cast<int64_t>(flipped_token) * k;
    id[k - 1] = next;
    for (int j = 0; j < k; ++j) picked += wt[j] = static_cast<float>(std::exp(r[id[j]] - mx) / sum);
    if (renormalize)
      for (int j = 0; j < k; ++j) wt[j] = static_cast<float>(wt[j] / picked);
  }

 private:
  int flip_call_, calls_ = 0;
};

// The prompts the experiments run: the issues' cases (qwen3_next_tiny's 300-token prompt,
// the 7-token prompts of qwen3_5_moe_text_tiny and qwen2_moe_shared, qwen3_moe_e8_k2_norm's
// 33-token prompt), or every selected prompt of the selected fixtures when
// TESSERA_CHECK_FIXTURES or TESSERA_CHECK_PROMPTS is set.
std::vector<std::pair<std::string, size_t>> experiment_cases() {
  std::vector<std::pair<std::string, size_t>> cases;
  if (!std::getenv("TESSERA_CHECK_FIXTURES") && !std::getenv("TESSERA_CHECK_PROMPTS"))
    return {{"qwen3_next_tiny", 3}, {"qwen3_5_moe_text_tiny", 1}, {"qwen2_moe_shared", 1}, {"qwen3_moe_e8_k2_norm", 2}};
  for (const std::string& name : check_fixtures()) {
    const size_t n = testing::load_reference(name)["cases"].size();
    for (size_t i = 0; i < n; ++i)
      if (case_selected(i)) cases.emplace_back(name, i);
  }
  return cases;
}

// Each prompt of the fixtures with bf16 activations on the CPU: a prompt that leaves the fixture
// test's bounds here as on CUDA does so without any CUDA kernel (`[bf16-cpu]` lines).
TEST(KernelOrBf16, ActivationsRoundedToBf16OnTheCpu) {
  for (const auto& [name, i] : experiment_cases()) {
    const auto ref = testing::load_reference(name);
    CpuBackend cpu;
    Bf16ActivationsBackend be(cpu);
    Loaded l = load(name, be);
    const CaseResult r = run_case(name, i, ref["cases"][i], be, nullptr, l, 0, "[bf16-cpu]");
    EXPECT_GT(r.last_logits_err, 0.0f) << name << " prompt " << i << ": the rounding must change something";
  }
}

// Each prompt's prefill in f32 on the CPU with the nearest router tie of one MoE block flipped
// (`[flip]` lines): a last-logits error equal to CUDA's is one near-tied expert choice that bf16
// rounding upstream flipped, not a wrong kernel.
TEST(KernelOrBf16, OneNearTiedRouterChoiceFlippedOnTheCpu) {
  for (const auto& [name, i] : experiment_cases()) {
    const auto ref = testing::load_reference(name);
    const ModelConfig cfg = load_model_config(testing::fixtures_dir() + "/" + name);
    if (cfg.moe.num_experts == 0) continue;
    {
      const auto& c = ref["cases"][i];
      std::vector<int32_t> tokens = c["prompt_ids"].get<std::vector<int32_t>>();
      const int len = static_cast<int>(tokens.size());
      const auto want = c["last_logits"].get<std::vector<float>>();
      std::string line;
      float largest = 0;
      for (int call = 0; call < cfg.num_layers; ++call) {
        CpuBackend cpu;
        RouterFlipBackend be(cpu, call);
        Loaded l = load(name, be);
        be.reset_scratch();
        const std::vector<float> got = to_host(
            be, l.model->forward(testing::step_of({testing::SeqPart{&tokens, 0, len, 0, kBlocks, 0}}), l.cache));
        if (be.flipped_token < 0) break;  // fewer MoE blocks than layers
        float err = 0;
        for (size_t v = 0; v < got.size() && v < want.size(); ++v) err = std::max(err, std::fabs(got[v] - want[v]));
        char buf[160];
        std::snprintf(buf, sizeof buf, " MoE block %d (token %d, logit gap %.3g): %.3g;", call, be.flipped_token,
                      be.flipped_gap, err);
        line += buf;
        largest = std::max(largest, err);
      }
      // A flip in the last MoE block changes only its token's row; earlier ones reach the logits.
      EXPECT_GT(largest, 1e-3f) << name << " prompt " << i << ": no flip changed the last logits";
      if (!line.empty()) line.pop_back();
      std::printf("[flip] %s prompt %zu (len %d): last-logits error with the nearest router tie flipped in%s\n",
                  name.c_str(), i, len, line.c_str());
    }
  }
}

// Routing replay: the primary's top-k choices recorded (RoutingRecorder) and imposed on an f32
// CPU run of the same steps (RoutingReplay: the recorded experts, weighted by the CPU's own
// probabilities for them). With the routing equal, what is left between the two runs is the
// kernels' arithmetic, so a bf16 backend must come within the fixture test's logit bound of the
// CPU at every step however many near ties it flipped. (The classes: bf16_emulation.h, shared with
// model_fixture_test's bf16 rule.)

// One case through `primary` (recording its routing) and the CPU in f32 (replaying it), step by
// step: the prefill, then the reference's tokens teacher-forced. Prints `tag` lines; returns the
// largest max |logits difference| over the steps and the fixture test's logit bound for it.
std::pair<float, double> routing_replay_case(const std::string& name, size_t index, const nlohmann::json& c,
                                             Backend& primary, const std::string& tag) {
  RoutingRecorder rec(primary);
  CpuBackend cpu;
  RoutingReplay rep(cpu, rec.routes);
  Loaded lp = load(name, rec), lc = load(name, rep);
  std::vector<int32_t> tokens = c["prompt_ids"].get<std::vector<int32_t>>();
  const int len = static_cast<int>(tokens.size());
  const auto greedy = c["greedy"].get<std::vector<int32_t>>();
  float worst = 0;
  std::string diffs;
  for (size_t s = 0; s <= greedy.size(); ++s) {
    const int start = s == 0 ? 0 : static_cast<int>(tokens.size()) - 1, n = s == 0 ? len : 1;
    const ModelInput in = testing::step_of({testing::SeqPart{&tokens, start, n, 0, kBlocks, 0}});
    rec.reset_scratch();
    const std::vector<float> a = to_host(rec, lp.model->forward(in, lp.cache));
    rep.reset_scratch();
    const std::vector<float> b = to_host(rep, lc.model->forward(in, lc.cache));
    float d = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    worst = std::max(worst, d);
    char buf[32];
    std::snprintf(buf, sizeof buf, " %.2g", d);
    diffs += buf;
    if (s == greedy.size() || s + 1 == greedy.size()) break;
    tokens.push_back(greedy[s]);
  }
  const double bound = std::max(0.15, 2 * c.value("bf16_last_logits_err", 0.0));
  std::printf(
      "%s %s prompt %zu (len %d): with the same routing as the CPU run (%d token rows re-routed to the "
      "primary's choice), logits max |primary - CPU f32| per step:%s; worst %.3g, bound %.3g\n",
      tag.c_str(), name.c_str(), index, len, rep.differing_rows, diffs.c_str(), worst, bound);
  return {worst, bound};
}

// The same with bf16 activations on the CPU (Bf16ActivationsBackend) as the primary: how close
// bf16 comes to f32 once the routing is equal, with no CUDA kernel involved (`[replay-bf16-cpu]`
// lines; compare with CUDA's `[replay]` lines).
TEST(KernelOrBf16, Bf16ActivationsWithTheSameRoutingOnTheCpu) {
  for (const auto& [name, i] : experiment_cases()) {
    const auto ref = testing::load_reference(name);
    CpuBackend cpu;
    Bf16ActivationsBackend bf16(cpu);
    const auto [worst, bound] = routing_replay_case(name, i, ref["cases"][i], bf16, "[replay-bf16-cpu]");
    EXPECT_GT(worst, 0.0f) << name << " prompt " << i << ": the rounding must change something";
  }
}

// ---------------------------------------------------------------- the tool itself, on the CPU

// Adds 0.5 to one element of the output of the n-th gated_delta_rule call (a wrong recurrent
// state would look like this) or of the n-th moe_experts call.
class FaultyBackend final : public ForwardingBackend {
 public:
  FaultyBackend(Backend& inner, std::string op, int call) : ForwardingBackend(inner), op_(std::move(op)), call_(call) {}
  void gated_delta_rule(const Tensor& qkv, const Tensor& ba, int64_t ba_col, const Tensor& A_log, const Tensor& dt_bias,
                        const Tensor& state, const LinearAttnMetadata& meta, const Tensor& out) override {
    inner().gated_delta_rule(qkv, ba, ba_col, A_log, dt_bias, state, meta, out);
    poke("gated_delta_rule", out);
  }
  void moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& ids, const Tensor& w,
                   int expert_begin, const Tensor& out) override {
    inner().moe_experts(x, gate_up, down, ids, w, expert_begin, out);
    poke("moe_experts", out);
  }

 private:
  void poke(const char* op, const Tensor& out) {
    if (op_ == op && calls_++ == call_) out.data<float>()[out.numel() - 3] += 0.5f;
  }
  std::string op_;
  int call_, calls_ = 0;
};

struct SelfTestCase {
  std::string fixture, op;
  int call;            // which call of op is faulty
  int expected_layer;  // the decoder layer of that call
};

class ModelCheckSelfTest : public ::testing::TestWithParam<SelfTestCase> {};

// CPU against CPU on a real fixture (every op wrapper on real shapes and metadata): without a
// fault nothing is recorded; with one, exactly that op is, in its layer, at its last token.
TEST_P(ModelCheckSelfTest, FindsTheFaultyOpInItsLayer) {
  const SelfTestCase& p = GetParam();
  const auto ref = testing::load_reference(p.fixture);
  const auto& c = ref["cases"][1];  // 7 tokens
  CheckOptions o;
  o.log = nullptr;
  {
    CpuBackend primary, cpu, shadow_be;
    CheckingBackend check(primary, cpu, o);
    Loaded l = load(p.fixture, check), shadow_l = load(p.fixture, shadow_be);
    Shadow shadow{&shadow_be, &shadow_l};
    const CaseResult r = run_case(p.fixture, 1, c, check, &check, l, 0, "[selftest]", &shadow);
    EXPECT_TRUE(check.mismatches().empty()) << check.mismatches().front().str();
    EXPECT_GT(check.ops_checked(), 100);
    EXPECT_EQ(r.max_shadow_diff, 0.0f) << "the CPU against its CPU shadow";
  }
  CpuBackend primary, cpu, shadow_be;
  FaultyBackend faulty(primary, p.op, p.call);
  CheckingBackend check(faulty, cpu, o);
  Loaded l = load(p.fixture, check), shadow_l = load(p.fixture, shadow_be);
  Shadow shadow{&shadow_be, &shadow_l};
  const CaseResult r = run_case(p.fixture, 1, c, check, &check, l, 0, "[selftest]", &shadow);
  EXPECT_GT(r.max_shadow_diff, 0.0f) << "the fault moves the logits away from the shadow's";
  ASSERT_EQ(check.mismatches().size(), 1u) << check.summary();
  const OpMismatch& m = check.mismatches()[0];
  EXPECT_EQ(m.op, p.op);
  EXPECT_EQ(m.output, "out");
  EXPECT_EQ(m.layer, p.expected_layer);
  EXPECT_EQ(m.step, 1);  // the prefill (the first reset_scratch of the run)
  EXPECT_NE(m.context.find("prefill tokens [0, 7)"), std::string::npos) << m.context;
  EXPECT_EQ(m.worst_at.rfind("[6, ", 0), 0u) << m.worst_at;  // the last token's row
  EXPECT_NEAR(m.max_abs, 0.5, 1e-4);
  EXPECT_GT(r.last_logits_err, 0.0f) << "the fault reaches the logits";
}

// The engine's chunked hybrid case through the checking backend on the CPU: state slots,
// prefix-free chunking and decode batches record nothing (no false alarms for the GPU run).
TEST(ModelCheckSelfTest, EngineCaseRecordsNothingOnTheCpu) {
  CpuBackend primary, cpu;
  CheckOptions o;
  o.log = nullptr;
  CheckingBackend check(primary, cpu, o);
  EXPECT_EQ(run_engine("qwen3_next_tiny", check, true, "checking backend on the CPU"), 0);
  EXPECT_TRUE(check.mismatches().empty()) << check.mismatches().front().str();
  EXPECT_GT(check.ops_checked(), 1000);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelCheckSelfTest,
                         ::testing::Values(SelfTestCase{"qwen3_next_tiny", "gated_delta_rule", 1, 1},
                                           SelfTestCase{"qwen2_moe_shared", "moe_experts", 1, 1}),
                         [](const auto& info) { return info.param.fixture; });

}  // namespace
}  // namespace tessera
