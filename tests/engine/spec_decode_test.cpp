// Speculative decoding's parts: the config, the ngram proposer, the scheduler with drafts, and
// (on a tiny fixture) that speculative sampling draws what plain sampling draws.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "engine/engine.h"
#include "engine/model_loader.h"
#include "engine/scheduler.h"
#include "engine/spec/ngram_proposer.h"
#include "fixture_util.h"

namespace tessera {
namespace {

TEST(SpeculativeConfig, DefaultsAliasesAndErrors) {
  SpeculativeConfig c;
  c.method = "ngram";
  c.num_speculative_tokens = 3;
  SpeculativeConfig v = validate_speculative_config(c);
  EXPECT_EQ(v.prompt_lookup_min, 5);
  EXPECT_EQ(v.prompt_lookup_max, 5);
  c.prompt_lookup_max = 4;
  v = validate_speculative_config(c);
  EXPECT_EQ(v.prompt_lookup_min, 4);
  EXPECT_EQ(v.prompt_lookup_max, 4);
  c.prompt_lookup_min = 2;
  v = validate_speculative_config(c);
  EXPECT_EQ(v.prompt_lookup_min, 2);
  EXPECT_EQ(v.prompt_lookup_max, 4);
  c.prompt_lookup_min = 5;
  EXPECT_THROW(validate_speculative_config(c), Error);
  SpeculativeConfig m;
  m.method = "qwen3_next_mtp";
  m.num_speculative_tokens = 2;
  EXPECT_EQ(validate_speculative_config(m).method, "mtp");
  m.method = "qwen3_5_mtp";
  EXPECT_EQ(validate_speculative_config(m).method, "mtp");
  m.method = "eagle";
  EXPECT_THROW(validate_speculative_config(m), Error);
  m.method = "ngram";
  m.num_speculative_tokens = 0;
  EXPECT_THROW(validate_speculative_config(m), Error);
  EXPECT_FALSE(validate_speculative_config(SpeculativeConfig{}).enabled());
  m.num_speculative_tokens = 2;
  m.disable_by_batch_size = -2;
  EXPECT_THROW(validate_speculative_config(m), Error);
  // -1 (what the CLI sets when the field is absent): measured at startup for MTP, never off for ngram.
  m.disable_by_batch_size = SpeculativeConfig::kDisableAuto;
  EXPECT_EQ(validate_speculative_config(m).disable_by_batch_size, 0);  // (m is ngram here)
  m.method = "mtp";
  EXPECT_EQ(validate_speculative_config(m).disable_by_batch_size, SpeculativeConfig::kDisableAuto);
  m.disable_by_batch_size = 16;
  EXPECT_EQ(validate_speculative_config(m).disable_by_batch_size, 16);
  EXPECT_NE(describe(validate_speculative_config(m)).find("disable_by_batch_size=16"), std::string::npos);
}

TEST(NgramProposer, LongestNgramFirstEarliestOccurrence) {
  NgramProposer p(1, 3);
  // Suffix "1 2 3" occurs at 0 (followed by 9 8) and at 5 (followed by 7): the earliest wins.
  EXPECT_EQ(p.propose_tokens({1, 2, 3, 9, 8, 1, 2, 3, 7, 5, 1, 2, 3}, 2), (std::vector<int32_t>{9, 8}));
  // Only "3" matches (n = 1): what follows its first occurrence.
  EXPECT_EQ(p.propose_tokens({3, 4, 5, 6, 3}, 3), (std::vector<int32_t>{4, 5, 6}));
  // The longer n wins over an earlier shorter match: "5 6" at 3 beats "6" at 0.
  EXPECT_EQ(p.propose_tokens({6, 0, 0, 5, 6, 1, 2, 5, 6}, 2), (std::vector<int32_t>{1, 2}));
  // Fewer than k at the end of the sequence.
  EXPECT_EQ(p.propose_tokens({4, 4}, 3), (std::vector<int32_t>{4}));
  // No match, k = 0, and too short a sequence give nothing.
  EXPECT_TRUE(p.propose_tokens({1, 2, 3, 4}, 3).empty());
  EXPECT_TRUE(p.propose_tokens({1, 1, 1}, 0).empty());
  EXPECT_TRUE(p.propose_tokens({1}, 3).empty());
  // prompt_lookup_min 2: a single-token match is not enough.
  NgramProposer p2(2, 3);
  EXPECT_TRUE(p2.propose_tokens({3, 4, 5, 6, 3}, 3).empty());
  EXPECT_EQ(p2.propose_tokens({3, 4, 5, 6, 3, 4}, 3), (std::vector<int32_t>{5, 6, 3}));
}

TEST(NgramProposer, ProposesWithinEachRequestsRoom) {
  NgramProposer p(1, 2);
  Request a, b;
  a.prompt = {1, 2, 3, 4};
  a.output = {1, 2};
  b.prompt = {7, 8};
  b.output = {9};
  std::vector<Request*> rs = {&a, &b};
  p.propose(rs, {1, 3});
  EXPECT_EQ(a.spec_tokens, (std::vector<int32_t>{3}));
  EXPECT_TRUE(b.spec_tokens.empty());
}

Request make_request(const std::string& id, std::vector<int32_t> prompt) {
  Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.params.max_tokens = 100;
  return r;
}

TEST(SchedulerDrafts, DraftsAreScheduledTrimmedAndRolledBack) {
  KvCacheCoordinator cache(16, 4, /*prefix=*/true);
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 64;
  sc.max_model_len = 64;
  Scheduler s(sc, cache);
  Request r = make_request("r", {1, 2, 3, 4, 5});
  s.add(&r);
  auto out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_draft_tokens, 0);
  s.on_step_done(out);
  r.output.push_back(6);
  r.spec_tokens = {7, 8, 9};
  out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 4);  // the last token and three drafts
  EXPECT_EQ(out.scheduled[0].num_draft_tokens, 3);
  EXPECT_EQ(r.block_ids().size(), 3u);  // positions 0..8
  EXPECT_EQ(r.token_at(6), 7);
  s.on_step_done(out);
  EXPECT_EQ(r.num_computed_tokens, 6) << "drafts count only once accepted";
  EXPECT_EQ(r.block_hashes.size(), 1u);
  // Draft 7 right, 8 wrong: the target's tokens were 7 then 11.
  r.output.push_back(7);
  r.output.push_back(11);
  s.accept_drafts(r, 1);
  EXPECT_EQ(r.num_computed_tokens, 7);
  EXPECT_TRUE(r.spec_tokens.empty());
  EXPECT_EQ(r.block_hashes.size(), 1u) << "block 1 (positions 4..7) is not complete yet";
  // Its registered block holds the accepted tokens only.
  r.spec_tokens = {12, 13, 14};
  out = s.schedule();
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 4);
  s.on_step_done(out);
  EXPECT_EQ(r.num_computed_tokens, 8);
  EXPECT_EQ(r.block_hashes.size(), 2u);
  Request twin = make_request("t", {1, 2, 3, 4, 5, 6, 7, 11, 0});
  EXPECT_EQ(cache.find_cached_prefix(twin).num_blocks(), 2) << "the full blocks hash prompt + accepted output";
  r.output.push_back(12);
  s.accept_drafts(r, 0);

  // A budget of 2 tokens keeps one draft.
  SchedulerConfig tight = sc;
  tight.max_num_batched_tokens = 2;
  KvCacheCoordinator cache2(16, 4, true);
  Scheduler s2(tight, cache2);
  Request q = make_request("q", {1, 2});
  s2.add(&q);
  s2.on_step_done(s2.schedule());
  q.output.push_back(3);
  q.spec_tokens = {4, 5, 6};
  out = s2.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 2);
  EXPECT_EQ(out.scheduled[0].num_draft_tokens, 1);
  EXPECT_EQ(q.spec_tokens, (std::vector<int32_t>{4}));
}

TEST(SchedulerDrafts, PreemptionDropsDrafts) {
  KvCacheCoordinator cache(3, 4, /*prefix=*/false);
  SchedulerConfig sc;
  sc.max_model_len = 64;
  Scheduler s(sc, cache);
  Request a = make_request("a", {1, 2, 3, 4, 5, 6}), b = make_request("b", {7, 8, 9});
  s.add(&a);
  s.add(&b);
  s.on_step_done(s.schedule());
  a.output.push_back(1);
  b.output.push_back(2);
  b.spec_tokens = {3, 4};  // b needs a second block; none is free
  auto out = s.schedule();
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], &b);
  EXPECT_TRUE(b.spec_tokens.empty());
  EXPECT_EQ(b.num_computed_tokens, 0);
}

// Proposes the greedy continuation at the request's output position (known in advance):
// drafts that sampling accepts often and rejects often.
class FixedContinuationProposer : public Proposer {
 public:
  explicit FixedContinuationProposer(std::vector<int32_t> cont) : cont_(std::move(cont)) {}
  void propose(const std::vector<Request*>& rs, const std::vector<int>& room) override {
    for (size_t i = 0; i < rs.size(); ++i) {
      const size_t from = rs[i]->output.size();
      rs[i]->spec_tokens.clear();
      for (size_t j = from; j < cont_.size() && rs[i]->spec_tokens.size() < static_cast<size_t>(room[i]); ++j)
        rs[i]->spec_tokens.push_back(cont_[j]);
    }
  }

 private:
  std::vector<int32_t> cont_;
};

struct SeedRun {
  std::map<std::string, std::vector<int32_t>> tokens;
  SpecDecodeStats spec;
};

SeedRun run_seeds(Backend& be, bool speculative, const std::vector<int32_t>& prompt, const std::vector<int32_t>& greedy,
                  uint64_t first_seed, int n, const SamplingParams& base) {
  LoadOptions lo;
  lo.model_dir = testing::fixtures_dir() + "/llama_gqa2";
  EngineConfig ec;
  ec.num_blocks_override = 512;
  ec.scheduler.max_num_seqs = 128;
  ec.scheduler.max_model_len = 64;
  if (speculative) {
    ec.speculative.method = "ngram";
    ec.speculative.num_speculative_tokens = 3;
  }
  LLMEngine e(load_model(lo, be), be, ec);
  if (speculative) e.set_proposer(std::make_unique<FixedContinuationProposer>(greedy));
  SeedRun run;
  for (int i = 0; i < n; ++i) {
    SamplingParams p = base;
    p.seed = first_seed + static_cast<uint64_t>(i);
    EXPECT_TRUE(e.add_request(std::to_string(i), prompt, p).ok());
  }
  while (e.has_unfinished())
    for (const auto& o : e.step()) {
      auto& v = run.tokens[o.request_id];
      v.insert(v.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }
  run.spec = e.stats().spec;
  return run;
}

// Speculative sampling (drafts verified against the target's keyed draws) against plain
// sampling on a tiny model: the same tokens for the same seeds, and over disjoint seed sets
// the same distribution of the tokens at output positions 1..3 (the verified ones) by a
// chi-square test of homogeneity at p = 0.001.
TEST(SpeculativeSampling, SameDistributionAsPlainSampling) {
  if (testing::testing_on_cuda()) GTEST_SKIP() << "CPU test (exact seeds)";
  auto be = testing::make_test_backend();
  const std::vector<int32_t> prompt = {11, 12, 13, 14, 15, 16, 17, 18};
  SamplingParams gp;
  gp.temperature = 0;
  gp.max_tokens = 4;
  gp.ignore_eos = true;
  std::vector<int32_t> greedy = run_seeds(*be, false, prompt, {}, 0, 1, gp).tokens["0"];
  ASSERT_EQ(greedy.size(), 4u);

  SamplingParams sp;
  sp.temperature = 0.6f;
  sp.top_k = 3;
  sp.max_tokens = 4;
  sp.ignore_eos = true;
  // Same seeds: the same tokens.
  const SeedRun plain_same = run_seeds(*be, false, prompt, greedy, 1, 64, sp);
  const SeedRun spec_same = run_seeds(*be, true, prompt, greedy, 1, 64, sp);
  EXPECT_EQ(plain_same.tokens, spec_same.tokens);

  const int n = 1500;
  const SeedRun plain = run_seeds(*be, false, prompt, greedy, 1000, n, sp);
  const SeedRun spec = run_seeds(*be, true, prompt, greedy, 1000 + n, n, sp);
  ASSERT_GT(spec.spec.num_accepted_tokens, 0u);
  ASSERT_LT(spec.spec.num_accepted_tokens, spec.spec.num_draft_tokens);
  std::map<std::vector<int32_t>, std::pair<int, int>> counts;
  for (const auto& [id, t] : plain.tokens) counts[std::vector<int32_t>(t.begin() + 1, t.end())].first++;
  for (const auto& [id, t] : spec.tokens) counts[std::vector<int32_t>(t.begin() + 1, t.end())].second++;
  // Categories with fewer than 10 draws in both arms together are pooled.
  double chi2 = 0;
  int cats = 0, pooled_a = 0, pooled_b = 0;
  for (const auto& [k, ab] : counts) {
    if (ab.first + ab.second < 10) {
      pooled_a += ab.first;
      pooled_b += ab.second;
      continue;
    }
    chi2 += std::pow(ab.first - ab.second, 2) / (ab.first + ab.second);
    ++cats;
  }
  if (pooled_a + pooled_b > 0) {
    chi2 += std::pow(pooled_a - pooled_b, 2) / (pooled_a + pooled_b);
    ++cats;
  }
  ASSERT_GE(cats, 4) << "too few outcomes for a useful test";
  const double df = cats - 1, z = 3.09;  // p = 0.001, Wilson-Hilferty
  const double crit = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
  std::printf("chi-square %.1f over %d outcome classes (critical %.1f); %llu of %llu drafts accepted\n", chi2, cats,
              crit, static_cast<unsigned long long>(spec.spec.num_accepted_tokens),
              static_cast<unsigned long long>(spec.spec.num_draft_tokens));
  EXPECT_LT(chi2, crit) << cats << " outcome classes";
}

}  // namespace
}  // namespace tessera
