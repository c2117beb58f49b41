// Constrained decoding in the engine, through its TokenConstraint seam (no grammar here: the constraints
// are small rules the test can check), on a tiny random-weight model: every token obeys the constraint,
// with sampling, several sequences, speculative drafts, a start after a given token (the end of the
// reasoning), a constraint that can only end; also allowed_token_ids and bad_words.
#include <gtest/gtest.h>

#include <map>

#include "engine/engine.h"
#include "engine/model_loader.h"
#include "engine/spec/proposer.h"
#include "fixture_util.h"

namespace tessera {
namespace {

constexpr int32_t kEos = 2;  // llama_gqa2's eos_token_id

// Token i of the constrained part must be = i (mod 5) (never the eos, whose residue is 2, before the end),
// and after `length` tokens only the eos may follow.
class ResidueConstraint : public TokenConstraint {
 public:
  explicit ResidueConstraint(int length, int* accepts) : length_(length), accepts_(accepts) {}
  void fill_mask(std::span<uint32_t> mask) override {
    std::fill(mask.begin(), mask.end(), 0u);
    const int vocab = static_cast<int>(mask.size()) * 32;
    if (pos_ >= length_) {
      mask[kEos / 32] |= 1u << (kEos % 32);
      return;
    }
    for (int t = 0; t < vocab; ++t)
      if (allowed(t)) mask[static_cast<size_t>(t) / 32] |= 1u << (t % 32);
  }
  bool accept(int32_t t) override {
    if (pos_ >= length_ ? t != kEos : !allowed(t)) return false;
    ++pos_;
    if (accepts_) ++*accepts_;
    return true;
  }
  bool is_finished() const override { return pos_ >= length_; }
  void rollback(int n) override {
    pos_ -= n;
    if (accepts_) *accepts_ -= n;
  }
  bool allowed(int32_t t) const { return t != kEos && t % 5 == pos_ % 5; }

 private:
  int length_, pos_ = 0;
  int* accepts_;
};

class ResidueFactory : public TokenConstraintFactory {
 public:
  explicit ResidueFactory(int length, int* accepts = nullptr) : length_(length), accepts_(accepts) {}
  std::unique_ptr<TokenConstraint> make() const override {
    return std::make_unique<ResidueConstraint>(length_, accepts_);
  }
  std::string describe() const override { return "residues"; }

 private:
  int length_;
  int* accepts_;
};

// Proposes the given continuation (drafts that the constraint accepts or not).
class FixedProposer : public Proposer {
 public:
  explicit FixedProposer(std::vector<int32_t> cont) : cont_(std::move(cont)) {}
  void propose(const std::vector<Request*>& rs, const std::vector<int>& room) override {
    for (size_t i = 0; i < rs.size(); ++i) {
      rs[i]->spec_tokens.clear();
      for (size_t j = rs[i]->output.size(); j < cont_.size() && rs[i]->spec_tokens.size() < size_t(room[i]); ++j)
        rs[i]->spec_tokens.push_back(cont_[j]);
    }
  }

 private:
  std::vector<int32_t> cont_;
};

struct EngineRun {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, FinishReason> finish;
};

EngineRun run(Backend& be, const std::vector<SamplingParams>& params, const std::vector<int32_t>* drafts = nullptr) {
  LoadOptions lo;
  lo.model_dir = testing::fixtures_dir() + "/llama_gqa2";
  EngineConfig ec;
  ec.num_blocks_override = 256;
  ec.scheduler.max_model_len = 64;
  if (drafts) {
    ec.speculative.method = "ngram";
    ec.speculative.num_speculative_tokens = 3;
  }
  LLMEngine e(load_model(lo, be), be, ec);
  if (drafts) e.set_proposer(std::make_unique<FixedProposer>(*drafts));
  const std::vector<int32_t> prompt = {11, 12, 13, 14, 15, 16, 17, 18};
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(e.add_request(std::to_string(i), prompt, params[i]).ok());
  EngineRun r;
  while (e.has_unfinished())
    for (const auto& o : e.step()) {
      auto& v = r.tokens[o.request_id];
      v.insert(v.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) r.finish[o.request_id] = o.finish_reason;
    }
  return r;
}

SamplingParams sampled(uint64_t seed, int max_tokens = 12) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = seed;
  p.max_tokens = max_tokens;
  return p;
}

void expect_residues(const std::vector<int32_t>& tokens, size_t from, int length) {
  for (size_t i = from; i < tokens.size(); ++i) {
    const int pos = static_cast<int>(i - from);
    if (pos < length)
      EXPECT_EQ(tokens[i] % 5, pos % 5) << "token " << i << " = " << tokens[i];
    else
      EXPECT_EQ(tokens[i], kEos) << "token " << i;
  }
}

TEST(ConstrainedDecoding, EveryTokenObeysAndTheSequenceEndsWhereTheConstraintDoes) {
  auto be = testing::make_test_backend();
  int accepts = 0;
  std::vector<SamplingParams> ps;
  for (int i = 0; i < 4; ++i) {
    SamplingParams p = sampled(100 + i, 20);
    p.n = i == 3 ? 3 : 1;  // three sequences: each its own state
    p.constraint = std::make_shared<ResidueFactory>(6, &accepts);
    ps.push_back(p);
  }
  EngineRun r = run(*be, ps);
  ASSERT_EQ(r.tokens.size(), 6u);
  for (const auto& [id, t] : r.tokens) {
    ASSERT_EQ(t.size(), 7u) << id;  // six constrained tokens, then the eos
    expect_residues(t, 0, 6);
    EXPECT_EQ(r.finish[id], FinishReason::kStop) << id;
  }
  EXPECT_EQ(accepts, 6 * 7);  // the eos is accepted too
}

TEST(ConstrainedDecoding, ALongConstraintEndsWithLength) {
  auto be = testing::make_test_backend();
  SamplingParams p = sampled(7, 5);
  p.constraint = std::make_shared<ResidueFactory>(50);
  EngineRun r = run(*be, {p});
  ASSERT_EQ(r.tokens["0"].size(), 5u);
  expect_residues(r.tokens["0"], 0, 50);
  EXPECT_EQ(r.finish["0"], FinishReason::kLength);
}

TEST(ConstrainedDecoding, StartsAfterTheGivenToken) {
  auto be = testing::make_test_backend();
  SamplingParams g = sampled(0, 6);
  g.temperature = 0;
  g.ignore_eos = true;
  const std::vector<int32_t> free = run(*be, {g}).tokens["0"];
  ASSERT_EQ(free.size(), 6u);
  ASSERT_NE(free[0], kEos);
  ASSERT_NE(free[1], kEos);
  SamplingParams p = g;
  p.ignore_eos = false;
  p.max_tokens = 10;
  p.constraint = std::make_shared<ResidueFactory>(4);
  p.constraint_after_token = free[1];
  const std::vector<int32_t> t = run(*be, {p}).tokens["0"];
  // Free (greedy, as without the constraint) up to and including the first free[1], constrained after it.
  size_t start = 0;
  while (start < t.size() && t[start] != free[1]) ++start;
  ASSERT_LT(start, t.size());
  for (size_t i = 0; i <= start; ++i) EXPECT_EQ(t[i], free[i]);
  ASSERT_EQ(t.size(), start + 1 + 5);
  expect_residues(t, start + 1, 4);
}

TEST(ConstrainedDecoding, DraftsAreCheckedAgainstTheConstraint) {
  auto be = testing::make_test_backend();
  // Drafts of which some obey the constraint (residues 0, 1, 2, ...) and some do not.
  const std::vector<int32_t> drafts = {5, 6, 99, 8, 9, 10, 11, 17, 13, 14, 15, 16};
  std::vector<SamplingParams> ps;
  for (int i = 0; i < 3; ++i) {
    SamplingParams p = sampled(40 + i, 16);
    p.temperature = i == 0 ? 0.0f : 1.0f;
    p.constraint = std::make_shared<ResidueFactory>(10);
    ps.push_back(p);
  }
  EngineRun r = run(*be, ps, &drafts);
  for (const auto& [id, t] : r.tokens) {
    ASSERT_EQ(t.size(), 11u) << id;
    expect_residues(t, 0, 10);
  }
}

TEST(ConstrainedDecoding, ManySequencesWithDraftsBesideFreeOnes) {
  // The masks of a step are filled on the thread pool: constrained sequences interleaved with free ones,
  // drafts refused at different places, each constrained row masked with its own sequence's state.
  auto be = testing::make_test_backend();
  const std::vector<int32_t> drafts = {5, 6, 99, 8, 9, 10, 11, 17, 13, 14, 15, 16};
  std::vector<SamplingParams> ps;
  for (int i = 0; i < 12; ++i) {
    SamplingParams p = sampled(60 + i, 14);
    if (i % 3 != 1) p.constraint = std::make_shared<ResidueFactory>(4 + i % 7);
    ps.push_back(p);
  }
  EngineRun r = run(*be, ps, &drafts);
  ASSERT_EQ(r.tokens.size(), ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::vector<int32_t>& t = r.tokens[std::to_string(i)];
    if (!ps[i].constraint) continue;
    const int length = 4 + static_cast<int>(i) % 7;
    ASSERT_EQ(t.size(), static_cast<size_t>(length) + 1) << i;  // then the eos
    expect_residues(t, 0, length);
    EXPECT_EQ(r.finish[std::to_string(i)], FinishReason::kStop) << i;
  }
}

TEST(ConstrainedDecoding, AllowedTokenIdsAndBadWords) {
  auto be = testing::make_test_backend();
  SamplingParams p = sampled(3, 16);
  p.ignore_eos = true;
  p.allowed_token_ids = {20, 21, 22, 40};
  EngineRun allowed = run(*be, {p});
  for (int32_t t : allowed.tokens["0"]) EXPECT_TRUE(t == 20 || t == 21 || t == 22 || t == 40) << t;

  SamplingParams g = sampled(0, 4);
  g.temperature = 0;
  g.ignore_eos = true;
  const std::vector<int32_t> free = run(*be, {g}).tokens["0"];
  SamplingParams one = g;
  one.bad_words_ids = {{free[0]}};  // a one-token word: never taken
  EXPECT_NE(run(*be, {one}).tokens["0"][0], free[0]);
  SamplingParams two = g;
  two.bad_words_ids = {{free[0], free[1]}};  // the second token only right after the first
  const std::vector<int32_t> t = run(*be, {two}).tokens["0"];
  EXPECT_EQ(t[0], free[0]);
  EXPECT_NE(t[1], free[1]);
}

TEST(ConstrainedDecoding, ValidationNamesTheField) {
  SamplingParams p;
  p.allowed_token_ids = {1, 100000};
  EXPECT_NE(validate_sampling_params(p, 1000).message().find("allowed_token_ids"), std::string::npos);
  SamplingParams q;
  q.bad_words_ids = {{5, -1}};
  EXPECT_NE(validate_sampling_params(q, 1000).message().find("bad_words"), std::string::npos);
}

}  // namespace
}  // namespace tessera
