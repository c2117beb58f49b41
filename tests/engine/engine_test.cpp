// The engine on the fixture models: batching, prefix caching, preemption and seeds
// must never change what a request generates.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <utility>

#include "backend/cpu/cpu_backend.h"
#include "backend/forwarding_backend.h"
#include "engine/engine.h"
#include "engine/kv_cache_coordinator.h"
#include "engine/memory_plan.h"
#include "engine/model_loader.h"
#include "engine/spec/mtp_proposer.h"
#include "fixture_util.h"

namespace tessera {
namespace {

// `num_blocks` below counts blocks of every paged layer. A model mixing full-attention and
// sliding-window layers has a KV cache group per kind, whose layers share the blocks' tensors (one
// layer a group in a block): the same memory holds this many of its blocks for each of those.
int blocks_in_the_memory_of_one(const std::vector<LayerCacheSpec>& specs) {
  const auto groups = engine_cache_groups(specs, 16, /*whole_model=*/true);
  const size_t one = cache_footprint(specs, DType::kF32, 16).kv_bytes_per_block;
  const size_t grouped = cache_footprint(specs, DType::kF32, 16, DType::kF32, DType::kF32,
                                         cache_layer_groups(groups, static_cast<int>(specs.size())))
                             .kv_bytes_per_block;
  return grouped > 0 ? static_cast<int>(one / grouped) : 1;
}

struct Harness {
  std::unique_ptr<Backend> owned = testing::make_test_backend();
  Backend& backend = *owned;
  std::unique_ptr<LLMEngine> engine;
  Executor* executor = nullptr;  // the engine's
  Harness(const std::string& fixture, int num_blocks, int max_num_seqs = 64, int budget = 512, bool prefix = true,
          SpeculativeConfig spec = {}, int max_model_len = 128, bool mtp_drafts_in_step = true) {
    LoadOptions lo;
    lo.model_dir = testing::fixtures_dir() + "/" + fixture;
    lo.mtp = spec.enabled() && spec.method == "mtp";
    EngineConfig ec;
    auto model = load_model(lo, backend);
    ec.num_blocks_override = num_blocks * blocks_in_the_memory_of_one(model->cache_specs());
    ec.scheduler.max_num_seqs = max_num_seqs;
    ec.scheduler.max_num_batched_tokens = budget;
    ec.scheduler.max_model_len = max_model_len;
    ec.enable_prefix_caching = prefix;
    ec.speculative = spec;
    ec.mtp_drafts_in_step = mtp_drafts_in_step;
    auto exec = std::make_unique<LocalExecutor>(std::move(model), backend);
    executor = exec.get();
    engine = std::make_unique<LLMEngine>(std::move(exec), ec);
  }
  // Top-2 logprob margin of each generated token (requests that asked for logprobs).
  std::map<std::string, std::vector<float>> margins;
  // Runs until done; returns the tokens of each request.
  std::map<std::string, std::vector<int32_t>> run_all(std::map<std::string, int>* cached = nullptr) {
    std::map<std::string, std::vector<int32_t>> out;
    while (engine->has_unfinished()) {
      for (const auto& o : engine->step()) {
        auto& v = out[o.request_id];
        v.insert(v.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        for (const auto& lp : o.logprobs)
          if (lp.top.size() >= 2) margins[o.request_id].push_back(lp.top[0].second - lp.top[1].second);
        if (cached) (*cached)[o.request_id] = o.num_cached_tokens;
      }
    }
    EXPECT_TRUE(engine->cache_manager().pool().all_free()) << "KV blocks leaked";
    return out;
  }
};

std::vector<int32_t> random_prompt(std::mt19937& g, int len) {
  std::uniform_int_distribution<int> d(3, 255);
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = d(g);
  return p;
}

// `margins`: on CUDA, the top-2 logprobs that expect_same_or_close_call reads (rows with
// logprobs are sampled on the host, so MTP drafting runs after such a step, not in it).
SamplingParams greedy(int max_tokens, bool margins = true) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  if (margins && testing::testing_on_cuda()) p.logprobs = 2;  // margins for same_or_close_call
  return p;
}

// CPU: identical tokens. CUDA (bf16): a different batch or recomputation changes rounding
// (GEMV below 5 rows, cuBLASLt above; prefill against decode), so two runs may part at a step
// that one of them called within testing::cuda_close_call(fixture) of the runner-up (0.05, or the
// fixture's bf16 spread where larger); up to there they must agree, and they must agree on most
// tokens overall. A run without margins (got_margins has no entry for a request) leaves the
// call to want's margin alone.
void expect_same_or_close_call(const std::map<std::string, std::vector<int32_t>>& want,
                               const std::map<std::string, std::vector<int32_t>>& got,
                               const std::map<std::string, std::vector<float>>& want_margins,
                               const std::map<std::string, std::vector<float>>& got_margins,
                               const std::string& fixture) {
  if (!testing::testing_on_cuda()) {
    EXPECT_EQ(want, got);
    return;
  }
  ASSERT_EQ(want.size(), got.size());
  const float close = testing::cuda_close_call(fixture);
  size_t compared = 0, total = 0;
  for (const auto& [id, w] : want) {
    const auto it = got.find(id);
    ASSERT_NE(it, got.end()) << id;
    const auto& g = it->second;
    ASSERT_EQ(w.size(), g.size()) << id;
    total += w.size();
    for (size_t i = 0; i < w.size(); ++i, ++compared) {
      if (w[i] == g[i]) continue;
      const auto& wm = want_margins.at(id);
      const auto gi = got_margins.find(id);
      const float got_m = gi != got_margins.end() && i < gi->second.size() ? gi->second[i] : 1e9f;
      const float m = std::min(i < wm.size() ? wm[i] : 1e9f, got_m);
      EXPECT_LE(m, close) << "request " << id << " step " << i << ": " << w[i] << " vs " << g[i];
      break;
    }
  }
  EXPECT_GE(compared * 2, total) << "diverged too early to be a useful comparison";
}

// Speculative decoding against plain greedy decoding, over every token. CPU: identical tokens.
// CUDA: where the speculative run `got` parts from the plain reference `want`, one of the two
// runs must have called that step within testing::cuda_two_run_bound(fixture) of its runner-up
// (both round, each within the fixture's bf16 spread of the exact logits). The plain reference is
// then run again, the same batch with each parted request's prompt extended by `got`'s tokens up
// to and including the parting (repetition penalty reads prompt and output alike, so that is the
// same request), and the comparison goes on from there: a parting at a near tie does not end the
// comparison of a request, so every token of every request is checked. `prompts[i]` and
// `params(i)` are request `std::to_string(i)`'s; each run prints its partings and the widest
// margin among them.
void expect_greedy_over_every_token(const std::string& fixture, const std::vector<std::vector<int32_t>>& prompts,
                                    const std::function<SamplingParams(size_t)>& params,
                                    const std::map<std::string, std::vector<int32_t>>& want,
                                    const std::map<std::string, std::vector<float>>& want_margins,
                                    const std::map<std::string, std::vector<int32_t>>& got,
                                    const std::map<std::string, std::vector<float>>& got_margins) {
  if (!testing::testing_on_cuda()) {
    EXPECT_EQ(want, got);
    return;
  }
  ASSERT_EQ(want.size(), got.size());
  ASSERT_EQ(want.size(), prompts.size());
  const float close = testing::cuda_two_run_bound(fixture);
  struct Track {
    size_t from = 0;  // ref holds the plain run's tokens from got's position `from`
    std::vector<int32_t> ref;
    std::vector<float> ref_margins;
  };
  std::map<std::string, Track> tracks;  // the requests still compared
  for (const auto& [id, w] : want) {
    ASSERT_TRUE(got.count(id)) << id;
    ASSERT_EQ(w.size(), got.at(id).size()) << id;
    tracks[id] = Track{0, w, want_margins.count(id) ? want_margins.at(id) : std::vector<float>{}};
  }
  int partings = 0;
  float widest = 0;  // the largest margin at which the runs parted
  for (int round = 0;; ++round) {
    std::map<std::string, size_t> extend;  // request -> got's tokens that extend its prompt
    for (const auto& [id, t] : tracks) {
      const auto& g = got.at(id);
      const auto gm = got_margins.find(id);
      size_t j = 0;
      while (t.from + j < g.size() && g[t.from + j] == t.ref[j]) ++j;
      if (t.from + j == g.size()) continue;
      const size_t at = t.from + j;
      const float want_m = j < t.ref_margins.size() ? t.ref_margins[j] : 1e9f;
      const float got_m = gm != got_margins.end() && at < gm->second.size() ? gm->second[at] : 1e9f;
      const float m = std::min(want_m, got_m);
      EXPECT_LE(m, close) << "request " << id << " step " << at << ": " << t.ref[j] << " vs " << g[at]
                          << " (plain reference from step " << t.from << ")";
      if (m > close) continue;
      ++partings;
      widest = std::max(widest, m);
      if (at + 1 < g.size()) extend[id] = at + 1;
    }
    if (extend.empty()) break;
    ASSERT_LT(round, 64) << "the comparison does not settle";
    Harness h(fixture, 64);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::string id = std::to_string(i);
      std::vector<int32_t> p = prompts[i];
      SamplingParams sp = params(i);
      if (const auto e = extend.find(id); e != extend.end()) {
        p.insert(p.end(), got.at(id).begin(), got.at(id).begin() + static_cast<std::ptrdiff_t>(e->second));
        sp.max_tokens -= static_cast<int>(e->second);
      }
      ASSERT_TRUE(h.engine->add_request(id, p, sp).ok());
    }
    auto r = h.run_all();
    std::map<std::string, Track> next;
    for (const auto& [id, n] : extend) {
      ASSERT_EQ(n + r[id].size(), got.at(id).size()) << id;
      next[id] = Track{n, r[id], h.margins[id]};
    }
    tracks = std::move(next);
  }
  ::testing::Test::RecordProperty("near_tie_partings", partings);
  if (partings > 0)
    std::printf("[ partings ] %d at near ties (widest margin %.3f, bound %.3f), each compared on from there\n",
                partings, widest, close);
}

class EngineFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineFixtureTest, BatchedEqualsOneAtATimeWithStaggeredArrivals) {
  std::mt19937 g(7);
  const std::vector<int> lengths = {1, 5, 17, 33, 40, 3, 64, 16};
  std::vector<std::vector<int32_t>> prompts;
  for (int n : lengths) prompts.push_back(random_prompt(g, n));

  std::map<std::string, std::vector<int32_t>> alone;
  std::map<std::string, std::vector<float>> alone_margins;
  {
    Harness h(GetParam(), 64);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(h.engine->add_request(std::to_string(i), prompts[i], greedy(12)).ok());
      auto r = h.run_all();
      alone[std::to_string(i)] = r[std::to_string(i)];
    }
    alone_margins = h.margins;
  }
  // Together, arriving every other step, with a small token budget so prefills are chunked.
  Harness h(GetParam(), 64, 64, 24);
  std::map<std::string, std::vector<int32_t>> together;
  size_t next = 0;
  int step = 0;
  while (next < prompts.size() || h.engine->has_unfinished()) {
    if (next < prompts.size() && step % 2 == 0) {
      ASSERT_TRUE(h.engine->add_request(std::to_string(next), prompts[next], greedy(12)).ok());
      ++next;
    }
    for (const auto& o : h.engine->step()) {
      together[o.request_id].insert(together[o.request_id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
      for (const auto& lp : o.logprobs)
        if (lp.top.size() >= 2) h.margins[o.request_id].push_back(lp.top[0].second - lp.top[1].second);
    }
    ++step;
  }
  EXPECT_TRUE(h.engine->cache_manager().pool().all_free());
  expect_same_or_close_call(alone, together, alone_margins, h.margins, GetParam());
}

TEST_P(EngineFixtureTest, PrefixCachingReusesBlocksAndKeepsOutput) {
  std::mt19937 g(11);
  std::vector<int32_t> shared = random_prompt(g, 48);
  std::vector<int32_t> a = shared, b = shared;
  auto ta = random_prompt(g, 5), tb = random_prompt(g, 9);
  a.insert(a.end(), ta.begin(), ta.end());
  b.insert(b.end(), tb.begin(), tb.end());

  Harness cold(GetParam(), 64, 64, 512, /*prefix=*/false);
  ASSERT_TRUE(cold.engine->add_request("b", b, greedy(10)).ok());
  auto want = cold.run_all();

  Harness h(GetParam(), 64);
  std::map<std::string, int> cached;
  ASSERT_TRUE(h.engine->add_request("a", a, greedy(10)).ok());
  h.run_all(&cached);
  EXPECT_EQ(cached["a"], 0);
  ASSERT_TRUE(h.engine->add_request("b", b, greedy(10)).ok());
  auto got = h.run_all(&cached);
  EXPECT_EQ(cached["b"], 48) << "three full shared blocks should come from the cache";
  expect_same_or_close_call({{"b", want["b"]}}, {{"b", got["b"]}}, cold.margins, h.margins, GetParam());
}

// The startup warm-up (EngineConfig::warm_up; the command line's engines run it where CUDA graphs
// are captured) runs a request through prefill and decode and leaves nothing behind: no request,
// no counted step or token, every block free; what a request generates afterwards is unchanged.
void expect_warm_up_leaves_nothing_behind(const std::string& fixture) {
  std::mt19937 g(29);
  const auto prompt = random_prompt(g, 21);
  Harness h(fixture, 64);
  const int steps = h.engine->warm_up();
  EXPECT_GT(steps, LLMEngine::kWarmUpDecode) << "a prefill and the decode steps";
  EXPECT_FALSE(h.engine->has_unfinished());
  EXPECT_EQ(h.engine->stats().steps, 0u);
  EXPECT_EQ(h.engine->stats().prompt_tokens, 0u);
  EXPECT_EQ(h.engine->stats().generation_tokens, 0u);
  EXPECT_TRUE(h.engine->cache_manager().pool().all_free());
  EXPECT_EQ(h.engine->cache_manager().state_slots().num_held(), 0);
  Harness plain(fixture, 64);
  ASSERT_TRUE(h.engine->add_request("a", prompt, greedy(12)).ok());
  ASSERT_TRUE(plain.engine->add_request("a", prompt, greedy(12)).ok());
  std::map<std::string, int> cached;
  const auto got = h.run_all(&cached), want = plain.run_all();
  EXPECT_EQ(cached["a"], 0);
  expect_same_or_close_call(want, got, plain.margins, h.margins, fixture);
  // No room for it (max_model_len shorter than the decode steps need): nothing runs.
  Harness tiny(fixture, 64, 64, 512, true, {}, /*max_model_len=*/LLMEngine::kWarmUpDecode + 1);
  EXPECT_EQ(tiny.engine->warm_up(), 0);
  EXPECT_FALSE(tiny.engine->has_unfinished());
}

TEST_P(EngineFixtureTest, WarmUpLeavesNothingBehind) { expect_warm_up_leaves_nothing_behind(GetParam()); }

// A sliding-window group frees the blocks before every future token's window, so a small pool that
// preempts a full-attention model's requests holds a model windowed on every layer without
// preempting. A model mixing both kinds keeps its full-attention layers' blocks: it may preempt.
enum class Windows { kNone, kSome, kAll };
Windows windows(const LLMEngine& e) {
  int paged = 0, windowed = 0;
  for (const CacheGroup& g : e.cache_manager().groups()) {
    paged += g.spec.paged() ? 1 : 0;
    windowed += g.spec.kind == CacheGroupKind::kSlidingWindow ? 1 : 0;
  }
  return windowed == 0 ? Windows::kNone : windowed == paged ? Windows::kAll : Windows::kSome;
}

void expect_preemption_or_window(const LLMEngine& e) {
  if (windows(e) == Windows::kAll)
    EXPECT_EQ(e.stats().num_preemptions, 0u) << "the window group frees out-of-window blocks: the small pool holds all";
  else if (windows(e) == Windows::kNone)
    EXPECT_GT(e.stats().num_preemptions, 0u) << "the pool was meant to force preemption";
}

TEST_P(EngineFixtureTest, PreemptionUnderMemoryPressureKeepsOutput) {
  std::mt19937 g(5);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(random_prompt(g, 20 + 7 * i));
  auto submit = [&](Harness& h) {
    for (size_t i = 0; i < prompts.size(); ++i)
      ASSERT_TRUE(h.engine->add_request(std::to_string(i), prompts[i], greedy(24)).ok());
  };
  Harness big(GetParam(), 128);
  submit(big);
  auto want = big.run_all();
  // 6 requests of up to 79 tokens need ~30 blocks at once; give them 12.
  Harness small(GetParam(), 12, 64, 512, /*prefix=*/false);
  submit(small);
  auto got = small.run_all();
  expect_preemption_or_window(*small.engine);
  // Preempted requests are recomputed in other batches: on CUDA a parting at a near tie is
  // followed up (the reference rerun from there), so every token is compared.
  expect_greedy_over_every_token(
      GetParam(), prompts, [](size_t) { return greedy(24); }, want, big.margins, got, small.margins);
}

TEST_P(EngineFixtureTest, SeededSamplingIsTheSameAloneAndInABatch) {
  std::mt19937 g(3);
  auto prompt = random_prompt(g, 12);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.top_k = 50;
  p.max_tokens = 16;
  p.ignore_eos = true;
  p.seed = 1234;
  Harness alone(GetParam(), 64);
  ASSERT_TRUE(alone.engine->add_request("x", prompt, p).ok());
  auto a = alone.run_all();

  Harness batch(GetParam(), 64);
  SamplingParams other = p;
  other.seed.reset();
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(batch.engine->add_request("o" + std::to_string(i), random_prompt(g, 9 + i), other).ok());
  ASSERT_TRUE(batch.engine->add_request("x", prompt, p).ok());
  auto b = batch.run_all();
  EXPECT_EQ(a["x"], b["x"]);
  // A different seed should (for 16 sampled tokens at temperature 1) differ somewhere.
  Harness diff(GetParam(), 64);
  p.seed = 99;
  ASSERT_TRUE(diff.engine->add_request("x", prompt, p).ok());
  EXPECT_NE(diff.run_all()["x"], a["x"]);
}

SpeculativeConfig ngram_spec(int k, int min_n = 1, int max_n = 3) {
  SpeculativeConfig c;
  c.method = "ngram";
  c.num_speculative_tokens = k;
  c.prompt_lookup_min = min_n;
  c.prompt_lookup_max = max_n;
  return c;
}

// Prompts that repeat themselves, so that prompt lookup finds drafts.
std::vector<std::vector<int32_t>> repetitive_prompts(std::mt19937& g) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    auto base = random_prompt(g, 6 + 3 * i);
    std::vector<int32_t> p = base;
    p.insert(p.end(), base.begin(), base.end());
    p.insert(p.end(), base.begin(), base.begin() + 2 + i % 3);
    prompts.push_back(p);
  }
  return prompts;
}

// Proposes each request's known greedy continuation, with every fourth output position's draft
// wrong: drafts accepted 0..k at a time (prompt lookup finds few on some fixtures).
class ContinuationProposer : public Proposer {
 public:
  explicit ContinuationProposer(std::map<std::string, std::vector<int32_t>> want) : want_(std::move(want)) {}
  void propose(const std::vector<Request*>& rs, const std::vector<int>& room) override {
    for (size_t i = 0; i < rs.size(); ++i) {
      const auto& w = want_.at(rs[i]->id);
      rs[i]->spec_tokens.clear();
      for (size_t p = rs[i]->output.size(); p < w.size() && rs[i]->spec_tokens.size() < static_cast<size_t>(room[i]);
           ++p)
        rs[i]->spec_tokens.push_back(p % 4 == 3 ? (w[p] + 1) % 200 : w[p]);
    }
  }

 private:
  std::map<std::string, std::vector<int32_t>> want_;
};

// Speculative decoding (k = 3) gives the tokens greedy decoding gives: plain rows, rows sampled
// on the host (logprobs, penalties), a small step budget that drops some drafts, and preemption;
// drafts from prompt lookup and drafts that are right up to a point. Hybrid models: the
// linear-attention state after each draft is kept and the accepted one's continues, with prefix
// caching (checkpoints) and chunked prefill.
TEST_P(EngineFixtureTest, SpeculationKeepsGreedyOutput) {
  if (testing::fixture_is_hybrid(GetParam()) && !testing::make_test_backend()->supports_token_state_slots())
    GTEST_SKIP() << "this backend does not keep per-token linear-attention states";
  std::mt19937 g(17);
  const auto prompts = repetitive_prompts(g);
  auto params = [](size_t i) {
    SamplingParams p = greedy(20 + static_cast<int>(i));
    if (i % 3 == 1) p.logprobs = 2;
    if (i % 3 == 2) p.repetition_penalty = 1.3f;
    return p;
  };
  std::map<std::string, std::vector<int32_t>> want;
  std::map<std::string, std::vector<float>> want_margins;
  {
    Harness h(GetParam(), 64);
    for (size_t i = 0; i < prompts.size(); ++i)
      ASSERT_TRUE(h.engine->add_request(std::to_string(i), prompts[i], params(i)).ok());
    want = h.run_all();
    want_margins = h.margins;
  }
  for (bool ngram : {true, false})
    for (auto [budget, blocks] : {std::pair{512, 64}, std::pair{9, 64}, std::pair{512, 12}}) {
      if (ngram && blocks == 12) continue;
      SCOPED_TRACE(std::string(ngram ? "ngram" : "continuation") + " drafts, budget " + std::to_string(budget) +
                   ", blocks " + std::to_string(blocks));
      Harness h(GetParam(), blocks, 64, budget, true, ngram_spec(3));
      if (!ngram) h.engine->set_proposer(std::make_unique<ContinuationProposer>(want));
      for (size_t i = 0; i < prompts.size(); ++i)
        ASSERT_TRUE(h.engine->add_request(std::to_string(i), prompts[i], params(i)).ok());
      auto got = h.run_all();
      for (size_t i = 0; i < prompts.size(); ++i)
        EXPECT_EQ(got[std::to_string(i)].size(), static_cast<size_t>(20 + i)) << "max_tokens with several a step";
      expect_greedy_over_every_token(GetParam(), prompts, params, want, want_margins, got, h.margins);
      const SpecDecodeStats& st = h.engine->stats().spec;
      EXPECT_GT(st.num_draft_tokens, 0u) << "no drafts were verified";
      if (!ngram) {
        EXPECT_GT(st.num_accepted_tokens, 0u) << "no draft was accepted";
        EXPECT_LT(st.num_accepted_tokens, st.num_draft_tokens) << "no draft was rejected: the test misses that path";
      }
      if (blocks == 12) expect_preemption_or_window(*h.engine);
    }
}

// Every supported fixture, the hybrid ones (linear-attention state slots) included.
INSTANTIATE_TEST_SUITE_P(Fixtures, EngineFixtureTest, ::testing::ValuesIn(testing::all_supported_fixture_names()),
                         [](const auto& info) { return info.param; });

class HybridEngineTest : public ::testing::TestWithParam<std::string> {};

// The reference prompts (1 to 300 tokens) together through the engine with a 32-token step
// budget: every prefill runs in chunks that continue from the sequence's state slot, batched
// with the others' chunks and decodes. CPU (f32): the greedy tokens are transformers' (up to a
// step the reference itself calls within 1e-3). CUDA (bf16): the tokens of the same prompts with
// a budget that prefills each in one step, up to a step either run called within twice the
// error transformers itself makes in bf16 on that prompt (at least 0.05); FixtureTest holds the
// one-step runs to transformers.
TEST_P(HybridEngineTest, ChunkedPrefillOf32TokensGivesTheReferenceTokens) {
  const auto ref = testing::load_reference(GetParam());
  const bool cuda = testing::testing_on_cuda();
  auto run = [&](int budget) {
    auto h = std::make_unique<Harness>(GetParam(), 128, 8, budget, true, SpeculativeConfig{}, 512);
    EXPECT_TRUE(h->engine->cache_manager().has_state_slots());
    int i = 0;
    for (const auto& c : ref["cases"])
      EXPECT_TRUE(h->engine
                      ->add_request(std::to_string(i++), c["prompt_ids"].get<std::vector<int32_t>>(),
                                    greedy(c["greedy"].size()))
                      .ok());
    auto tokens = h->run_all();
    EXPECT_EQ(h->engine->cache_manager().state_slots().num_held(), 0) << "state slots leaked";
    return std::make_pair(std::move(h), std::move(tokens));
  };
  const auto got = run(32);
  decltype(run(0)) one_step;
  if (cuda) one_step = run(1024);
  size_t compared = 0;
  int i = 0;
  for (const auto& c : ref["cases"]) {
    const std::string id = std::to_string(i++);
    const auto& g = got.second.at(id);
    const auto want = cuda ? one_step.second.at(id) : c["greedy"].get<std::vector<int32_t>>();
    ASSERT_EQ(g.size(), want.size()) << id;
    const double close = cuda ? std::max(0.05, 2.0 * c.value("bf16_last_logits_err", 0.0)) : 1e-3;
    for (size_t k = 0; k < want.size(); ++k, ++compared) {
      if (g[k] == want[k]) continue;
      double m;
      if (cuda) {
        const auto& a = one_step.first->margins.at(id);
        const auto& b = got.first->margins.at(id);
        m = std::min(k < a.size() ? a[k] : 1e9f, k < b.size() ? b[k] : 1e9f);
      } else {
        m = c["margins"][k].get<double>();
      }
      EXPECT_LE(m, close) << "prompt " << id << " step " << k << ": " << g[k] << " vs " << want[k];
      break;
    }
  }
  EXPECT_GE(compared, 8u);
}

// Three prompts share a 48-token prefix (a system prompt) and have 20-token tails, so each
// prompt's last full block (64) is its own. The first finds nothing cached; the second finds
// the shared KV blocks without a state checkpoint, so no hit, but its prefill stops at 48 and
// checkpoints the state there; the third hits those three blocks. Tokens as without caching.
TEST_P(HybridEngineTest, SharedPrefixIsCheckpointedWhereThePromptsDiverge) {
  std::mt19937 g(23);
  const std::vector<int32_t> shared = random_prompt(g, 48);
  std::map<std::string, std::vector<int32_t>> prompts;
  for (const char* id : {"a", "b", "c"}) {
    auto tail = random_prompt(g, 20);
    prompts[id] = shared;
    prompts[id].insert(prompts[id].end(), tail.begin(), tail.end());
  }
  Harness cold(GetParam(), 64, 64, 512, /*prefix=*/false);
  std::map<std::string, std::vector<int32_t>> want, got;
  for (const auto& [id, p] : prompts) {
    ASSERT_TRUE(cold.engine->add_request(id, p, greedy(8)).ok());
    want[id] = cold.run_all()[id];
  }
  Harness h(GetParam(), 64);
  ASSERT_TRUE(h.engine->cache_manager().has_state_slots());
  std::map<std::string, int> cached;
  for (const auto& [id, p] : prompts) {
    ASSERT_TRUE(h.engine->add_request(id, p, greedy(8)).ok());
    got[id] = h.run_all(&cached)[id];
  }
  EXPECT_EQ(cached["a"], 0);
  EXPECT_EQ(cached["b"], 0) << "the shared blocks have no state checkpoint yet";
  EXPECT_EQ(cached["c"], 48) << "b checkpointed the state where the prompts diverge";
  EXPECT_EQ(h.engine->cache_manager().state_slots().num_held(), 0) << "state slots leaked";
  expect_same_or_close_call(want, got, cold.margins, h.margins, GetParam());
}

SpeculativeConfig mtp_spec(int k) {
  SpeculativeConfig c;
  c.method = "mtp";
  c.num_speculative_tokens = k;
  return c;
}

// Speculative decoding with the checkpoint's MTP layer (random weights here: drafts of any
// quality) gives the tokens greedy decoding gives, for k = 1, 2, 3: a batch with rows sampled on
// the host, prompts prefilled in 32-token chunks (the MTP layer's KV written chunk by chunk),
// preemption (recomputed from scratch, MTP KV included), and a second round of the same prompts
// that hits the prefix cache (the MTP layer's KV of the cached blocks is reused).
TEST_P(HybridEngineTest, MtpSpeculationKeepsGreedyOutput) {
  if (!testing::make_test_backend()->supports_token_state_slots())
    GTEST_SKIP() << "this backend does not keep per-token linear-attention states";
  std::mt19937 g(29);
  auto prompts = repetitive_prompts(g);
  prompts.push_back(random_prompt(g, 40));
  auto params = [](size_t i) {
    SamplingParams p = greedy(12 + static_cast<int>(i));
    if (i % 3 == 1) p.logprobs = 2;
    if (i % 3 == 2) p.repetition_penalty = 1.3f;
    return p;
  };
  auto submit = [&](Harness& h, const std::string& round) {
    for (size_t i = 0; i < prompts.size(); ++i)
      ASSERT_TRUE(h.engine->add_request(round + std::to_string(i), prompts[i], params(i)).ok());
  };
  std::map<std::string, std::vector<int32_t>> want;
  std::map<std::string, std::vector<float>> want_margins;
  {
    Harness h(GetParam(), 64);
    submit(h, "");
    want = h.run_all();
    want_margins = h.margins;
  }
  for (int k : {1, 2, 3})
    for (auto [budget, blocks] : {std::pair{512, 64}, std::pair{32, 64}, std::pair{512, 14}}) {
      SCOPED_TRACE("k " + std::to_string(k) + ", budget " + std::to_string(budget) + ", blocks " +
                   std::to_string(blocks));
      Harness h(GetParam(), blocks, 64, budget, true, mtp_spec(k));
      submit(h, "");
      const auto got = h.run_all();
      expect_greedy_over_every_token(GetParam(), prompts, params, want, want_margins, got, h.margins);
      const SpecDecodeStats& st = h.engine->stats().spec;
      EXPECT_GT(st.num_draft_tokens, 0u) << "no MTP drafts were verified";
      EXPECT_EQ(st.accepted_per_pos.size() <= static_cast<size_t>(k), true);
      if (blocks == 14) EXPECT_GT(h.engine->stats().num_preemptions, 0u) << "the pool was meant to force preemption";
      if (blocks != 64) continue;
      // The same prompts again: their full blocks (and checkpointed states) are cached.
      submit(h, "again-");
      std::map<std::string, int> cached;
      auto again = h.run_all(&cached);
      std::map<std::string, std::vector<int32_t>> renamed;
      int hits = 0;
      for (size_t i = 0; i < prompts.size(); ++i) {
        renamed[std::to_string(i)] = again["again-" + std::to_string(i)];
        hits += cached["again-" + std::to_string(i)] > 0;
      }
      EXPECT_GT(hits, 0) << "the second round was meant to hit the prefix cache";
      if (!testing::testing_on_cuda()) EXPECT_EQ(want, renamed);
    }
}

// Records the drafts of the proposer it wraps, by (request, tokens so far).
class RecordingProposer : public Proposer {
 public:
  explicit RecordingProposer(std::unique_ptr<Proposer> inner) : inner_(std::move(inner)) {}
  void observe_step(const std::vector<ComputedSpan>& spans) override { inner_->observe_step(spans); }
  bool needs_lookahead_slots() const override { return inner_->needs_lookahead_slots(); }
  bool drafts_in_step() const override { return inner_->drafts_in_step(); }
  void take_step_drafts(std::vector<const Request*> seqs, std::vector<int32_t> d, int passes) override {
    inner_->take_step_drafts(std::move(seqs), std::move(d), passes);
  }
  void propose(const std::vector<Request*>& rs, const std::vector<int>& room) override {
    inner_->propose(rs, room);
    for (const Request* r : rs) drafts[{r->id, r->num_tokens()}] = r->spec_tokens;
  }
  std::map<std::pair<std::string, int>, std::vector<int32_t>> drafts;

 private:
  std::unique_ptr<Proposer> inner_;
};

// The MTP layer's drafts depend only on the tokens so far, not on how its KV cache was filled: a
// sequence decoded with speculation (MTP KV written by each step's pass over the accepted
// positions, draft positions overwritten later) drafts at each length what a fresh request gets
// whose prompt is that sequence, prefilled in 8-token chunks (the whole context in the first
// passes). CPU: the same drafts; CUDA (bf16, other GEMM shapes): most of them.
TEST_P(HybridEngineTest, MtpDraftsDependOnlyOnTheTokens) {
  if (!testing::make_test_backend()->supports_token_state_slots())
    GTEST_SKIP() << "this backend does not keep per-token linear-attention states";
  constexpr int kK = 3, kMax = 24;
  std::mt19937 g(31);
  const std::vector<int32_t> prompt = random_prompt(g, 21);
  Harness a(GetParam(), 64, 8, 512, false, mtp_spec(kK));
  auto rec_a = std::make_unique<RecordingProposer>(std::make_unique<MtpProposer>(*a.executor, 16));
  RecordingProposer& ra = *rec_a;
  a.engine->set_proposer(std::move(rec_a));
  ASSERT_TRUE(a.engine->add_request("a", prompt, greedy(kMax, false)).ok());
  const std::vector<int32_t> out = a.run_all()["a"];
  ASSERT_EQ(out.size(), static_cast<size_t>(kMax));
  size_t compared = 0, same = 0;
  for (const auto& [key, drafts] : ra.drafts) {
    const int len = key.second, produced = len - static_cast<int>(prompt.size());
    if (produced < 2 || drafts.empty()) continue;
    // A fresh request whose prompt ends one token before `len`: its first step makes that token.
    std::vector<int32_t> p = prompt;
    p.insert(p.end(), out.begin(), out.begin() + produced - 1);
    Harness b(GetParam(), 64, 8, 8, false, mtp_spec(kK));
    auto rec_b = std::make_unique<RecordingProposer>(std::make_unique<MtpProposer>(*b.executor, 16));
    RecordingProposer& rb = *rec_b;
    b.engine->set_proposer(std::move(rec_b));
    ASSERT_TRUE(b.engine->add_request("b", p, greedy(kMax - produced + 1, false)).ok());
    while (!rb.drafts.count({"b", len}) && b.engine->has_unfinished()) b.engine->step();
    b.engine->abort("b");
    ASSERT_TRUE(rb.drafts.count({"b", len})) << "no drafts at length " << len;
    const std::vector<int32_t>& fresh = rb.drafts[std::make_pair(std::string("b"), len)];
    ++compared;
    same += fresh == drafts;
    if (!testing::testing_on_cuda()) EXPECT_EQ(fresh, drafts) << "drafts at length " << len;
  }
  EXPECT_GE(compared, 4u) << "too few speculative steps to compare";
  EXPECT_GE(2 * same, compared);
  EXPECT_GT(a.engine->stats().spec.steps_drafting_in_step, 0u) << "the decode steps were meant to draft in the step";
}

// MTP drafting run with the step (Executor::execute_with_mtp: acceptance on the device, the first
// pass over every row of the step, the chained passes from the accepted row) drafts what the
// drafting after the step does: the same tokens and, on the CPU, the same drafts accepted at
// every position; a batch of greedy sequences of different lengths, k = 1, 2, 3, and a pool so
// small that sequences are preempted (their MTP KV recomputed). On CUDA (no logprobs asked, so
// that the steps draft in the step) both runs give the tokens of decoding without speculation,
// up to the close calls that run's margins allow.
TEST_P(HybridEngineTest, MtpDraftingInTheStepDraftsWhatDraftingAfterItDoes) {
  if (!testing::make_test_backend()->supports_token_state_slots())
    GTEST_SKIP() << "this backend does not keep per-token linear-attention states";
  std::mt19937 g(41);
  auto prompts = repetitive_prompts(g);
  prompts.push_back(random_prompt(g, 30));
  for (int k : {1, 2, 3})
    for (int blocks : {64, 14}) {
      SCOPED_TRACE("k " + std::to_string(k) + ", blocks " + std::to_string(blocks));
      auto submit = [&](Harness& h, bool margins) {
        for (size_t i = 0; i < prompts.size(); ++i)
          ASSERT_TRUE(
              h.engine->add_request(std::to_string(i), prompts[i], greedy(10 + 3 * static_cast<int>(i), margins)).ok());
      };
      std::map<std::string, std::vector<int32_t>> plain, tokens[2];
      std::map<std::string, std::vector<float>> plain_margins;
      SpecDecodeStats stats[2];
      if (testing::testing_on_cuda()) {
        Harness h(GetParam(), blocks);
        submit(h, true);
        plain = h.run_all();
        plain_margins = h.margins;
      }
      for (int in_step : {0, 1}) {
        Harness h(GetParam(), blocks, 64, 512, true, mtp_spec(k), 128, in_step == 1);
        submit(h, false);
        tokens[in_step] = h.run_all();
        stats[in_step] = h.engine->stats().spec;
      }
      EXPECT_EQ(stats[0].steps_drafting_in_step, 0u);
      EXPECT_GT(stats[1].steps_drafting_in_step, 0u) << "no step drafted with the step";
      if (testing::testing_on_cuda()) {
        for (const auto& t : tokens) expect_same_or_close_call(plain, t, plain_margins, {}, GetParam());
        continue;
      }
      EXPECT_EQ(tokens[0], tokens[1]);
      EXPECT_EQ(stats[0].num_drafts, stats[1].num_drafts);
      EXPECT_EQ(stats[0].num_accepted_tokens, stats[1].num_accepted_tokens);
      EXPECT_EQ(stats[0].accepted_per_pos, stats[1].accepted_per_pos);
    }
}

// Every graph capture fails (a backend whose end_capture throws): the speculative-decoding shapes
// then run eagerly, on the rows their graphs would have had (the step's bucket), and MTP drafting
// in the step and after it take those rows too; decode shapes turn graphs off. The tokens are
// those of the same runs with graphs working. Only where the backend captures graphs (CUDA).
class FailingCaptures : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  int failed = 0;
  std::unique_ptr<CapturedGraph> end_capture() override {
    inner().end_capture();
    ++failed;
    fail(ErrorKind::kInternal, "a capture made to fail (test)");
  }
};

// The query lengths of the attention calls (one a step and layer): what shapes the steps had.
class QueryLengths : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::set<std::pair<int, int>> seen;  // (sequences, longest query)
  void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionMetadata& meta,
                       float scale, float k_scale, float v_scale, int window, const Tensor& out) override {
    seen.emplace(meta.num_seqs, meta.max_query_len);
    ForwardingBackend::paged_attention(q, k_cache, v_cache, meta, scale, k_scale, v_scale, window, out);
  }
  void qkv_attention(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& positions,
                     const RopeTable& table, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionMetadata& meta, float scale, float k_scale, float v_scale, int window,
                     const Tensor& out) override {
    seen.emplace(meta.num_seqs, meta.max_query_len);
    ForwardingBackend::qkv_attention(qkv, q_norm, k_norm, eps, positions, table, k_cache, v_cache, meta, scale, k_scale,
                                     v_scale, window, out);
  }
};

// With ngram (which finds no drafts in the warm-up's random tokens) the warm-up verifies k, k - 1,
// ..., 1 drafts in its decode steps, so the batch-1 graph of each verification shape is captured
// before a user's request; afterwards prompt lookup drafts again and nothing is left behind.
TEST(Engine, WarmUpWithNgramVerifiesEveryDraftCount) {
  std::unique_ptr<Backend> owned = testing::make_test_backend();
  QueryLengths rec(*owned);
  LoadOptions lo;
  lo.model_dir = testing::fixtures_dir() + "/qwen3_gqa4_hd32";
  EngineConfig ec;
  ec.num_blocks_override = 64;
  ec.speculative = ngram_spec(3);
  ec.scheduler.max_model_len = 128;
  LLMEngine engine(std::make_unique<LocalExecutor>(load_model(lo, rec), rec), ec);
  EXPECT_GT(engine.warm_up(), LLMEngine::kWarmUpDecode);
  for (int q : {1, 2, 3, 4}) EXPECT_TRUE(rec.seen.count({1, q})) << "no batch-1 step of " << q << " tokens a sequence";
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_EQ(engine.stats().steps, 0u);
  EXPECT_EQ(engine.stats().spec.num_draft_tokens, 0u);
  EXPECT_TRUE(engine.cache_manager().pool().all_free());
  std::mt19937 g(17);
  const auto prompt = repetitive_prompts(g)[3];
  ASSERT_TRUE(engine.add_request("a", prompt, greedy(16, false)).ok());
  std::vector<int32_t> got;
  while (engine.has_unfinished())
    for (const auto& o : engine.step()) got.insert(got.end(), o.new_token_ids.begin(), o.new_token_ids.end());
  EXPECT_GT(engine.stats().spec.num_draft_tokens, 0u) << "prompt lookup drafts again after the warm-up";
  Harness plain("qwen3_gqa4_hd32", 64);
  ASSERT_TRUE(plain.engine->add_request("a", prompt, greedy(16, false)).ok());
  const auto want = plain.run_all();
  if (!testing::testing_on_cuda()) {
    EXPECT_EQ(want.at("a"), got);
  }
}

TEST_P(HybridEngineTest, MtpAfterFailedGraphCapturesRunsEagerly) {
  if (!testing::make_test_backend()->supports_graphs()) GTEST_SKIP() << "this backend does not capture graphs";
  std::mt19937 g(43);
  auto prompts = repetitive_prompts(g);
  for (bool in_step : {true, false}) {
    SCOPED_TRACE(in_step ? "drafting in the step" : "drafting after the step");
    std::map<std::string, std::vector<int32_t>> tokens[2];
    for (int failing : {0, 1}) {
      std::unique_ptr<Backend> owned = testing::make_test_backend();
      FailingCaptures failer(*owned);
      Backend& be = failing ? static_cast<Backend&>(failer) : *owned;
      LoadOptions lo;
      lo.model_dir = testing::fixtures_dir() + "/" + GetParam();
      lo.mtp = true;
      EngineConfig ec;
      ec.num_blocks_override = 64;
      ec.speculative = mtp_spec(2);
      ec.speculative.disable_by_batch_size = 0;
      ec.mtp_drafts_in_step = in_step;
      ec.scheduler.max_model_len = 128;
      LLMEngine engine(std::make_unique<LocalExecutor>(load_model(lo, be), be), ec);
      for (size_t i = 0; i < prompts.size(); ++i)
        ASSERT_TRUE(engine.add_request(std::to_string(i), prompts[i], greedy(12)).ok());
      while (engine.has_unfinished())
        for (const auto& o : engine.step())
          tokens[failing][o.request_id].insert(tokens[failing][o.request_id].end(), o.new_token_ids.begin(),
                                               o.new_token_ids.end());
      EXPECT_TRUE(engine.cache_manager().pool().all_free()) << "KV blocks leaked";
      if (failing) EXPECT_GT(failer.failed, 0) << "no graph was captured";
      EXPECT_GT(engine.stats().spec.num_draft_tokens, 0u);
    }
    expect_same_or_close_call(tokens[0], tokens[1], {}, {}, GetParam());
  }
}

// MTP with disable_by_batch_size: the sequences of a step where drafting is off run it without
// the MTP pass (nothing of the MTP layer runs), so they never draft again, even once the batch is
// small; a sequence that arrives then drafts. Tokens stay greedy's.
TEST_P(HybridEngineTest, MtpSequencesThatRanWithoutDraftsDraftNoMore) {
  if (!testing::make_test_backend()->supports_token_state_slots())
    GTEST_SKIP() << "this backend does not keep per-token linear-attention states";
  std::mt19937 g(43);
  const auto prompts = repetitive_prompts(g);
  ASSERT_GE(prompts.size(), 3u);
  const std::vector<int> lengths = {30, 3, 3};
  auto run = [&](SpeculativeConfig spec, uint64_t* drafting_steps, uint64_t* most_per_step) {
    Harness h(GetParam(), 64, 8, 512, false, spec);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_TRUE(h.engine->add_request(std::to_string(i), prompts[i], greedy(lengths[i], false)).ok());
    std::map<std::string, std::vector<int32_t>> got;
    bool late_added = false;
    while (h.engine->has_unfinished()) {
      if (!late_added && h.engine->stats().num_running == 1 && h.engine->stats().steps > 0) {
        EXPECT_TRUE(h.engine->add_request("late", prompts[1], greedy(12, false)).ok());
        late_added = true;
      }
      const uint64_t before = h.engine->stats().spec.num_drafts;
      for (const auto& o : h.engine->step())
        got[o.request_id].insert(got[o.request_id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
      const uint64_t now = h.engine->stats().spec.num_drafts;
      if (drafting_steps) *drafting_steps += now > before;
      if (most_per_step) *most_per_step = std::max(*most_per_step, now - before);
    }
    EXPECT_TRUE(late_added);
    EXPECT_TRUE(h.engine->cache_manager().pool().all_free());
    return got;
  };
  const auto plain = run({}, nullptr, nullptr);
  SpeculativeConfig spec = mtp_spec(2);
  spec.disable_by_batch_size = 3;
  uint64_t drafting_steps = 0, most = 0;
  const auto got = run(spec, &drafting_steps, &most);
  EXPECT_GT(drafting_steps, 0u) << "the late sequence never drafted";
  EXPECT_EQ(most, 1u) << "a sequence that ran without drafts drafted again";
  if (!testing::testing_on_cuda()) EXPECT_EQ(got, plain);
}

// disable_by_batch_size auto (MTP): startup runs calibration sequences at batch 1, 2, 4 (up to
// --max-num-seqs) with drafts and without and keeps each batch's cost ratio; nothing of them is
// left behind (requests, blocks, state slots, counters), and the tokens afterwards are greedy's.
TEST_P(HybridEngineTest, MtpAutoLimitIsMeasuredAtStartupAndLeavesNothingBehind) {
  if (!testing::make_test_backend()->supports_token_state_slots())
    GTEST_SKIP() << "this backend does not keep per-token linear-attention states";
  std::mt19937 g(47);
  const auto prompts = repetitive_prompts(g);
  SpeculativeConfig spec = validate_speculative_config(mtp_spec(2));
  spec.disable_by_batch_size = SpeculativeConfig::kDisableAuto;
  Harness h(GetParam(), 64, 4, 512, true, spec);
  const auto& costs = h.engine->speculation_costs();
  ASSERT_FALSE(costs.empty());
  EXPECT_EQ(costs.front().first, 1);
  for (size_t i = 0; i < costs.size(); ++i) {
    EXPECT_GT(costs[i].second, 0.0);
    if (i > 0) EXPECT_EQ(costs[i].first, 2 * costs[i - 1].first);
  }
  EXPECT_LE(costs.back().first, 4);
  EXPECT_FALSE(h.engine->has_unfinished());
  EXPECT_EQ(h.engine->stats().steps, 0u);
  EXPECT_EQ(h.engine->stats().spec.num_drafts, 0u);
  EXPECT_EQ(h.engine->stats().generation_tokens, 0u);
  EXPECT_TRUE(h.engine->cache_manager().pool().all_free());
  EXPECT_EQ(h.engine->cache_manager().state_slots().num_held(), 0);
  Harness plain(GetParam(), 64, 4);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(h.engine->add_request(std::to_string(i), prompts[i], greedy(12, false)).ok());
    ASSERT_TRUE(plain.engine->add_request(std::to_string(i), prompts[i], greedy(12, false)).ok());
  }
  const auto got = h.run_all(), want = plain.run_all();
  if (!testing::testing_on_cuda()) {
    EXPECT_EQ(got, want);
  }
}

// A checkpoint without MTP weights, asked for method mtp, fails at load naming what is missing.
TEST(Engine, MtpWithoutMtpWeightsFailsNamingThem) {
  auto backend = testing::make_test_backend();
  LoadOptions lo;
  lo.model_dir = testing::fixtures_dir() + "/qwen3_gqa4_hd32";
  lo.mtp = true;
  try {
    (void)load_model(lo, *backend);
    FAIL() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multi-token-prediction"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ngram"), std::string::npos) << e.what();
  }
  // Without the MTP layer loaded, the engine refuses the method.
  lo.mtp = false;
  EngineConfig ec;
  ec.num_blocks_override = 16;
  ec.scheduler.max_model_len = 64;
  ec.speculative = mtp_spec(2);
  try {
    LLMEngine engine(load_model(lo, *backend), *backend, ec);
    FAIL() << "an engine with method mtp and no MTP layer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multi-token-prediction"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HybridEngineTest, ::testing::ValuesIn(testing::hybrid_fixture_names()),
                         [](const auto& info) { return info.param; });

TEST(Engine, AnUnvalidatedRequestIsAnInternalErrorWithoutSideEffects) {
  // Requests are validated once, at AsyncEngine::submit (validate_request); the engine asserts it.
  Harness h("qwen3_gqa4_hd32", 32);
  SamplingParams p = greedy(4);
  auto expect_internal = [&](std::vector<int32_t> prompt, const SamplingParams& sp) {
    try {
      (void)h.engine->add_request("a", std::move(prompt), sp);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal) << e.what();
    }
  };
  expect_internal({}, p);
  expect_internal({1, 999}, p);
  expect_internal(std::vector<int32_t>(200, 5), p);
  expect_internal(std::vector<int32_t>(125, 5), p);  // 125 + 4 > 128
  p.n = 100;
  expect_internal({1, 2}, p);
  EXPECT_FALSE(h.engine->has_unfinished());
  // A sequence id in use is the engine's state, not validation: a Status.
  ASSERT_TRUE(h.engine->add_request("a", {1, 2}, greedy(4)).ok());
  EXPECT_FALSE(h.engine->add_request("a", {1, 2}, greedy(4)).ok());
}

TEST(Engine, AbortFreesBlocksAndNGivesSeveralSequences) {
  Harness h("qwen3_gqa4_hd32", 32);
  SamplingParams p = greedy(50);
  p.n = 3;
  p.temperature = 1.0f;
  ASSERT_TRUE(h.engine->add_request("r", std::vector<int32_t>(20, 7), p).ok());
  std::map<std::string, int> seen;
  for (int i = 0; i < 3; ++i)
    for (const auto& o : h.engine->step()) seen[o.request_id]++;
  EXPECT_EQ(seen.size(), 3u);
  h.engine->abort("r");
  EXPECT_FALSE(h.engine->has_unfinished());
  EXPECT_TRUE(h.engine->cache_manager().pool().all_free());
}

TEST(Engine, StopsAtEosAndStopTokenIdsAndMaxTokens) {
  Harness h("llama_gqa2", 32);
  SamplingParams p = greedy(8);
  ASSERT_TRUE(h.engine->add_request("len", {5, 6, 7}, p).ok());
  auto out = h.run_all();
  ASSERT_EQ(out["len"].size(), 8u);
  // Make a later greedy token (its first occurrence) a stop token: generation must end right there.
  const auto& seq = out["len"];
  size_t k = 1;
  while (k < seq.size() && std::find(seq.begin(), seq.begin() + k, seq[k]) != seq.begin() + k) ++k;
  ASSERT_LT(k, seq.size()) << "fixture produced one repeated token";
  p.stop_token_ids = {seq[k]};
  ASSERT_TRUE(h.engine->add_request("stop", {5, 6, 7}, p).ok());
  auto out2 = h.run_all();
  std::vector<int32_t> want(seq.begin(), seq.begin() + k + 1);
  EXPECT_EQ(out2["stop"], want);
  // The same token as EOS (ignore_eos off) stops too; min_tokens pushes past it.
  h.engine->set_eos_token_ids({seq[k]});
  p.stop_token_ids.clear();
  p.ignore_eos = false;
  ASSERT_TRUE(h.engine->add_request("eos", {5, 6, 7}, p).ok());
  EXPECT_EQ(h.run_all()["eos"].size(), k + 1);
  p.min_tokens = static_cast<int>(k) + 2;
  ASSERT_TRUE(h.engine->add_request("min", {5, 6, 7}, p).ok());
  EXPECT_GE(h.run_all()["min"].size(), k + 2);
}

// A stop token, EOS or max_tokens met among accepted drafts ends the sequence right there,
// with one finished output.
TEST(Engine, SpeculationStopsInsideAStepsTokens) {
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7};
  Harness plain("llama_gqa2", 32);
  SamplingParams p = greedy(16);
  ASSERT_TRUE(plain.engine->add_request("x", prompt, p).ok());
  const auto seq = plain.run_all()["x"];
  ASSERT_EQ(seq.size(), 16u);
  Harness h("llama_gqa2", 32, 64, 512, true, ngram_spec(4, 1, 2));
  for (size_t k = 1; k < seq.size(); ++k) {
    if (std::find(seq.begin(), seq.begin() + static_cast<ptrdiff_t>(k), seq[k]) !=
        seq.begin() + static_cast<ptrdiff_t>(k))
      continue;  // not its first occurrence
    SamplingParams q = p;
    q.stop_token_ids = {seq[k]};
    ASSERT_TRUE(h.engine->add_request("s" + std::to_string(k), prompt, q).ok());
  }
  SamplingParams m = p;
  m.max_tokens = 7;
  ASSERT_TRUE(h.engine->add_request("max", prompt, m).ok());
  std::map<std::string, int> finishes;
  std::map<std::string, std::vector<int32_t>> got;
  while (h.engine->has_unfinished())
    for (const auto& o : h.engine->step()) {
      got[o.request_id].insert(got[o.request_id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) ++finishes[o.request_id];
      EXPECT_EQ(o.num_output_tokens, static_cast<int>(got[o.request_id].size()));
    }
  EXPECT_GT(h.engine->stats().spec.num_accepted_tokens, 0u);
  EXPECT_EQ(got["max"], std::vector<int32_t>(seq.begin(), seq.begin() + 7));
  for (const auto& [id, toks] : got) {
    EXPECT_EQ(finishes[id], 1) << id;
    if (id == "max") continue;
    const size_t k = std::stoul(id.substr(1));
    EXPECT_EQ(toks, std::vector<int32_t>(seq.begin(), seq.begin() + static_cast<ptrdiff_t>(k) + 1)) << id;
  }
  EXPECT_TRUE(h.engine->cache_manager().pool().all_free());
}

// disable_by_batch_size: no drafts while that many sequences run; drafts again once fewer do
// (the shorter request finishes first), and the tokens stay greedy's.
TEST(Engine, SpeculationIsOffWhileTheBatchIsLarge) {
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7};
  Harness plain("llama_gqa2", 32);
  ASSERT_TRUE(plain.engine->add_request("x", prompt, greedy(24)).ok());
  const auto seq = plain.run_all()["x"];
  SpeculativeConfig spec = ngram_spec(3, 1, 2);
  spec.disable_by_batch_size = 2;
  Harness h("llama_gqa2", 32, 64, 512, true, spec);
  ASSERT_TRUE(h.engine->add_request("long", prompt, greedy(24)).ok());
  ASSERT_TRUE(h.engine->add_request("short", prompt, greedy(4)).ok());
  std::map<std::string, std::vector<int32_t>> got;
  uint64_t drafts_while_two = 0;
  while (h.engine->has_unfinished()) {
    const bool two = h.engine->stats().num_running >= 2;
    const uint64_t before = h.engine->stats().spec.num_draft_tokens;
    for (const auto& o : h.engine->step())
      got[o.request_id].insert(got[o.request_id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
    if (two) drafts_while_two += h.engine->stats().spec.num_draft_tokens - before;
  }
  EXPECT_EQ(drafts_while_two, 0u) << "drafts were verified while two sequences ran";
  EXPECT_GT(h.engine->stats().spec.num_draft_tokens, 0u) << "no drafts once one sequence was left";
  EXPECT_EQ(got["long"], seq);
  EXPECT_EQ(got["short"], std::vector<int32_t>(seq.begin(), seq.begin() + 4));
}

// A model mixing full-attention and sliding-window layers (qwen2_sliding_window: layer 0 full,
// layers 1-2 a window of 8): with a KV cache group per kind, its windowed layers give their blocks
// back to the shared pool as the window slides, so the same memory runs more sequences at once
// than one group does (--disable-hybrid-kv-cache-manager: every layer keeps every block), with the
// same tokens; prefix caching and preemption stay right.
TEST(Engine, AWindowModelFitsMoreSequencesInTheSameMemory) {
  const std::string fixture = "qwen2_sliding_window";
  std::mt19937 g(41);
  std::vector<std::vector<int32_t>> prompts;
  const std::vector<int32_t> shared = random_prompt(g, 32);
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p = shared;  // two full blocks in common
    const auto tail = random_prompt(g, 20 + 5 * i);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  struct Run {
    std::map<std::string, std::vector<int32_t>> tokens;
    size_t most_running = 0;
    uint64_t preemptions = 0, cache_hits = 0;
    int num_blocks = 0;
    std::vector<CacheGroup> groups;
  };
  auto run = [&](bool hybrid) {
    auto be = testing::make_test_backend();
    LoadOptions lo;
    lo.model_dir = testing::fixtures_dir() + "/" + fixture;
    EngineConfig ec;
    // 24 blocks of 16 tokens of the three layers, K and V: f32 on the CPU, bf16 on CUDA (the "auto"
    // cache dtype of each backend).
    ec.kv_cache_memory_bytes = 24 * (testing::testing_on_cuda() ? 6144 : 12288);
    ec.hybrid_kv_cache_manager = hybrid;
    ec.scheduler.max_num_seqs = 8;
    ec.scheduler.max_num_batched_tokens = 256;
    ec.scheduler.max_model_len = 128;
    LLMEngine e(std::make_unique<LocalExecutor>(load_model(lo, *be), *be), ec);
    Run r;
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_TRUE(e.add_request(std::to_string(i), prompts[i], greedy(32, false)).ok());
    while (e.has_unfinished()) {
      for (const auto& o : e.step()) {
        auto& v = r.tokens[o.request_id];
        v.insert(v.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        if (o.finished) r.cache_hits += static_cast<uint64_t>(o.num_cached_tokens);
      }
      r.most_running = std::max(r.most_running, e.stats().num_running);
    }
    EXPECT_TRUE(e.cache_manager().pool().all_free());
    r.preemptions = e.stats().num_preemptions;
    r.num_blocks = e.num_blocks();
    r.groups = e.cache_manager().groups();
    return r;
  };
  const Run one = run(false), hybrid = run(true);
  ASSERT_EQ(one.groups.size(), 1u);
  EXPECT_EQ(one.num_blocks, 24);
  ASSERT_EQ(hybrid.groups.size(), 3u) << "full attention, and a window group a windowed layer";
  EXPECT_EQ(hybrid.groups[1].spec.kind, CacheGroupKind::kSlidingWindow);
  EXPECT_EQ(hybrid.num_blocks, 3 * 24) << "a block is one layer's page: three times as many in the same memory";
  // 8 sequences of 84 to 119 tokens (6 to 8 blocks): one group's 24 blocks hold three or four at
  // once; the hybrid cache's 72 hold a decoding sequence's full-attention blocks and at most two a
  // window group.
  EXPECT_GT(hybrid.most_running, one.most_running) << "the freed window blocks ran more sequences at once";
  EXPECT_LT(hybrid.preemptions, one.preemptions);
  EXPECT_GT(hybrid.cache_hits, 0u) << "the shared prefix came from the cache in every group";
  if (!testing::testing_on_cuda()) EXPECT_EQ(hybrid.tokens, one.tokens);
}

}  // namespace
}  // namespace tessera
