// Prompt logprobs (vLLM's prompt_logprobs; /v1/completions echo + logprobs): the engine's entries
// equal a direct forward of the whole prompt, however the prefill is chunked, with prefix caching on
// (a request that scores its prompt takes no cache hit), and with max_tokens 0 (score, generate nothing).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "engine/engine.h"
#include "engine/model_loader.h"
#include "fixture_util.h"

namespace tessera {
namespace {

std::vector<int32_t> random_prompt(std::mt19937& g, int len) {
  std::uniform_int_distribution<int> d(3, 255);
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = d(g);
  return p;
}

// f32 logits [n - 1, V] of positions 0..n-2 from one forward of the whole prompt (one sequence, a
// fresh cache; state slot 0 for hybrid models), outside the engine.
std::vector<float> full_forward_logits(Model& model, Backend& be, const std::vector<int32_t>& ids) {
  const int n = static_cast<int>(ids.size()), blocks = (n + 15) / 16;
  KvCache cache = testing::alloc_test_cache(be, model.cache_specs(), blocks, DType::kF32, 1);
  ModelInput in;
  for (int i = 0; i < n; ++i) {
    in.token_ids.push_back(ids[i]);
    in.positions.push_back(i);
    in.attention.slot_mapping.push_back(i);
  }
  in.attention.block_size = 16;
  in.attention.query_start_loc = {0, n};
  in.attention.seq_lens = {n};
  in.attention.max_blocks_per_seq = blocks;
  for (int b = 0; b < blocks; ++b) in.attention.block_tables.push_back(b);
  if (cache.num_state_slots > 0) {
    in.linear.query_start_loc = {0, n};
    in.linear.state_slots = {0};
    in.linear.has_initial_state = {0};
  }
  in.logits_indices.resize(static_cast<size_t>(n - 1));
  std::iota(in.logits_indices.begin(), in.logits_indices.end(), 0);
  Tensor lg = model.forward(in, cache);
  std::vector<float> v(static_cast<size_t>(lg.numel()));
  be.copy_to_host(v.data(), lg);
  be.synchronize();
  return v;
}

struct Reference {
  std::vector<float> logprob;  // of prompt[p + 1] at position p
  std::vector<int> rank;       // its rank there (1 = the most likely)
  // The ranks it could have where other tokens' logits lie within 1e-4 of its own (the f32 sums
  // of a chunked prefill, and of another CPU's BLAS kernels, part such near-ties either way).
  std::vector<int> rank_lo, rank_hi;
  std::vector<std::vector<int32_t>> top;    // the 3 best ids at position p
  std::vector<std::vector<float>> top_lps;  // and their logprobs
};

Reference reference(const std::vector<float>& logits, int vocab, const std::vector<int32_t>& prompt) {
  Reference ref;
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    const float* row = logits.data() + p * static_cast<size_t>(vocab);
    double mx = *std::max_element(row, row + vocab), sum = 0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(row[i] - mx);
    const double lse = mx + std::log(sum);
    ref.logprob.push_back(static_cast<float>(row[prompt[p + 1]] - lse));
    const float x = row[prompt[p + 1]];
    auto above = [&](float bound) {
      return static_cast<int>(std::count_if(row, row + vocab, [&](float v) { return v > bound; }));
    };
    ref.rank.push_back(1 + above(x));
    ref.rank_lo.push_back(1 + above(x + 1e-4f));
    ref.rank_hi.push_back(above(x - 1e-4f));  // (x itself is above x - 1e-4)
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + 3, idx.end(), [&](int a, int b) { return row[a] > row[b]; });
    ref.top.emplace_back(idx.begin(), idx.begin() + 3);
    ref.top_lps.push_back({});
    for (int k = 0; k < 3; ++k) ref.top_lps.back().push_back(static_cast<float>(row[idx[k]] - lse));
  }
  return ref;
}

LoadOptions fixture(const std::string& name) {
  LoadOptions lo;
  lo.model_dir = testing::fixtures_dir() + "/" + name;
  return lo;
}

// The reference entries of `prompt` from a model loaded for the purpose (and freed after).
Reference reference(const LoadOptions& lo, Backend& be, const std::vector<int32_t>& prompt) {
  auto model = load_model(lo, be);
  return reference(full_forward_logits(*model, be, prompt), model->config().vocab_size, prompt);
}

// CUDA: within 0.1, or the fixture's bf16 spread where larger (testing::fixture_bf16_spread: a
// chunked prefill rounds differently from the full forward it is compared with).
void expect_matches(const std::string& fixture, const Reference& ref, const std::vector<int32_t>& prompt,
                    const std::vector<TokenLogprob>& got, const std::string& what) {
  const float tol =
      testing::testing_on_cuda() ? static_cast<float>(std::max(0.1, testing::fixture_bf16_spread(fixture))) : 1e-3f;
  ASSERT_EQ(got.size(), prompt.size() - 1) << what;
  for (size_t p = 0; p < got.size(); ++p) {
    EXPECT_EQ(got[p].token, prompt[p + 1]) << what << " position " << p;
    EXPECT_NEAR(got[p].logprob, ref.logprob[p], tol) << what << " position " << p;
    if (!testing::testing_on_cuda()) {
      EXPECT_GE(got[p].rank, ref.rank_lo[p])
          << what << " position " << p << ": rank " << got[p].rank << ", the reference's " << ref.rank[p];
      EXPECT_LE(got[p].rank, ref.rank_hi[p])
          << what << " position " << p << ": rank " << got[p].rank << ", the reference's " << ref.rank[p];
    }
    ASSERT_EQ(got[p].top.size(), 3u) << what;
    for (int k = 0; k < 3; ++k) {
      EXPECT_NEAR(got[p].top[k].second, ref.top_lps[p][k], tol) << what << " position " << p << " top " << k;
      // Ids may swap between near-ties (bf16 on CUDA); on the CPU they are the reference's unless
      // the reference's own top entries are within 1e-4 (f32 sums of a chunked prefill).
      if (testing::testing_on_cuda() || got[p].top[k].first == ref.top[p][k]) continue;
      bool tie = false;
      for (int j = 0; j < 3; ++j)
        tie |= ref.top[p][j] == got[p].top[k].first && std::fabs(ref.top_lps[p][j] - ref.top_lps[p][k]) < 1e-4f;
      EXPECT_TRUE(tie) << what << " position " << p << " top " << k << ": id " << got[p].top[k].first
                       << ", the reference's " << ref.top[p][k] << " (logprob " << ref.top_lps[p][k] << ")";
    }
  }
}

struct Outputs {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, std::vector<TokenLogprob>> prompt_logprobs;
  std::map<std::string, FinishReason> finish;
  std::map<std::string, int> cached, prompt_logprob_deliveries;
};

void collect(const std::vector<RequestOutput>& outs, Outputs& run) {
  for (const auto& o : outs) {
    auto& t = run.tokens[o.request_id];
    t.insert(t.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    if (!o.prompt_logprobs.empty()) {
      run.prompt_logprobs[o.request_id] = o.prompt_logprobs;
      ++run.prompt_logprob_deliveries[o.request_id];
    }
    run.cached[o.request_id] = o.num_cached_tokens;
    if (o.finished) run.finish[o.request_id] = o.finish_reason;
  }
}

void run_all(LLMEngine& engine, Outputs& run) {
  while (engine.has_unfinished()) collect(engine.step(), run);
  EXPECT_TRUE(engine.cache_manager().pool().all_free()) << "KV blocks leaked";
}

SamplingParams greedy(int max_tokens, int prompt_logprobs = -1) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.prompt_logprobs = prompt_logprobs;
  return p;
}

std::vector<std::string> fixtures() {
  std::vector<std::string> v{"qwen3_gqa4_hd32"};
  for (const auto& h : testing::hybrid_fixture_names()) v.push_back(h);
  return v;
}

class PromptLogprobsTest : public ::testing::TestWithParam<std::string> {};

// 16-token steps with at most 7 prompt-logprob rows each: a 45-token prompt is scored over several steps.
EngineConfig chunked_scoring_config() {
  EngineConfig ec;
  ec.num_blocks_override = 64;
  ec.scheduler.max_num_seqs = 8;
  ec.scheduler.max_num_batched_tokens = 16;
  ec.scheduler.max_model_len = 128;
  ec.scheduler.max_prompt_logprob_rows = 7;
  return ec;
}

// A 45-token prompt, computed first by a plain request (so its blocks are in the prefix cache), then
// scored by two requests at once (max_tokens 2 and 0) in 16-token chunks with at most 7 prompt-logprob
// rows per step: each gets the full forward's 44 entries, once, and takes no prefix-cache hit.
TEST_P(PromptLogprobsTest, EqualAFullForwardInChunksWithPrefixCachingOn) {
  auto owned = testing::make_test_backend();
  Backend& be = *owned;
  const LoadOptions lo = fixture(GetParam());
  std::mt19937 g(7);
  const std::vector<int32_t> prompt = random_prompt(g, 45);
  const Reference ref = reference(lo, be, prompt);

  EngineConfig ec = chunked_scoring_config();
  ec.enable_prefix_caching = true;
  LLMEngine engine(load_model(lo, be), be, ec);
  Outputs warm;
  ASSERT_TRUE(engine.add_request("warm", prompt, greedy(2)).ok());
  run_all(engine, warm);
  EXPECT_TRUE(warm.prompt_logprobs.empty()) << "a request without prompt_logprobs got some";

  Outputs run;
  ASSERT_TRUE(engine.add_request("gen", prompt, greedy(2, 3)).ok());
  ASSERT_TRUE(engine.add_request("score", prompt, greedy(0, 3)).ok());
  ASSERT_TRUE(engine.add_request("plain", prompt, greedy(2)).ok());
  run_all(engine, run);
  expect_matches(GetParam(), ref, prompt, run.prompt_logprobs["gen"], "gen");
  expect_matches(GetParam(), ref, prompt, run.prompt_logprobs["score"], "score");
  EXPECT_EQ(run.prompt_logprob_deliveries["gen"], 1);
  EXPECT_EQ(run.prompt_logprob_deliveries["score"], 1);
  EXPECT_EQ(run.cached["gen"], 0) << "a request scoring its prompt must not skip cached positions";
  EXPECT_EQ(run.cached["score"], 0);
  EXPECT_GT(run.cached["plain"], 0) << "the prefix cache should serve the plain request";
  EXPECT_EQ(run.tokens["gen"], warm.tokens["warm"]) << "scoring changed what the request generates";
  EXPECT_TRUE(run.tokens["score"].empty()) << "max_tokens 0 generated tokens";
  EXPECT_EQ(run.finish["score"], FinishReason::kLength);
  EXPECT_EQ(run.finish["gen"], FinishReason::kLength);
}

// Too few blocks for two 45-token requests: the scoring request is preempted and recomputed at least
// once; its entries are still the full forward's, delivered once, none twice.
TEST_P(PromptLogprobsTest, SurvivePreemption) {
  auto owned = testing::make_test_backend();
  Backend& be = *owned;
  const LoadOptions lo = fixture(GetParam());
  std::mt19937 g(11);
  const std::vector<int32_t> a = random_prompt(g, 45), b = random_prompt(g, 45);
  const Reference ref = reference(lo, be, b);

  EngineConfig ec;
  ec.num_blocks_override = 7;  // 112 tokens: both prompts (6 blocks) fit, their outputs do not
  ec.scheduler.max_num_seqs = 4;
  ec.scheduler.max_num_batched_tokens = 16;
  ec.scheduler.max_model_len = 96;
  ec.scheduler.max_prompt_logprob_rows = 5;
  LLMEngine engine(load_model(lo, be), be, ec);
  Outputs run;
  ASSERT_TRUE(engine.add_request("a", a, greedy(40)).ok());
  ASSERT_TRUE(engine.add_request("b", b, greedy(40, 3)).ok());
  run_all(engine, run);
  EXPECT_GT(engine.stats().num_preemptions, 0u) << "the test needs a preemption";
  expect_matches(GetParam(), ref, b, run.prompt_logprobs["b"], "b");
  EXPECT_EQ(run.prompt_logprob_deliveries["b"], 1);
  EXPECT_EQ(run.tokens["b"].size(), 40u);
}

// Proposes one request's known continuation as its drafts (always right), nothing for the others.
class KnownContinuation : public Proposer {
 public:
  KnownContinuation(std::string id, std::vector<int32_t> tokens) : id_(std::move(id)), tokens_(std::move(tokens)) {}
  void propose(const std::vector<Request*>& rs, const std::vector<int>& room) override {
    for (size_t i = 0; i < rs.size(); ++i) {
      rs[i]->spec_tokens.clear();
      if (rs[i]->id != id_) continue;
      for (size_t p = rs[i]->output.size(); p < tokens_.size() && static_cast<int>(rs[i]->spec_tokens.size()) < room[i];
           ++p)
        rs[i]->spec_tokens.push_back(tokens_[p]);
    }
  }

 private:
  std::string id_;
  std::vector<int32_t> tokens_;
};

// Speculative decoding next to prompt logprobs: one request verifies drafts ((k+1)-token chunks;
// on hybrid models with a state slot per token) in the very steps that prefill another one scoring
// its prompt in 7-row chunks. The scored entries are the full forward's, and both requests
// generate what they generate without speculative decoding.
TEST_P(PromptLogprobsTest, AlongsideSpeculativeDecodingInTheSameSteps) {
  auto owned = testing::make_test_backend();
  Backend& be = *owned;
  if (testing::fixture_is_hybrid(GetParam()) && !be.supports_token_state_slots())
    GTEST_SKIP() << "this backend does not keep per-token linear-attention states";
  const LoadOptions lo = fixture(GetParam());
  std::mt19937 g(5);
  const std::vector<int32_t> spec_prompt = random_prompt(g, 10), prompt = random_prompt(g, 45);
  const Reference ref = reference(lo, be, prompt);
  EngineConfig ec = chunked_scoring_config();
  Outputs plain;
  {
    LLMEngine engine(load_model(lo, be), be, ec);
    ASSERT_TRUE(engine.add_request("spec", spec_prompt, greedy(40)).ok());
    ASSERT_TRUE(engine.add_request("score", prompt, greedy(4)).ok());
    run_all(engine, plain);
  }
  ec.speculative.method = "ngram";
  ec.speculative.num_speculative_tokens = 3;
  LLMEngine engine(load_model(lo, be), be, ec);
  engine.set_proposer(std::make_unique<KnownContinuation>("spec", plain.tokens["spec"]));
  Outputs run;
  ASSERT_TRUE(engine.add_request("spec", spec_prompt, greedy(40)).ok());
  while (run.tokens["spec"].empty()) collect(engine.step(), run);
  ASSERT_TRUE(engine.add_request("score", prompt, greedy(4, 3)).ok());
  int shared_steps = 0;  // steps that accepted drafts of "spec" while "score" was prefilling
  while (engine.has_unfinished()) {
    const bool prefilling = run.tokens["score"].empty();
    const size_t before = run.tokens["spec"].size();
    collect(engine.step(), run);
    if (prefilling && run.tokens["spec"].size() > before + 1) ++shared_steps;
  }
  EXPECT_TRUE(engine.cache_manager().pool().all_free()) << "KV blocks leaked";
  EXPECT_GT(shared_steps, 1) << "the test needs verification steps that also score prompt positions";
  expect_matches(GetParam(), ref, prompt, run.prompt_logprobs["score"], "score");
  EXPECT_EQ(run.prompt_logprob_deliveries["score"], 1);
  EXPECT_EQ(run.tokens["spec"], plain.tokens["spec"]);
  EXPECT_EQ(run.tokens["score"], plain.tokens["score"]);
  EXPECT_TRUE(run.prompt_logprobs["spec"].empty());
  EXPECT_GT(engine.stats().spec.num_accepted_tokens, 0u);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PromptLogprobsTest, ::testing::ValuesIn(fixtures()),
                         [](const auto& info) { return info.param; });

TEST(PromptLogprobs, MaxTokensZeroOnlyWhenScoringAndAtMostMaxLogprobs) {
  SamplingParams p;
  p.max_tokens = 0;
  EXPECT_FALSE(validate_sampling_params(p, 1000).ok());
  p.prompt_logprobs = 0;
  EXPECT_TRUE(validate_sampling_params(p, 1000).ok());
  p.prompt_logprobs = 21;
  const Status s = validate_sampling_params(p, 1000);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("prompt_logprobs"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tessera
